// The MX scale-layout family: scale bytes LINEAR <-> SWIZZLED_128X4 for a
// stack of experts with uniform rows, or with device expert offsets
// (kjit.h's kjit_scale_layout_desc). Home: this header and
// codegen/src/families/mx_scale_layout.cpp; device code in
// templates/mx/mx_scale_layout.cuh; ABI block templates/abi/mx_scale_layout_params.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kjit/codegen/families/mx_dequant.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The most experts a conversion with offsets takes: each block keeps every
// expert's rows and swizzled start in shared memory.
inline constexpr int64_t kScaleLayoutMaxOffsetExperts = 1024;

// The shape key is the scale column count (compiled in: the swizzle divides by
// its tile count); experts, rows, the offsets and the pad byte are run-time.
struct MxScaleLayoutSpec {
  MxScaleLayout from = MxScaleLayout::linear;
  MxScaleLayout to = MxScaleLayout::swizzled_128x4;
  int64_t scale_cols = 0;
  bool with_offsets = false;  // rows per expert from device offsets (else uniform)
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;  // with_offsets only

  bool operator==(const MxScaleLayoutSpec&) const = default;
};

template <>
struct Family<MxScaleLayoutSpec> : SpecForms<MxScaleLayoutSpec> {
  static constexpr std::string_view op = "mx_scale_layout";
  static constexpr auto fields = std::tuple{
      field("from", &MxScaleLayoutSpec::from), field("to", &MxScaleLayoutSpec::to),
      field("scale_cols", &MxScaleLayoutSpec::scale_cols).range(1, kMaxDimension),
      // Given: rows per expert from device offsets of this convention; absent: uniform.
      field("offsets", &MxScaleLayoutSpec::offsets)
          .present_if(&MxScaleLayoutSpec::with_offsets)
          .text([](const MxScaleLayoutSpec& s) {
            return std::string(" rows=").append(s.with_offsets ? name(s.offsets) : std::string_view("uniform"));
          })};
  static Expected<void> validate(const MxScaleLayoutSpec& s);
  static Expected<void> supported_on(const MxScaleLayoutSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const MxScaleLayoutSpec& s);
  static std::vector<MxScaleLayoutSpec> kernels_for_target(const MxScaleLayoutSpec& s, const ArchInfo&) {
    return {s};
  }
};

// Grid for a conversion that walks `swizzled_words` 4-byte words of the
// swizzled side (with offsets: the worst case); threads loop past the grid.
LaunchGeometry mx_scale_layout_geometry(int64_t swizzled_words);

}  // namespace kjit::codegen
