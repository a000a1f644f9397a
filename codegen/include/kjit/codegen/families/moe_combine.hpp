// The MoE combine family: out[t] = sum over j of weight[t, j] * expert_out[row of (t, j)]; its gradient
// (`gradient`): the weights', d weight[t, j] = <d out[t], expert_out[row of (t, j)]> (fp32); its transpose
// (`dispatch`, kjit_moe_dispatch): out[row of (t, j)] = x[t], the tokens' rows copied into expert order.
// Home: this header and codegen/src/families/moe_combine.cpp; device code in
// templates/routing/moe_routing.cuh (beside routing, whose permutation it reads);
// ABI block templates/abi/moe_routing_params.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

struct MoeCombineSpec {
  int64_t top_k = 0;
  int64_t hidden = 0;
  DType out = DType::bf16;  // expert_out is bf16
  bool gradient = false;    // the weights' gradient (out f32 [tokens, top_k]) from the output's (`grad`, bf16)
  bool dispatch = false;    // the transpose: bf16 [tokens, hidden] in, bf16 [tokens * top_k, hidden] out
  bool operator==(const MoeCombineSpec&) const = default;
};

template <>
struct Family<MoeCombineSpec> : SpecForms<MoeCombineSpec> {
  static constexpr std::string_view op = "moe_combine";
  static constexpr auto fields = std::tuple{field("top_k", &MoeCombineSpec::top_k).range(1, 32),
                                            field("hidden", &MoeCombineSpec::hidden).range(8, kMaxDimension),
                                            fixed_text(" in=bf16"),
                                            field("out", &MoeCombineSpec::out).only(DType::bf16, DType::f32),
                                            field("gradient", &MoeCombineSpec::gradient).omit_default(),
                                            field("dispatch", &MoeCombineSpec::dispatch).omit_default()};
  static Expected<void> validate(const MoeCombineSpec& s);
  static Expected<void> supported_on(const MoeCombineSpec&, const ArchInfo&) { return {}; }  // every arch
  static RenderedKernel render(const MoeCombineSpec& s);
  static std::vector<MoeCombineSpec> kernels_for_target(const MoeCombineSpec& s, const ArchInfo&) { return {s}; }
};

// x over the tokens, y over the hidden size in slices of 2048 columns (one 16-byte load a thread and row): at
// decode a token's rows are read by several SMs at once, not one block in turn. The dispatch likewise. The
// gradient: x over the pairs, 8 (a warp each) a block.
LaunchGeometry moe_combine_geometry(const MoeCombineSpec& spec, int64_t tokens);

}  // namespace kjit::codegen
