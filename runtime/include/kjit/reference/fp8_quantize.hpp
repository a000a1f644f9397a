// CPU reference of the fp8 activation quantizer (kjit_fp8_quantize; kjit.h
// states the arithmetic), written from the definitions, independent of the
// kernel: fp32 amax and IEEE divisions as stated, and an e4m3fn encoder with
// round-to-nearest-even and saturation written from the OCP format.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "kjit/reference/fp8.hpp"

namespace kjit::reference {

inline float float_from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// fp32 -> e4m3fn, nearest even, finite values beyond +-448 (and +-inf) saturate
// to +-448 (0x7E / 0xFE); NaN -> 0x7F. What cvt.rn.satfinite.e4m3x2.f32 does.
inline uint8_t encode_e4m3fn_satfinite(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7E;
  if (a < 0x1p-6f) {  // subnormal: multiples of 2^-9 (0x1p-6 itself is code 8, the first normal)
    return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  }
  int exponent;
  const float fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, fraction in [0.5, 1)
  const int e = exponent - 1;                      // a = m * 2^e, m in [1, 2)
  auto steps = static_cast<int>(std::nearbyint((fraction * 2.0f - 1.0f) * 8.0f));  // exact scaling, then nearest even
  int biased = e + 7;
  if (steps == 8) {
    steps = 0;
    ++biased;
  }
  return sign | static_cast<uint8_t>(biased << 3 | steps);
}

// The scale of one group from its amax (finite, >= 0), as kjit.h states.
inline float quantize_scale(float amax, bool ue8m0) {
  const float scale = std::max(amax, 1e-10f) / 448.0f;
  if (!ue8m0) return scale;
  const uint32_t bits = float_bits(scale);
  return (bits & 0x007FFFFFu) ? float_from_bits((bits & 0x7F800000u) + 0x00800000u) : scale;
}

// Quantises one group of bf16 values (as bits) into `codes`; returns the scale.
inline float quantize_group(std::span<const uint16_t> group, std::span<uint8_t> codes, bool ue8m0) {
  float amax = 0.0f;
  bool finite = true;
  for (uint16_t bits : group) {
    const float x = bf16_to_float(bits);
    finite = finite && std::isfinite(x);
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  }
  if (!finite) {
    std::fill(codes.begin(), codes.end(), uint8_t{0x7F});
    return float_from_bits(0x7FC00000u);
  }
  const float scale = quantize_scale(amax, ue8m0);
  for (size_t i = 0; i < group.size(); ++i) codes[i] = encode_e4m3fn_satfinite(bf16_to_float(group[i]) / scale);
  return scale;
}

// A whole quantize: `in` bf16 [input rows, in_row_stride] -> codes [rows, k] and
// scales [rows, k / 128]. With gather (top_k >= 1), output row r reads input row
// sorted_to_flat[r] / top_k; a negative entry, or one at or past
// tokens * top_k, gives zero codes and scale 0.
inline void fp8_quantize(std::span<const uint16_t> in, int64_t in_row_stride, int64_t rows, int64_t k, bool ue8m0,
                         std::span<const int32_t> sorted_to_flat, int64_t tokens, int64_t top_k,
                         std::span<uint8_t> codes, std::span<float> scales) {
  constexpr int64_t kGroup = 128;
  const int64_t groups = k / kGroup;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t source = r;
    if (top_k >= 1) {
      const int64_t flat = sorted_to_flat[static_cast<size_t>(r)];
      if (flat < 0 || flat >= tokens * top_k) {
        std::fill_n(codes.begin() + r * k, k, uint8_t{0});
        std::fill_n(scales.begin() + r * groups, groups, 0.0f);
        continue;
      }
      source = flat / top_k;
    }
    for (int64_t g = 0; g < groups; ++g)
      scales[static_cast<size_t>(r * groups + g)] =
          quantize_group(in.subspan(static_cast<size_t>(source * in_row_stride + g * kGroup), kGroup),
                         codes.subspan(static_cast<size_t>(r * k + g * kGroup), kGroup), ue8m0);
  }
}

}  // namespace kjit::reference
