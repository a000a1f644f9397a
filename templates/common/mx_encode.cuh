// Encoders of the block-scaled "MX" formats on the device (NVFP4, MXFP4,
// MXFP8): fp32 -> e2m1, fp8 codes, and the OCP MX shared exponent of a block.
// Each is bit-exact with its CPU twin in runtime/include/kjit/reference/fp4_mx.hpp
// (encode_e2m1_satfinite, encode_e5m2_satfinite, mx_scale_byte) and
// fp8_quantize.hpp (encode_e4m3fn_satfinite); docs/formats.md states them.
#pragma once

#include "fp8_convert.cuh"
#include "mx_formats.cuh"

namespace kjit {

// fp32 -> e2m1 nibble, round to nearest even, saturating to +-6 (inf too),
// the sign of zero kept, NaN -> +0 (encode_e2m1_satfinite). The grid is 0,
// 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7), so the code is the number of decision
// points |f| has passed: the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.
// A value exactly on a midpoint goes to the neighbour with the even code:
// the comparison is strict (>) where the lower neighbour's code is even
// (0.25 -> 0, 1.25 -> 1, 2.5 -> 2, 5 -> 4) and inclusive (>=) where the upper
// one's is (0.75 -> 1, 1.75 -> 2, 3.5 -> 4). NaN passes no comparison. One
// code path on every arch: sm_90a has no cvt to e2m1, and the compares are
// exact by construction (every midpoint is an fp32).
__device__ __forceinline__ unsigned int encode_e2m1_satfinite(float f) {
  const float a = fabsf(f);
  const unsigned int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) +
                            (a > 5.0f);
  const unsigned int sign = (__float_as_uint(f) >> 28) & 0x8u;
  return a == a ? sign | code : 0u;  // a != a: NaN, which has no code
}

// Round two floats to nearest-even e5m2, saturating finite values beyond
// +-57344 and infinities to +-57344 (NaN stays NaN); `first` in the low byte.
__device__ __forceinline__ unsigned short cvt_rn_satfinite_e5m2x2_f32(float first, float second) {
  unsigned short out;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(second), "f"(first));
  return out;
}

// One fp32 -> e4m3fn code, nearest even, saturating at 448 (NaN -> 0x7F).
__device__ __forceinline__ unsigned int encode_e4m3fn_satfinite(float f) {
  return cvt_rn_satfinite_e4m3x2_f32(f, 0.0f) & 0xFFu;
}

// The exact fp32 value of an e4m3fn code (through f16, which holds every e4m3 value).
__device__ __forceinline__ float decode_e4m3fn(unsigned int code) {
  float value, unused;
  decode_fp8x2<Fp8Format::e4m3fn>(static_cast<unsigned short>(code), value, unused);
  return value;
}

// The OCP MX shared scale byte of a finite block from its amax given as bf16
// magnitude bits (below 0x7F80): E = floor(log2 amax) - emax, clamped to
// [-127, 127], stored as E + 127. For a normal amax floor(log2) is the biased
// exponent field minus 127, so the byte is field - emax; a zero or subnormal
// amax (field 0) and anything below 2^(emax - 127) clamp to byte 0 (2^-127),
// and the field (at most 254) never reaches the upper clamp.
__device__ __forceinline__ unsigned int mx_scale_byte(unsigned int bf16_magnitude, int emax) {
  return static_cast<unsigned int>(max(static_cast<int>(bf16_magnitude >> 7) - emax, 0));
}

// 1 / X for the UE8M0 scale X = 2^(byte - 127), byte in [0, 254]: 2^(127 - byte),
// exact (2^-127 is an fp32 subnormal, built by decode_ue8m0). x * (1 / X) and
// x / X are the same real number rounded once, so they give the same bits.
__device__ __forceinline__ float ue8m0_reciprocal(unsigned int byte) { return decode_ue8m0(254u - byte); }

}  // namespace kjit
