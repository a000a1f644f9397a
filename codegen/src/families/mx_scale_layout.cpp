// The MX scale-layout family: spec forms, invariants, recipe and grid.
#include "kjit/codegen/families/mx_scale_layout.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

std::string Family<MxScaleLayoutSpec>::canonical(const MxScaleLayoutSpec& s) {
  return fmt::format("mx_scale_layout from={} to={} scale_cols={} rows={}", name(s.from), name(s.to), s.scale_cols,
                     s.with_offsets ? name(s.offsets) : std::string_view("uniform"));
}

nlohmann::json Family<MxScaleLayoutSpec>::to_json(const MxScaleLayoutSpec& s) {
  nlohmann::json j = {{"op", op}, {"from", name(s.from)}, {"to", name(s.to)}, {"scale_cols", s.scale_cols}};
  if (s.with_offsets) j["offsets"] = name(s.offsets);
  return j;
}

Expected<MxScaleLayoutSpec> Family<MxScaleLayoutSpec>::from_json(SpecReader& reader) {
  MxScaleLayoutSpec s;
  s.from = KJIT_TRY(reader.enumeration<MxScaleLayout>("from"));
  s.to = KJIT_TRY(reader.enumeration<MxScaleLayout>("to"));
  s.scale_cols = KJIT_TRY(reader.integer("scale_cols"));
  s.with_offsets = reader.has("offsets");
  if (s.with_offsets) s.offsets = KJIT_TRY(reader.enumeration<OffsetsConvention>("offsets"));
  return s;
}

const std::vector<FieldRule>& Family<MxScaleLayoutSpec>::schema() {
  static const std::vector<FieldRule> rules{text_field("from", {"linear", "swizzled_128x4"}),
                                            text_field("to", {"linear", "swizzled_128x4"}),
                                            integer_field("scale_cols", 1, kMaxDimension),
                                            text_field("offsets", {"cumulative_end", "with_leading_zero"}, false)};
  return rules;
}

void Family<MxScaleLayoutSpec>::hash(const MxScaleLayoutSpec& s, HashMixer& h) {
  h.mix(static_cast<uint64_t>(s.scale_cols));
  h.mix(static_cast<uint64_t>(s.from) | static_cast<uint64_t>(s.to) << 8 |
        static_cast<uint64_t>(s.with_offsets) << 16 | static_cast<uint64_t>(s.offsets) << 24);
}

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
                   .body = "kjit::mx_scale_layout"});
}

LaunchGeometry mx_scale_layout_geometry(int64_t swizzled_words) {
  LaunchGeometry g;
  g.block_x = kThreads;
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>((swizzled_words + kThreads - 1) / kThreads, 1, kMaxBlocks));
  return g;
}

}  // namespace kjit::codegen
