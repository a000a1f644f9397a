// The grouped weight-gradient GEMM family: invariants, recipe and grid.
#include "kjit/codegen/families/grouped_gemm_wgrad.hpp"

#include <fmt/format.h>

#include "../recipe.hpp"
#include "gemm_configuration.hpp"
#include "gemm_problem_fields.hpp"
#include "wgmma_instructions.hpp"

namespace kjit::codegen {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

// The portable kernel's shapes (GroupedGemmWgradConfig): 128 x 128 output
// tiles of 8 warps (64 x 32 each), or 32 x 128 of 4 warps (32 x 32) for
// N <= 64; 32 rows of dy and x per stage, 3 stages.
constexpr int kTileK = 32;
constexpr int kStages = 3;
constexpr int kWideTileM = 128, kNarrowTileM = 32, kTileN = 128;
constexpr int64_t kNarrowMaxN = 64;
// The wgmma kernel's (GroupedGemmWgradSm90Config): 128 output rows (two
// consumer warpgroups) x 128 columns, 64 rows per stage, 3 stages (two blocks
// an SM), or x 256 with 4 (one block); two consumer warpgroups and a producer warp.
constexpr int kSm90TileM = 128, kSm90TileK = 64, kSm90Threads = 288;
constexpr int kSm90MinDimension = 128;  // below it the 128-wide tile idles: the portable kernel
int sm90_stages(int tile_n) { return tile_n == 128 ? 3 : 4; }
int sm90_blocks_per_sm(int tile_n) { return tile_n == 128 ? 2 : 1; }

int wgrad_threads(const GroupedGemmWgradSpec& s) {
  if (s.kernel == GemmKernel::wgmma_sm90) return kSm90Threads;
  const int warp_m = s.tile_m >= 64 ? 64 : s.tile_m;
  return 32 * (s.tile_m / warp_m) * (s.tile_n / 32);
}

}  // namespace

template struct SpecForms<GroupedGemmWgradSpec>;

Expected<void> Family<GroupedGemmWgradSpec>::validate(const GroupedGemmWgradSpec& s) {
  if (s.out != DType::bf16 && s.out != DType::f32)
    return invalid(fmt::format("grouped_gemm_wgrad output must be f32 or bf16, not {}", name(s.out)));
  // 16-byte copies of dy's and x's rows and paired stores of out's.
  if (s.n < 8 || s.n % 8 != 0 || s.n > kMaxDimension)
    return invalid(
        fmt::format("grouped_gemm_wgrad: N must be a positive multiple of 8 up to {}, got {}", kMaxDimension, s.n));
  if (s.k < 8 || s.k % 8 != 0 || s.k > kMaxDimension)
    return invalid(
        fmt::format("grouped_gemm_wgrad: K must be a positive multiple of 8 up to {}, got {}", kMaxDimension, s.k));
  // 0: a configured kernel's identity, whose expert count comes with each launch
  if ((s.experts < 1 && !(s.experts == 0 && s.configured())) || s.experts > kMaxExperts)
    return invalid(fmt::format("grouped_gemm_wgrad needs 1 to {} experts, got {}", kMaxExperts, s.experts));
  if (!s.configured()) {
    if (s.tile_n != 0 || s.tile_k != 0 || s.stages != 0 || s.kernel != GemmKernel::mma_sync)
      return invalid(fmt::format("grouped_gemm_wgrad tile {}x{}x{} is neither a configuration nor a problem (all zero)",
                                 s.tile_m, s.tile_n, s.tile_k));
    return {};
  }
  if (s.kernel == GemmKernel::mma_sync) {
    if ((s.tile_m != kWideTileM && s.tile_m != kNarrowTileM) || s.tile_n != kTileN || s.tile_k != kTileK ||
        s.stages != kStages)
      return invalid(fmt::format("grouped_gemm_wgrad: the mma_sync kernel's tile {}x{}x{} with {} stages is not "
                                 "supported (128x128x32 or 32x128x32, {} stages)",
                                 s.tile_m, s.tile_n, s.tile_k, s.stages, kStages));
    return {};
  }
  if (s.kernel != GemmKernel::wgmma_sm90 || s.tile_m != kSm90TileM || (s.tile_n != 128 && s.tile_n != 256) ||
      s.tile_k != kSm90TileK || s.stages != sm90_stages(s.tile_n))
    return invalid(fmt::format("grouped_gemm_wgrad: kernel {} tile {}x{}x{} with {} stages is not supported "
                               "(mma_sync; or wgmma_sm90 128x128x64 with 3 stages, 128x256x64 with 4)",
                               name(s.kernel), s.tile_m, s.tile_n, s.tile_k, s.stages));
  return {};
}

Expected<void> Family<GroupedGemmWgradSpec>::supported_on(const GroupedGemmWgradSpec& s, const ArchInfo& arch) {
  KJIT_TRY(require_configuration(s));
  // The portable kernel (mma.sync bf16, cp.async and ldmatrix): every arch in the table (sm_80 and newer).
  return require_wgmma_tma(s, s.kernel == GemmKernel::wgmma_sm90, arch);
}

RenderedKernel Family<GroupedGemmWgradSpec>::render(const GroupedGemmWgradSpec& s) {
  if (s.kernel == GemmKernel::wgmma_sm90)
    return assemble(
        canonical(s),
        {.entry_point = "kjit_grouped_gemm_wgrad_sm90",
         .threads = kSm90Threads,
         .min_blocks = sm90_blocks_per_sm(s.tile_n),
         .templates = {"gemm/grouped_gemm_wgrad_sm90.cuh"},
         .config = fmt::format("kjit::GroupedGemmWgradSm90Config<{}LL, {}LL, {}, {}, {}, {}, KjitWgmmaWgrad>", s.n,
                               s.k, s.offsets == OffsetsConvention::with_leading_zero, s.out == DType::f32,
                               s.tile_n, s.stages),
         .params_type = "kjit_grouped_gemm_wgrad_sm90_params",
         .body = "kjit::grouped_gemm_wgrad_sm90",
         // dy^T and x: both operands MN-major (the rows, their reduction axis, are the slow one).
         .prelude = wgmma_wrapper("struct KjitWgmmaWgrad", {.n = s.tile_n,
                                                            .operands = WgmmaOperands::bf16,
                                                            .transpose_a = true,
                                                            .transpose_b = true}),
         .dynamic_shared_bytes = grouped_gemm_wgrad_shared_bytes(s)});
  return assemble(canonical(s),
                  {.entry_point = "kjit_grouped_gemm_wgrad",
                   .threads = wgrad_threads(s),
                   .templates = {"gemm/grouped_gemm_wgrad_mma.cuh"},
                   .config = fmt::format("kjit::GroupedGemmWgradConfig<{}LL, {}LL, {}, {}, {}, {}, {}, {}>", s.n,
                                         s.k, s.offsets == OffsetsConvention::with_leading_zero,
                                         s.out == DType::f32, s.tile_m, s.tile_n, s.tile_k, s.stages),
                   .params_type = "kjit_grouped_gemm_wgrad_params",
                   .body = "kjit::grouped_gemm_wgrad_mma",
                   .dynamic_shared_bytes = grouped_gemm_wgrad_shared_bytes(s)});
}

std::vector<GroupedGemmWgradSpec> Family<GroupedGemmWgradSpec>::kernels_for_target(const GroupedGemmWgradSpec& s,
                                                                                   const ArchInfo& arch) {
  if (s.configured()) return {s};
  auto config = grouped_gemm_wgrad_config(s, arch);
  return config ? std::vector{*config} : std::vector<GroupedGemmWgradSpec>{};
}

Expected<GroupedGemmWgradSpec> grouped_gemm_wgrad_config(const GroupedGemmWgradSpec& problem, const ArchInfo& arch,
                                                         GemmRequest::Kernel request) {
  using Kernel = GemmRequest::Kernel;
  if (request != Kernel::arch_default && request != Kernel::portable && request != Kernel::sm90)
    return invalid("grouped_gemm_wgrad runs the portable kernel or the SM90 (wgmma) kernel only");
  if (request == Kernel::sm90 && !arch.wgmma_tma)
    return fail(KJIT_ERROR_UNSUPPORTED,
                fmt::format("grouped_gemm_wgrad's SM90 kernel (wgmma, TMA) runs only on sm_90a, not {}", arch.target));
  auto s = problem;
  const bool sm90 = request == Kernel::sm90 || (request == Kernel::arch_default && arch.wgmma_tma &&
                                                problem.n >= kSm90MinDimension && problem.k >= kSm90MinDimension);
  if (sm90) {
    s.kernel = GemmKernel::wgmma_sm90;
    s.tile_m = kSm90TileM;
    s.tile_n = 128;
    s.tile_k = kSm90TileK;
    s.stages = sm90_stages(s.tile_n);
    return s;
  }
  s.kernel = GemmKernel::mma_sync;
  s.tile_m = problem.n <= kNarrowMaxN ? kNarrowTileM : kWideTileM;
  s.tile_n = kTileN;
  s.tile_k = kTileK;
  s.stages = kStages;
  return s;
}

int grouped_gemm_wgrad_shared_bytes(const GroupedGemmWgradSpec& s) {
  // The generated code asserts these equal its Config's kSharedBytes.
  // wgmma (GroupedGemmWgradSm90Config): per stage tile_k rows of dy (tile_m
  // columns) and of x (tile_n), 1 KB of slack to align the stages to the
  // swizzle's 1 KB, two mbarriers per stage. Portable
  // (GroupedGemmWgradConfig): the same rows, each padded by 16 bytes.
  if (s.kernel == GemmKernel::wgmma_sm90) return s.stages * s.tile_k * (s.tile_m + s.tile_n) * 2 + 1024 + 16 * s.stages;
  return s.stages * s.tile_k * ((s.tile_m + 8) + (s.tile_n + 8)) * 2;
}

LaunchGeometry grouped_gemm_wgrad_geometry(const GroupedGemmWgradSpec& s, int resident_blocks) {
  const int64_t tiles = ((s.n + s.tile_m - 1) / s.tile_m) * ((s.k + s.tile_n - 1) / s.tile_n);
  if (s.kernel == GemmKernel::wgmma_sm90)
    return persistent_gemm_grid(tiles * s.experts, 1, resident_blocks * sm90_blocks_per_sm(s.tile_n), kSm90Threads,
                                grouped_gemm_wgrad_shared_bytes(s));
  LaunchGeometry g;
  g.block_x = static_cast<uint32_t>(wgrad_threads(s));
  g.grid_x = static_cast<uint32_t>(tiles);
  g.grid_y = static_cast<uint32_t>(s.experts);
  g.shared_bytes = static_cast<uint32_t>(grouped_gemm_wgrad_shared_bytes(s));
  return g;
}

}  // namespace kjit::codegen
