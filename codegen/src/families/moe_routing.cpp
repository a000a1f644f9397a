// The MoE routing family.
#include "kjit/codegen/families/moe_routing.hpp"

#include <fmt/format.h>

#include "../recipe.hpp"
#include "../spec_forms.hpp"

namespace kjit::codegen {
namespace {

constexpr int kRoutingThreads = 1024;

}  // namespace

template struct SpecForms<MoeRoutingSpec>;

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
                                 .body = "kjit::moe_routing",
                                 .signals_dependents_early = true});
}

LaunchGeometry moe_routing_geometry() {
  LaunchGeometry g;
  g.block_x = kRoutingThreads;
  return g;
}

}  // namespace kjit::codegen
