// The MoE combine family.
#include "kjit/codegen/families/moe_combine.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "../spec_forms.hpp"

namespace kjit::codegen {
namespace {

constexpr int kCombineThreads = 256;

}  // namespace

template struct SpecForms<MoeCombineSpec>;

Expected<void> Family<MoeCombineSpec>::validate(const MoeCombineSpec& s) {
  if (s.top_k < 1 || s.top_k > 32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_combine needs top_k from 1 to 32, got {}", s.top_k));
  if (s.hidden < 8 || s.hidden % 8 != 0 || s.hidden > kMaxDimension)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("moe_combine: hidden must be a positive multiple of 8 up to {}, got {}", kMaxDimension,
                            s.hidden));
  if (s.out != DType::bf16 && s.out != DType::f32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("moe_combine output must be bf16 or f32, not {}", name(s.out)));
  if (s.gradient && s.out != DType::f32)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "moe_combine: the weights' gradient is f32 (out=f32)");
  if (s.dispatch && (s.gradient || s.out != DType::bf16))
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "moe_combine: the dispatch copies bf16 rows (out=bf16, no gradient)");
  return {};
}

RenderedKernel Family<MoeCombineSpec>::render(const MoeCombineSpec& s) {
  return assemble(canonical(s), {.entry_point = s.dispatch ? "kjit_moe_dispatch" : "kjit_moe_combine",
                                 .threads = kCombineThreads,
                                 .templates = {"routing/moe_routing.cuh"},
                                 .config = fmt::format("kjit::CombineConfig<{}, {}LL, {}, {}, {}>", s.top_k, s.hidden,
                                                       s.out == DType::f32, s.gradient, s.dispatch),
                                 .params_type = s.dispatch ? "kjit_moe_dispatch_params" : "kjit_moe_combine_params",
                                 .body = s.dispatch ? "kjit::moe_dispatch" : "kjit::moe_combine",
                                 .signals_dependents_early = true});
}

LaunchGeometry moe_combine_geometry(const MoeCombineSpec& spec, int64_t tokens) {
  LaunchGeometry g;
  g.block_x = kCombineThreads;
  if (spec.gradient) {
    const int64_t warps = kCombineThreads / 32, pairs = tokens * spec.top_k;
    g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>((pairs + warps - 1) / warps, 1, 0x7fffffff));
    return g;
  }
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>(tokens, 1, 0x7fffffff));
  g.grid_y = static_cast<uint32_t>((spec.hidden + kCombineThreads * 8 - 1) / (kCombineThreads * 8));
  return g;
}

}  // namespace kjit::codegen
