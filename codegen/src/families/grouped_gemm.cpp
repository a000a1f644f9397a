// The grouped GEMM family: invariants, recipes and grid.
#include "kjit/codegen/families/grouped_gemm.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "gemm_configuration.hpp"
#include "gemm_problem_fields.hpp"
#include "wgmma_instructions.hpp"

namespace kjit::codegen {

namespace {

constexpr std::array kGemmKernelNames{"mma_sync", "wgmma_sm90", "wgmma_sm90_swap_ab", "mma_decode", "mma_short_k"};
constexpr std::array kClusterAxisNames{"m", "n"};

// Invariants of the problem (what every configuration shares). The bounds are
// what the kernels support: 16-byte rows (N, K multiples of 8), and experts
// up to the routing helpers' 4096.
Expected<void> validate_problem(const GroupedGemmSpec& s) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  if (s.out != DType::bf16 && s.out != DType::f32)
    return invalid(fmt::format("grouped_gemm output must be bf16 or f32, not {}", name(s.out)));
  if (s.n < 8 || s.n % 8 != 0 || s.n > kMaxDimension)
    return invalid(fmt::format("grouped_gemm: N must be a positive multiple of 8 up to {}, got {}", kMaxDimension, s.n));
  if (s.k < 8 || s.k % 8 != 0 || s.k > kMaxDimension)
    return invalid(fmt::format("grouped_gemm: K must be a positive multiple of 8 up to {}, got {}", kMaxDimension, s.k));
  // 0: a configured kernel's identity, whose expert count comes with each launch
  if ((s.experts < 1 && !(s.experts == 0 && s.configured())) || s.experts > kMaxExperts)
    return invalid(fmt::format("grouped_gemm needs 1 to {} experts, got {}", kMaxExperts, s.experts));
  if (s.activation != Activation::none && s.n % 16 != 0)
    return invalid(fmt::format("grouped_gemm with activation {}: N (gate and up rows) must be a multiple of 16 (gate/up "
                               "groups of 8), got {}",
                               name(s.activation), s.n));
  if (s.addend != Addend::none && s.activation != Activation::none)
    return invalid(fmt::format("grouped_gemm: an addend and a fused activation ({}) do not go together: the addend "
                               "has the product's N columns",
                               name(s.activation)));
  return {};
}

// The decode kernel (GroupedGemmDecodeConfig): its tiles (decode_tile_supported), k-chunks of 128; [E, N, K]
// weights only.
Expected<void> validate_decode_configuration(const GroupedGemmSpec& s) {
  const bool ok = decode_tile_supported(DecodeOperands::bf16, s.tile_m, s.tile_n) && s.tile_k == 128 &&
                  s.stages == 0 && s.cluster == 1;
  if (!ok)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("grouped_gemm mma_decode tile {}x{}x{} with {} stages, cluster {} is not supported "
                            "({}, tile_k 128, no stages, cluster 1)",
                            s.tile_m, s.tile_n, s.tile_k, s.stages, s.cluster, decode_tiles(DecodeOperands::bf16)));
  if (s.weights != WeightLayout::e_n_k)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "grouped_gemm mma_decode reads [E, N, K] weights only");
  return {};
}

// The short-K kernel (GroupedGemmShortKConfig).
Expected<void> validate_short_k_configuration(const GroupedGemmSpec& s) {
  const bool ok = s.tile_m == 64 && (s.tile_n == 64 || s.tile_n == 128 || s.tile_n == 256) &&
                  s.tile_k == kShortKMaxK && s.stages == 0 && s.cluster == 1;
  if (!ok)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("grouped_gemm mma_short_k tile {}x{}x{} with {} stages, cluster {} is not supported "
                            "(tile_m 64, tile_n 64, 128 or 256, tile_k {}, no stages, cluster 1)",
                            s.tile_m, s.tile_n, s.tile_k, s.stages, s.cluster, kShortKMaxK));
  if (!short_k_serves(s))
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("grouped_gemm mma_short_k serves K up to {} without a fused activation, not K {}{}",
                            kShortKMaxK, s.k,
                            s.activation == Activation::none ? "" : fmt::format(" with {}", name(s.activation))));
  return {};
}

Expected<void> validate_configuration(const GroupedGemmSpec& s) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  const auto tile = fmt::format("{} tile {}x{}x{} with {} stages, cluster {} along {}", name(s.kernel), s.tile_m,
                                s.tile_n, s.tile_k, s.stages, s.cluster, name(s.cluster_axis));
  // Along m is the only axis a lone block has: one spelling per kernel.
  if (s.cluster == 1 && s.cluster_axis != ClusterAxis::m)
    return invalid(fmt::format("grouped_gemm {}: a cluster of 1 has no axis (use m)", tile));
  if (!s.configured()) {
    if (s.tile_n != 0 || s.tile_k != 0 || s.stages != 0 || s.kernel != GemmKernel::mma_sync || s.cluster != 1)
      return invalid(fmt::format("grouped_gemm {} is neither a configuration nor a problem (all zero)", tile));
    return {};
  }
  if (s.kernel == GemmKernel::mma_decode) return validate_decode_configuration(s);
  if (s.kernel == GemmKernel::mma_short_k) return validate_short_k_configuration(s);
  if (s.kernel == GemmKernel::mma_sync) {
    const bool ok = s.tile_m > 0 && s.tile_m % 32 == 0 && s.tile_m <= 128 && s.tile_n > 0 && s.tile_n % 16 == 0 &&
                    s.tile_n <= 128 && s.tile_k > 0 && s.tile_k % 16 == 0 && s.tile_k <= 64 && s.stages == 0 &&
                    s.cluster == 1;
    if (!ok) return invalid(fmt::format("grouped_gemm {} is not supported", tile));
    // A warp's half of the tile must hold whole gate/up pairs of 8-column fragments.
    if (s.activation != Activation::none && s.tile_n % 32 != 0)
      return invalid(fmt::format("grouped_gemm {} with activation {} needs tile_n a multiple of 32", tile,
                                 name(s.activation)));
    return {};
  }
  const bool pipeline_ok = s.tile_k == 64 && s.stages >= 2 && s.stages <= sm90_max_stages(s.kernel, s.tile_m, s.tile_n);
  if (s.kernel == GemmKernel::wgmma_sm90_swap_ab) {
    // Pairs lie along n only, and never past N (GroupedGemmSwapAbConfig).
    const bool ok = s.tile_m % 32 == 0 && s.tile_m >= 32 && s.tile_m <= 256 && (s.tile_n == 64 || s.tile_n == 128) &&
                    pipeline_ok &&
                    (s.cluster == 1 || (s.cluster == 2 && s.cluster_axis == ClusterAxis::n && s.n % (2 * s.tile_n) == 0));
    if (!ok)
      return invalid(fmt::format("grouped_gemm {} is not supported (swap AB: tile_m 32 to 256 in steps of 32, tile_n "
                                 "64 or 128, tile_k 64, 2 stages up to what fits in 227 KB, cluster 1, or 2 along n "
                                 "when N is a multiple of 2 tile_n)",
                                 tile));
    return {};
  }
  const bool ok = (s.tile_m == 64 || s.tile_m == 128) && s.tile_n % 64 == 0 && s.tile_n >= 64 && s.tile_n <= 256 &&
                  pipeline_ok &&
                  (s.cluster == 1 || (s.cluster == 2 && (s.cluster_axis == ClusterAxis::n || s.tile_n % 128 == 0)));
  if (!ok)
    return invalid(fmt::format("grouped_gemm {} is not supported (tile_m 64 or 128, tile_n 64 to 256 in steps of 64, "
                               "tile_k 64, 2 stages up to what fits in 227 KB, cluster 1, or 2 along n, or 2 along "
                               "m with tile_n 128 or 256)",
                               tile));
  return {};
}

constexpr int kPortableThreads = 128;
constexpr int kShortKThreads = 128;  // GroupedGemmShortKConfig::kThreads

// Threads of an SM90 configuration: a producer warpgroup and a consumer
// warpgroup per 64 rows (or, swap AB, per 64 columns) of the tile.
int sm90_threads(const GroupedGemmSpec& s) {
  const int consumers = (s.kernel == GemmKernel::wgmma_sm90_swap_ab ? s.tile_n : s.tile_m) / 64;
  return 128 * (consumers + 1);
}

// Swap AB's instructions: m64n<rows>k16 for every tile height, as
// specialisations of KjitWgmmaRows<rows> (the weights are operand A).
std::string swap_ab_wgmma_wrappers(const GroupedGemmSpec& s) {
  std::string out = "template <int kRows>\nstruct KjitWgmmaRows;\n";
  for (int rows = 32; rows <= s.tile_m; rows += 32)
    out += wgmma_wrapper(fmt::format("template <>\nstruct KjitWgmmaRows<{}>", rows),
                         {.n = rows, .operands = WgmmaOperands::bf16, .transpose_a = s.weights == WeightLayout::e_k_n});
  return out;
}

}  // namespace

std::string_view name(GemmKernel k) { return kGemmKernelNames[static_cast<size_t>(k)]; }
std::string_view name(ClusterAxis a) { return kClusterAxisNames[static_cast<size_t>(a)]; }

template struct SpecForms<GroupedGemmSpec>;

Expected<void> Family<GroupedGemmSpec>::validate(const GroupedGemmSpec& s) {
  KJIT_TRY(validate_problem(s));
  return validate_configuration(s);
}

Expected<void> Family<GroupedGemmSpec>::supported_on(const GroupedGemmSpec& s, const ArchInfo& arch) {
  KJIT_TRY(require_configuration(s));
  KJIT_TRY(require_bulk_copies(s, s.kernel == GemmKernel::mma_decode, arch));
  return require_wgmma_tma(s, is_sm90(s.kernel), arch);  // the portable kernel: every arch in the table (sm_80+)
}

RenderedKernel Family<GroupedGemmSpec>::render(const GroupedGemmSpec& s) {
  const auto problem =
      fmt::format("kjit::GemmProblem<{}LL, {}LL, {}, {}, {}, {}, kjit::Activation::{}, {}, kjit::Addend::{}>",
                  s.n, s.k, s.weights == WeightLayout::e_k_n,
                  s.offsets == OffsetsConvention::with_leading_zero, s.row_scale, s.out == DType::f32,
                  name(s.activation), s.gather, name(s.addend));
  if (is_sm90(s.kernel)) {
    const bool swap_ab = s.kernel == GemmKernel::wgmma_sm90_swap_ab;
    const bool weights_kn = s.weights == WeightLayout::e_k_n;
    return assemble(
        canonical(s),
        {.entry_point = swap_ab ? "kjit_grouped_gemm_sm90_swap_ab" : "kjit_grouped_gemm_sm90",
         .threads = sm90_threads(s),
         .min_blocks = 1,  // a register cap at entry, which setmaxnreg needs
         .templates = {swap_ab ? "gemm/grouped_gemm_sm90_swap_ab.cuh" : "gemm/grouped_gemm_sm90.cuh"},
         .config = swap_ab ? fmt::format("kjit::GroupedGemmSwapAbConfig<{}, {}, {}, {}, {}, KjitWgmmaRows>", problem,
                                         s.tile_m, s.tile_n, s.stages, s.cluster)
                           : fmt::format("kjit::GroupedGemmSm90Config<{}, {}, {}, {}, {}, {}, KjitWgmma, "
                                         "KjitWgmmaHalf>",
                                         problem, s.tile_m, s.tile_n, s.stages, s.cluster,
                                         s.cluster_axis == ClusterAxis::n),
         .params_type = "kjit_grouped_gemm_sm90_params",
         .body = swap_ab ? "kjit::grouped_gemm_sm90_swap_ab" : "kjit::grouped_gemm_sm90",
         .prelude = swap_ab ? swap_ab_wgmma_wrappers(s)
                            : wgmma_wrapper("struct KjitWgmma", {.n = s.tile_n,
                                                                 .operands = WgmmaOperands::bf16,
                                                                 .transpose_b = weights_kn}) +
                                  wgmma_wrapper("struct KjitWgmmaHalf", {.n = s.tile_n / 2,
                                                                         .operands = WgmmaOperands::bf16,
                                                                         .transpose_b = weights_kn}),
         .dynamic_shared_bytes = grouped_gemm_shared_bytes(s),
         .cluster_x = s.cluster});
  }
  if (s.kernel == GemmKernel::mma_decode)
    return render_decode_kernel(canonical(s), problem, s.tile_m, s.tile_n,
                                {.operands = DecodeOperands::bf16,
                                 .entry_point = "kjit_grouped_gemm_decode",
                                 .params_type = "kjit_grouped_gemm_params",
                                 .body = "kjit::grouped_gemm_decode"});
  if (s.kernel == GemmKernel::mma_short_k)
    return assemble(canonical(s), {.entry_point = "kjit_grouped_gemm_short_k",
                                   .threads = kShortKThreads,
                                   // A stated budget (128 registers): with none, ptxas aimed at ~64 and spilled.
                                   .min_blocks = 4,
                                   .templates = {"gemm/grouped_gemm_short_k.cuh"},
                                   .config = fmt::format("kjit::GroupedGemmShortKConfig<{}, {}>", problem, s.tile_n),
                                   .params_type = "kjit_grouped_gemm_params",
                                   .body = "kjit::grouped_gemm_short_k"});
  return assemble(canonical(s),
                  {.entry_point = "kjit_grouped_gemm",
                   .threads = kPortableThreads,
                   .templates = {"gemm/grouped_gemm_mma.cuh"},
                   .config = fmt::format("kjit::GroupedGemmConfig<{}, {}, {}, {}>", problem, s.tile_m, s.tile_n,
                                         s.tile_k),
                   .params_type = "kjit_grouped_gemm_params",
                   .body = "kjit::grouped_gemm_mma"});
}

std::vector<GroupedGemmSpec> Family<GroupedGemmSpec>::kernels_for_target(const GroupedGemmSpec& s,
                                                                         const ArchInfo& arch) {
  if (s.configured()) return {s};
  return distinct_configs(grouped_gemm_configs(s, arch));
}

std::string_view name(DecodeOperands operands) {
  switch (operands) {
    case DecodeOperands::bf16: return "bf16";
    case DecodeOperands::w8a16: return "w8a16";
    case DecodeOperands::w8a8: return "w8a8";
    case DecodeOperands::w4a16: return "w4a16";
  }
  return "?";
}

RenderedKernel render_decode_kernel(const std::string& canonical, const std::string& problem, int tile_m, int tile_n,
                                    const DecodeRecipe& recipe) {
  return assemble(canonical, {.entry_point = recipe.entry_point,
                              .threads = kDecodeThreads,
                              .min_blocks = recipe.min_blocks != 0 ? recipe.min_blocks : decode_min_blocks(tile_m),
                              .templates = {"gemm/grouped_gemm_decode.cuh"},
                              .config = fmt::format("kjit::GroupedGemmDecodeConfig<{}, kjit::DecodeOperands::{}, {}, "
                                                    "{}>",
                                                    problem, name(recipe.operands), tile_m, tile_n),
                              .params_type = recipe.params_type,
                              .body = recipe.body,
                              .dynamic_shared_bytes = decode_shared_bytes(recipe.operands)});
}

bool decode_tile_supported(DecodeOperands operands, int tile_m, int tile_n) {
  const bool rows_ok = tile_m == 8 || tile_m == 16 || (tile_m == 32 && operands != DecodeOperands::w8a8);
  return rows_ok && (tile_n == 16 || tile_n == 32 || tile_n == 64 || tile_n == 128);
}

std::string_view decode_tiles(DecodeOperands operands) {
  return operands == DecodeOperands::w8a8 ? "tile_m 8 or 16, tile_n 16, 32, 64 or 128"
                                          : "tile_m 8, 16 or 32, tile_n 16, 32, 64 or 128";
}

int decode_shared_bytes(DecodeOperands operands) {
  constexpr int kChunk = 128, kWarps = kDecodeThreads / 32;
  // W8A16: each thread's 4 chunks of two rows' 32 codes (64 bytes) and two scales;
  // bf16 and W8A8: each warp's 3 chunks of 16 rows' 256 bytes and an mbarrier each; W4A16 the same with rows
  // of 128 bytes, then its code-pair table (Fp4Tables' pairs: a 256-byte row per byte of two codes).
  if (operands == DecodeOperands::w8a16) return 4 * kDecodeThreads * (2 * kChunk / 4 + 2 * 4);
  if (operands == DecodeOperands::w4a16) return 3 * kWarps * (16 * kChunk + 8) + 256 * 256;
  return 3 * kWarps * (16 * kChunk * 2 + 8);
}

int grouped_gemm_shared_bytes(const GroupedGemmSpec& s) {
  if (s.kernel == GemmKernel::mma_decode) return decode_shared_bytes(DecodeOperands::bf16);
  if (!is_sm90(s.kernel)) return 0;  // the portable and short-K kernels' shared memory is static
  // GroupedGemmSm90Config::kSharedBytes and GroupedGemmSwapAbConfig's (the
  // generated code asserts they agree): the stages, 1 KB of slack to align
  // them to the swizzle's 1 KB, two mbarriers per stage; swap AB adds its
  // epilogue scratch, 1 KB per consumer warp (tile_n / 64 warpgroups), and
  // its tile queue (4 slots of two mbarriers and an index).
  const int scratch = s.kernel == GemmKernel::wgmma_sm90_swap_ab ? s.tile_n / 64 * 4 * 1024 + 4 * 24 : 0;
  return s.stages * (s.tile_m + s.tile_n) * s.tile_k * 2 + 1024 + 16 * s.stages + scratch;
}

LaunchGeometry grouped_gemm_geometry(const GroupedGemmSpec& spec, int64_t total_rows, int resident_blocks) {
  // Every expert adds at most one partial m-tile: an upper bound that needs no
  // offsets on the host. Surplus blocks (or persistent iterations) find no tile.
  const int64_t m_tiles = (total_rows + spec.tile_m - 1) / spec.tile_m + spec.experts;
  const int64_t n_tiles = (spec.n + spec.tile_n - 1) / spec.tile_n;
  if (is_sm90(spec.kernel)) {
    // Persistent: one block per SM (the shared memory admits no second), in
    // whole clusters: `resident_blocks` is how many fit at once. Swap AB's
    // row tiles per expert are ceil(rows / tile_m) too, and its pairs lie along n.
    const int m_group = spec.cluster_axis == ClusterAxis::m ? spec.cluster : 1;
    const int n_group = spec.cluster / m_group;
    const int64_t cluster_tiles =
        ((total_rows + spec.tile_m * m_group - 1) / (spec.tile_m * m_group) + spec.experts) *
        ((n_tiles + n_group - 1) / n_group);
    return persistent_gemm_grid(cluster_tiles, spec.cluster, resident_blocks, sm90_threads(spec),
                                grouped_gemm_shared_bytes(spec));
  }
  if (spec.kernel == GemmKernel::mma_decode)
    return decode_gemm_grid(total_rows, spec.experts, spec.tile_m, n_tiles, grouped_gemm_shared_bytes(spec));
  return portable_gemm_grid(m_tiles, n_tiles,
                            spec.kernel == GemmKernel::mma_short_k ? kShortKThreads : kPortableThreads);
}

LaunchGeometry decode_gemm_grid(int64_t total_rows, int64_t experts, int tile_m, int64_t n_tiles, int shared_bytes,
                                int threads) {
  // Each non-empty expert (at most min(E, rows) of them) adds at most one partial chunk of tile_m rows.
  const int64_t slots = (total_rows + std::min(experts, total_rows) * (tile_m - 1)) / tile_m;
  LaunchGeometry g;
  g.block_x = static_cast<uint32_t>(threads);
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>(slots, 1, 0x7fffffff));  // blocks walk the slots past it
  g.grid_y = static_cast<uint32_t>(n_tiles);
  g.shared_bytes = static_cast<uint32_t>(shared_bytes);
  return g;
}

LaunchGeometry persistent_gemm_grid(int64_t cluster_tiles, int cluster, int resident_blocks, int threads,
                                    int shared_bytes) {
  LaunchGeometry g;
  const int64_t clusters = std::clamp<int64_t>(cluster_tiles, 1, std::max(resident_blocks / cluster, 1));
  g.block_x = static_cast<uint32_t>(threads);
  g.grid_x = static_cast<uint32_t>(clusters * cluster);
  g.cluster_x = static_cast<uint32_t>(cluster);
  g.shared_bytes = static_cast<uint32_t>(shared_bytes);
  return g;
}

LaunchGeometry portable_gemm_grid(int64_t m_tiles, int64_t n_tiles, int threads) {
  LaunchGeometry g;
  g.block_x = static_cast<uint32_t>(threads);
  g.grid_x = static_cast<uint32_t>(std::min<int64_t>(m_tiles, 0x7fffffff));
  g.grid_y = static_cast<uint32_t>(n_tiles);
  return g;
}

}  // namespace kjit::codegen
