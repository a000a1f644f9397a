// The MX scale-layout family: invariants, recipe and grid.
#include "kjit/codegen/families/mx_scale_layout.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "mx_spec_fields.hpp"

namespace kjit::codegen {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any GPU; each thread then loops over several words
// (and a launch with offsets scans them once per block, not once per word).
constexpr int64_t kMaxBlocks = 4096;

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

}  // namespace

template struct SpecForms<MxScaleLayoutSpec>;

Expected<void> Family<MxScaleLayoutSpec>::validate(const MxScaleLayoutSpec& s) {
  if (s.from == s.to)
    return invalid(fmt::format("mx_scale_layout: from and to are both {}; a conversion needs the other layout",
                               name(s.from)));
  if (s.scale_cols < 1 || s.scale_cols > kMaxDimension)
    return invalid(fmt::format("mx_scale_layout: scale_cols must be 1 to {}, got {}", kMaxDimension, s.scale_cols));
  if (!s.with_offsets && s.offsets != OffsetsConvention::cumulative_end)
    return invalid("mx_scale_layout: an offsets convention without offsets");
  return {};
}

Expected<void> Family<MxScaleLayoutSpec>::supported_on(const MxScaleLayoutSpec&, const ArchInfo&) { return {}; }

RenderedKernel Family<MxScaleLayoutSpec>::render(const MxScaleLayoutSpec& s) {
  const int offsets = !s.with_offsets ? 0 : s.offsets == OffsetsConvention::cumulative_end ? 1 : 2;
  return assemble(canonical(s),
                  {.entry_point = "kjit_mx_scale_layout",
                   .threads = kThreads,
                   .templates = {"mx/mx_scale_layout.cuh"},
                   .config = fmt::format("kjit::ScaleLayoutConfig<{}, {}LL, {}, {}, {}>",
                                         s.to == MxScaleLayout::swizzled_128x4, s.scale_cols, offsets, kThreads,
                                         kScaleLayoutMaxOffsetExperts),
                   .params_type = "kjit_mx_scale_layout_params",
                   .body = "kjit::mx_scale_layout",
                   .signals_dependents_early = true});
}

LaunchGeometry mx_scale_layout_geometry(int64_t swizzled_words) {
  LaunchGeometry g;
  g.block_x = kThreads;
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>((swizzled_words + kThreads - 1) / kThreads, 1, kMaxBlocks));
  return g;
}

}  // namespace kjit::codegen
