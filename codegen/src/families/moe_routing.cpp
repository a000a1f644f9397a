// The MoE routing family.
#include "kjit/codegen/families/moe_routing.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "../recipe.hpp"
#include "../spec_reader.hpp"

namespace kjit::codegen {
namespace {

constexpr int kRoutingThreads = 1024;

}  // namespace

std::string Family<MoeRoutingSpec>::canonical(const MoeRoutingSpec& s) {
  return fmt::format("moe_routing experts={} offsets={}", s.experts, name(s.offsets));
}

nlohmann::json Family<MoeRoutingSpec>::to_json(const MoeRoutingSpec& s) {
  return {{"op", op}, {"experts", s.experts}, {"offsets", name(s.offsets)}};
}

Expected<MoeRoutingSpec> Family<MoeRoutingSpec>::from_json(SpecReader& reader) {
  MoeRoutingSpec s;
  s.experts = KJIT_TRY(reader.integer("experts"));
  s.offsets = KJIT_TRY(reader.enumeration<OffsetsConvention>("offsets"));
  return s;
}

const std::vector<FieldRule>& Family<MoeRoutingSpec>::schema() {
  static const std::vector<FieldRule> rules{
      integer_field("experts", 1, kMaxExperts), text_field("offsets", {"cumulative_end", "with_leading_zero"})};
  return rules;
}

void Family<MoeRoutingSpec>::hash(const MoeRoutingSpec& s, HashMixer& h) {
  h.mix(static_cast<uint64_t>(s.experts) << 8 | static_cast<uint64_t>(s.offsets));
}

Expected<void> Family<MoeRoutingSpec>::validate(const MoeRoutingSpec& s) {
  if (s.experts < 1 || s.experts > kMaxExperts)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("moe_routing needs 1 to {} local experts (experts_local), got {}", kMaxExperts, s.experts));
  return {};
}

RenderedKernel Family<MoeRoutingSpec>::render(const MoeRoutingSpec& s) {
  return assemble(canonical(s), {.entry_point = "kjit_moe_routing",
                                 .threads = kRoutingThreads,
                                 .templates = {"routing/moe_routing.cuh"},
                                 .config = fmt::format("kjit::RoutingConfig<{}LL, {}>", s.experts,
                                                       s.offsets == OffsetsConvention::with_leading_zero),
                                 .params_type = "kjit_moe_routing_params",
                                 .body = "kjit::moe_routing"});
}

LaunchGeometry moe_routing_geometry() {
  LaunchGeometry g;
  g.block_x = kRoutingThreads;
  return g;
}

}  // namespace kjit::codegen
