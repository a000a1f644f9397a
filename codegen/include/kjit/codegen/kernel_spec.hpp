// KernelSpec: everything that selects one generated kernel, independent of the
// device it will run on (the arch is a separate compile input). Each kernel
// family has a small value type; KernelSpec is their variant. A spec has one
// canonical text form and one JSON form (manifests, cache metadata), and they
// round-trip: from_json(to_json(s)) == s.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/base/expected.hpp"

namespace kjit::codegen {

enum class DType : uint8_t { f8_e4m3fn, f8_e5m2, bf16, f16, f32 };
enum class ScaleGranularity : uint8_t { per_tensor, per_row, per_block };
enum class ScaleConvention : uint8_t { multiply, divide };

std::string_view name(DType t);
std::string_view name(ScaleGranularity g);
std::string_view name(ScaleConvention c);
int size_bytes(DType t);

// fp8 dequantisation. The shape key is the column count (the contiguous
// dimension, compiled in so that index division is by a constant) and the
// scale block; rows, experts and strides are run-time arguments, so one kernel
// serves every row count and expert count of a weight shape.
struct DequantSpec {
  DType in = DType::f8_e4m3fn;
  DType out = DType::bf16;
  int64_t cols = 0;
  ScaleGranularity granularity = ScaleGranularity::per_block;
  int64_t block_rows = 0;  // per_block only; 0 otherwise
  int64_t block_cols = 0;  // per_block only; 0 otherwise
  ScaleConvention convention = ScaleConvention::multiply;
  int vec = 16;                   // columns per thread access; divides cols
  bool selected_experts = false;  // the "only these experts" form

  bool operator==(const DequantSpec&) const = default;
};

enum class WeightLayout : uint8_t { e_n_k, e_k_n };
enum class OffsetsConvention : uint8_t { cumulative_end, with_leading_zero };
std::string_view name(WeightLayout l);
std::string_view name(OffsetsConvention c);

// Which grouped GEMM kernel a configuration uses: the portable mma.sync one
// (sm_80 and newer) or one of Hopper's wgmma/TMA ones (sm_90a only): rows on
// wgmma's M (tiles of 64 or 128 rows), or "swap AB", rows on wgmma's N (tiles
// of any multiple of 32 rows up to tile_m; tile_n columns per block).
enum class GemmKernel : uint8_t { mma_sync, wgmma_sm90, wgmma_sm90_swap_ab };
std::string_view name(GemmKernel k);
constexpr bool is_sm90(GemmKernel k) { return k == GemmKernel::wgmma_sm90 || k == GemmKernel::wgmma_sm90_swap_ab; }
// Which way a cluster's blocks lie over the output tiles: along m they share
// the weight tile (B), along n the activation tile (A), by TMA multicast.
enum class ClusterAxis : uint8_t { m, n };
std::string_view name(ClusterAxis a);

// Grouped GEMM for MoE experts: out[rows of e] = A[rows of e] . W_e. The shape
// key is N, K and the expert count; the token count (rows) is a run-time
// argument and never part of a key. The kernel, tile and pipeline depth are
// the configuration, chosen per arch and token-count bucket by
// grouped_gemm_configs / choose_grouped_gemm_config. A spec whose tile is
// 0x0x0 is a problem, not a kernel: manifests list problems, and precompile
// expands each into every configuration its arch may pick.
struct GroupedGemmSpec {
  DType out = DType::bf16;  // operands are bf16
  int64_t n = 0;
  int64_t k = 0;
  int64_t experts = 0;
  WeightLayout weights = WeightLayout::e_n_k;
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  bool row_scale = false;
  GemmKernel kernel = GemmKernel::mma_sync;
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int stages = 0;   // shared-memory pipeline depth (wgmma_sm90); 0 for mma_sync
  int cluster = 1;  // blocks per cluster sharing an operand by TMA multicast (wgmma_sm90: 1 or 2)
  ClusterAxis cluster_axis = ClusterAxis::m;  // with cluster 2: the axis the blocks lie along

  bool configured() const { return tile_m != 0; }
  bool operator==(const GroupedGemmSpec&) const = default;
};

// MoE routing: top-k global expert ids -> this rank's per-expert counts,
// offsets and the expert-sorted permutation and its inverse. The key is the
// local expert count; tokens, top-k and the rank's expert range are run-time.
struct MoeRoutingSpec {
  int64_t experts = 0;  // experts this rank owns
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  bool operator==(const MoeRoutingSpec&) const = default;
};

// MoE combine: out[t] = sum over j of weight[t, j] * expert_out[row of (t, j)].
struct MoeCombineSpec {
  int64_t top_k = 0;
  int64_t hidden = 0;
  DType out = DType::bf16;  // expert_out is bf16
  bool operator==(const MoeCombineSpec&) const = default;
};

using KernelSpec = std::variant<DequantSpec, GroupedGemmSpec, MoeRoutingSpec, MoeCombineSpec>;

// Grouped GEMM configurations (the heuristic, documented in
// docs/architecture.md "Grouped GEMM tiles"). `target` is an NVRTC arch such
// as "sm_90a". The configurations `target` may pick, one per token-count
// bucket, in bucket order (what precompile builds):
std::vector<GroupedGemmSpec> grouped_gemm_configs(const GroupedGemmSpec& problem, std::string_view target);

// The dynamic shared memory a configuration's kernel needs (0: none).
int grouped_gemm_shared_bytes(const GroupedGemmSpec& spec);

// What a caller may ask of the configuration choice.
struct GemmRequest {
  enum class Kernel : uint8_t { arch_default, portable, sm90, sm90_swap_ab };
  // portable: tests, comparisons; sm90 (the arch's SM90 buckets) and sm90_swap_ab (every bucket swap AB): an
  // error off Hopper
  Kernel kernel = Kernel::arch_default;
  int tile_m = 0, tile_n = 0;  // 0: the heuristic's
  int cluster = 0;             // 0: the heuristic's (1 whenever a tile is given)
  ClusterAxis cluster_axis = ClusterAxis::m;  // with cluster 2
};
// The configuration a launch of `rows` rows on `target` uses.
Expected<GroupedGemmSpec> choose_grouped_gemm_config(const GroupedGemmSpec& problem, std::string_view target,
                                                     int64_t rows, const GemmRequest& request = {});

// Every configuration choose_grouped_gemm_config may return for `request`
// on `target`, whatever the row count (what a prepare call loads).
Expected<std::vector<GroupedGemmSpec>> grouped_gemm_candidates(const GroupedGemmSpec& problem, std::string_view target,
                                                               const GemmRequest& request = {});

// Every kernel a manifest spec stands for on `target`: a grouped GEMM problem
// expands into its configurations; every other spec is itself.
std::vector<KernelSpec> kernels_for_target(const KernelSpec& spec, std::string_view target);

// The family name, e.g. "fp8_dequant".
std::string_view op_name(const KernelSpec& spec);

// One line, stable across releases of the same entry format, e.g.
// "fp8_dequant in=f8_e4m3fn out=bf16 cols=7168 scale=per_block:128x128 convention=multiply vec=16 experts=all".
std::string canonical(const KernelSpec& spec);

nlohmann::json to_json(const KernelSpec& spec);
// Validates as it parses: the message names the field that is wrong.
Expected<KernelSpec> spec_from_json(const nlohmann::json& j);
// Checks the invariants every spec must satisfy (sizes, vec divides cols ...).
Expected<void> validate(const KernelSpec& spec);
// validate, and that `spec` is one kernel that builds for `target` (not a
// grouped GEMM problem; Hopper's kernel only for sm_90a).
Expected<void> validate_for_target(const KernelSpec& spec, std::string_view target);

// The widest access (16, 8, 4, 2 or 1 columns, at most `max_vec`) that divides
// `cols` and every alignment in `alignments` (in elements).
int widest_vector(int64_t cols, std::initializer_list<int64_t> alignments = {}, int max_vec = 16);

// The access width a dequant to `out` uses: the widest whose output is one
// 16-byte store (8 columns for bf16/f16, 4 for f32): full-width coalesced
// stores measured faster than wider accesses split into two stores. Used by
// ops and manifests alike, so a manifest precompiles what a launch picks.
int dequant_vector(DType out, int64_t cols, std::initializer_list<int64_t> alignments = {});

struct SpecHash {
  size_t operator()(const KernelSpec& spec) const noexcept;
};

}  // namespace kjit::codegen
