// The JSON fields every grouped GEMM problem has, read the same way by the
// bf16, FP8 and mixed families, a configuration's fields (the weight-gradient
// family's too), and the GEMM enums' sizes for SpecReader (the
// weight-gradient family reads GemmKernel too).
#pragma once

#include <algorithm>
#include <cstdint>

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

// A configuration's kernel, tile ([m, n], or [m, n, k] where the spec has tile_k) and stages, and its cluster
// and cluster axis where the spec has them, as cache metadata names them. The numbers are clamped, not checked:
// validate bounds them before any narrowing matters.
template <class Spec>
Expected<void> read_gemm_configuration(SpecReader& reader, Spec& s) {
  constexpr bool kTileK = requires { s.tile_k; };
  s.kernel = KJIT_TRY(reader.enumeration<decltype(s.kernel)>("kernel"));
  const auto tile = KJIT_TRY(reader.small_integers(
      "tile", kTileK ? 3 : 2, kTileK ? "[tile_m, tile_n, tile_k] with 'kernel'" : "[tile_m, tile_n] with 'kernel'"));
  s.tile_m = tile[0];
  s.tile_n = tile[1];
  if constexpr (kTileK) s.tile_k = tile[2];
  s.stages = static_cast<int>(std::clamp<int64_t>(KJIT_TRY(reader.integer_or("stages", 0)), -1, 64));
  if constexpr (requires { s.cluster; })
    s.cluster = static_cast<int>(std::clamp<int64_t>(KJIT_TRY(reader.integer_or("cluster", 1)), -1, 64));
  if constexpr (requires { s.cluster_axis; })
    if (reader.has("cluster_axis")) s.cluster_axis = KJIT_TRY(reader.enumeration<ClusterAxis>("cluster_axis"));
  return {};
}

}  // namespace kjit::codegen
