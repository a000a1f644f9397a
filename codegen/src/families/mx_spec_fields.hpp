// The spec readers' enum sizes of the MX vocabulary (mx_formats.hpp), shared
// by the families that read them (mx_quantize, mx_dequant, mx_scale_layout).
#pragma once

#include "kjit/codegen/families/mx_formats.hpp"
#include "../spec_forms.hpp"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<MxFormat> = 3;
template <>
inline constexpr int kEnumCount<MxScaleLayout> = 2;

}  // namespace kjit::codegen
