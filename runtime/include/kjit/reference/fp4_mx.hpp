// CPU reference of the FP4 and MX formats (NVFP4, MXFP4, MXFP8) and of their
// two scale layouts, written from the format definitions (../shared/FORMATS.md,
// the OCP MX spec v1.0), independent of the kernels: dequant, quantize, and
// linear <-> swizzled 128x4 scale conversion.
//
// Dequant results are fp32 (float), not fp64: fp32 is the widest output kjit's
// ops write, and here every fp32 result is the exact value rounded once.
//   NVFP4: e2m1 · e4m3 block scale has at most 6 significant bits and lies in
//     [2^-10, 2688], so it is exact in fp32; one IEEE multiply or divide by the
//     fp32 global scale then rounds once (a kernel must keep this order:
//     folding the global into the block scale first rounds twice).
//   MX: the element times a power of two in [2^-127, 2^127] is exact in fp32
//     (2^-127 and the small products are fp32 subnormals, which a kernel must
//     not flush), or overflows to ±inf past FLT_MAX.
// bf16/f16 outputs are one more round-to-nearest of that float (fp8.hpp).
//
// Matrices are row-major [rows, K] with K the contraction axis; scales run
// along K, one per block of 16 (NVFP4) or 32 (MX) consecutive elements. The
// functions here take and write the LINEAR scale layout [rows, K / block];
// the swizzled 128x4 layout is reached only through the conversions at the
// end, so the swizzle lives in one place. Shapes are preconditions (K a
// multiple of the block; spans large enough): the ops reject bad ones.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"
#include "kjit/reference/fp8_quantize.hpp"

namespace kjit::reference {

inline constexpr int64_t kNvfp4Block = 16;  // elements per e4m3 block scale
inline constexpr int64_t kMxBlock = 32;     // elements per UE8M0 block scale

// ---------------------------------------------------------------- decoders

// e2m1 (1 sign, 2 exponent bits with bias 1, 1 mantissa bit): magnitudes
// 0, 0.5 (the one subnormal), 1, 1.5, 2, 3, 4, 6; code 0x8 is -0. No inf, no NaN.
inline float decode_e2m1(uint8_t nibble) {
  static constexpr std::array<float, 8> kMagnitudes = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float magnitude = kMagnitudes[nibble & 0x7u];
  return (nibble & 0x8u) ? -magnitude : magnitude;
}

// Element i of a row of packed e2m1 pairs: byte i / 2, the even element in the
// LOW nibble (FORMATS.md).
inline uint8_t e2m1_code_at(std::span<const uint8_t> packed, int64_t i) {
  const uint8_t byte = packed[static_cast<size_t>(i / 2)];
  return (i % 2) ? static_cast<uint8_t>(byte >> 4) : static_cast<uint8_t>(byte & 0xFu);
}

// UE8M0 (OCP MX scale): byte e stands for 2^(e - 127), so 0x00 is 2^-127 (an
// fp32 subnormal, exact; NOT zero) and 0xFE is 2^127; 0xFF is NaN.
inline float decode_ue8m0(uint8_t byte) {
  if (byte == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int{byte} - 127);
}

// ----------------------------------------------------------- element values

// One NVFP4 element: (e2m1 · e4m3 scale) exactly, then one IEEE multiply or
// divide by the global scale. The convention has no default and no fallback:
// anything but MULTIPLY or DIVIDE gives NaN, so a caller that forgot it fails.
inline float nvfp4_value(uint8_t e2m1, uint8_t e4m3_scale, float global_scale, kjit_scale_convention convention) {
  const float local = decode_e2m1(e2m1) * decode_e4m3fn(e4m3_scale);  // exact
  if (convention == KJIT_SCALE_MULTIPLY) return local * global_scale;
  if (convention == KJIT_SCALE_DIVIDE) return local / global_scale;
  return std::numeric_limits<float>::quiet_NaN();
}

// One MX element (already decoded exactly) times its UE8M0 scale: exact, or ±inf.
inline float mx_value(float element, uint8_t ue8m0_scale) { return element * decode_ue8m0(ue8m0_scale); }

// The fp8 element of MXFP8: e4m3fn or e5m2 (fp8.hpp's decoders).
inline float decode_fp8(kjit_dtype element, uint8_t code) {
  return element == KJIT_DTYPE_F8_E4M3FN ? decode_e4m3fn(code) : decode_e5m2(code);
}

// --------------------------------------------------------- matrix dequant

// NVFP4 [rows, k] -> fp32 [rows, k]: packed [rows, k / 2] bytes, scales linear
// [rows, k / 16] e4m3fn bytes, one fp32 global scale and what it means.
inline void dequant_nvfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, int64_t rows, int64_t k,
                          float global_scale, kjit_scale_convention convention, std::span<float> out) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = packed.subspan(static_cast<size_t>(r * (k / 2)), static_cast<size_t>(k / 2));
    for (int64_t c = 0; c < k; ++c)
      out[static_cast<size_t>(r * k + c)] =
          nvfp4_value(e2m1_code_at(row, c), scales[static_cast<size_t>(r * (k / kNvfp4Block) + c / kNvfp4Block)],
                      global_scale, convention);
  }
}

// MXFP4 [rows, k] -> fp32: packed [rows, k / 2], scales linear [rows, k / 32] UE8M0.
inline void dequant_mxfp4(std::span<const uint8_t> packed, std::span<const uint8_t> scales, int64_t rows, int64_t k,
                          std::span<float> out) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = packed.subspan(static_cast<size_t>(r * (k / 2)), static_cast<size_t>(k / 2));
    for (int64_t c = 0; c < k; ++c)
      out[static_cast<size_t>(r * k + c)] = mx_value(
          decode_e2m1(e2m1_code_at(row, c)), scales[static_cast<size_t>(r * (k / kMxBlock) + c / kMxBlock)]);
  }
}

// MXFP8 [rows, k] -> fp32: codes [rows, k] of `element` (E4M3FN or E5M2),
// scales linear [rows, k / 32] UE8M0.
inline void dequant_mxfp8(kjit_dtype element, std::span<const uint8_t> codes, std::span<const uint8_t> scales,
                          int64_t rows, int64_t k, std::span<float> out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const auto i = static_cast<size_t>(r * k + c);
      out[i] = mx_value(decode_fp8(element, codes[i]), scales[static_cast<size_t>(r * (k / kMxBlock) + c / kMxBlock)]);
    }
}

// ---------------------------------------------------------------- encoders

// fp32 -> e2m1, round to nearest even, |x| > 6 (and ±inf) saturating to ±6,
// the sign of zero kept. NaN has no code: it gives +0 (the block quantizers
// never pass one; they mark the block's scale NaN instead). Ties: 0.25 -> 0,
// 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
inline uint8_t encode_e2m1_satfinite(float f) {
  if (std::isnan(f)) return 0x0;
  const uint8_t sign = std::signbit(f) ? 0x8 : 0x0;
  const float a = std::fabs(f);
  if (a >= 6.0f) return sign | 0x7;
  if (a < 1.0f) return sign | static_cast<uint8_t>(std::nearbyint(a * 2.0f));  // 0, 0.5, or 1 (code 2)
  int exponent;
  const float fraction = std::frexp(a, &exponent);                                // a = fraction · 2^exponent
  auto step = static_cast<int>(std::nearbyint((fraction * 2.0f - 1.0f) * 2.0f));  // exact scaling, then nearest even
  int biased = exponent;                                                          // (exponent - 1) + bias 1
  if (step == 2) {
    step = 0;
    ++biased;
  }
  return sign | static_cast<uint8_t>(biased << 1 | step);
}

// fp32 -> e5m2, round to nearest even, finite values beyond ±57344 and ±inf
// saturating to ±57344 (0x7B / 0xFB); NaN -> 0x7F. The e5m2 twin of
// encode_e4m3fn_satfinite (cvt.rn.satfinite.e5m2x2.f32).
inline uint8_t encode_e5m2_satfinite(float f) {
  if (std::isnan(f)) return 0x7F;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float a = std::fabs(f);
  if (a >= 57344.0f) return sign | 0x7B;
  if (a < 0x1p-14f) return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p16f));  // subnormals: multiples of 2^-16
  int exponent;
  const float fraction = std::frexp(a, &exponent);
  auto step = static_cast<int>(std::nearbyint((fraction * 2.0f - 1.0f) * 4.0f));
  int biased = exponent - 1 + 15;
  if (step == 4) {
    step = 0;
    ++biased;
  }
  return sign | static_cast<uint8_t>(biased << 2 | step);
}

// --------------------------------------------------------------- quantizers

// What the quantizers need of an element format: its largest finite value, and
// emax, the exponent of its largest binade (6 = 1.5 · 2^2, 448 = 1.75 · 2^8,
// 57344 = 1.75 · 2^15): the OCP MX rule subtracts it from the block's exponent.
struct ElementFormat {
  float max;
  int emax;
};
inline constexpr ElementFormat kE2m1{6.0f, 2};
inline constexpr ElementFormat kE4m3fn{448.0f, 8};
inline constexpr ElementFormat kE5m2{57344.0f, 15};

// The amax of a block, or NaN when the block holds NaN or an infinity.
inline float block_amax(std::span<const float> block) {
  float amax = 0.0f;
  for (float x : block) {
    if (!std::isfinite(x)) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(x));
  }
  return amax;
}

// The NVFP4 global scale kjit_quantize_mx computes on the device
// (KJIT_GLOBAL_SCALE_COMPUTE) from one expert's values: amax = max |x| over the
// FINITE values (a NaN or inf marks only its own block, through its NaN scale;
// it does not poison the whole expert), then one IEEE fp32 operation:
// amax / 2688 as a MULTIPLY, 2688 / amax as a DIVIDE (2688 = 448 · 6, the
// largest e4m3 scale times the largest e2m1 value). An expert with no finite
// non-zero value (all zero, or only NaN/inf) gets 1.0f. A divisor can
// overflow to +inf for amax below 2688 / FLT_MAX (bf16 subnormals): the block
// quantizer then gives scale 448 and zero codes, as it would for any +inf global.
inline float nvfp4_global_scale(std::span<const float> expert_values, kjit_scale_convention convention) {
  float amax = 0.0f;
  for (float x : expert_values)
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  if (amax == 0.0f) return 1.0f;
  constexpr float kRange = 448.0f * 6.0f;
  return convention == KJIT_SCALE_DIVIDE ? kRange / amax : amax / kRange;
}

// One NVFP4 block of 16 values -> 8 packed bytes; returns its e4m3fn scale byte.
// The arithmetic, all fp32 IEEE round-to-nearest (the NVFP4 recipe of
// TensorRT-LLM's quantizer, written with IEEE divisions: a kernel matches it
// with div.rn, not with approximate reciprocals):
//   amax  = max |x|
//   s     = amax / 6, then s / global (MULTIPLY: dequant multiplies by global)
//           or s · global (DIVIDE: dequant divides by it)
//   scale = e4m3fn(s), nearest even, saturating at 448 (encode_e4m3fn_satfinite)
//   d     = decode(scale) · global (MULTIPLY) or decode(scale) / global (DIVIDE):
//           the block's effective scale
//   code  = e2m1(x / d), nearest even, saturating at 6; every code +0 when d is 0
//           (an all-zero block, or a scale below e4m3's smallest subnormal).
// A block holding NaN or an infinity gets scale 0x7F (NaN, so its dequant is
// NaN everywhere: e2m1 has no NaN) and zero codes. The recipe's global scale is
// tensor amax / (448 · 6) as a multiplier, 448 · 6 / tensor amax as a divisor:
// every block scale then fits under 448.
inline uint8_t quantize_nvfp4_block(std::span<const float> block, float global_scale,
                                    kjit_scale_convention convention, std::span<uint8_t> packed) {
  std::fill_n(packed.begin(), kNvfp4Block / 2, uint8_t{0});
  const float amax = block_amax(block);
  if (std::isnan(amax)) return 0x7F;
  const bool multiply = convention == KJIT_SCALE_MULTIPLY;
  const float per_block = amax / 6.0f;
  const uint8_t scale = encode_e4m3fn_satfinite(multiply ? per_block / global_scale : per_block * global_scale);
  const float d = multiply ? decode_e4m3fn(scale) * global_scale : decode_e4m3fn(scale) / global_scale;
  if (d == 0.0f) return scale;
  for (int64_t i = 0; i < kNvfp4Block; ++i)
    packed[static_cast<size_t>(i / 2)] |=
        static_cast<uint8_t>(encode_e2m1_satfinite(block[static_cast<size_t>(i)] / d) << (4 * (i % 2)));
  return scale;
}

// The OCP MX shared scale of a block (OCP MX spec v1.0): X = 2^E with
// E = floor(log2(amax)) - emax of the element format, clamped to UE8M0's
// [-127, 127]; returned as its byte E + 127. floor(log2) is read off the
// binary exponent (frexp), exactly. amax 0 gives 0x00 (2^-127); a NaN amax
// (a block holding NaN or inf) gives 0xFF. The rule leaves the block's largest
// values up to 2^(emax+1) · X, above the format's max: they saturate.
inline uint8_t mx_scale_byte(float amax, ElementFormat format) {
  if (std::isnan(amax)) return 0xFF;
  if (amax == 0.0f) return 0x00;
  int exponent;
  std::frexp(amax, &exponent);  // amax = f · 2^exponent, f in [0.5, 1): floor(log2 amax) = exponent - 1
  return static_cast<uint8_t>(std::clamp(exponent - 1 - format.emax, -127, 127) + 127);
}

// One MXFP4 block of 32 values -> 16 packed bytes; returns its UE8M0 scale
// byte. code = e2m1(x / X) (exact division by a power of two, then nearest
// even, saturating at 6). A NaN/inf block: scale 0xFF, zero codes.
inline uint8_t quantize_mxfp4_block(std::span<const float> block, std::span<uint8_t> packed) {
  std::fill_n(packed.begin(), kMxBlock / 2, uint8_t{0});
  const uint8_t scale = mx_scale_byte(block_amax(block), kE2m1);
  if (scale == 0xFF) return scale;
  const float x_scale = decode_ue8m0(scale);
  for (int64_t i = 0; i < kMxBlock; ++i)
    packed[static_cast<size_t>(i / 2)] |=
        static_cast<uint8_t>(encode_e2m1_satfinite(block[static_cast<size_t>(i)] / x_scale) << (4 * (i % 2)));
  return scale;
}

// One MXFP8 block of 32 values -> 32 codes of `element` (E4M3FN or E5M2);
// returns its UE8M0 scale byte. code = fp8(x / X), nearest even, saturating
// (e5m2 too: no infinities are produced). A NaN/inf block: scale 0xFF, zero codes.
inline uint8_t quantize_mxfp8_block(kjit_dtype element, std::span<const float> block, std::span<uint8_t> codes) {
  std::fill_n(codes.begin(), kMxBlock, uint8_t{0});
  const bool e4m3 = element == KJIT_DTYPE_F8_E4M3FN;
  const uint8_t scale = mx_scale_byte(block_amax(block), e4m3 ? kE4m3fn : kE5m2);
  if (scale == 0xFF) return scale;
  const float x_scale = decode_ue8m0(scale);
  for (int64_t i = 0; i < kMxBlock; ++i) {
    const float x = block[static_cast<size_t>(i)] / x_scale;
    codes[static_cast<size_t>(i)] = e4m3 ? encode_e4m3fn_satfinite(x) : encode_e5m2_satfinite(x);
  }
  return scale;
}

// Whole matrices: fp32 [rows, k] (bf16 input converts exactly, bf16_to_float)
// -> packed [rows, k / 2] or codes [rows, k], and linear scales [rows, k / block].
inline void quantize_nvfp4(std::span<const float> in, int64_t rows, int64_t k, float global_scale,
                           kjit_scale_convention convention, std::span<uint8_t> packed, std::span<uint8_t> scales) {
  for (int64_t b = 0; b < rows * k / kNvfp4Block; ++b)
    scales[static_cast<size_t>(b)] = quantize_nvfp4_block(
        in.subspan(static_cast<size_t>(b * kNvfp4Block), kNvfp4Block), global_scale, convention,
        packed.subspan(static_cast<size_t>(b * kNvfp4Block / 2), kNvfp4Block / 2));
}

inline void quantize_mxfp4(std::span<const float> in, int64_t rows, int64_t k, std::span<uint8_t> packed,
                           std::span<uint8_t> scales) {
  for (int64_t b = 0; b < rows * k / kMxBlock; ++b)
    scales[static_cast<size_t>(b)] = quantize_mxfp4_block(
        in.subspan(static_cast<size_t>(b * kMxBlock), kMxBlock),
        packed.subspan(static_cast<size_t>(b * kMxBlock / 2), kMxBlock / 2));
}

inline void quantize_mxfp8(kjit_dtype element, std::span<const float> in, int64_t rows, int64_t k,
                           std::span<uint8_t> codes, std::span<uint8_t> scales) {
  for (int64_t b = 0; b < rows * k / kMxBlock; ++b)
    scales[static_cast<size_t>(b)] =
        quantize_mxfp8_block(element, in.subspan(static_cast<size_t>(b * kMxBlock), kMxBlock),
                             codes.subspan(static_cast<size_t>(b * kMxBlock), kMxBlock));
}

// ------------------------------------------------------------ scale layouts
//
// Linear: [rows, scale_cols] row-major, scale_cols = K / block. For a stack of
// experts, their matrices one after another with no padding (gpt-oss's
// `*_scales` [E, N, K/32] is this, with N rows per expert).
//
// Swizzled "128x4" (cuBLASLt, CUTLASS, TensorRT-LLM, FlashInfer; FORMATS.md's
// formula): rows padded to a multiple of 128, scale columns to a multiple of
// 4; each 128-row x 4-column tile is 512 contiguous bytes, tiles row-major
// (numKTiles = ceil(scale_cols / 4) per 128 rows); inside a tile, row m sits
// at (m % 32) · 16 + ((m / 32) % 4) · 4 and column k at k % 4.
// Where FORMATS.md is silent, assumed here:
//  - m is the row within its expert: each expert is swizzled on its own;
//  - expert e's block starts at byte sum_{j<e} round_up(rows_j, 128) ·
//    round_up(scale_cols, 4) (its 128-row-padded offset times the padded
//    width), so an expert with no rows takes no bytes;
//  - MX scales (one per 32 elements) use the same layout with k = element
//    column / 32 (the layout only counts scale bytes, whatever their block);
//  - the padding's content is not part of the layout: the caller names it.

inline constexpr int64_t kSwizzleTileRows = 128;
inline constexpr int64_t kSwizzleTileCols = 4;

inline int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Bytes one expert's swizzled scales take.
inline int64_t swizzled_scale_bytes(int64_t rows, int64_t scale_cols) {
  return round_up(rows, kSwizzleTileRows) * round_up(scale_cols, kSwizzleTileCols);
}

// Byte offset of scale (row, scale_col) of one expert's [rows, scale_cols]
// matrix in its swizzled block (FORMATS.md, verbatim).
inline int64_t swizzled_scale_offset(int64_t row, int64_t scale_col, int64_t scale_cols) {
  const int64_t k_tiles = (scale_cols + kSwizzleTileCols - 1) / kSwizzleTileCols;
  return (row / 128 * k_tiles + scale_col / 4) * 512 + row % 32 * 16 + row / 32 % 4 * 4 + scale_col % 4;
}

// Byte offset of expert `expert`'s swizzled block in a stack whose experts have
// expert_rows[0..E) rows.
inline int64_t swizzled_expert_base(std::span<const int64_t> expert_rows, int64_t expert, int64_t scale_cols) {
  int64_t base = 0;
  for (int64_t e = 0; e < expert; ++e) base += swizzled_scale_bytes(expert_rows[static_cast<size_t>(e)], scale_cols);
  return base;
}

// Linear scales of a stack (sum of expert_rows rows) -> the swizzled stack
// (sum of swizzled_scale_bytes bytes); every padding byte becomes `pad`.
inline void scales_linear_to_swizzled(std::span<const uint8_t> linear, std::span<const int64_t> expert_rows,
                                      int64_t scale_cols, uint8_t pad, std::span<uint8_t> swizzled) {
  std::fill_n(swizzled.begin(), swizzled_expert_base(expert_rows, static_cast<int64_t>(expert_rows.size()), scale_cols),
              pad);
  int64_t first_row = 0;
  for (size_t e = 0; e < expert_rows.size(); ++e) {
    const int64_t base = swizzled_expert_base(expert_rows, static_cast<int64_t>(e), scale_cols);
    for (int64_t r = 0; r < expert_rows[e]; ++r)
      for (int64_t c = 0; c < scale_cols; ++c)
        swizzled[static_cast<size_t>(base + swizzled_scale_offset(r, c, scale_cols))] =
            linear[static_cast<size_t>((first_row + r) * scale_cols + c)];
    first_row += expert_rows[e];
  }
}

// The swizzled stack -> linear scales (the padding is dropped).
inline void scales_swizzled_to_linear(std::span<const uint8_t> swizzled, std::span<const int64_t> expert_rows,
                                      int64_t scale_cols, std::span<uint8_t> linear) {
  int64_t first_row = 0;
  for (size_t e = 0; e < expert_rows.size(); ++e) {
    const int64_t base = swizzled_expert_base(expert_rows, static_cast<int64_t>(e), scale_cols);
    for (int64_t r = 0; r < expert_rows[e]; ++r)
      for (int64_t c = 0; c < scale_cols; ++c)
        linear[static_cast<size_t>((first_row + r) * scale_cols + c)] =
            swizzled[static_cast<size_t>(base + swizzled_scale_offset(r, c, scale_cols))];
    first_row += expert_rows[e];
  }
}

// ------------------------------------------------------- the whole quantize op
//
// What kjit_quantize_mx writes for bf16 in[E, rows, in_row_stride] (the first
// k elements of each row): out packed [E * rows, k / 2] (FP4) or codes
// [E * rows, k] (MXFP8), the scale bytes in `layout` (swizzled: each expert
// on its own, padding 0), and NVFP4's global scale per expert (`given`, or
// nvfp4_global_scale of the expert's values for KJIT_GLOBAL_SCALE_COMPUTE).
struct MxQuantized {
  std::vector<uint8_t> out;
  std::vector<uint8_t> scales;
  std::vector<float> global_scales;  // NVFP4 only
};

inline MxQuantized quantize_mx_stack(kjit_block_format format, kjit_dtype element, std::span<const uint16_t> in,
                                     int64_t experts, int64_t rows, int64_t k, int64_t in_row_stride,
                                     kjit_scale_layout layout, kjit_global_scale_mode mode,
                                     kjit_scale_convention convention, std::span<const float> given) {
  const int64_t block = format == KJIT_BLOCK_FORMAT_NVFP4 ? kNvfp4Block : kMxBlock;
  const int64_t out_row = format == KJIT_BLOCK_FORMAT_MXFP8 ? k : k / 2, scale_cols = k / block;
  MxQuantized q;
  q.out.resize(static_cast<size_t>(experts * rows * out_row));
  std::vector<uint8_t> linear(static_cast<size_t>(experts * rows * scale_cols));
  for (int64_t e = 0; e < experts; ++e) {
    std::vector<float> values(static_cast<size_t>(rows * k));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < k; ++c)
        values[static_cast<size_t>(r * k + c)] =
            bf16_to_float(in[static_cast<size_t>((e * rows + r) * in_row_stride + c)]);
    const auto out =
        std::span(q.out).subspan(static_cast<size_t>(e * rows * out_row), static_cast<size_t>(rows * out_row));
    const auto scales = std::span(linear).subspan(static_cast<size_t>(e * rows * scale_cols),
                                                  static_cast<size_t>(rows * scale_cols));
    if (format == KJIT_BLOCK_FORMAT_NVFP4) {
      const float global = mode == KJIT_GLOBAL_SCALE_COMPUTE ? nvfp4_global_scale(values, convention)
                                                              : given[static_cast<size_t>(e)];
      q.global_scales.push_back(global);
      quantize_nvfp4(values, rows, k, global, convention, out, scales);
    } else if (format == KJIT_BLOCK_FORMAT_MXFP4) {
      quantize_mxfp4(values, rows, k, out, scales);
    } else {
      quantize_mxfp8(element, values, rows, k, out, scales);
    }
  }
  if (layout == KJIT_SCALE_LAYOUT_LINEAR) {
    q.scales = std::move(linear);
  } else {
    const std::vector<int64_t> expert_rows(static_cast<size_t>(experts), rows);
    q.scales.resize(static_cast<size_t>(experts * swizzled_scale_bytes(rows, scale_cols)));
    scales_linear_to_swizzled(linear, expert_rows, scale_cols, 0x00, q.scales);
  }
  return q;
}

}  // namespace kjit::reference
