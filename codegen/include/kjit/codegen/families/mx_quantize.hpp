// The MX quantize family: bf16 [E, rows, K] -> block-scaled NVFP4, MXFP4 or
// MXFP8 (packed e2m1 pairs or fp8 codes, scale bytes in a linear or swizzled
// 128x4 layout, and for NVFP4 a per-expert fp32 global scale, given or
// computed on the device). The arithmetic is kjit/reference/fp4_mx.hpp's,
// bit for bit; docs/formats.md states it.
// Home: this header and codegen/src/families/mx_quantize.cpp; device code in
// templates/quantize/mx_quantize.cuh (encoders in templates/common/mx_encode.cuh);
// ABI block templates/abi/mx_quantize_params.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/families/mx_formats.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The output format (mx_formats.hpp) and its element: NVFP4 and MXFP4 hold e2m1, MXFP8 e4m3fn or e5m2.
enum class MxElement : uint8_t { e2m1, f8_e4m3fn, f8_e5m2 };
// NVFP4's global scale: read (given) or computed per expert on the device; MX formats have none.
enum class GlobalScaleMode : uint8_t { none, given, compute };
std::string_view name(MxElement e);
std::string_view name(GlobalScaleMode m);

// K is compiled in (row and block indices divide by constants); experts, rows
// and the input row stride are run-time arguments.
struct MxQuantizeSpec {
  MxFormat format = MxFormat::nvfp4;
  MxElement element = MxElement::e2m1;
  int64_t k = 0;
  MxScaleLayout scale_layout = MxScaleLayout::linear;
  GlobalScaleMode global_scale = GlobalScaleMode::given;     // NVFP4: given or compute; MX: none
  ScaleConvention convention = ScaleConvention::multiply;  // NVFP4 only (MX: multiply, not part of the key's text)
  bool operator==(const MxQuantizeSpec&) const = default;
};

template <>
struct Family<MxQuantizeSpec> : SpecForms<MxQuantizeSpec> {
  static constexpr std::string_view op = "mx_quantize";
  static constexpr auto fields = std::tuple{
      fixed_text(" in=bf16"), field("format", &MxQuantizeSpec::format),
      // The FP4 formats' element can only be e2m1: it may be left out there.
      field("element", &MxQuantizeSpec::element).optional_if([](const MxQuantizeSpec& s) { return is_fp4(s.format); }),
      field("k", &MxQuantizeSpec::k).range(16, kMaxDimension),
      field("scale_layout", &MxQuantizeSpec::scale_layout).key("scales"),
      // NVFP4 needs its global scale and convention; the MX formats have neither (global scale none).
      field("global_scale", &MxQuantizeSpec::global_scale)
          .when([](const MxQuantizeSpec& s) { return s.format == MxFormat::nvfp4; })
          .fallback([](const MxQuantizeSpec&) { return GlobalScaleMode::none; })
          .key("global")
          .only(GlobalScaleMode::given, GlobalScaleMode::compute),
      field("convention", &MxQuantizeSpec::convention).when([](const MxQuantizeSpec& s) {
        return s.format == MxFormat::nvfp4;
      })};
  static Expected<void> validate(const MxQuantizeSpec& s);
  static Expected<void> supported_on(const MxQuantizeSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const MxQuantizeSpec& s);
  static std::vector<MxQuantizeSpec> kernels_for_target(const MxQuantizeSpec& s, const ArchInfo&) { return {s}; }
};

// The passes of one kernel (kjit_mx_quantize_params.phase): with a computed
// global scale, amax (after a memset of global_scales) then finalize, then
// quantize; otherwise quantize alone. Grid: x over an expert's 16-byte chunks
// (linear scales) or its 128x4 scale tiles (swizzled), y over experts
// (finalize: x over experts).
LaunchGeometry mx_quantize_geometry(const MxQuantizeSpec& spec, int64_t experts, int64_t rows, bool finalize);
// The most rows per expert one launch takes for `spec` (the grid's x limit).
int64_t mx_quantize_max_rows(const MxQuantizeSpec& spec);

}  // namespace kjit::codegen
