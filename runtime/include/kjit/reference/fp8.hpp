// CPU reference of fp8 dequantisation, written from the format definitions
// (OCP FP8: e4m3fn bias 7, no inf, S.1111.111 = NaN; e5m2 bias 15, IEEE-like),
// independent of the kernels: decode exactly, apply the fp32 scale with one
// IEEE operation, round once to nearest-even.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kjit/kjit.h"

namespace kjit::reference {

inline float decode_e4m3fn(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

inline float decode_e5m2(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> 2) & 0x1F;
  const int mantissa = code & 0x3;
  if (exponent == 0x1F)
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -16);
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 4.0f, exponent - 15);
}

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// bf16 bits -> the fp32 value they stand for (exact).
inline float bf16_to_float(uint16_t bits) {
  const uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round-to-nearest-even fp32 -> bf16 bits (NaN handled by the caller).
inline uint16_t bf16_bits_rne(float f) {
  const uint32_t u = float_bits(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Round-to-nearest-even fp32 -> f16 bits, through the compiler's _Float16.
inline uint16_t f16_bits_rne(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, sizeof u);
  return u;
}

// One dequantised element as output bits. NaN results compare as "any NaN"
// (the hardware's canonical NaN payload is not part of the contract).
struct ExpectedValue {
  uint32_t bits;
  bool is_nan;
};

inline ExpectedValue dequant_value(kjit_dtype in, kjit_dtype out, uint8_t code, float scale,
                                   kjit_scale_convention convention) {
  const float value = in == KJIT_DTYPE_F8_E4M3FN ? decode_e4m3fn(code) : decode_e5m2(code);
  const float scaled = convention == KJIT_SCALE_MULTIPLY ? value * scale : value / scale;
  if (out == KJIT_DTYPE_F32) return {float_bits(scaled), std::isnan(scaled)};
  if (out == KJIT_DTYPE_BF16) return {bf16_bits_rne(scaled), std::isnan(scaled)};
  return {f16_bits_rne(scaled), std::isnan(scaled)};
}

inline bool is_nan_bits(kjit_dtype out, uint32_t bits) {
  if (out == KJIT_DTYPE_F32) return (bits & 0x7F800000u) == 0x7F800000u && (bits & 0x7FFFFFu);
  if (out == KJIT_DTYPE_BF16) return (bits & 0x7F80u) == 0x7F80u && (bits & 0x7Fu);
  return (bits & 0x7C00u) == 0x7C00u && (bits & 0x3FFu);
}

// True when `got` is what the reference says for this element.
inline bool matches(kjit_dtype out, const ExpectedValue& want, uint32_t got) {
  return want.is_nan ? is_nan_bits(out, got) : got == want.bits;
}

}  // namespace kjit::reference
