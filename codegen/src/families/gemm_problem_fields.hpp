// The JSON fields every grouped GEMM problem has, read the same way by the
// bf16 and FP8 families (grouped_gemm.cpp, grouped_gemm_fp8.cpp), and the
// GEMM enums' sizes for SpecReader (the weight-gradient family reads
// GemmKernel too).
#pragma once

#include "../spec_reader.hpp"
#include "kjit/codegen/families/grouped_gemm.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

template <>
inline constexpr int kEnumCount<GemmKernel> = 4;
template <>
inline constexpr int kEnumCount<ClusterAxis> = 2;

template <class Spec>
Expected<void> read_gemm_problem(SpecReader& reader, Spec& s) {
  s.out = KJIT_TRY(reader.enumeration<DType>("out"));
  s.offsets = KJIT_TRY(reader.enumeration<OffsetsConvention>("offsets"));
  s.n = KJIT_TRY(reader.integer("n"));
  s.k = KJIT_TRY(reader.integer("k"));
  s.experts = KJIT_TRY(reader.integer("experts"));
  s.row_scale = KJIT_TRY(reader.boolean_or("row_scale", false));
  return {};
}

}  // namespace kjit::codegen
