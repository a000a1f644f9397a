// The MoE routing family: top-k global expert ids -> this rank's per-expert
// counts, offsets and the expert-sorted permutation and its inverse.
// Home: this header and codegen/src/families/moe_routing.cpp; device code in
// templates/routing/moe_routing.cuh; ABI block templates/abi/moe_routing_params.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The key is the local expert count; tokens, top-k and the rank's expert range are run-time.
struct MoeRoutingSpec {
  int64_t experts = 0;  // experts this rank owns
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  bool operator==(const MoeRoutingSpec&) const = default;
};

template <>
struct Family<MoeRoutingSpec> : SpecForms<MoeRoutingSpec> {
  static constexpr std::string_view op = "moe_routing";
  static constexpr auto fields = std::tuple{field("experts", &MoeRoutingSpec::experts).range(1, kMaxExperts),
                                            field("offsets", &MoeRoutingSpec::offsets)};
  static Expected<void> validate(const MoeRoutingSpec& s);
  static Expected<void> supported_on(const MoeRoutingSpec&, const ArchInfo&) { return {}; }  // every arch
  static RenderedKernel render(const MoeRoutingSpec& s);
  static std::vector<MoeRoutingSpec> kernels_for_target(const MoeRoutingSpec& s, const ArchInfo&) { return {s}; }
};

// Routing launches: one block does it all, or (given a workspace) blocks of
// kRoutingIdsPerBlock ids count, one block scans, blocks place: 8 chunks of the
// block's 1024 threads, enough work to cover the extra launches and the
// per-expert scan over blocks.
inline constexpr int64_t kRoutingIdsPerBlock = 8192;
LaunchGeometry moe_routing_geometry();

}  // namespace kjit::codegen
