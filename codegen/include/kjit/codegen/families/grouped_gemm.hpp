// The bf16 grouped GEMM family (MoE experts): out[rows of e] = A[rows of e] . W_e.
// Home: this header (the spec and its fields), codegen/src/families/grouped_gemm.cpp
// (invariants, recipes, geometry) and grouped_gemm_tuning.cpp (which
// configuration serves which arch and token count); device code in
// templates/gemm/; ABI block templates/abi/grouped_gemm_params.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// Which grouped GEMM kernel a configuration uses: the portable mma.sync one
// (sm_80 and newer) or one of Hopper's wgmma/TMA ones (sm_90a only): rows on
// wgmma's M (tiles of 64 or 128 rows), or "swap AB", rows on wgmma's N (tiles
// of any multiple of 32 rows up to tile_m; tile_n columns per block); or the
// decode kernel (templates/gemm/grouped_gemm_decode.cuh, mma.sync, sm_80 and
// newer; Hopper's heuristic picks it for few routed rows): blocks only for
// non-empty (expert, chunk of tile_m rows) pairs, tile_n weight rows each,
// the weights streamed from global memory into registers; or the short-K kernel
// (templates/gemm/grouped_gemm_short_k.cuh, mma.sync, sm_80 and newer; every
// arch's heuristic picks it for K <= kShortKMaxK): a LoRA branch's rank-deep
// GEMMs, whose output and addend are nearly all their bytes.
enum class GemmKernel : uint8_t { mma_sync, wgmma_sm90, wgmma_sm90_swap_ab, mma_decode, mma_short_k };
std::string_view name(GemmKernel k);
constexpr bool is_sm90(GemmKernel k) { return k == GemmKernel::wgmma_sm90 || k == GemmKernel::wgmma_sm90_swap_ab; }
// Which way a cluster's blocks lie over the output tiles: along m they share
// the weight tile (B), along n the activation tile (A), by TMA multicast.
enum class ClusterAxis : uint8_t { m, n };
std::string_view name(ClusterAxis a);

// The shape key is N, K and the expert count; the token count (rows) is a
// run-time argument and never part of a key. The kernel, tile and pipeline
// depth are the configuration, chosen per arch and token-count bucket
// (grouped_gemm_configs / choose_grouped_gemm_config). A spec whose tile is
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
  // A fused MoE activation: the weight rows are gate/up groups of 8
  // (gate_up_interleaved order), the output has N / 2 columns, and the row
  // scale, if any, multiplies the activation.
  Activation activation = Activation::none;
  // A's rows read through the routing's sorted_to_flat (row r is a[sorted_to_flat[r] / top_k]): the kernels'
  // loads gather, so no gathered copy of the activations is made.
  bool gather = false;
  // out = product (times the row scale) + addend[row, col] in fp32, rounded once to out's type: a LoRA
  // branch's product summed into its base GEMM's output without a pass of its own. Not with an activation.
  Addend addend = Addend::none;
  GemmKernel kernel = GemmKernel::mma_sync;
  int tile_m = 0, tile_n = 0, tile_k = 0;
  int stages = 0;   // shared-memory pipeline depth (wgmma_sm90); 0 for mma_sync
  int cluster = 1;  // blocks per cluster sharing an operand by TMA multicast (wgmma_sm90: 1 or 2)
  ClusterAxis cluster_axis = ClusterAxis::m;  // with cluster 2: the axis the blocks lie along

  bool configured() const { return tile_m != 0; }
  bool operator==(const GroupedGemmSpec&) const = default;
};

// The fields every grouped GEMM spec's table has first (the bf16, FP8, mixed-input and weight-gradient
// families): the output type, N and K (at least `min_n` and `min_k`) and the expert count, which a problem
// names and a kernel's identity (kernel_identity: the count is a launch argument) leaves out.
template <class Spec>
constexpr auto gemm_shape_fields(int64_t min_n, int64_t min_k) {
  return std::tuple{field("out", &Spec::out).only(DType::bf16, DType::f32),
                    field("n", &Spec::n).range(min_n, kMaxDimension), field("k", &Spec::k).range(min_k, kMaxDimension),
                    field("experts", &Spec::experts).range(1, kMaxExperts).omit_default()};
}

template <>
struct Family<GroupedGemmSpec> : SpecForms<GroupedGemmSpec> {
  static constexpr std::string_view op = "grouped_gemm";
  static constexpr auto fields = std::tuple_cat(
      std::tuple{fixed_text(" a=bf16 b=bf16")}, gemm_shape_fields<GroupedGemmSpec>(8, 8),
      std::tuple{
          field("weights", &GroupedGemmSpec::weights), field("offsets", &GroupedGemmSpec::offsets),
          field("row_scale", &GroupedGemmSpec::row_scale).optional(),
          // Only where fused or gathered, so that the other kernels keep their keys.
          field("activation", &GroupedGemmSpec::activation).omit_default(),
          field("gather", &GroupedGemmSpec::gather).omit_default().spelled("false", "sorted_to_flat"),
          field("addend", &GroupedGemmSpec::addend).omit_default(),
          // A configuration's fields (cache metadata; rare in manifests). Bounded so that they stay in int;
          // validate says which are supported.
          configuration(field("kernel", &GroupedGemmSpec::kernel),
                        field("tile", &GroupedGemmSpec::tile_m, &GroupedGemmSpec::tile_n, &GroupedGemmSpec::tile_k)
                            .range(1, 256)
                            .shape("[m, n, k]"),
                        field("stages", &GroupedGemmSpec::stages).optional().range(0, 16),
                        field("cluster", &GroupedGemmSpec::cluster).optional().range(1, 16),
                        // The text names a cluster's axis where it has one: " along n".
                        field("cluster_axis", &GroupedGemmSpec::cluster_axis)
                            .optional()
                            .text([](const GroupedGemmSpec& s) {
                              return s.cluster > 1 ? std::string(" along ").append(name(s.cluster_axis))
                                                   : std::string();
                            }))});
  static Expected<void> validate(const GroupedGemmSpec& s);
  // A configuration only (a problem is no kernel); Hopper's kernels only where the arch has wgmma and TMA.
  static Expected<void> supported_on(const GroupedGemmSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const GroupedGemmSpec& s);
  // A problem: every configuration `arch` may pick (grouped_gemm_configs); a configuration: itself.
  static std::vector<GroupedGemmSpec> kernels_for_target(const GroupedGemmSpec& s, const ArchInfo& arch);
};

// The dynamic shared memory a configuration's kernel needs (0: none).
int grouped_gemm_shared_bytes(const GroupedGemmSpec& spec);

// Grid for a grouped GEMM over `total_rows` rows of A on a device where
// `resident_blocks` blocks of the kernel fit at once (the SM90 kernels are
// persistent: its SM count, or what its clusters leave of it).
LaunchGeometry grouped_gemm_geometry(const GroupedGemmSpec& spec, int64_t total_rows, int resident_blocks);

// The two grid shapes of the grouped GEMM kernels (both families):
// - persistent (SM90): whole clusters of `cluster` blocks, one per cluster
//   tile up to what is resident at once (`resident_blocks`), at least one;
// - portable: x over an upper bound of m-tiles (surplus blocks find no tile), y over n-tiles.
LaunchGeometry persistent_gemm_grid(int64_t cluster_tiles, int cluster, int resident_blocks, int threads,
                                    int shared_bytes);
LaunchGeometry portable_gemm_grid(int64_t m_tiles, int64_t n_tiles, int threads);
// - decode: x over an upper bound of the non-empty (expert, chunk of tile_m rows) pairs, y over n-tiles,
//   with the kernel's ring (decode_shared_bytes) and threads (by default the mma.sync decode kernel's).
inline constexpr int kDecodeThreads = 256;  // GroupedGemmDecodeConfig::kThreads
LaunchGeometry decode_gemm_grid(int64_t total_rows, int64_t experts, int tile_m, int64_t n_tiles, int shared_bytes,
                                int threads = kDecodeThreads);

// ---- Tuning policy (grouped_gemm_tuning.cpp; docs/architecture.md "Grouped GEMM tiles") ----

// The configurations `arch` may pick, one per token-count bucket, in bucket order (what precompile builds).
std::vector<GroupedGemmSpec> grouped_gemm_configs(const GroupedGemmSpec& problem, const ArchInfo& arch);

// The decode buckets: when the decode kernel runs instead of the SM90 kernels. Measured on an H200 (whole MoE
// layers, graph replays, Qwen3-30B-A3B, DeepSeek-V3 TP8 and EP8 shapes; docs/decisions/0023):
// - bf16 weights (bulk-copy ring): 1.04-3.11x the SM90 kernels up to 64 routed rows (8 tokens of top 8) in all
//   three shapes; at 128 rows 0.96-1.06x, at 256 0.87-0.98x;
// - FP8 weights, W8A16 (the threads' cp.async ring): 1.18-3.44x up to 64 routed rows in all three shapes,
//   0.88-1.11x at 128 (two runs; MoEExperts runs W8A8 from 64 rows);
// - W8A8 (sm_90a: the wgmma decode kernel): 1.04-3.00x up to 128 routed rows in all three shapes; from 256
//   rows (32 tokens) 1.22-1.28x over Qwen3's 128 experts, 1.00x over DeepSeek-V3 TP8's 256 and 0.63-0.93x over
//   an EP8 rank's 32 (16 rows an expert and more: its SM90 tiles stream at 82-84% of copy bandwidth there);
// - FP4 weights, W4A16 (bulk-copy ring, lookup conversion; gpt-oss-120b's MXFP4 layer, 128 experts, top 4):
//   1.18-1.65x the SM90 register-operand kernel at 4 to 256 routed rows (1 to 64 tokens).
inline constexpr int64_t kDecodeMaxRowsBf16 = 64;
inline constexpr int64_t kDecodeMaxRowsW8A16 = 64;
inline constexpr int64_t kDecodeMaxRowsW8A8 = 128;
inline constexpr int64_t kDecodeManyExperts = 128;  // the larger buckets below hold over this many experts or more
inline constexpr int64_t kDecodeMaxRowsW8A8ManyExperts = 512;
inline constexpr int64_t kDecodeMaxRowsW4A16ManyExperts = 256;
inline bool bf16_decode_bucket(int64_t rows) { return rows <= kDecodeMaxRowsBf16; }
inline bool w8a16_decode_bucket(int64_t rows) { return rows <= kDecodeMaxRowsW8A16; }
inline bool w8a8_decode_bucket(int64_t rows, int64_t experts) {
  return rows <= kDecodeMaxRowsW8A8 || (rows <= kDecodeMaxRowsW8A8ManyExperts && experts >= kDecodeManyExperts);
}
inline bool w4a16_decode_bucket(int64_t rows, int64_t experts) {
  return rows <= kDecodeMaxRowsW8A16 || (rows <= kDecodeMaxRowsW4A16ManyExperts && experts >= kDecodeManyExperts);
}
// The decode kernel's weight rows per block for N weight rows: the widest of 128, 64, 32 and 16 that still
// gives 16 blocks per expert. One token's 8 experts then give ~128-256 blocks, one wave at two blocks per SM
// of an H100/H200; at 32 blocks per expert (the first rule) a 1536-row gate_up took 1.45 waves, and at 4
// tokens the wider tiles streamed 10-30% faster (tools/bench/probe_decode_tiles.py, decision 0023).
int decode_tile_n(int64_t n);
// The decode kernel's rows per block (tokens on mma's N, 8 per tile). 8: the bucket's experts get 1-4 rows at
// top 8 (at most 32 rows, distinct experts per token), and one token tile of activations in registers is what
// lets two blocks share an SM without spills (decode_min_blocks).
inline constexpr int kDecodeTileRows = 8;
// The decode kernel's operands (its DecodeOperands): bf16, fp8 weights with bf16 activations, fp8 both, FP4
// weights (NVFP4, MXFP4) with bf16 activations.
enum class DecodeOperands : uint8_t { bf16, w8a16, w8a8, w4a16 };
std::string_view name(DecodeOperands operands);
// The decode kernel's dynamic shared memory (GroupedGemmDecodeConfig::kSharedBytes; the generated code asserts
// they agree): bf16 and W8A8, each of its 8 warps' ring of 3 chunks of 16 weight rows' 256 bytes (bf16's 128 k,
// W8A8's 256) with an mbarrier a chunk (96 KB); W8A16, each of its 256 threads' ring of 4 chunks of two rows'
// 32 codes and two 4-byte scales (72 KB). Two blocks fit an SM of Hopper, one sm_120's 99 KB.
int decode_shared_bytes(DecodeOperands operands);
// The decode kernel's tiles: tile_m rows of an expert per block (token tiles of 8: 8, 16, or 32 but for W8A8,
// whose four token tiles of codes and scales, each a chunk ahead, spill), tile_n weight rows (16 to 128: whole
// warps of 16 rows). decode_tiles says which, for messages.
bool decode_tile_supported(DecodeOperands operands, int tile_m, int tile_n);
std::string_view decode_tiles(DecodeOperands operands);
// The blocks per SM the decode kernel's launch bounds ask for: 2 at 8 rows (a 128-register cap), 1 at 16 and 32
// (two or four token tiles of activations in registers spill under that cap).
inline int decode_min_blocks(int tile_m) { return tile_m == 8 ? 2 : 1; }

// The short-K kernel (GroupedGemmShortKConfig): K up to 32 (a LoRA rank), no fused activation; tile_m 64 rows
// (4 warps of 16), tile_n 64, 128 or 256 columns per block, tile_k 32 (its whole K). Every arch's heuristic picks
// it where it serves (short_k_serves), in every bucket: the kernels for long K compute their k-blocks of 64 or 128
// for 16 columns of it and write one tile at a time per SM, 25-43% of copy bandwidth at rank 16 (H200,
// tools/bench/bench_lora_gemms.py; decision 0021).
inline constexpr int64_t kShortKMaxK = 32;
inline bool short_k_serves(const GroupedGemmSpec& problem) {
  return problem.k <= kShortKMaxK && problem.activation == Activation::none;
}
// Its columns per block: the narrowest of 64, 128 and 256 that holds N, else 256.
inline int short_k_tile_n(int64_t n) { return n <= 64 ? 64 : n <= 128 ? 128 : 256; }

// The deepest SM90 pipeline of `kernel` with this tile that fits a Hopper block's shared memory.
int sm90_max_stages(GemmKernel kernel, int tile_m, int tile_n);

// What a caller may ask of the configuration choice.
struct GemmRequest {
  enum class Kernel : uint8_t { arch_default, portable, sm90, sm90_swap_ab, sm90_converter, decode, short_k };
  // portable: tests, comparisons; sm90 (the arch's SM90 buckets, the decode bucket left out), sm90_swap_ab
  // (every bucket swap AB) and sm90_converter (the mixed-input family's converter kernel in every bucket; the
  // op refuses it for the others): an error off Hopper; decode: the decode kernel in every bucket (bf16 and
  // fp8 W8A16 weights read [E, N, K]); short_k: the short-K kernel in every bucket (bf16, K <= kShortKMaxK, no
  // fused activation; the op refuses it for the other families)
  Kernel kernel = Kernel::arch_default;
  int tile_m = 0, tile_n = 0;  // 0: the heuristic's
  int cluster = 0;             // 0: the heuristic's (1 whenever a tile is given)
  ClusterAxis cluster_axis = ClusterAxis::m;  // with cluster 2
};
// `configs` without repeats, in order (buckets may share a configuration; a prepare call loads each once).
template <class Spec>
std::vector<Spec> distinct_configs(const std::vector<Spec>& configs) {
  std::vector<Spec> unique;
  for (const auto& c : configs)
    if (std::find(unique.begin(), unique.end(), c) == unique.end()) unique.push_back(c);
  return unique;
}

// The configuration a launch of `rows` rows on `arch` uses.
Expected<GroupedGemmSpec> choose_grouped_gemm_config(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                     int64_t rows, const GemmRequest& request = {});
// Every configuration choose_grouped_gemm_config may return for `request`
// on `arch`, whatever the row count (what a prepare call loads).
Expected<std::vector<GroupedGemmSpec>> grouped_gemm_candidates(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                               const GemmRequest& request = {});

}  // namespace kjit::codegen
