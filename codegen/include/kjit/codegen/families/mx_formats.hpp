// The MX families' shared vocabulary (mx_quantize, mx_dequant,
// mx_scale_layout): the block-scaled formats and where their scale bytes
// live. kjit.h's kjit_block_format and kjit_scale_layout state the formulas;
// the names are defined in codegen/src/families/mx_dequant.cpp.
#pragma once

#include <cstdint>
#include <string_view>

namespace kjit::codegen {

enum class MxFormat : uint8_t { nvfp4, mxfp4, mxfp8 };
enum class MxScaleLayout : uint8_t { linear, swizzled_128x4 };
std::string_view name(MxFormat f);
std::string_view name(MxScaleLayout l);

// Elements per scale byte: 16 (NVFP4) or 32 (MX).
int64_t mx_block(MxFormat f);
// FP4 formats pack two elements per byte.
constexpr bool is_fp4(MxFormat f) { return f != MxFormat::mxfp8; }

}  // namespace kjit::codegen
