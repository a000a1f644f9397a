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
// the sign of zero kept, NaN -> +0 (encode_e2m1_satfinite). One exact code
// path on every arch (sm_90a has no cvt to e2m1), branch-free (both ranges
// are computed and one is selected: a branch per element diverged):
//  - |f| < 1: e2m1's subnormal step is 0.5, so the code is |f| * 2 rounded to
//    the nearest even integer (0, 1 or 2 = 1.0's code): one fma with 2^23,
//    which rounds |f| * 2 + 2^23 once, to an integer n whose bits are
//    0x4B000000 + n.
//  - |f| >= 1: e2m1 is 2^E * (1 + m / 2), E in 0..2, which is fp32's format
//    cut to one mantissa bit: round fp32's bits at bit 22 to nearest even
//    (adding 0x1FFFFF plus the kept bit carries into the exponent exactly when
//    the discarded bits exceed half, or equal it with the kept bit odd); the
//    bits from 22 up are then 2 * (E + 127) + m, and the code 2 * (E + 1) + m,
//    saturated to 7 (6.0; infinity's bits give 258).
// Ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
__device__ __forceinline__ unsigned int encode_e2m1_satfinite(float f) {
  const unsigned int bits = __float_as_uint(f);
  const unsigned int magnitude = bits & 0x7fffffffu;
  const unsigned int below_one = __float_as_uint(__fmaf_rn(__uint_as_float(magnitude), 2.0f, 0x1p23f)) - 0x4B000000u;
  const unsigned int rounded = magnitude + 0x1FFFFFu + ((magnitude >> 22) & 1u);
  const unsigned int code = magnitude < 0x3f800000u ? below_one : min((rounded >> 22) - 252u, 7u);
  return magnitude > 0x7f800000u ? 0u : ((bits >> 28) & 0x8u) | code;  // NaN has no code
}

// encode_e2m1_satfinite in fewer operations, for a finite y that lies more
// than 2^-24 from the two ties below 1 (0.25, 0.75) unless exactly on one:
// s = y * 2^-126 moves e2m1's subnormal boundary (1.0) onto fp32's (2^-126),
// where fp32's subnormal step 2^-149 is y's step 2^-23, so one rounding of
// s's bits at bit 22 covers both ranges (the same rounding as above; the code
// is then bits 22 and up). For |y| >= 1 the multiply is exact. Below 1 it
// rounds y to a multiple of 2^-23 first: that second rounding can only differ
// from rounding y itself when it moves y onto or across a tie, i.e. when y is
// within 2^-24 of 0.25 or 0.75 and not on it. For NVFP4's fast path
// (nvfp4_codes), which makes sure of that with `tie_gap`: 0 when s's bits
// below bit 22 are within 16 of half (0x200000), i.e. s is within 16 of its
// last places of a rounding tie of this encoder ("near"), else non-zero (the
// caller takes the minimum over a chunk). Those ties are exactly e2m1's
// boundaries: for |y| >= 1 (s normal, its ulps y's) the fractions .25 and
// .75 of a binade (1.25, 1.75, 2.5, 3.5, 5, and 7 past saturation,
// harmlessly); below 1 (s subnormal, linear: one unit is 2^-23 of y, at least
// 2 of y's ulps there) 0.25 and 0.75. Zero, tiny values and infinity are
// never near. A y that is not near is more than 15.5 * 2^-23 from 0.25 and
// 0.75, which keeps the condition above.
// The sign of zero survives the underflow.
__device__ __forceinline__ unsigned int encode_e2m1_clear_of_ties(float y, unsigned int& tie_gap) {
  const unsigned int bits = __float_as_uint(__fmul_rn(y, 0x1p-126f));
  const unsigned int magnitude = bits & 0x7fffffffu;
  // (magnitude + 16 - 0x200000) mod 2^22 in [0, 31] <=> near; bits above 21 masked off.
  tie_gap = (magnitude + (16u - 0x200000u)) & 0x3FFFE0u;
  const unsigned int rounded = magnitude + 0x1FFFFFu + ((magnitude >> 22) & 1u);
  return ((bits >> 28) & 0x8u) | min(rounded >> 22, 7u);
}

// MXFP4's codes, two at a time. For the block's scale byte s (E = s - 127),
// mxfp4_prescale(s) = 2^(113 - s) = 2^-E * 2^-14, exact for every s in
// [0, 254] (a normal float up to s = 239, a subnormal power of two above).
// Two elements x * 2^(113 - s), rounded once to f16 (cvt.rn.f16x2.f32), give
// e2m1x2_of_prescaled_f16x2 the byte of their two codes (first in the low
// nibble): y = x / 2^E is below 8 in magnitude (the OCP scale rule), so y *
// 2^-14 is an f16 whose 10-bit significand holds bf16's 8 exactly for |y| >=
// 2^-3 (smaller y may round, to code 0 either way), and f16's subnormal step
// 2^-24 is y's 2^-10: like encode_e2m1_clear_of_ties one level down, rounding
// the f16 bits at bit 9 to nearest even gives 2 * (E + 1) + m for |y| >= 1 and
// round(2y) below, saturated to 7, in 16-bit lanes (no carry crosses a lane:
// every lane is below 0x1100). Checked against encode_e2m1_satfinite(x / 2^E)
// for every finite bf16 x and scale byte a block holding x can have.
__device__ __forceinline__ float mxfp4_prescale(unsigned int scale_byte) {
  return __uint_as_float(scale_byte <= 239u ? (240u - scale_byte) << 23 : 1u << (262u - scale_byte));
}

__device__ __forceinline__ unsigned int e2m1x2_of_prescaled_f16x2(unsigned int halves) {
  const unsigned int magnitudes = halves & 0x7fff7fffu;
  const unsigned int rounded = magnitudes + 0x00FF00FFu + ((magnitudes >> 9) & 0x00010001u);
  const unsigned int codes = __vminu2((rounded >> 9) & 0x000F000Fu, 0x00070007u) | ((halves >> 12) & 0x00080008u);
  return (codes | codes >> 12) & 0xFFu;
}

// RN(a / 6) for a finite non-negative bf16 value a, without a division:
// q0 = RN(a * RN(1/6)), the residual a - 6 q0 (exact in one fma), and one fma
// correction. Equal to the IEEE quotient for every such a (all 32640 of them,
// subnormals included: tests/unit/test_fp4_mx_reference.cpp checks the
// identity); 3 instructions instead of a division's ~9.
__device__ __forceinline__ float bf16_over_6(float a) {
  constexpr float kSixth = 1.0f / 6.0f;
  const float q0 = __fmul_rn(a, kSixth);
  return __fmaf_rn(__fmaf_rn(-q0, 6.0f, a), kSixth, q0);
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
