// Exact conversions of fp8 codes to wider floats and rounding of fp32 to the
// 16-bit output types, as small PTX wrappers named after their instruction.
// Every fp8 value (e4m3fn and e5m2, NaN and inf included) is exactly
// representable in f16, so code -> f16 -> f32 loses nothing; the only rounding
// in a dequant is the fp32 scale operation and the final cvt.rn to bf16/f16.
// Hardware fp8 conversion needs sm_89 or newer (the capability table gates it).
#pragma once

namespace kjit {

// Two e4m3fn codes (low byte = first element) -> f16x2 (low half = first).
__device__ __forceinline__ unsigned int cvt_f16x2_e4m3x2(unsigned short codes) {
  unsigned int out;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(codes));
  return out;
}

// Two e5m2 codes (low byte = first element) -> f16x2 (low half = first).
__device__ __forceinline__ unsigned int cvt_f16x2_e5m2x2(unsigned short codes) {
  unsigned int out;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(out) : "h"(codes));
  return out;
}

__device__ __forceinline__ float cvt_f32_f16(unsigned short bits) {
  float out;
  asm("cvt.f32.f16 %0, %1;" : "=f"(out) : "h"(bits));
  return out;
}

// Round two floats to nearest-even bf16; `first` lands in the low half.
__device__ __forceinline__ unsigned int cvt_rn_bf16x2_f32(float first, float second) {
  unsigned int out;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(second), "f"(first));
  return out;
}

// Round two floats to nearest-even f16; `first` lands in the low half.
__device__ __forceinline__ unsigned int cvt_rn_f16x2_f32(float first, float second) {
  unsigned int out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(second), "f"(first));
  return out;
}

// Round two floats to nearest-even e4m3fn, saturating finite values beyond
// +-448 to +-448 (NaN stays NaN, 0x7F); `first` lands in the low byte.
__device__ __forceinline__ unsigned short cvt_rn_satfinite_e4m3x2_f32(float first, float second) {
  unsigned short out;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(second), "f"(first));
  return out;
}

enum class Fp8Format { e4m3fn, e5m2 };

// Decodes two fp8 codes packed in a 16-bit word into two exact floats.
template <Fp8Format kFormat>
__device__ __forceinline__ void decode_fp8x2(unsigned short codes, float& first, float& second) {
  const unsigned int halves =
      kFormat == Fp8Format::e4m3fn ? cvt_f16x2_e4m3x2(codes) : cvt_f16x2_e5m2x2(codes);
  first = cvt_f32_f16(static_cast<unsigned short>(halves & 0xffffu));
  second = cvt_f32_f16(static_cast<unsigned short>(halves >> 16));
}

}  // namespace kjit
