// The MoE combine family.
#include "kjit/codegen/families/moe_combine.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../recipe.hpp"
#include "../spec_reader.hpp"

namespace kjit::codegen {
namespace {

constexpr int kCombineThreads = 256;

}  // namespace

std::string Family<MoeCombineSpec>::canonical(const MoeCombineSpec& s) {
  return fmt::format("moe_combine top_k={} hidden={} in=bf16 out={}", s.top_k, s.hidden, name(s.out));
}

nlohmann::json Family<MoeCombineSpec>::to_json(const MoeCombineSpec& s) {
  return {{"op", op}, {"top_k", s.top_k}, {"hidden", s.hidden}, {"out", name(s.out)}};
}

Expected<MoeCombineSpec> Family<MoeCombineSpec>::from_json(SpecReader& reader) {
  MoeCombineSpec s;
  s.top_k = KJIT_TRY(reader.integer("top_k"));
  s.hidden = KJIT_TRY(reader.integer("hidden"));
  s.out = KJIT_TRY(reader.enumeration<DType>("out"));
  return s;
}

const std::vector<FieldRule>& Family<MoeCombineSpec>::schema() {
  static const std::vector<FieldRule> rules{
      integer_field("top_k", 1, 32), integer_field("hidden", 8, kMaxDimension), text_field("out", {"bf16", "f32"})};
  return rules;
}

void Family<MoeCombineSpec>::hash(const MoeCombineSpec& s, HashMixer& h) {
  h.mix(static_cast<uint64_t>(s.top_k) << 40 | static_cast<uint64_t>(s.hidden) << 8 | static_cast<uint64_t>(s.out));
}

Expected<void> Family<MoeCombineSpec>::validate(const MoeCombineSpec& s) {
  if (s.top_k < 1 || s.top_k > 32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_combine needs top_k from 1 to 32, got {}", s.top_k));
  if (s.hidden < 8 || s.hidden % 8 != 0 || s.hidden > kMaxDimension)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("moe_combine: hidden must be a positive multiple of 8 up to {}, got {}", kMaxDimension,
                            s.hidden));
  if (s.out != DType::bf16 && s.out != DType::f32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_combine output must be bf16 or f32, not {}", name(s.out)));
  return {};
}

RenderedKernel Family<MoeCombineSpec>::render(const MoeCombineSpec& s) {
  return assemble(canonical(s), {.entry_point = "kjit_moe_combine",
                                 .threads = kCombineThreads,
                                 .templates = {"routing/moe_routing.cuh"},
                                 .config = fmt::format("kjit::CombineConfig<{}, {}LL, {}>", s.top_k, s.hidden,
                                                       s.out == DType::f32),
                                 .params_type = "kjit_moe_combine_params",
                                 .body = "kjit::moe_combine"});
}

LaunchGeometry moe_combine_geometry(int64_t tokens) {
  LaunchGeometry g;
  g.block_x = kCombineThreads;
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>(tokens, 1, 0x7fffffff));
  return g;
}

}  // namespace kjit::codegen
