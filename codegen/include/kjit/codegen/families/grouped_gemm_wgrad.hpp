// The K-grouped weight-gradient GEMM family (MoE experts' dW):
//   out[e] (N x K) = sum over rows r of expert e of dy[r, :]^T x[r, :]
// i.e. dW_e = dY_e^T . X_e, the reduction running over each expert's rows.
// Home: this header and codegen/src/families/grouped_gemm_wgrad.cpp; device
// code in templates/gemm/grouped_gemm_wgrad_mma.cuh; ABI block
// templates/abi/grouped_gemm_wgrad_params.h. kjit.h
// (kjit_grouped_gemm_wgrad_desc) states the contract.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The key: N, K, the expert count, the offsets convention, the output type
// and the configuration (the portable kernel's tile). The row count is a
// run-time argument and never part of a key. A spec whose tile is 0x0x0 is a
// problem (what manifests list); kernels_for_target picks its configuration,
// which depends on N only.
struct GroupedGemmWgradSpec {
  DType out = DType::f32;  // f32 or bf16; dy and x are bf16
  int64_t n = 0;           // dy's columns: out's rows
  int64_t k = 0;           // x's columns: out's columns
  int64_t experts = 0;
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  int tile_m = 0, tile_n = 0, tile_k = 0;  // out rows x out columns x dy/x rows per stage; 0: a problem

  bool configured() const { return tile_m != 0; }
  bool operator==(const GroupedGemmWgradSpec&) const = default;
};

template <>
struct Family<GroupedGemmWgradSpec> {
  static constexpr std::string_view op = "grouped_gemm_wgrad";
  static std::string canonical(const GroupedGemmWgradSpec& s);
  static nlohmann::json to_json(const GroupedGemmWgradSpec& s);
  static Expected<GroupedGemmWgradSpec> from_json(SpecReader& reader);
  static const std::vector<FieldRule>& schema();
  static void hash(const GroupedGemmWgradSpec& s, HashMixer& mixer);
  static Expected<void> validate(const GroupedGemmWgradSpec& s);
  // A configuration only (a problem is no kernel); the portable kernel runs on every arch in the table.
  static Expected<void> supported_on(const GroupedGemmWgradSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const GroupedGemmWgradSpec& s);
  // A problem: its configuration (grouped_gemm_wgrad_config); a configuration: itself.
  static std::vector<GroupedGemmWgradSpec> kernels_for_target(const GroupedGemmWgradSpec& s, const ArchInfo& arch);
};

// The configuration of a problem: 32-row output tiles when N <= 64 (LoRA's
// rank-sized dB and dA), 128 x 128 otherwise.
GroupedGemmWgradSpec grouped_gemm_wgrad_config(const GroupedGemmWgradSpec& problem);

// The dynamic shared memory of a configuration's kernel (its cp.async stages).
int grouped_gemm_wgrad_shared_bytes(const GroupedGemmWgradSpec& spec);

// One block per (output tile, expert): x over the tiles of N x K, y over experts.
LaunchGeometry grouped_gemm_wgrad_geometry(const GroupedGemmWgradSpec& spec);

}  // namespace kjit::codegen
