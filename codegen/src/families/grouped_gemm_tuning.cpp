// The grouped GEMM tuning policy: which configuration serves which arch and
// token count (docs/architecture.md "Grouped GEMM tiles"; why each choice:
// docs/decisions/0002). Asks the arch's traits, never its name.
#include <algorithm>

#include <fmt/format.h>

#include "kjit/codegen/families/grouped_gemm.hpp"

namespace kjit::codegen {
namespace {

// The SM90 kernels' pipeline stops at what fits in the 227 KB a Hopper block
// may opt into (grouped_gemm_shared_bytes says what a depth costs).
constexpr int kSm90SharedLimit = 227 * 1024;
constexpr int kSm90MaxStages = 8;

// The portable mma.sync kernel's one configuration (every arch, every row count).
GroupedGemmSpec portable_config(const GroupedGemmSpec& problem) {
  GroupedGemmSpec s = problem;
  s.kernel = GemmKernel::mma_sync;
  s.tile_m = 64;
  s.tile_n = 128;
  s.tile_k = 32;
  s.stages = 0;
  s.cluster = 1;
  s.cluster_axis = ClusterAxis::m;
  return s;
}

// An SM90 configuration of `problem`: k-blocks of 64, the deepest pipeline that fits.
GroupedGemmSpec sm90_config(const GroupedGemmSpec& problem, GemmKernel kernel, int tile_m, int tile_n,
                            int cluster = 1, ClusterAxis axis = ClusterAxis::m) {
  GroupedGemmSpec s = problem;
  s.kernel = kernel;
  s.tile_m = tile_m;
  s.tile_n = tile_n;
  s.tile_k = 64;
  s.stages = sm90_max_stages(kernel, tile_m, tile_n);
  s.cluster = cluster;
  s.cluster_axis = axis;
  return s;
}

// The decode kernel's configuration: chunks of kDecodeTileRows rows, decode_tile_n weight rows per block.
GroupedGemmSpec decode_config(const GroupedGemmSpec& problem) {
  GroupedGemmSpec s = problem;
  s.kernel = GemmKernel::mma_decode;
  s.tile_m = kDecodeTileRows;
  s.tile_n = decode_tile_n(problem.n);
  s.tile_k = 128;
  s.stages = 0;
  s.cluster = 1;
  s.cluster_axis = ClusterAxis::m;
  return s;
}

// Swap AB's configuration: up to 256 rows per tile, 128 columns per block (two consumer warpgroups).
GroupedGemmSpec swap_ab_config(const GroupedGemmSpec& problem) {
  return sm90_config(problem, GemmKernel::wgmma_sm90_swap_ab, 256, 128);
}

// The configurations a request may pick from: the arch's buckets, or the
// portable kernel's when the request or the arch says so.
Expected<std::vector<GroupedGemmSpec>> requested_configs(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                         const GemmRequest& request) {
  using Kernel = GemmRequest::Kernel;
  if ((request.kernel == Kernel::sm90 || request.kernel == Kernel::sm90_swap_ab) && !arch.wgmma_tma)
    return fail(KJIT_ERROR_UNSUPPORTED,
                fmt::format("the SM90 grouped GEMM kernels run only on sm_90a (Hopper); this device compiles for {}",
                            arch.target));
  const bool tile_given = request.tile_m != 0 || request.tile_n != 0 || request.cluster != 0;
  if (request.kernel == Kernel::decode) {
    if (problem.weights != WeightLayout::e_n_k)
      return fail(KJIT_ERROR_UNSUPPORTED, "the decode grouped GEMM kernel reads [E, N, K] weights only");
    GroupedGemmSpec s = decode_config(problem);
    if (request.tile_m != 0) s.tile_m = request.tile_m;
    if (request.tile_n != 0) s.tile_n = request.tile_n;
    if (request.cluster > 1)
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "the decode grouped GEMM kernel runs without clusters");
    KJIT_TRY(Family<GroupedGemmSpec>::validate(s));
    return std::vector{s};
  }
  auto configs = request.kernel == Kernel::portable ? std::vector{portable_config(problem)}
                                                    : grouped_gemm_configs(problem, arch);
  // The decode bucket runs the decode kernel only when nothing else is asked for.
  if (configs.size() > 1 && (request.kernel != Kernel::arch_default || tile_given)) configs[0] = configs[1];
  if (request.kernel == Kernel::sm90_swap_ab)
    for (auto& s : configs) s = swap_ab_config(problem);
  if (!tile_given) return configs;
  for (auto& s : configs) {
    // A tile names a kernel's tile: the rows-on-M kernel's unless swap AB is asked for.
    if (is_sm90(s.kernel))
      s.kernel = request.kernel == Kernel::sm90_swap_ab ? GemmKernel::wgmma_sm90_swap_ab : GemmKernel::wgmma_sm90;
    if (request.tile_m != 0) s.tile_m = request.tile_m;
    if (request.tile_n != 0) s.tile_n = request.tile_n;
    s.cluster = request.cluster != 0 ? request.cluster : 1;
    s.cluster_axis = s.cluster > 1 ? request.cluster_axis : ClusterAxis::m;
    if (is_sm90(s.kernel)) s.stages = sm90_max_stages(s.kernel, s.tile_m, s.tile_n);
    KJIT_TRY(Family<GroupedGemmSpec>::validate(s));
  }
  return configs;
}

}  // namespace

int decode_tile_n(int64_t n) {
  for (int tile_n : {128, 64, 32})
    if (n / tile_n >= 16) return tile_n;
  return 16;
}

int sm90_max_stages(GemmKernel kernel, int tile_m, int tile_n) {
  GroupedGemmSpec s;
  s.kernel = kernel;
  s.tile_m = tile_m;
  s.tile_n = tile_n;
  s.tile_k = 64;
  for (s.stages = kSm90MaxStages; s.stages > 1; --s.stages)
    if (grouped_gemm_shared_bytes(s) <= kSm90SharedLimit) break;
  return s.stages;
}

std::vector<GroupedGemmSpec> grouped_gemm_configs(const GroupedGemmSpec& problem, const ArchInfo& arch) {
  if (!arch.wgmma_tma) return {portable_config(problem)};
  // Measured on an H100 against every tile (docs/decisions/0002), by average
  // rows per expert:
  // - <= 64 (decode): one consumer warpgroup on 64 x 256 tiles, 5 stages;
  //   memory-bound on the weights.
  // - <= 512: swap AB, row tiles of up to 256 x 128 columns: an expert's
  //   rows split into tiles of near-equal height (steps of 32), where 64-
  //   or 128-row tiles compute up to 127 rows past each expert's end
  //   (a fifth of the work at ~256 rows per expert).
  // - more: swap AB in clusters of two blocks along N that share the row
  //   tile by TMA multicast (a third less L2 traffic, so less power and
  //   higher clocks under the power cap: faster than alone at ~1024 rows per
  //   expert, slower at ~256). Where N holds no whole pairs of
  //   128-column tiles: 128 x 256 tiles in pairs along M sharing B.
  const GroupedGemmSpec swap_ab = swap_ab_config(problem);
  const GroupedGemmSpec many = problem.n % (2 * swap_ab.tile_n) == 0
                                   ? sm90_config(problem, swap_ab.kernel, swap_ab.tile_m, swap_ab.tile_n, 2,
                                                 ClusterAxis::n)
                                   : sm90_config(problem, GemmKernel::wgmma_sm90, 128, 256, 2);
  // Before them, the decode bucket (bf16_decode_bucket: few routed rows): the decode kernel, where it reads the
  // weights ([E, N, K]); else the first bucket's kernel.
  const GroupedGemmSpec few = sm90_config(problem, GemmKernel::wgmma_sm90, 64, 256);
  return {problem.weights == WeightLayout::e_n_k ? decode_config(problem) : few, few, swap_ab, many};
}

Expected<GroupedGemmSpec> choose_grouped_gemm_config(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                     int64_t rows, const GemmRequest& request) {
  // TMA coordinates are 32-bit: past 2^31 rows only the portable kernel serves.
  constexpr int64_t kTmaRowLimit = (int64_t{1} << 31) - 256;
  if (rows > kTmaRowLimit && request.kernel != GemmRequest::Kernel::portable) {
    if (request.kernel == GemmRequest::Kernel::sm90)
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("the SM90 grouped GEMM addresses at most {} rows, got {}", kTmaRowLimit, rows));
    return choose_grouped_gemm_config(problem, arch, rows, {.kernel = GemmRequest::Kernel::portable});
  }
  const auto configs = KJIT_TRY(requested_configs(problem, arch, request));
  // The bucket: average rows per expert, the quantity that decides how full
  // an m-tile is (decode: a few rows per expert; prefill: hundreds).
  const int64_t rows_per_expert = rows / std::max<int64_t>(problem.experts, 1);
  const size_t bucket = bf16_decode_bucket(rows, problem.experts) ? 0
                        : rows_per_expert <= 64              ? 1
                        : rows_per_expert <= 512             ? 2
                                                             : 3;
  return configs[std::min(bucket, configs.size() - 1)];
}

Expected<std::vector<GroupedGemmSpec>> grouped_gemm_candidates(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                               const GemmRequest& request) {
  return distinct_configs(KJIT_TRY(requested_configs(problem, arch, request)));
}

}  // namespace kjit::codegen
