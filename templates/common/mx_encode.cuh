// Encoders of the block-scaled "MX" formats on the device (NVFP4, MXFP4,
// MXFP8): fp32 -> e2m1, fp8 codes, and the OCP MX shared exponent of a block.
// Each is bit-exact with its CPU twin in runtime/include/kjit/reference/fp4_mx.hpp
// (encode_e2m1_satfinite, encode_e5m2_satfinite, mx_scale_byte) and
// fp8_quantize.hpp (encode_e4m3fn_satfinite); docs/formats.md states them.
#pragma once

#include "fp8_convert.cuh"
#include "mx_formats.cuh"

namespace kjit {

// The e2m1 code of a finite y >= 0 (3 bits, saturating at 6) as the fp32
// bits of 2^23 + code, from fp32 additions that round onto the integers of
// [2^23, 2^24) (nearest even there is e2m1's nearest even: the even code):
//   fma(y, 2, 2^23)                = 2^23 + RNE(2 y):         the code for y < 2 (steps of 0.5)
//   y + (2^23 + 2)                 = 2^23 + RNE(y) + 2:       the code for 2 <= y < 4 (steps of 1)
//   fma(min(y, 6), 0.5, 2^23 + 4)  = 2^23 + RNE(y / 2) + 4:   the code for y >= 4 (steps of 2), saturated
// and each candidate is at least the code outside its range (2y <= y + 2 for
// y <= 2, and so on), so the code is their smallest (as bits: all are
// positive floats). Equal to reference::encode_e2m1_satfinite for every
// finite y >= 0 (all 2^31 - 2^23 checked on the CPU;
// tests/unit/test_fp4_mx_reference.cpp checks a stride of them and every float
// near each rounding boundary). The code is the low 3 bits, the rest is
// 0x4B000000.
__device__ __forceinline__ unsigned int e2m1_code_plus_2p23(float y) {
  const unsigned int below_two = __float_as_uint(__fmaf_rn(y, 2.0f, 0x1p23f));
  const unsigned int two_to_four = __float_as_uint(__fadd_rn(y, 0x1p23f + 2.0f));
  const unsigned int from_four = __float_as_uint(__fmaf_rn(fminf(y, 6.0f), 0.5f, 0x1p23f + 4.0f));
  return min(min(below_two, two_to_four), from_four);
}

// fp32 -> e2m1 nibble, round to nearest even, saturating to +-6 (inf too),
// the sign of zero kept, NaN -> +0 (encode_e2m1_satfinite). One exact code
// path on every arch (sm_90a has no cvt to e2m1), branch-free: the magnitude
// through e2m1_code_plus_2p23. Ties: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 ->
// 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
__device__ __forceinline__ unsigned int encode_e2m1_satfinite(float f) {
  const unsigned int bits = __float_as_uint(f);
  const unsigned int code = e2m1_code_plus_2p23(fabsf(f)) & 7u;  // inf: min(inf, 6) saturates
  return (bits & 0x7fffffffu) > 0x7f800000u ? 0u : ((bits >> 28) & 0x8u) | code;  // NaN has no code
}

// MXFP4's codes, two at a time. For the block's scale byte s (E = s - 127),
// mxfp4_prescale(s) = 2^(113 - s) = 2^-E * 2^-14, exact for every s in
// [0, 254] (a normal float up to s = 239, a subnormal power of two above).
// Two elements x * 2^(113 - s), rounded once to f16 (cvt.rn.f16x2.f32), give
// e2m1x2_of_prescaled_f16x2 the byte of their two codes (first in the low
// nibble): y = x / 2^E is below 8 in magnitude (the OCP scale rule), so y *
// 2^-14 is an f16 whose 10-bit significand holds bf16's 8 exactly for |y| >=
// 2^-3 (smaller y may round, to code 0 either way), and f16's subnormal step
// 2^-24 is y's 2^-10: fp32's subnormal boundary moved onto e2m1's, so rounding
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

// RN(a / d) for a bf16 value a >= 0 (finite) from r = RN(1 / d), with no
// division and no branch: q0 = RN(a r) is within about an ulp of a / d, and
// one correction by the exact residual (a - d q0 in one fma, times r, added
// to q0 in another) leaves q0 + (a - d q0) r = a / d + (q0 - a / d)(1 - r d)
// to round, within a tiny fraction of an ulp of a / d (|1 - r d| <= 2^-24).
// That is the correctly rounded quotient unless a / d lies closer still to a
// rounding midpoint, which bf16 over fp32 quotients never do: RN(q0 + (a - d
// q0) r) equals the IEEE quotient for every one of bf16's 128 significands
// against every one of fp32's 2^23 (all 2^30 pairs, checked on the CPU; 27%
// of the q0 are off by an ulp), and the arithmetic scales exactly with a's
// and d's exponents as long as nothing overflows and the residual is exact:
// the caller keeps a r below 2^100 and r in [2^-126, 2^96], which leaves the
// quotient exact whenever it is 2^-90 or more (a residual underflows only for
// a far below d, where the quotient is tiny either way). nvfp4_codes relies
// on it; tests/unit/test_fp4_mx_reference.cpp checks every bf16 significand
// against a stride of d's.
__device__ __forceinline__ float quotient_from_reciprocal(float a, float d, float r) {
  const float q0 = __fmul_rn(a, r);
  return __fmaf_rn(__fmaf_rn(-q0, d, a), r, q0);
}

// The sign bits of a chunk's 8 bf16 (the words' bits 15 and 31) at bit 3 of
// their e2m1 nibbles, element e at bit 4e + 3: bytes 1 and 3 of word i carry
// the signs of elements 2i and 2i + 1 in their top bits.
__device__ __forceinline__ unsigned int e2m1_signs(const unsigned int (&words)[4]) {
  const unsigned int front = __byte_perm(words[0], words[1], 0x7351) & 0x80808080u;  // elements 0, 2, 1, 3
  const unsigned int back = __byte_perm(words[2], words[3], 0x7351) & 0x80808080u;   // elements 4, 6, 5, 7
  const unsigned int even = __byte_perm(front, back, 0x5410);  // elements 0, 2, 4, 6 at bits 7, 15, 23, 31
  const unsigned int odd = __byte_perm(front, back, 0x7632);   // elements 1, 3, 5, 7 at bits 7, 15, 23, 31
  return (even >> 4) | odd;
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
