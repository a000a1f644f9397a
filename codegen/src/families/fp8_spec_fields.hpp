// The spec readers' enum size of the fp8 quantize scale format, shared by the
// families that read it (fp8_quantize, moe_activation).
#pragma once

#include "kjit/codegen/families/fp8_quantize.hpp"
#include "../spec_forms.hpp"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<QuantScaleFormat> = 2;

}  // namespace kjit::codegen
