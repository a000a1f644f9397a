// The MX dequant family: block-scaled FP4/FP8 weights (NVFP4, MXFP4, MXFP8;
// kjit.h's kjit_mx_dequant_desc states every formula) -> bf16/f16/f32, with
// linear or swizzled 128x4 scales. Home: this header and
// codegen/src/families/mx_dequant.cpp; device code in
// templates/mx/mx_dequant.cuh; ABI block templates/abi/mx_dequant_params.h.
// The format and scale-layout vocabulary is shared with mx_scale_layout.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/families/fp8_dequant.hpp"
#include "kjit/codegen/families/mx_formats.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The shape key is K (compiled in: row and scale-column indices divide by
// constants); rows, experts, strides and the expert ids are run-time arguments.
struct MxDequantSpec {
  MxFormat format = MxFormat::mxfp4;
  DType element = DType::f8_e4m3fn;  // MXFP8 only (e4m3fn or e5m2); FP4 formats keep the default
  DType out = DType::bf16;
  int64_t k = 0;
  MxScaleLayout scale_layout = MxScaleLayout::linear;
  ScaleConvention convention = ScaleConvention::multiply;  // NVFP4's global scale; MX formats keep the default
  int vec = 32;                   // elements per thread access; divides k
  bool selected_experts = false;  // the "only these experts" form

  bool operator==(const MxDequantSpec&) const = default;
};

// The access width (in elements) a dequant of `format` uses: the widest that
// divides k and every alignment in `byte_alignments` (input bytes: address
// and row stride) and `out_alignments` (output elements: address and row
// stride), at most one 16-byte store of output (8 bf16/f16, 4 f32: whole
// sectors per warp store; a spec may still name up to 16 input bytes). At least 2
// for FP4 (one packed byte); 0 when no width fits (an FP4 output that is not
// aligned to two elements). Used by ops and manifests alike.
int mx_dequant_vector(MxFormat format, DType out, int64_t k, std::initializer_list<int64_t> byte_alignments = {},
                      std::initializer_list<int64_t> out_alignments = {});

template <>
struct Family<MxDequantSpec> : SpecForms<MxDequantSpec> {
  static constexpr std::string_view op = "mx_dequant";
  // A field the format has no use for is not read, so the reader refuses it.
  static constexpr auto fields = std::tuple_cat(
      std::tuple{
          field("format", &MxDequantSpec::format),
          field("element", &MxDequantSpec::element)
              .when([](const MxDequantSpec& s) { return s.format == MxFormat::mxfp8; })
              .prefix(":")
              .only(DType::f8_e4m3fn, DType::f8_e5m2),
          field("convention", &MxDequantSpec::convention).when([](const MxDequantSpec& s) {
            return s.format == MxFormat::nvfp4;
          }),
          field("out", &MxDequantSpec::out).only(DType::bf16, DType::f16, DType::f32),
          field("k", &MxDequantSpec::k).range(16, kMaxDimension),
          field("scale_layout", &MxDequantSpec::scale_layout).key("scales")},
      dequant_access_fields<MxDequantSpec>(
          [](const MxDequantSpec& s) { return s.k > 0 ? mx_dequant_vector(s.format, s.out, s.k) : 2; }, 32));
  static Expected<void> validate(const MxDequantSpec& s);
  static Expected<void> supported_on(const MxDequantSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const MxDequantSpec& s);
  static std::vector<MxDequantSpec> kernels_for_target(const MxDequantSpec& s, const ArchInfo&) { return {s}; }
};

// Grid for a dequant of `rows` rows into `output_slots` experts.
LaunchGeometry mx_dequant_geometry(const MxDequantSpec& spec, int64_t rows, int64_t output_slots);

}  // namespace kjit::codegen
