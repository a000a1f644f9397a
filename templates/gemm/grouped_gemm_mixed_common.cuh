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

// The same conversion in full-rate integer and fp32 instructions (the
// hardware's f16 -> f32 conversion runs at a quarter of the rate and bounded
// the SM90 kernel): a code's sign, exponent and mantissa bits moved into an
// fp32's make w x 2^-kCodeBias exactly (e4m3's subnormals become fp32
// subnormals), and multiplying that by scale x 2^kCodeBias (`biased`) rounds
// the same real product w x scale once, as convert_weight_pair does. Exact
// only for finite codes and finite biased scales: fast_conversion_exact says
// when the caller may take it.
template <class Cfg>
struct FastWeightConversion {
  static constexpr bool kE4m3 = Cfg::kWeightFormat == Fp8Format::e4m3fn;
  static constexpr int kCodeBias = kE4m3 ? 120 : 112;  // 127 minus the code's exponent bias (7 or 15)
  static constexpr int kShift = kE4m3 ? 20 : 21;       // the code's mantissa bits (3 or 2) under fp32's 23
  static constexpr float kBiasFactor = kE4m3 ? 0x1p120f : 0x1p112f;
  // Bits set in a 16-bit pair exactly where a code is NaN (e4m3fn: 0x7F) or inf/NaN (e5m2: exponent 31).
  static __device__ __forceinline__ unsigned special_codes(unsigned codes) {
    return kE4m3 ? ((codes & 0x7F7Fu) + 0x0101u) & 0x8080u : ((codes & 0x7C7Cu) + 0x0404u) & 0x8080u;
  }
  static __device__ __forceinline__ unsigned pair(unsigned codes, float first_biased, float second_biased) {
    const unsigned first = (codes << 24 & 0x80000000u) | (codes << kShift & 0x7Fu << kShift);
    const unsigned second = (codes << 16 & 0x80000000u) | (codes << (kShift - 8) & 0x7Fu << kShift);
    return cvt_rn_bf16x2_f32(__uint_as_float(first) * first_biased, __uint_as_float(second) * second_biased);
  }
};

}  // namespace kjit
