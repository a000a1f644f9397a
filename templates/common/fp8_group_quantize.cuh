// One 128-column group of bf16 values -> e4m3fn codes and its scale, the
// arithmetic kjit.h states for kjit_fp8_quantize (mirrored by
// runtime/include/kjit/reference/fp8_quantize.hpp). Shared by the fp8
// quantizer and the MoE activation's FP8 output, so the two write the same
// bits for the same bf16 values.
//
// A team of kTeam consecutive lanes owns a group, 16 values per lane. The
// amax is a max over the bf16 magnitudes' bits (monotonic for non-negative
// values; inf and NaN compare above every finite value, so a non-finite group
// is one comparison), reduced with log2(kTeam) shuffles.
#pragma once

#include "fp8_convert.cuh"

namespace kjit {

// amax / 448 in fp32 (IEEE division), or that rounded up to a power of two.
template <bool kUe8m0>
__device__ __forceinline__ float quantize_scale(float amax) {
  const float scale = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
  if constexpr (!kUe8m0) {
    return scale;
  } else {
    const unsigned int bits = __float_as_uint(scale);
    return __uint_as_float((bits & 0x007fffffu) ? (bits & 0x7f800000u) + 0x00800000u : bits);
  }
}

// The largest bf16 magnitude (as its 16 bits) over the team's words (two bf16
// each, the first in the low half). Every lane of the warp must call it (the
// shuffles take them all).
template <int kTeam, int kWords>
__device__ __forceinline__ unsigned int group_magnitude_bits(const unsigned int (&words)[kWords]) {
  unsigned int magnitude = 0;  // two bf16 magnitudes per word, compared as unsigned halves
#pragma unroll
  for (int i = 0; i < kWords; ++i) magnitude = __vmaxu2(magnitude, words[i] & 0x7fff7fffu);
  magnitude = max(magnitude & 0xffffu, magnitude >> 16);
#pragma unroll
  for (int offset = kTeam / 2; offset > 0; offset /= 2)
    magnitude = max(magnitude, __shfl_xor_sync(0xffffffffu, magnitude, offset));
  return magnitude;
}

// A lane's 16 values (8 words of bf16 pairs) -> 16 codes (the first in the
// lowest byte), given the group's magnitude bits; `scale` receives the group's
// scale (NaN and every code NaN when the group holds inf or NaN).
template <bool kUe8m0>
__device__ __forceinline__ uint4 quantize_group16(const unsigned int (&words)[8], unsigned int magnitude,
                                                  float& scale) {
  if (magnitude >= 0x7f80u) {  // inf or NaN in the group
    scale = __uint_as_float(0x7fc00000u);
    return make_uint4(0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu);
  }
  scale = quantize_scale<kUe8m0>(__uint_as_float(magnitude << 16));
  // x / scale, one IEEE division; a UE8M0 scale is a power of two in
  // [2^-42, 2^120], whose reciprocal is exact, and x * (1 / scale) rounds the
  // same real number as x / scale: the same bits, without the divisions.
  const float inverse = __frcp_rn(scale);
  const float divisor = scale;
  auto scaled = [&](float value) { return kUe8m0 ? __fmul_rn(value, inverse) : __fdiv_rn(value, divisor); };
  unsigned int packed[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned int low = words[2 * i], high = words[2 * i + 1];
    packed[i] = cvt_rn_satfinite_e4m3x2_f32(scaled(__uint_as_float(low << 16)),
                                            scaled(__uint_as_float(low & 0xffff0000u))) |
                static_cast<unsigned int>(cvt_rn_satfinite_e4m3x2_f32(scaled(__uint_as_float(high << 16)),
                                                                      scaled(__uint_as_float(high & 0xffff0000u))))
                    << 16;
  }
  return make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

}  // namespace kjit
