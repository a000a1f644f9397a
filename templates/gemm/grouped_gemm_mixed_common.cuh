// What the mixed-input (W8A16) grouped GEMM kernels share: the problem's
// constants, where a weight's scale lives, and the conversion of fp8 codes
// to the bf16 the tensor cores multiply, which is kjit's dequant's:
//   w = code x scale (fp32; DIVIDE multiplies by the fp32 reciprocal),
//   rounded to nearest-even bf16.
// Scales index the stored tensor [E, R, C]: (R, C) = (N, K) for [E, N, K]
// weights and (K, N) for [E, K, N] (the same storage read for dX = dY . W).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "../common/fp8_convert.cuh"
#include "grouped_gemm_common.cuh"

namespace kjit {

enum class MixedScale { block, row, tensor };

template <long long kN_, long long kK_, int kExperts_, bool kWeightsKN_, bool kOffsetsWithZero_, bool kRowScale_,
          bool kOutF32_, Fp8Format kWeightFormat_, MixedScale kScale_, bool kDivide_>
struct MixedGemmProblem : GemmProblem<kN_, kK_, kExperts_, kWeightsKN_, kOffsetsWithZero_, kRowScale_, kOutF32_> {
  static constexpr Fp8Format kWeightFormat = kWeightFormat_;
  static constexpr MixedScale kScale = kScale_;
  static constexpr bool kDivide = kDivide_;
  // The stored tensor's rows and columns.
  static constexpr long long kStoredRows = kWeightsKN_ ? kK_ : kN_, kStoredCols = kWeightsKN_ ? kN_ : kK_;
  static constexpr long long kScaleRows = (kStoredRows + KJIT_MIXED_SCALE_BLOCK - 1) / KJIT_MIXED_SCALE_BLOCK;
  static constexpr long long kScaleCols = (kStoredCols + KJIT_MIXED_SCALE_BLOCK - 1) / KJIT_MIXED_SCALE_BLOCK;
  static_assert(kN_ % 16 == 0 && kK_ % 16 == 0, "the host admits only N and K divisible by 16");
};

// The multiplier of `expert`'s stored element (row, col): its scale, or the
// scale's reciprocal under the DIVIDE convention. Rows and columns past the
// stored tensor's (a tile's edge) read no scale.
template <class Cfg>
__device__ __forceinline__ float weight_multiplier(const float* scales, int expert, long long row, long long col) {
  float s;
  if constexpr (Cfg::kScale == MixedScale::block) {
    if (row >= Cfg::kStoredRows || col >= Cfg::kStoredCols) return 0.0f;
    s = scales[(expert * Cfg::kScaleRows + row / KJIT_MIXED_SCALE_BLOCK) * Cfg::kScaleCols +
               col / KJIT_MIXED_SCALE_BLOCK];
  } else if constexpr (Cfg::kScale == MixedScale::row) {
    if (row >= Cfg::kStoredRows) return 0.0f;
    s = scales[expert * Cfg::kStoredRows + row];
  } else {
    s = scales[expert];
  }
  if constexpr (Cfg::kDivide) s = __frcp_rn(s);
  return s;
}

// Two codes (low byte first) times their multipliers, as a bf16 pair (first in the low half).
template <class Cfg>
__device__ __forceinline__ unsigned convert_weight_pair(unsigned short codes, float first_scale, float second_scale) {
  float first, second;
  decode_fp8x2<Cfg::kWeightFormat>(codes, first, second);
  return cvt_rn_bf16x2_f32(first * first_scale, second * second_scale);
}

}  // namespace kjit
