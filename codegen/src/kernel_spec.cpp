// KernelSpec names, canonical text, JSON form and invariants.
#include "kjit/codegen/kernel_spec.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <functional>

#include <fmt/format.h>

namespace kjit::codegen {
namespace {

constexpr std::array kDTypeNames{"f8_e4m3fn", "f8_e5m2", "bf16", "f16", "f32"};
constexpr std::array kGranularityNames{"per_tensor", "per_row", "per_block"};
constexpr std::array kConventionNames{"multiply", "divide"};
constexpr std::array kLayoutNames{"e_n_k", "e_k_n"};
constexpr std::array kOffsetsNames{"cumulative_end", "with_leading_zero"};
constexpr std::array kGemmKernelNames{"mma_sync", "wgmma_sm90", "wgmma_sm90_swap_ab"};
constexpr std::array kClusterAxisNames{"m", "n"};

// The SM90 kernel's pipeline stops at what fits in the 227 KB a Hopper block
// may opt into (grouped_gemm_shared_bytes says what a depth costs).
constexpr int kSm90SharedLimit = 227 * 1024;
constexpr int kSm90MaxStages = 8;
int sm90_deepest_pipeline(GemmKernel kernel, int tile_m, int tile_n) {
  GroupedGemmSpec s;
  s.kernel = kernel;
  s.tile_m = tile_m;
  s.tile_n = tile_n;
  s.tile_k = 64;
  for (s.stages = kSm90MaxStages; s.stages > 1; --s.stages)
    if (grouped_gemm_shared_bytes(s) <= kSm90SharedLimit) break;
  return s.stages;
}

template <class Enum, size_t N>
Expected<Enum> parse_enum(const nlohmann::json& j, const char* field,
                          const std::array<const char*, N>& names) {
  if (!j.contains(field) || !j[field].is_string())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be a string", field));
  const auto text = j[field].get<std::string>();
  for (size_t i = 0; i < N; ++i)
    if (text == names[i]) return static_cast<Enum>(i);
  return fail(KJIT_ERROR_INVALID_ARGUMENT,
              fmt::format("spec field '{}' has unknown value '{}' (expected one of: {})", field, text,
                          fmt::join(names, ", ")));
}

Expected<int64_t> parse_int(const nlohmann::json& j, const char* field, int64_t fallback, bool required) {
  if (!j.contains(field)) {
    if (required) return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' is missing", field));
    return fallback;
  }
  if (!j[field].is_number_integer())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be an integer", field));
  return j[field].get<int64_t>();
}

bool is_fp8(DType t) { return t == DType::f8_e4m3fn || t == DType::f8_e5m2; }

Expected<void> validate_dequant(const DequantSpec& s) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  if (!is_fp8(s.in)) return invalid(fmt::format("fp8_dequant input must be f8_e4m3fn or f8_e5m2, not {}", name(s.in)));
  if (is_fp8(s.out)) return invalid(fmt::format("fp8_dequant output must be bf16, f16 or f32, not {}", name(s.out)));
  if (s.cols <= 0) return invalid(fmt::format("cols must be positive, got {}", s.cols));
  if (s.vec != 1 && s.vec != 2 && s.vec != 4 && s.vec != 8 && s.vec != 16)
    return invalid(fmt::format("vec must be 1, 2, 4, 8 or 16, got {}", s.vec));
  if (s.cols % s.vec != 0) return invalid(fmt::format("vec {} does not divide cols {}", s.vec, s.cols));
  const bool blocked = s.granularity == ScaleGranularity::per_block;
  if (blocked && (s.block_rows <= 0 || s.block_cols <= 0))
    return invalid(fmt::format("per_block scales need block sizes >= 1, got {}x{}", s.block_rows, s.block_cols));
  if (!blocked && (s.block_rows != 0 || s.block_cols != 0))
    return invalid(fmt::format("block sizes are only meaningful for per_block scales, got {}x{} with {}",
                               s.block_rows, s.block_cols, name(s.granularity)));
  return {};
}

Expected<void> validate_gemm(const GroupedGemmSpec& s) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  if (s.out != DType::bf16 && s.out != DType::f32)
    return invalid(fmt::format("grouped_gemm output must be bf16 or f32, not {}", name(s.out)));
  if (s.n < 8 || s.n % 8 != 0) return invalid(fmt::format("grouped_gemm needs N >= 8 and divisible by 8, got {}", s.n));
  if (s.k < 8 || s.k % 8 != 0) return invalid(fmt::format("grouped_gemm needs K >= 8 and divisible by 8, got {}", s.k));
  if (s.experts < 1 || s.experts > 4096)
    return invalid(fmt::format("grouped_gemm needs 1 to 4096 experts, got {}", s.experts));
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
  if (s.kernel == GemmKernel::mma_sync) {
    const bool ok = s.tile_m > 0 && s.tile_m % 32 == 0 && s.tile_m <= 128 && s.tile_n > 0 && s.tile_n % 16 == 0 &&
                    s.tile_n <= 128 && s.tile_k > 0 && s.tile_k % 16 == 0 && s.tile_k <= 64 && s.stages == 0 &&
                    s.cluster == 1;
    if (!ok) return invalid(fmt::format("grouped_gemm {} is not supported", tile));
    return {};
  }
  const bool pipeline_ok =
      s.tile_k == 64 && s.stages >= 2 && s.stages <= sm90_deepest_pipeline(s.kernel, s.tile_m, s.tile_n);
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

Expected<KernelSpec> gemm_from_json(const nlohmann::json& j) {
  GroupedGemmSpec s;
  auto out = parse_enum<DType>(j, "out", kDTypeNames);
  if (!out) return std::unexpected(out.error());
  auto weights = parse_enum<WeightLayout>(j, "weights", kLayoutNames);
  if (!weights) return std::unexpected(weights.error());
  auto offsets = parse_enum<OffsetsConvention>(j, "offsets", kOffsetsNames);
  if (!offsets) return std::unexpected(offsets.error());
  auto n = parse_int(j, "n", 0, true);
  if (!n) return std::unexpected(n.error());
  auto k = parse_int(j, "k", 0, true);
  if (!k) return std::unexpected(k.error());
  auto experts = parse_int(j, "experts", 0, true);
  if (!experts) return std::unexpected(experts.error());
  s.out = *out;
  s.weights = *weights;
  s.offsets = *offsets;
  s.n = *n;
  s.k = *k;
  s.experts = *experts;
  if (j.contains("row_scale")) {
    if (!j["row_scale"].is_boolean())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'row_scale' must be true or false");
    s.row_scale = j["row_scale"].get<bool>();
  }
  // A configuration (cache metadata) names its kernel, tile and stages; a
  // problem (manifests) names none of them.
  if (j.contains("kernel")) {
    auto kernel = parse_enum<GemmKernel>(j, "kernel", kGemmKernelNames);
    if (!kernel) return std::unexpected(kernel.error());
    s.kernel = *kernel;
    const auto& tile = j.contains("tile") ? j["tile"] : nlohmann::json();
    if (!tile.is_array() || tile.size() != 3 || !tile[0].is_number_integer() || !tile[1].is_number_integer() ||
        !tile[2].is_number_integer())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'tile' must be [tile_m, tile_n, tile_k] with 'kernel'");
    s.tile_m = tile[0].get<int>();
    s.tile_n = tile[1].get<int>();
    s.tile_k = tile[2].get<int>();
    auto stages = parse_int(j, "stages", 0, false);
    if (!stages) return std::unexpected(stages.error());
    s.stages = static_cast<int>(*stages);
    auto cluster = parse_int(j, "cluster", 1, false);
    if (!cluster) return std::unexpected(cluster.error());
    s.cluster = static_cast<int>(*cluster);
    if (j.contains("cluster_axis")) {
      auto axis = parse_enum<ClusterAxis>(j, "cluster_axis", kClusterAxisNames);
      if (!axis) return std::unexpected(axis.error());
      s.cluster_axis = *axis;
    }
  } else if (j.contains("tile") || j.contains("stages") || j.contains("cluster") || j.contains("cluster_axis")) {
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                "spec fields 'tile', 'stages', 'cluster' and 'cluster_axis' need 'kernel' beside them");
  }
  KernelSpec spec = s;
  if (auto ok = validate(spec); !ok) return std::unexpected(ok.error());
  return spec;
}

Expected<void> validate_routing(const MoeRoutingSpec& s) {
  if (s.experts < 1 || s.experts > 4096)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_routing needs 1 to 4096 local experts, got {}", s.experts));
  return {};
}

Expected<void> validate_combine(const MoeCombineSpec& s) {
  if (s.top_k < 1 || s.top_k > 32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_combine needs top_k from 1 to 32, got {}", s.top_k));
  if (s.hidden < 8 || s.hidden % 8 != 0)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("moe_combine needs a hidden size divisible by 8, got {}", s.hidden));
  if (s.out != DType::bf16 && s.out != DType::f32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_combine output must be bf16 or f32, not {}", name(s.out)));
  return {};
}

Expected<KernelSpec> routing_from_json(const nlohmann::json& j, bool combine) {
  KernelSpec spec;
  if (combine) {
    MoeCombineSpec c;
    auto top_k = parse_int(j, "top_k", 0, true);
    if (!top_k) return std::unexpected(top_k.error());
    auto hidden = parse_int(j, "hidden", 0, true);
    if (!hidden) return std::unexpected(hidden.error());
    auto out = parse_enum<DType>(j, "out", kDTypeNames);
    if (!out) return std::unexpected(out.error());
    c.top_k = *top_k;
    c.hidden = *hidden;
    c.out = *out;
    spec = c;
  } else {
    MoeRoutingSpec r;
    auto experts = parse_int(j, "experts", 0, true);
    if (!experts) return std::unexpected(experts.error());
    auto offsets = parse_enum<OffsetsConvention>(j, "offsets", kOffsetsNames);
    if (!offsets) return std::unexpected(offsets.error());
    r.experts = *experts;
    r.offsets = *offsets;
    spec = r;
  }
  if (auto ok = validate(spec); !ok) return std::unexpected(ok.error());
  return spec;
}

}  // namespace

std::string_view name(WeightLayout l) { return kLayoutNames[static_cast<size_t>(l)]; }
std::string_view name(OffsetsConvention c) { return kOffsetsNames[static_cast<size_t>(c)]; }

std::string_view name(GemmKernel k) { return kGemmKernelNames[static_cast<size_t>(k)]; }
std::string_view name(ClusterAxis a) { return kClusterAxisNames[static_cast<size_t>(a)]; }

namespace {

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
  s.stages = sm90_deepest_pipeline(kernel, tile_m, tile_n);
  s.cluster = cluster;
  s.cluster_axis = axis;
  return s;
}

// Swap AB's configuration: up to 256 rows per tile, 128 columns per block (two consumer warpgroups).
GroupedGemmSpec swap_ab_config(const GroupedGemmSpec& problem) {
  return sm90_config(problem, GemmKernel::wgmma_sm90_swap_ab, 256, 128);
}

}  // namespace

std::vector<GroupedGemmSpec> grouped_gemm_configs(const GroupedGemmSpec& problem, std::string_view target) {
  if (target == "sm_90a") {
    // Measured on an H100 against every tile (docs/benchmarks.md, the sweeps),
    // by average rows per expert:
    // - <= 64 (decode): one consumer warpgroup on 64 x 256 tiles, 5 stages;
    //   memory-bound on the weights.
    // - <= 512: swap AB, row tiles of up to 256 x 128 columns: an expert's
    //   rows split into tiles of near-equal height (steps of 32), where 64-
    //   or 128-row tiles compute up to 127 rows past each expert's end
    //   (a fifth of the work at ~256 rows per expert).
    // - more: swap AB in clusters of two blocks along N that share the row
    //   tile by TMA multicast (a third less L2 traffic, so less power and
    //   higher clocks under the power cap; 7% faster than alone at 1024 rows
    //   per expert, 2% slower at 256). Where N holds no whole pairs of
    //   128-column tiles: 128 x 256 tiles in pairs along M sharing B.
    const GroupedGemmSpec swap_ab = swap_ab_config(problem);
    const GroupedGemmSpec many =
        problem.n % (2 * swap_ab.tile_n) == 0
            ? sm90_config(problem, swap_ab.kernel, swap_ab.tile_m, swap_ab.tile_n, 2, ClusterAxis::n)
            : sm90_config(problem, GemmKernel::wgmma_sm90, 128, 256, 2);
    return {sm90_config(problem, GemmKernel::wgmma_sm90, 64, 256), swap_ab, many};
  }
  return {portable_config(problem)};
}

int grouped_gemm_shared_bytes(const GroupedGemmSpec& s) {
  if (!is_sm90(s.kernel)) return 0;  // the portable kernel's tiles are static
  // GroupedGemmSm90Config::kSharedBytes and GroupedGemmSwapAbConfig's (the
  // generated code asserts they agree): the stages, 1 KB of slack to align
  // them to the swizzle's 1 KB, two mbarriers per stage; swap AB adds its
  // epilogue scratch, 1 KB per consumer warp (tile_n / 64 warpgroups), and
  // its tile queue (4 slots of two mbarriers and an index).
  const int scratch = s.kernel == GemmKernel::wgmma_sm90_swap_ab ? s.tile_n / 64 * 4 * 1024 + 4 * 24 : 0;
  return s.stages * (s.tile_m + s.tile_n) * s.tile_k * 2 + 1024 + 16 * s.stages + scratch;
}

namespace {

// The configurations a request may pick from: the arch's buckets, or the
// portable kernel's when the request or the arch says so.
Expected<std::vector<GroupedGemmSpec>> requested_configs(const GroupedGemmSpec& problem, std::string_view target,
                                                         const GemmRequest& request) {
  const bool sm90 = target == "sm_90a";
  using Kernel = GemmRequest::Kernel;
  if ((request.kernel == Kernel::sm90 || request.kernel == Kernel::sm90_swap_ab) && !sm90)
    return fail(KJIT_ERROR_UNSUPPORTED,
                fmt::format("the SM90 grouped GEMM kernels run only on sm_90a (Hopper); this device compiles for {}",
                            target));
  auto configs = request.kernel == Kernel::portable ? std::vector{portable_config(problem)}
                                                    : grouped_gemm_configs(problem, target);
  if (request.kernel == Kernel::sm90_swap_ab)
    for (auto& s : configs) s = swap_ab_config(problem);
  if (request.tile_m == 0 && request.tile_n == 0 && request.cluster == 0) return configs;
  for (auto& s : configs) {
    // A tile names a kernel's tile: the rows-on-M kernel's unless swap AB is asked for.
    if (is_sm90(s.kernel))
      s.kernel = request.kernel == Kernel::sm90_swap_ab ? GemmKernel::wgmma_sm90_swap_ab : GemmKernel::wgmma_sm90;
    if (request.tile_m != 0) s.tile_m = request.tile_m;
    if (request.tile_n != 0) s.tile_n = request.tile_n;
    s.cluster = request.cluster != 0 ? request.cluster : 1;
    s.cluster_axis = s.cluster > 1 ? request.cluster_axis : ClusterAxis::m;
    if (is_sm90(s.kernel)) s.stages = sm90_deepest_pipeline(s.kernel, s.tile_m, s.tile_n);
    if (auto ok = validate_gemm(s); !ok) return std::unexpected(ok.error());
  }
  return configs;
}

}  // namespace

Expected<GroupedGemmSpec> choose_grouped_gemm_config(const GroupedGemmSpec& problem, std::string_view target,
                                                     int64_t rows, const GemmRequest& request) {
  // TMA coordinates are 32-bit: past 2^31 rows only the portable kernel serves.
  constexpr int64_t kTmaRowLimit = (int64_t{1} << 31) - 256;
  if (rows > kTmaRowLimit && request.kernel != GemmRequest::Kernel::portable) {
    if (request.kernel == GemmRequest::Kernel::sm90)
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("the SM90 grouped GEMM addresses at most {} rows, got {}", kTmaRowLimit, rows));
    return choose_grouped_gemm_config(problem, target, rows, {.kernel = GemmRequest::Kernel::portable});
  }
  auto configs = requested_configs(problem, target, request);
  if (!configs) return std::unexpected(configs.error());
  // The bucket: average rows per expert, the quantity that decides how full
  // an m-tile is (decode: a few rows per expert; prefill: hundreds).
  const int64_t rows_per_expert = rows / std::max<int64_t>(problem.experts, 1);
  const size_t bucket = rows_per_expert <= 64 ? 0 : rows_per_expert <= 512 ? 1 : 2;
  return (*configs)[std::min(bucket, configs->size() - 1)];
}

Expected<std::vector<GroupedGemmSpec>> grouped_gemm_candidates(const GroupedGemmSpec& problem, std::string_view target,
                                                               const GemmRequest& request) {
  auto configs = requested_configs(problem, target, request);
  if (!configs) return std::unexpected(configs.error());
  std::vector<GroupedGemmSpec> unique;
  for (const auto& c : *configs)
    if (std::find(unique.begin(), unique.end(), c) == unique.end()) unique.push_back(c);
  return unique;
}

std::vector<KernelSpec> kernels_for_target(const KernelSpec& spec, std::string_view target) {
  const auto* gemm = std::get_if<GroupedGemmSpec>(&spec);
  if (!gemm || gemm->configured()) return {spec};
  std::vector<KernelSpec> out;
  for (const auto& config : grouped_gemm_configs(*gemm, target)) out.emplace_back(config);
  return out;
}

std::string_view name(DType t) { return kDTypeNames[static_cast<size_t>(t)]; }
std::string_view name(ScaleGranularity g) { return kGranularityNames[static_cast<size_t>(g)]; }
std::string_view name(ScaleConvention c) { return kConventionNames[static_cast<size_t>(c)]; }

int size_bytes(DType t) {
  switch (t) {
    case DType::f8_e4m3fn:
    case DType::f8_e5m2: return 1;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f32: return 4;
  }
  return 0;
}

std::string_view op_name(const KernelSpec& spec) {
  static constexpr std::string_view kNames[] = {"fp8_dequant", "grouped_gemm", "moe_routing", "moe_combine"};
  static_assert(std::size(kNames) == std::variant_size_v<KernelSpec>);
  return kNames[spec.index()];
}

std::string canonical(const KernelSpec& spec) {
  if (const auto* r = std::get_if<MoeRoutingSpec>(&spec))
    return fmt::format("moe_routing experts={} offsets={}", r->experts, name(r->offsets));
  if (const auto* c = std::get_if<MoeCombineSpec>(&spec))
    return fmt::format("moe_combine top_k={} hidden={} in=bf16 out={}", c->top_k, c->hidden, name(c->out));
  if (const auto* g = std::get_if<GroupedGemmSpec>(&spec))
    return fmt::format("grouped_gemm a=bf16 b=bf16 out={} n={} k={} experts={} weights={} offsets={} row_scale={}{}",
                       name(g->out), g->n, g->k, g->experts, name(g->weights), name(g->offsets), g->row_scale,
                       g->configured() ? fmt::format(" kernel={} tile={}x{}x{} stages={} cluster={}{}", name(g->kernel),
                                                     g->tile_m, g->tile_n, g->tile_k, g->stages, g->cluster,
                                                     g->cluster > 1 ? fmt::format(" along {}", name(g->cluster_axis))
                                                                    : std::string())
                                       : std::string(" config=per-arch"));
  const auto& s = std::get<DequantSpec>(spec);
  std::string scale(name(s.granularity));
  if (s.granularity == ScaleGranularity::per_block) scale += fmt::format(":{}x{}", s.block_rows, s.block_cols);
  return fmt::format("fp8_dequant in={} out={} cols={} scale={} convention={} vec={} experts={}", name(s.in),
                     name(s.out), s.cols, scale, name(s.convention), s.vec,
                     s.selected_experts ? "selected" : "all");
}

nlohmann::json to_json(const KernelSpec& spec) {
  if (const auto* r = std::get_if<MoeRoutingSpec>(&spec))
    return {{"op", "moe_routing"}, {"experts", r->experts}, {"offsets", name(r->offsets)}};
  if (const auto* c = std::get_if<MoeCombineSpec>(&spec))
    return {{"op", "moe_combine"}, {"top_k", c->top_k}, {"hidden", c->hidden}, {"out", name(c->out)}};
  if (const auto* g = std::get_if<GroupedGemmSpec>(&spec)) {
    nlohmann::json j = {{"op", "grouped_gemm"}, {"out", name(g->out)},         {"n", g->n},
                        {"k", g->k},            {"experts", g->experts},       {"weights", name(g->weights)},
                        {"offsets", name(g->offsets)}, {"row_scale", g->row_scale}};
    if (g->configured()) {
      j["kernel"] = name(g->kernel);
      j["tile"] = {g->tile_m, g->tile_n, g->tile_k};
      j["stages"] = g->stages;
      j["cluster"] = g->cluster;
      j["cluster_axis"] = name(g->cluster_axis);
    }
    return j;
  }
  const auto& s = std::get<DequantSpec>(spec);
  nlohmann::json j = {{"op", "fp8_dequant"},
                      {"in", name(s.in)},
                      {"out", name(s.out)},
                      {"cols", s.cols},
                      {"scale", name(s.granularity)},
                      {"convention", name(s.convention)},
                      {"vec", s.vec},
                      {"selected_experts", s.selected_experts}};
  if (s.granularity == ScaleGranularity::per_block) j["block"] = {s.block_rows, s.block_cols};
  return j;
}

Expected<KernelSpec> spec_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return fail(KJIT_ERROR_INVALID_ARGUMENT, "a kernel spec must be a JSON object");
  if (!j.contains("op") || !j["op"].is_string())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'op' must be a string");
  const auto op = j["op"].get<std::string>();
  if (op == "grouped_gemm") return gemm_from_json(j);
  if (op == "moe_routing" || op == "moe_combine") return routing_from_json(j, op == "moe_combine");
  if (op != "fp8_dequant")
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("unknown op '{}' (known: fp8_dequant, grouped_gemm, moe_routing, moe_combine)", op));

  DequantSpec s;
  auto in = parse_enum<DType>(j, "in", kDTypeNames);
  if (!in) return std::unexpected(in.error());
  auto out = parse_enum<DType>(j, "out", kDTypeNames);
  if (!out) return std::unexpected(out.error());
  auto cols = parse_int(j, "cols", 0, true);
  if (!cols) return std::unexpected(cols.error());
  auto granularity = parse_enum<ScaleGranularity>(j, "scale", kGranularityNames);
  if (!granularity) return std::unexpected(granularity.error());
  auto convention = parse_enum<ScaleConvention>(j, "convention", kConventionNames);
  if (!convention) return std::unexpected(convention.error());
  s.in = *in;
  s.out = *out;
  s.cols = *cols;
  s.granularity = *granularity;
  s.convention = *convention;
  if (s.granularity == ScaleGranularity::per_block) {
    const auto& block = j.contains("block") ? j["block"] : nlohmann::json();
    if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'block' must be [block_rows, block_cols] for per_block scales");
    s.block_rows = block[0].get<int64_t>();
    s.block_cols = block[1].get<int64_t>();
  }
  auto vec = parse_int(j, "vec", dequant_vector(s.out, s.cols), false);
  if (!vec) return std::unexpected(vec.error());
  s.vec = static_cast<int>(*vec);
  if (j.contains("selected_experts")) {
    if (!j["selected_experts"].is_boolean())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'selected_experts' must be true or false");
    s.selected_experts = j["selected_experts"].get<bool>();
  }
  KernelSpec spec = s;
  if (auto ok = validate(spec); !ok) return std::unexpected(ok.error());
  return spec;
}

Expected<void> validate(const KernelSpec& spec) {
  if (const auto* g = std::get_if<GroupedGemmSpec>(&spec)) return validate_gemm(*g);
  if (const auto* r = std::get_if<MoeRoutingSpec>(&spec)) return validate_routing(*r);
  if (const auto* c = std::get_if<MoeCombineSpec>(&spec)) return validate_combine(*c);
  return validate_dequant(std::get<DequantSpec>(spec));
}

Expected<void> validate_for_target(const KernelSpec& spec, std::string_view target) {
  if (auto ok = validate(spec); !ok) return ok;
  const auto* gemm = std::get_if<GroupedGemmSpec>(&spec);
  if (gemm && !gemm->configured())
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("{} names no configuration: expand it for an arch first (kernels_for_target)",
                            canonical(spec)));
  if (gemm && is_sm90(gemm->kernel) && target != "sm_90a")
    return fail(KJIT_ERROR_UNSUPPORTED,
                fmt::format("{} is Hopper's kernel (wgmma, TMA) and builds only for sm_90a, not {}", canonical(spec),
                            target));
  return {};
}

int widest_vector(int64_t cols, std::initializer_list<int64_t> alignments, int max_vec) {
  for (int vec : {16, 8, 4, 2}) {
    bool fits = vec <= max_vec && cols % vec == 0;
    for (int64_t a : alignments) fits = fits && a % vec == 0;
    if (fits) return vec;
  }
  return 1;
}

int dequant_vector(DType out, int64_t cols, std::initializer_list<int64_t> alignments) {
  return widest_vector(cols, alignments, 16 / size_bytes(out));
}

size_t SpecHash::operator()(const KernelSpec& spec) const noexcept {
  size_t h = spec.index();
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  if (const auto* r = std::get_if<MoeRoutingSpec>(&spec)) {
    mix(static_cast<uint64_t>(r->experts) << 8 | static_cast<uint64_t>(r->offsets));
    return h;
  }
  if (const auto* c = std::get_if<MoeCombineSpec>(&spec)) {
    mix(static_cast<uint64_t>(c->top_k) << 40 | static_cast<uint64_t>(c->hidden) << 8 | static_cast<uint64_t>(c->out));
    return h;
  }
  if (const auto* g = std::get_if<GroupedGemmSpec>(&spec)) {
    mix(static_cast<uint64_t>(g->n));
    mix(static_cast<uint64_t>(g->k));
    mix(static_cast<uint64_t>(g->experts));
    mix(static_cast<uint64_t>(g->out) | static_cast<uint64_t>(g->weights) << 8 |
        static_cast<uint64_t>(g->offsets) << 16 | static_cast<uint64_t>(g->row_scale) << 24);
    mix(static_cast<uint64_t>(g->tile_m) << 32 | static_cast<uint64_t>(g->tile_n) << 16 | static_cast<uint64_t>(g->tile_k));
    mix(static_cast<uint64_t>(g->cluster_axis) << 24 | static_cast<uint64_t>(g->kernel) << 16 |
        static_cast<uint64_t>(g->stages) << 8 | static_cast<uint64_t>(g->cluster));
    return h;
  }
  const auto& s = std::get<DequantSpec>(spec);
  mix(static_cast<uint64_t>(s.cols));
  mix(static_cast<uint64_t>(s.in) | static_cast<uint64_t>(s.out) << 8 | static_cast<uint64_t>(s.granularity) << 16 |
      static_cast<uint64_t>(s.convention) << 24 | static_cast<uint64_t>(s.vec) << 32 |
      static_cast<uint64_t>(s.selected_experts) << 40);
  mix(static_cast<uint64_t>(s.block_rows));
  mix(static_cast<uint64_t>(s.block_cols));
  return h;
}

}  // namespace kjit::codegen
