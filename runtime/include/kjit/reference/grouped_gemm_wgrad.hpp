// CPU reference of the grouped weight-gradient GEMM, written from the C ABI's
// statement (kjit.h: kjit_grouped_gemm_wgrad_desc), independent of the kernel:
//   out[e, n, k] = sum over rows r of expert e of dy[r, n] * x[r, k]
// with bf16 operands decoded exactly and every product and sum in fp64. The
// GPU tests and jitctl selftest compare the kernel against it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"

namespace kjit::reference {

// Rows [start, end) of expert e under either offsets convention (offsets as the kernel reads them).
struct ExpertSegment {
  int64_t start, end;
};
inline ExpertSegment expert_segment(std::span<const int32_t> offsets, kjit_expert_offsets convention, int64_t e) {
  if (convention == KJIT_OFFSETS_WITH_LEADING_ZERO)
    return {offsets[static_cast<size_t>(e)], offsets[static_cast<size_t>(e + 1)]};
  return {e == 0 ? 0 : offsets[static_cast<size_t>(e - 1)], offsets[static_cast<size_t>(e)]};
}

// Row n (K values) of expert `segment`'s out, from bf16 dy [rows, N] and x [rows, K].
inline std::vector<double> grouped_gemm_wgrad_row(std::span<const uint16_t> dy, std::span<const uint16_t> x, int64_t n_cols,
                                                  int64_t k_cols, ExpertSegment segment, int64_t n) {
  std::vector<double> row(static_cast<size_t>(k_cols), 0.0);
  for (int64_t r = segment.start; r < segment.end; ++r) {
    const double d = bf16_to_float(dy[static_cast<size_t>(r * n_cols + n)]);
    const uint16_t* xr = x.data() + r * k_cols;
    for (int64_t k = 0; k < k_cols; ++k) row[static_cast<size_t>(k)] += d * bf16_to_float(xr[k]);
  }
  return row;
}

}  // namespace kjit::reference
