// The grouped weight-gradient GEMM family: spec forms, invariants, recipe and grid.
#include "kjit/codegen/families/grouped_gemm_wgrad.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../recipe.hpp"
#include "../spec_reader.hpp"

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

int wgrad_threads(const GroupedGemmWgradSpec& s) {
  const int warp_m = s.tile_m >= 64 ? 64 : s.tile_m;
  return 32 * (s.tile_m / warp_m) * (s.tile_n / 32);
}

}  // namespace

std::string Family<GroupedGemmWgradSpec>::canonical(const GroupedGemmWgradSpec& s) {
  return fmt::format("grouped_gemm_wgrad dy=bf16 x=bf16 out={} n={} k={} experts={} offsets={} layout=e_n_k{}",
                     name(s.out), s.n, s.k, s.experts, name(s.offsets),
                     s.configured() ? fmt::format(" kernel=mma_sync tile={}x{}x{} stages={}", s.tile_m, s.tile_n,
                                                  s.tile_k, kStages)
                                    : std::string(" config=per-arch"));
}

nlohmann::json Family<GroupedGemmWgradSpec>::to_json(const GroupedGemmWgradSpec& s) {
  nlohmann::json j{{"op", op},     {"out", name(s.out)},         {"n", s.n},
                   {"k", s.k},     {"experts", s.experts},       {"offsets", name(s.offsets)}};
  if (s.configured()) j["tile"] = {s.tile_m, s.tile_n, s.tile_k};
  return j;
}

Expected<GroupedGemmWgradSpec> Family<GroupedGemmWgradSpec>::from_json(SpecReader& reader) {
  GroupedGemmWgradSpec s;
  s.out = KJIT_TRY(reader.enumeration<DType>("out"));
  s.n = KJIT_TRY(reader.integer("n"));
  s.k = KJIT_TRY(reader.integer("k"));
  s.experts = KJIT_TRY(reader.integer("experts"));
  s.offsets = KJIT_TRY(reader.enumeration<OffsetsConvention>("offsets"));
  if (reader.has("tile")) {
    const auto tile = KJIT_TRY(reader.small_integers("tile", 3, "[tile_m, tile_n, tile_k]"));
    s.tile_m = tile[0];
    s.tile_n = tile[1];
    s.tile_k = tile[2];
  }
  return s;
}

const std::vector<FieldRule>& Family<GroupedGemmWgradSpec>::schema() {
  static const std::vector<FieldRule> rules{
      text_field("out", {"f32", "bf16"}), integer_field("n", 8, kMaxDimension), integer_field("k", 8, kMaxDimension),
      integer_field("experts", 1, kMaxExperts), text_field("offsets", {"cumulative_end", "with_leading_zero"}),
      integers_field("tile", "[m, n, k]", 3, 1, 256)};
  return rules;
}

void Family<GroupedGemmWgradSpec>::hash(const GroupedGemmWgradSpec& s, HashMixer& h) {
  h.mix(static_cast<uint64_t>(s.n));
  h.mix(static_cast<uint64_t>(s.k));
  h.mix(static_cast<uint64_t>(s.experts) << 16 | static_cast<uint64_t>(s.out) << 8 |
        static_cast<uint64_t>(s.offsets));
  h.mix(static_cast<uint64_t>(s.tile_m) << 32 | static_cast<uint64_t>(s.tile_n) << 16 |
        static_cast<uint64_t>(s.tile_k));
}

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
  if (s.experts < 1 || s.experts > kMaxExperts)
    return invalid(fmt::format("grouped_gemm_wgrad needs 1 to {} experts, got {}", kMaxExperts, s.experts));
  if (!s.configured()) {
    if (s.tile_n != 0 || s.tile_k != 0)
      return invalid(fmt::format("grouped_gemm_wgrad tile {}x{}x{} is neither a configuration nor a problem (all zero)",
                                 s.tile_m, s.tile_n, s.tile_k));
    return {};
  }
  if ((s.tile_m != kWideTileM && s.tile_m != kNarrowTileM) || s.tile_n != kTileN || s.tile_k != kTileK)
    return invalid(fmt::format("grouped_gemm_wgrad tile {}x{}x{} is not supported (128x128x32 or 32x128x32)",
                               s.tile_m, s.tile_n, s.tile_k));
  return {};
}

Expected<void> Family<GroupedGemmWgradSpec>::supported_on(const GroupedGemmWgradSpec& s, const ArchInfo&) {
  if (!s.configured())
    return invalid(fmt::format("{} names no configuration: expand it for an arch first (kernels_for_target)",
                               canonical(s)));
  return {};  // mma.sync bf16, cp.async and ldmatrix: every arch in the table (sm_80 and newer)
}

RenderedKernel Family<GroupedGemmWgradSpec>::render(const GroupedGemmWgradSpec& s) {
  return assemble(canonical(s),
                  {.entry_point = "kjit_grouped_gemm_wgrad",
                   .threads = wgrad_threads(s),
                   .templates = {"gemm/grouped_gemm_wgrad_mma.cuh"},
                   .config = fmt::format("kjit::GroupedGemmWgradConfig<{}LL, {}LL, {}, {}, {}, {}, {}, {}, {}>", s.n,
                                         s.k, s.experts, s.offsets == OffsetsConvention::with_leading_zero,
                                         s.out == DType::f32, s.tile_m, s.tile_n, s.tile_k, kStages),
                   .params_type = "kjit_grouped_gemm_wgrad_params",
                   .body = "kjit::grouped_gemm_wgrad_mma",
                   .dynamic_shared_bytes = grouped_gemm_wgrad_shared_bytes(s)});
}

std::vector<GroupedGemmWgradSpec> Family<GroupedGemmWgradSpec>::kernels_for_target(const GroupedGemmWgradSpec& s,
                                                                                   const ArchInfo&) {
  return {s.configured() ? s : grouped_gemm_wgrad_config(s)};
}

GroupedGemmWgradSpec grouped_gemm_wgrad_config(const GroupedGemmWgradSpec& problem) {
  auto s = problem;
  s.tile_m = problem.n <= kNarrowMaxN ? kNarrowTileM : kWideTileM;
  s.tile_n = kTileN;
  s.tile_k = kTileK;
  return s;
}

int grouped_gemm_wgrad_shared_bytes(const GroupedGemmWgradSpec& s) {
  // GroupedGemmWgradConfig::kSharedBytes (the generated code asserts they
  // agree): per stage, tile_k rows of dy (tile_m columns) and of x (tile_n),
  // each row padded by 16 bytes.
  return kStages * s.tile_k * ((s.tile_m + 8) + (s.tile_n + 8)) * 2;
}

LaunchGeometry grouped_gemm_wgrad_geometry(const GroupedGemmWgradSpec& s) {
  LaunchGeometry g;
  g.block_x = static_cast<uint32_t>(wgrad_threads(s));
  g.grid_x = static_cast<uint32_t>(((s.n + s.tile_m - 1) / s.tile_m) * ((s.k + s.tile_n - 1) / s.tile_n));
  g.grid_y = static_cast<uint32_t>(s.experts);
  g.shared_bytes = static_cast<uint32_t>(grouped_gemm_wgrad_shared_bytes(s));
  return g;
}

}  // namespace kjit::codegen
