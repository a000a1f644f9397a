// The grouped GEMM tuning policy: which configuration serves which arch and
// token count (docs/architecture.md "Grouped GEMM tiles"; why each choice:
// docs/decisions/0002). Asks the arch's traits, never its name. The choice's
// skeleton (requests, buckets, candidates) is gemm_configuration.hpp's.
#include <vector>

#include "gemm_configuration.hpp"
#include "kjit/codegen/families/grouped_gemm.hpp"

namespace kjit::codegen {

// The bf16 family's part of the configuration choice (gemm_configuration.hpp says what each member is for).
template <>
struct GemmChoice<GroupedGemmSpec> {
  static constexpr GemmChoiceRules kRules{"the SM90 grouped GEMM kernels run", "the SM90 grouped GEMM", {64, 512}};
  static std::vector<GroupedGemmSpec> arch_configs(const GroupedGemmSpec& problem, const ArchInfo& arch) {
    return grouped_gemm_configs(problem, arch);
  }
  static bool decode_bucket(const GroupedGemmSpec&, int64_t rows) { return bf16_decode_bucket(rows); }
  // k-blocks of 64 (SM90), the decode kernel's chunks of 128, the portable kernel's 32, the short-K kernel's K.
  static int tile_k(GemmKernel k) {
    return is_sm90(k) ? 64 : k == GemmKernel::mma_decode ? 128 : k == GemmKernel::mma_short_k ? kShortKMaxK : 32;
  }
  // A forced short-K kernel where it does not serve: validate's reason, as unsupported.
  static Expected<void> check_request(const GroupedGemmSpec& problem, const GemmRequest& request);
  static Expected<void> check_decode_request(const GroupedGemmSpec& problem, const ArchInfo&, const GemmRequest&) {
    if (problem.weights != WeightLayout::e_n_k)
      return fail(KJIT_ERROR_UNSUPPORTED, "the decode grouped GEMM kernel reads [E, N, K] weights only");
    return {};
  }
  static int max_stages(const GroupedGemmSpec& s) { return sm90_max_stages(s.kernel, s.tile_m, s.tile_n); }
  // A tile names the rows-on-M kernel's unless swap AB is asked for.
  static GemmKernel tile_kernel(bool swap_ab) {
    return swap_ab ? GemmKernel::wgmma_sm90_swap_ab : GemmKernel::wgmma_sm90;
  }
  // sm90_swap_ab: swap AB's configuration in every bucket; sm90: the SM90 buckets where the arch's choice is the
  // short-K kernel; short_k: the short-K kernel in every bucket.
  static void force_kernel(std::vector<GroupedGemmSpec>& configs, const GroupedGemmSpec& problem,
                           const GemmRequest& request);
  // Only a forced sm90 is refused past TMA's rows: a forced swap AB falls back to the portable kernel there.
  static bool refused_past_tma_rows(GemmRequest::Kernel k) { return k == GemmRequest::Kernel::sm90; }
};

namespace {

// Swap AB's configuration: up to 256 rows per tile, 128 columns per block (two consumer warpgroups).
GroupedGemmSpec swap_ab_config(const GroupedGemmSpec& problem) {
  return gemm_config(problem, GemmKernel::wgmma_sm90_swap_ab, 256, 128);
}

GroupedGemmSpec short_k_config(const GroupedGemmSpec& problem) {
  return gemm_config(problem, GemmKernel::mma_short_k, 64, short_k_tile_n(problem.n));
}

// Hopper's buckets (the decode bucket first).
std::vector<GroupedGemmSpec> sm90_configs(const GroupedGemmSpec& problem) {
  // A rank-wide output (N <= 64: a LoRA branch's x A^T, and its dB GEMM's): the rows-on-M kernel on 64 x 64 tiles
  // past the decode bucket. The tiles below compute their columns past N for nothing (swap AB's 128, the pairs'
  // 256): at rank 16 they ran 1.5-3.4x slower (H200, tools/bench/bench_lora_gemms.py; decision 0021).
  if (problem.n <= 64) {
    const GroupedGemmSpec narrow = gemm_config(problem, GemmKernel::wgmma_sm90, 64, 64);
    return {problem.weights == WeightLayout::e_n_k ? decode_gemm_config(problem) : narrow, narrow, narrow, narrow};
  }
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
                                   ? gemm_config(problem, swap_ab.kernel, swap_ab.tile_m, swap_ab.tile_n, 2,
                                                 ClusterAxis::n)
                                   : gemm_config(problem, GemmKernel::wgmma_sm90, 128, 256, 2);
  // Before them, the decode bucket (bf16_decode_bucket: few routed rows): the decode kernel, where it reads the
  // weights ([E, N, K]); else the first bucket's kernel.
  const GroupedGemmSpec few = gemm_config(problem, GemmKernel::wgmma_sm90, 64, 256);
  return {problem.weights == WeightLayout::e_n_k ? decode_gemm_config(problem) : few, few, swap_ab, many};
}

}  // namespace

Expected<void> GemmChoice<GroupedGemmSpec>::check_request(const GroupedGemmSpec& problem,
                                                          const GemmRequest& request) {
  if (request.kernel != GemmRequest::Kernel::short_k) return {};
  auto valid = Family<GroupedGemmSpec>::validate(short_k_config(problem));
  if (!valid) return fail(KJIT_ERROR_UNSUPPORTED, std::move(valid.error().message));
  return {};
}

void GemmChoice<GroupedGemmSpec>::force_kernel(std::vector<GroupedGemmSpec>& configs, const GroupedGemmSpec& problem,
                                                const GemmRequest& request) {
  if (request.kernel == GemmRequest::Kernel::sm90_swap_ab)
    for (auto& s : configs) s = swap_ab_config(problem);
  if (request.kernel == GemmRequest::Kernel::sm90 && configs.front().kernel == GemmKernel::mma_short_k) {
    configs = sm90_configs(problem);
    configs[0] = configs[1];  // a forced kernel leaves the decode bucket to its first bucket's (as the skeleton does)
  }
  if (request.kernel == GemmRequest::Kernel::short_k) configs = {short_k_config(problem)};
}

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
  return deepest_sm90_pipeline([&](int stages) {
    s.stages = stages;
    return grouped_gemm_shared_bytes(s);
  });
}

std::vector<GroupedGemmSpec> grouped_gemm_configs(const GroupedGemmSpec& problem, const ArchInfo& arch) {
  if (short_k_serves(problem)) return {short_k_config(problem)};  // every arch, every bucket
  if (!arch.wgmma_tma) return {portable_gemm_config(problem)};
  return sm90_configs(problem);
}

Expected<GroupedGemmSpec> choose_grouped_gemm_config(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                     int64_t rows, const GemmRequest& request) {
  return choose_gemm_config(problem, arch, rows, request);
}

Expected<std::vector<GroupedGemmSpec>> grouped_gemm_candidates(const GroupedGemmSpec& problem, const ArchInfo& arch,
                                                               const GemmRequest& request) {
  return gemm_candidates(problem, arch, request);
}

}  // namespace kjit::codegen
