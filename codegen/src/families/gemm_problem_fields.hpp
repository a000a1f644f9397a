// The GEMM enums' sizes for the spec reader, shared by the families that read
// them (the bf16 and weight-gradient families read GemmKernel).
#pragma once

#include "../spec_forms.hpp"
#include "kjit/codegen/families/grouped_gemm.hpp"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<GemmKernel> = 5;
template <>
inline constexpr int kEnumCount<ClusterAxis> = 2;

}  // namespace kjit::codegen
