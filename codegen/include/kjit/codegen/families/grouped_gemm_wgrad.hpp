// The K-grouped weight-gradient GEMM family (MoE experts' dW):
//   out[e] (N x K) = sum over rows r of expert e of dy[r, :]^T x[r, :]
// i.e. dW_e = dY_e^T . X_e, the reduction running over each expert's rows.
// Home: this header and codegen/src/families/grouped_gemm_wgrad.cpp; device
// code in templates/gemm/grouped_gemm_wgrad_mma.cuh (portable) and
// grouped_gemm_wgrad_sm90.cuh (Hopper); ABI block
// templates/abi/grouped_gemm_wgrad_params.h. kjit.h
// (kjit_grouped_gemm_wgrad_desc) states the contract.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/families/grouped_gemm.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The key: N, K, the expert count, the offsets convention, the output type
// and the configuration (kernel, tile, stages). The row count is a run-time
// argument and never part of a key. A spec whose tile is 0x0x0 is a problem
// (what manifests list); kernels_for_target picks its configuration, which
// depends on the arch, N and K only.
struct GroupedGemmWgradSpec {
  DType out = DType::f32;  // f32 or bf16; dy and x are bf16
  int64_t n = 0;           // dy's columns: out's rows
  int64_t k = 0;           // x's columns: out's columns
  int64_t experts = 0;
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  int tile_m = 0, tile_n = 0, tile_k = 0;  // out rows x out columns x dy/x rows per stage; 0: a problem
  GemmKernel kernel = GemmKernel::mma_sync;  // mma_sync (every arch) or wgmma_sm90 (sm_90a)
  int stages = 0;                            // the pipeline's depth (a configuration's; 0 in a problem)

  bool configured() const { return tile_m != 0; }
  bool operator==(const GroupedGemmWgradSpec&) const = default;
};

template <>
struct Family<GroupedGemmWgradSpec> : SpecForms<GroupedGemmWgradSpec> {
  static constexpr std::string_view op = "grouped_gemm_wgrad";
  static constexpr auto fields = std::tuple_cat(
      std::tuple{fixed_text(" dy=bf16 x=bf16")}, gemm_shape_fields<GroupedGemmWgradSpec>(8, 8),
      std::tuple{field("offsets", &GroupedGemmWgradSpec::offsets), fixed_text(" layout=e_n_k"),
                 // A configuration's fields (cache metadata; rare in manifests); validate says which are supported.
                 configuration(field("kernel", &GroupedGemmWgradSpec::kernel)
                                   .only(GemmKernel::mma_sync, GemmKernel::wgmma_sm90),
                               field("tile", &GroupedGemmWgradSpec::tile_m, &GroupedGemmWgradSpec::tile_n,
                                     &GroupedGemmWgradSpec::tile_k)
                                   .range(1, 256)
                                   .shape("[m, n, k]"),
                               field("stages", &GroupedGemmWgradSpec::stages).optional().range(0, 16))});
  static Expected<void> validate(const GroupedGemmWgradSpec& s);
  // A configuration only (a problem is no kernel); the portable kernel runs on every arch in the table, the
  // wgmma kernel on sm_90a.
  static Expected<void> supported_on(const GroupedGemmWgradSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const GroupedGemmWgradSpec& s);
  // A problem: its configuration (grouped_gemm_wgrad_config); a configuration: itself.
  static std::vector<GroupedGemmWgradSpec> kernels_for_target(const GroupedGemmWgradSpec& s, const ArchInfo& arch);
};

// The configuration of a problem on `arch`: on sm_90a the wgmma kernel
// (128 x 128 output tiles) when N and K are both at least 128; otherwise the
// portable kernel, 32-row output tiles when N <= 64 (LoRA's rank-sized dA),
// 128 x 128 else. `request` may ask for the portable kernel anywhere, or for
// the wgmma kernel (an error off sm_90a; any N and K).
Expected<GroupedGemmWgradSpec> grouped_gemm_wgrad_config(const GroupedGemmWgradSpec& problem, const ArchInfo& arch,
                                                         GemmRequest::Kernel request = GemmRequest::Kernel::arch_default);

// The dynamic shared memory of a configuration's kernel (its stages; the wgmma kernel's barriers and alignment slack).
int grouped_gemm_wgrad_shared_bytes(const GroupedGemmWgradSpec& spec);

// The portable kernel: one block per (output tile, expert), x over the tiles
// of N x K, y over experts. The wgmma kernel is persistent: as many blocks as
// fit at once (`resident_blocks` a block an SM, times the blocks its
// configuration fits on an SM), at most one per tile.
LaunchGeometry grouped_gemm_wgrad_geometry(const GroupedGemmWgradSpec& spec, int resident_blocks);

}  // namespace kjit::codegen
