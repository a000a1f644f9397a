// The host-side configuration choice the forward grouped GEMM families share
// (bf16, FP8 W8A8, mixed W8A16/W4A16): the buckets by routed rows, candidate
// assembly, forced-kernel requests (GemmRequest), the portable and decode
// configurations, and the SM90 pipelines' depth. Written once over a family's
// `GemmChoice<Spec>` traits (in its family file: its kernels, its per-arch
// bucket configurations and the requests it refuses); validate, supported_on
// and render stay the family's own.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kjit/codegen/arch.hpp"
#include "kjit/codegen/families/grouped_gemm.hpp"
#include "kjit/codegen/render.hpp"

namespace kjit::codegen {

// The deepest pipeline any SM90 configuration asks for.
inline constexpr int kSm90MaxStages = 8;
// TMA coordinates are 32-bit: past 2^31 rows only the portable kernel serves.
inline constexpr int64_t kTmaRowLimit = (int64_t{1} << 31) - 256;

// The deepest SM90 pipeline, up to kSm90MaxStages, whose shared memory (`bytes(stages)`) fits what a Hopper
// block may opt into; 1 when none does (validate refuses it).
template <class SharedBytes>
int deepest_sm90_pipeline(SharedBytes bytes) {
  int stages = kSm90MaxStages;
  while (stages > 1 && bytes(stages) > wgmma_tma_shared_bytes_per_block()) --stages;
  return stages;
}

// The refusals the GEMM families' supported_on share: a problem names no kernel until it is expanded for an
// arch (kernels_for_target), and Hopper's kernels (`sm90`) build only where the arch has wgmma and TMA.
template <class Spec>
Expected<void> require_configuration(const Spec& s) {
  if (s.configured()) return {};
  return fail(KJIT_ERROR_INVALID_ARGUMENT,
              fmt::format("{} names no configuration: expand it for an arch first (kernels_for_target)",
                          Family<Spec>::canonical(s)));
}
template <class Spec>
Expected<void> require_wgmma_tma(const Spec& s, bool sm90, const ArchInfo& arch) {
  if (!sm90 || arch.wgmma_tma) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("{} is Hopper's kernel (wgmma, TMA) and builds only for sm_90a, not {}",
                          Family<Spec>::canonical(s), arch.target));
}

// The decode kernel is built on sm_90's bulk copies and mbarriers (its bf16 ring): sm_90 and newer.
template <class Spec>
Expected<void> require_bulk_copies(const Spec& s, bool decode, const ArchInfo& arch) {
  if (!decode || arch.major >= 9) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("{} is built on sm_90's bulk copies (cp.async.bulk): compute capability 9.0 or "
                          "newer, not {} ({})",
                          Family<Spec>::canonical(s), arch.target, arch.note));
}

// The decode kernel's recipe (templates/gemm/grouped_gemm_decode.cuh) for a family's operands: `problem` is the
// family's problem type, `params_type` its ABI block.
struct DecodeRecipe {
  DecodeOperands operands;
  std::string_view entry_point;
  std::string_view params_type;
  std::string_view body;
  int min_blocks = 0;  // the launch bounds' blocks per SM; 0: decode_min_blocks(tile_m)
};
RenderedKernel render_decode_kernel(const std::string& canonical, const std::string& problem, int tile_m, int tile_n,
                                    const DecodeRecipe& recipe);

// What the skeleton reads of a family besides its spec and kernel enum: the errors' names and the buckets.
struct GemmChoiceRules {
  std::string_view sm90_kernels;           // "the SM90 ... kernels run": a forced SM90 kernel off Hopper
  std::string_view sm90_gemm;              // "the SM90 ... GEMM": a forced SM90 kernel past kTmaRowLimit rows
  std::array<int64_t, 2> rows_per_expert;  // the bounds of the buckets after the decode bucket
};

// Each family specialises this in its family file, with:
//   kRules (GemmChoiceRules);
//   arch_configs(problem, arch): one configuration per bucket, the decode bucket first where the family runs
//     the decode kernel (its kernels include mma_decode; then also decode_bucket(problem, rows));
//   max_stages(spec): the deepest pipeline of an SM90 configuration;
//   force_kernel(configs, problem, request): what a forced kernel does to the bucket configurations;
// and where it has them: decode_config(problem, arch), the decode kernel of the arch where it is not
// decode_gemm_config's; tile_k(kernel) (a spec with tile_k); tile_kernel(swap_ab), the kernel a requested tile
// names; check_request(problem, request), its refusals of any request; check_decode_request(problem, arch,
// request), its refusals of a forced decode kernel (clusters are refused for every family);
// refused_past_tma_rows(kernel), where not every forced SM90 kernel is refused past kTmaRowLimit rows.
template <class Spec>
struct GemmChoice;

template <class Spec>
using GemmKernelOf = decltype(Spec::kernel);
// A family runs the decode kernel where its kernels include it.
template <class Spec>
inline constexpr bool kRunsDecode = requires { GemmKernelOf<Spec>::mma_decode; };

// A forced SM90 kernel: refused off Hopper (the converter where the family has one).
template <class Spec>
bool forces_sm90(GemmRequest::Kernel k) {
  using K = GemmRequest::Kernel;
  if constexpr (requires { GemmKernelOf<Spec>::wgmma_sm90_converter; })
    if (k == K::sm90_converter) return true;
  return k == K::sm90 || k == K::sm90_swap_ab;
}

// A configuration of `problem`: the kernel and tile, the deepest pipeline that fits (SM90 kernels; else none),
// and, where the spec has them, the k-tile and the cluster.
template <class Spec>
Spec gemm_config(const Spec& problem, GemmKernelOf<Spec> kernel, int tile_m, int tile_n, int cluster = 1,
                 ClusterAxis axis = ClusterAxis::m) {
  Spec s = problem;
  s.kernel = kernel;
  s.tile_m = tile_m;
  s.tile_n = tile_n;
  if constexpr (requires { s.tile_k; }) s.tile_k = GemmChoice<Spec>::tile_k(kernel);
  if constexpr (requires { s.cluster; }) s.cluster = cluster;
  if constexpr (requires { s.cluster_axis; }) s.cluster_axis = axis;
  s.stages = is_sm90(kernel) ? GemmChoice<Spec>::max_stages(s) : 0;
  return s;
}

// The portable mma.sync kernel's one configuration (every arch, every row count).
template <class Spec>
Spec portable_gemm_config(const Spec& problem) {
  return gemm_config(problem, GemmKernelOf<Spec>::mma_sync, 64, 128);
}

// The decode kernel's configuration: chunks of kDecodeTileRows rows, decode_tile_n weight rows per block.
template <class Spec>
Spec decode_gemm_config(const Spec& problem) {
  return gemm_config(problem, GemmKernelOf<Spec>::mma_decode, kDecodeTileRows, decode_tile_n(problem.n));
}

// The configurations a request may pick from, one per bucket: the arch's, or the portable kernel's when the
// request or the arch says so, with what the request forces applied.
template <class Spec>
Expected<std::vector<Spec>> requested_gemm_configs(const Spec& problem, const ArchInfo& arch,
                                                   const GemmRequest& request) {
  using Choice = GemmChoice<Spec>;
  using Kernel = GemmRequest::Kernel;
  if (forces_sm90<Spec>(request.kernel) && !arch.wgmma_tma)
    return fail(KJIT_ERROR_UNSUPPORTED, fmt::format("{} only on sm_90a (Hopper); this device compiles for {}",
                                                    Choice::kRules.sm90_kernels, arch.target));
  if constexpr (requires { Choice::check_request(problem, request); })
    KJIT_TRY(Choice::check_request(problem, request));
  if constexpr (kRunsDecode<Spec>) {
    if (request.kernel == Kernel::decode) {
      if (request.cluster > 1)
        return fail(KJIT_ERROR_INVALID_ARGUMENT, "the decode grouped GEMM kernel runs without clusters");
      if constexpr (requires { Choice::check_decode_request(problem, arch, request); })
        KJIT_TRY(Choice::check_decode_request(problem, arch, request));
      Spec s = decode_gemm_config(problem);
      if constexpr (requires { Choice::decode_config(problem, arch); }) s = Choice::decode_config(problem, arch);
      if (request.tile_m != 0) s.tile_m = request.tile_m;
      if (request.tile_n != 0) s.tile_n = request.tile_n;
      KJIT_TRY(Family<Spec>::validate(s));
      KJIT_TRY(require_bulk_copies(s, true, arch));
      return std::vector{s};
    }
  }
  // A cluster names a tile where the family has clusters.
  bool tile_given = request.tile_m != 0 || request.tile_n != 0;
  if constexpr (requires { problem.cluster; }) tile_given = tile_given || request.cluster != 0;
  auto configs = request.kernel == Kernel::portable ? std::vector{portable_gemm_config(problem)}
                                                    : Choice::arch_configs(problem, arch);
  // The decode bucket runs the decode kernel only when nothing else is asked for.
  if (kRunsDecode<Spec> && configs.size() > 1 && (request.kernel != Kernel::arch_default || tile_given))
    configs[0] = configs[1];
  Choice::force_kernel(configs, problem, request);
  if (!tile_given) return configs;
  for (auto& s : configs) {
    if constexpr (requires { Choice::tile_kernel(true); })
      if (is_sm90(s.kernel)) s.kernel = Choice::tile_kernel(request.kernel == Kernel::sm90_swap_ab);
    if (request.tile_m != 0) s.tile_m = request.tile_m;
    if (request.tile_n != 0) s.tile_n = request.tile_n;
    if constexpr (requires { s.cluster; }) s.cluster = request.cluster != 0 ? request.cluster : 1;
    if constexpr (requires { s.cluster_axis; })
      s.cluster_axis = s.cluster > 1 ? request.cluster_axis : ClusterAxis::m;
    if (is_sm90(s.kernel)) s.stages = Choice::max_stages(s);
    KJIT_TRY(Family<Spec>::validate(s));
  }
  return configs;
}

// The configuration a launch of `rows` rows uses. The bucket: the decode bucket (few routed rows), then average
// rows per expert, the quantity that decides how full a tile is (decode: a few rows per expert; prefill:
// hundreds), against the family's two bounds.
template <class Spec>
Expected<Spec> choose_gemm_config(const Spec& problem, const ArchInfo& arch, int64_t rows,
                                  const GemmRequest& request) {
  using Choice = GemmChoice<Spec>;
  if (rows > kTmaRowLimit && request.kernel != GemmRequest::Kernel::portable) {
    bool refused = forces_sm90<Spec>(request.kernel);
    if constexpr (requires { Choice::refused_past_tma_rows(request.kernel); })
      refused = Choice::refused_past_tma_rows(request.kernel);
    if (refused)
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("{} addresses at most {} rows, got {}", Choice::kRules.sm90_gemm, kTmaRowLimit, rows));
    return choose_gemm_config(problem, arch, rows, {.kernel = GemmRequest::Kernel::portable});
  }
  const auto configs = KJIT_TRY(requested_gemm_configs(problem, arch, request));
  const int64_t rows_per_expert = rows / std::max<int64_t>(problem.experts, 1);
  const auto& bounds = Choice::kRules.rows_per_expert;
  size_t bucket = rows_per_expert <= bounds[0] ? 0 : rows_per_expert <= bounds[1] ? 1 : 2;
  if constexpr (kRunsDecode<Spec>) bucket = Choice::decode_bucket(problem, rows) ? 0 : bucket + 1;
  return configs[std::min(bucket, configs.size() - 1)];
}

// Every configuration choose_gemm_config may return for `request`, whatever the row count (what a prepare loads).
template <class Spec>
Expected<std::vector<Spec>> gemm_candidates(const Spec& problem, const ArchInfo& arch, const GemmRequest& request) {
  return distinct_configs(KJIT_TRY(requested_gemm_configs(problem, arch, request)));
}

}  // namespace kjit::codegen
