// CPU reference of the W8A16 grouped GEMM (FP8 weights, bf16 activations),
// written from the C ABI's statement (kjit.h: the W8A16 comment at the end of
// kjit_grouped_gemm_desc), independent of the kernels: each weight decoded
// exactly, times its fp32 scale in one fp32 multiplication (DIVIDE: by the
// fp32 reciprocal 1 / scale, not an IEEE division), rounded to nearest-even
// bf16; then every product and sum in fp64 over each expert's rows. The GPU
// tests and jitctl selftest compare the kernels against it.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "kjit/kjit.h"
#include "kjit/reference/fp4_mx.hpp"
#include "kjit/reference/fp8.hpp"

namespace kjit::reference {

// The rows and columns of a W8A16 weight scale block (b_block_rows x b_block_cols).
inline constexpr int64_t kMixedScaleBlock = 128;

// One launch's FP8 weights: the stored tensor [E, R, C] read as `layout` says
// (E_N_K: R = N, C = K; E_K_N: R = K, C = N, the same storage read for dY . W)
// and its fp32 scales over the stored tensor: PER_BLOCK [E, ceil(R / 128),
// ceil(C / 128)], PER_ROW [E, R], PER_TENSOR [E].
struct MixedWeights {
  std::span<const uint8_t> codes;
  std::span<const float> scales;
  kjit_dtype dtype;  // KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2
  kjit_weight_layout layout;
  kjit_scale_granularity granularity;
  kjit_scale_convention convention;
  int64_t experts, n, k;  // the GEMM's
  // W4A16 (dtype KJIT_DTYPE_F4_E2M1): `codes` holds the stored pairs [E, R, C / 2] (R, C as stored_rows(),
  // stored_cols() say), `scales` is unused, and these the format, its LINEAR scale bytes [E, R, C / group] and
  // NVFP4's global scales [E] (`convention` says how the global applies).
  kjit_block_format format = KJIT_BLOCK_FORMAT_UNSET;
  std::span<const uint8_t> block_scales = {};
  std::span<const float> global_scales = {};

  int64_t stored_rows() const { return layout == KJIT_WEIGHTS_E_N_K ? n : k; }
  int64_t stored_cols() const { return layout == KJIT_WEIGHTS_E_N_K ? k : n; }
  int64_t scales_per_expert() const {
    if (granularity == KJIT_SCALE_PER_TENSOR) return 1;
    if (granularity == KJIT_SCALE_PER_ROW) return stored_rows();
    return ceil_blocks(stored_rows()) * ceil_blocks(stored_cols());
  }
  // The scale of stored element (r, c) of expert e.
  float scale_of(int64_t e, int64_t r, int64_t c) const {
    int64_t index = 0;
    if (granularity == KJIT_SCALE_PER_ROW) index = r;
    if (granularity == KJIT_SCALE_PER_BLOCK)
      index = r / kMixedScaleBlock * ceil_blocks(stored_cols()) + c / kMixedScaleBlock;
    return scales[static_cast<size_t>(e * scales_per_expert() + index)];
  }

 private:
  static int64_t ceil_blocks(int64_t extent) { return (extent + kMixedScaleBlock - 1) / kMixedScaleBlock; }
};

// One weight as the W8A16 kernels convert it: code * scale (MULTIPLY) or
// code * (1 / scale) with the reciprocal rounded to fp32 (DIVIDE), one fp32
// rounding, then nearest-even bf16; returned as the fp32 value of that bf16.
inline float mixed_weight_value(kjit_dtype dtype, uint8_t code, float scale, kjit_scale_convention convention) {
  const float value = dtype == KJIT_DTYPE_F8_E4M3FN ? decode_e4m3fn(code) : decode_e5m2(code);
  const float multiplier = convention == KJIT_SCALE_MULTIPLY ? scale : 1.0f / scale;
  const float scaled = value * multiplier;
  if (std::isnan(scaled)) return scaled;
  return bf16_to_float(bf16_bits_rne(scaled));
}

// One FP4 weight dequantised to bf16 (kjit_dequant_mx's value): e2m1 x group
// scale (exact in fp32), NVFP4 then times the global (DIVIDE: times its fp32
// reciprocal), one fp32 rounding, then nearest-even bf16; as the fp32 value of
// that bf16. (The W4A16 kernels leave NVFP4's global to their fp32 sums:
// kjit.h; they agree with this reference within the GEMM tolerance.)
inline float fp4_weight_value(kjit_block_format format, uint8_t e2m1, uint8_t scale_byte, float global,
                              kjit_scale_convention convention) {
  float value;
  if (format == KJIT_BLOCK_FORMAT_NVFP4) {
    const float multiplier = convention == KJIT_SCALE_DIVIDE ? 1.0f / global : global;
    value = decode_e2m1(e2m1) * decode_e4m3fn(scale_byte) * multiplier;
  } else {
    value = mx_value(decode_e2m1(e2m1), scale_byte);
  }
  if (std::isnan(value)) return value;
  return bf16_to_float(bf16_bits_rne(value));
}

// Stored element (r, c) of expert e converted: the value of W_e at GEMM
// element (n, k) = (r, c) for E_N_K and (c, r) for E_K_N.
inline float mixed_weight_at(const MixedWeights& w, int64_t e, int64_t r, int64_t c) {
  const int64_t rows = w.stored_rows(), cols = w.stored_cols();
  if (w.dtype == KJIT_DTYPE_F4_E2M1) {
    const bool nvfp4 = w.format == KJIT_BLOCK_FORMAT_NVFP4;
    const int64_t group = nvfp4 ? kNvfp4Block : kMxBlock;
    const auto row = w.codes.subspan(static_cast<size_t>((e * rows + r) * (cols / 2)), static_cast<size_t>(cols / 2));
    const uint8_t scale = w.block_scales[static_cast<size_t>((e * rows + r) * (cols / group) + c / group)];
    const float global = nvfp4 ? w.global_scales[static_cast<size_t>(e)] : 1.0f;
    return fp4_weight_value(w.format, e2m1_code_at(row, c), scale, global, w.convention);
  }
  return mixed_weight_value(w.dtype, w.codes[static_cast<size_t>((e * rows + r) * cols + c)], w.scale_of(e, r, c),
                            w.convention);
}

// Expert e's weights converted, in the stored order [R, C].
inline std::vector<float> dequantize_mixed_expert(const MixedWeights& w, int64_t e) {
  const int64_t rows = w.stored_rows(), cols = w.stored_cols();
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[static_cast<size_t>(r * cols + c)] = mixed_weight_at(w, e, r, c);
  return out;
}

// out[N] = row_scale * sum over k of A[k] * W_e(n, k), in fp64, for one row
// `a_row` (K bf16 bits) routed to the expert whose converted weights
// (dequantize_mixed_expert) are `expert`; W_e(n, k) is expert[n * K + k]
// for E_N_K and expert[k * N + n] for E_K_N. Row scale 1 when the launch
// has none.
inline void mixed_gemm_row(std::span<const uint16_t> a_row, std::span<const float> expert, const MixedWeights& w,
                           double row_scale, std::span<double> out) {
  const int64_t n = w.n, k = w.k;
  if (w.layout == KJIT_WEIGHTS_E_N_K) {
    for (int64_t col = 0; col < n; ++col) {
      double sum = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        sum += double(bf16_to_float(a_row[static_cast<size_t>(kk)])) * double(expert[static_cast<size_t>(col * k + kk)]);
      out[static_cast<size_t>(col)] = sum;
    }
  } else {
    // Along the stored rows, so that the inner loop reads the weights in order.
    for (int64_t col = 0; col < n; ++col) out[static_cast<size_t>(col)] = 0;
    for (int64_t kk = 0; kk < k; ++kk) {
      const double a = bf16_to_float(a_row[static_cast<size_t>(kk)]);
      for (int64_t col = 0; col < n; ++col)
        out[static_cast<size_t>(col)] += a * double(expert[static_cast<size_t>(kk * n + col)]);
    }
  }
  for (int64_t col = 0; col < n; ++col) out[static_cast<size_t>(col)] *= row_scale;
}

// Where each expert's rows start and end, from the op's offsets in
// `convention` (E entries of ends, or E + 1 with a leading 0), which must be
// valid (non-decreasing, within the rows).
inline std::vector<int64_t> mixed_segment_starts(std::span<const int32_t> offsets, kjit_expert_offsets convention,
                                                 int64_t experts) {
  std::vector<int64_t> starts{0};
  const size_t first_end = convention == KJIT_OFFSETS_WITH_LEADING_ZERO ? 1 : 0;
  for (int64_t e = 0; e < experts; ++e) starts.push_back(offsets[first_end + static_cast<size_t>(e)]);
  return starts;  // E + 1 entries: expert e owns rows [starts[e], starts[e + 1])
}

// The grouped GEMM of A (bf16 bits [rows, K]) on every `row_step`-th routed
// row (those with row % row_step == 0, row < the last offset), [those rows][N]
// in order; `row_scale` is empty or holds one factor per row of A.
inline std::vector<double> mixed_grouped_gemm(std::span<const uint16_t> a, const MixedWeights& w,
                                              std::span<const int32_t> offsets, kjit_expert_offsets convention,
                                              std::span<const float> row_scale, int64_t row_step = 1) {
  const std::vector<int64_t> starts = mixed_segment_starts(offsets, convention, w.experts);
  std::vector<double> out;
  std::vector<double> row_out(static_cast<size_t>(w.n));
  for (int64_t e = 0; e < w.experts; ++e) {
    const int64_t begin = starts[static_cast<size_t>(e)], end = starts[static_cast<size_t>(e) + 1];
    const int64_t first = (begin + row_step - 1) / row_step * row_step;
    if (first >= end) continue;
    const std::vector<float> expert = dequantize_mixed_expert(w, e);
    for (int64_t row = first; row < end; row += row_step) {
      const double scale = row_scale.empty() ? 1.0 : double(row_scale[static_cast<size_t>(row)]);
      mixed_gemm_row(a.subspan(static_cast<size_t>(row * w.k), static_cast<size_t>(w.k)), expert, w, scale, row_out);
      out.insert(out.end(), row_out.begin(), row_out.end());
    }
  }
  return out;
}

}  // namespace kjit::reference
