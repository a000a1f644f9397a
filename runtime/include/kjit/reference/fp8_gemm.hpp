// CPU reference of the FP8 (W8A8) grouped GEMM, written from the C ABI's
// statement (kjit.h: the FP8 fields of kjit_grouped_gemm_desc), independent of
// the kernels: codes decoded exactly, every product and sum in fp64, each
// 128-column block's sum multiplied by its own scales (DeepSeek's recipe).
// The GPU tests and jitctl selftest compare the kernels against it.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"

namespace kjit::reference {

// Columns of K per scale of A and per block of B (KJIT_FP8_SCALE_BLOCK).
inline constexpr int64_t kFp8GemmBlock = 128;

// decode_e4m3fn of every code, as fp64 (a table: the harness's rows run to N x K = 30M products).
inline const std::array<double, 256>& e4m3fn_values() {
  static const std::array<double, 256> values = [] {
    std::array<double, 256> v{};
    for (int code = 0; code < 256; ++code) v[static_cast<size_t>(code)] = decode_e4m3fn(static_cast<uint8_t>(code));
    return v;
  }();
  return values;
}

// One expert's weights: e4m3fn codes [N, K] and their fp32 multipliers,
// KJIT_SCALE_PER_BLOCK [ceil(N / 128), K / 128] or KJIT_SCALE_PER_ROW [N].
struct Fp8ExpertWeights {
  std::span<const uint8_t> codes;
  std::span<const float> scales;
  kjit_scale_granularity granularity;
};

// Column `col` of one output row of the grouped GEMM for a row of A routed to
// expert W, without the row scale:
//   sum over k-blocks kb of (sum_{k in kb} A[k] * W[col, k]) * a_scales[kb] * w_scale(col, kb)
// with w_scale(col, kb) = scales[col / 128][kb] per block, scales[col] per
// channel (the same sum, the channel's scale taken out of it). `a` holds the
// row's K codes and `a_scales` its K / 128 scales; K is a multiple of 128.
inline double fp8_gemm_value(std::span<const uint8_t> a, std::span<const float> a_scales, const Fp8ExpertWeights& w,
                             int64_t k, int64_t col) {
  const int64_t k_blocks = k / kFp8GemmBlock;
  const auto& value = e4m3fn_values();
  const uint8_t* w_row = w.codes.data() + col * k;
  double sum = 0;
  for (int64_t kb = 0; kb < k_blocks; ++kb) {
    double partial = 0;
    for (int64_t kk = kb * kFp8GemmBlock; kk < (kb + 1) * kFp8GemmBlock; ++kk)
      partial += value[a[static_cast<size_t>(kk)]] * value[w_row[kk]];
    double scaled = partial * double(a_scales[static_cast<size_t>(kb)]);
    if (w.granularity == KJIT_SCALE_PER_BLOCK)
      scaled *= double(w.scales[static_cast<size_t>((col / kFp8GemmBlock) * k_blocks + kb)]);
    sum += scaled;
  }
  if (w.granularity != KJIT_SCALE_PER_BLOCK) sum *= double(w.scales[static_cast<size_t>(col)]);
  return sum;
}

// One output row of the grouped GEMM for a row of A routed to expert W:
// out[n] = row_scale * fp8_gemm_value(n) for each of the N columns. Row
// scale 1 when the launch has none.
inline void fp8_gemm_row(std::span<const uint8_t> a, std::span<const float> a_scales, const Fp8ExpertWeights& w,
                         int64_t n, int64_t k, double row_scale, std::span<double> out) {
  for (int64_t col = 0; col < n; ++col)
    out[static_cast<size_t>(col)] = fp8_gemm_value(a, a_scales, w, k, col) * row_scale;
}

}  // namespace kjit::reference
