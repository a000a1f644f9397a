// What the grouped GEMM checks (bf16: grouped_gemm.cpp, FP8:
// grouped_gemm_fp8.cpp) share: the experts they route rows to, the offsets,
// the upload of the routed experts' weights, the common part of the launch's
// descriptor, the check of the rows past the last offset and the relative
// error of sampled rows (internal to the harness).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "device_buffers.hpp"
#include "kjit/codegen/types.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"

namespace kjit::harness {

// The experts a check routes rows to: the second, the middle and the last
// (fewer where they coincide). The others stay empty, so only these experts'
// weights need filling: a DeepSeek spec holds 256 x 4096 x 7168 weights, too
// many to generate on the host.
inline std::vector<int64_t> routed_experts(int64_t experts) {
  std::vector<int64_t> routed;
  for (int64_t e : {std::min<int64_t>(1, experts - 1), experts / 2, experts - 1})
    if (std::find(routed.begin(), routed.end(), e) == routed.end()) routed.push_back(e);
  return routed;
}

// `counts` rows per expert as the op's offsets in `convention`, and the expert of each routed row.
struct Routing {
  std::vector<int32_t> offsets;
  std::vector<int64_t> expert_of;

  Routing(const std::vector<int32_t>& counts, codegen::OffsetsConvention convention) {
    if (convention == codegen::OffsetsConvention::with_leading_zero) offsets.push_back(0);
    int32_t routed = 0;
    for (int32_t c : counts) offsets.push_back(routed += c);
    for (size_t e = 0; e < counts.size(); ++e) expert_of.insert(expert_of.end(), static_cast<size_t>(counts[e]), int64_t(e));
  }
  int64_t routed() const { return static_cast<int64_t>(expert_of.size()); }
};

// Copies each routed expert's weights `w[e]` into its slice of `weights`, the
// device memory of every expert's (the others keep the poison).
template <class T>
Expected<void> upload_routed_weights(Buffers& buffers, CUdeviceptr weights, const std::vector<std::vector<T>>& w,
                                     const std::vector<int64_t>& routed) {
  for (int64_t e : routed) {
    const std::vector<T>& expert = w[static_cast<size_t>(e)];
    const size_t bytes = expert.size() * sizeof(T);
    KJIT_TRY(buffers.copy_in(weights + static_cast<size_t>(e) * bytes, expert.data(), bytes));
  }
  return {};
}

// The descriptor fields both checks fill alike: `spec`'s output dtype, N, K,
// experts, offsets convention and row scale, over `rows` rows with operands of
// dtype `in`. The rest (weights layout, scales, kernel, tiles) is the caller's.
template <class Spec>
kjit_grouped_gemm_desc launch_desc(const Spec& spec, kjit_dtype in, int64_t rows, CUdeviceptr a, CUdeviceptr b,
                                   CUdeviceptr out, CUdeviceptr offsets, CUdeviceptr row_scale) {
  kjit_grouped_gemm_desc g;
  kjit_grouped_gemm_desc_init(&g);
  g.a_dtype = g.b_dtype = in;
  g.out_dtype = spec.out == codegen::DType::f32 ? KJIT_DTYPE_F32 : KJIT_DTYPE_BF16;
  g.rows = rows;
  g.n = spec.n;
  g.k = spec.k;
  g.experts = spec.experts;
  g.offsets_convention = spec.offsets == codegen::OffsetsConvention::with_leading_zero ? KJIT_OFFSETS_WITH_LEADING_ZERO
                                                                                       : KJIT_OFFSETS_CUMULATIVE_END;
  g.a = reinterpret_cast<const void*>(a);
  g.b = reinterpret_cast<const void*>(b);
  g.out = reinterpret_cast<void*>(out);
  g.offsets = reinterpret_cast<const int32_t*>(offsets);
  g.row_scale = spec.row_scale ? reinterpret_cast<const float*>(row_scale) : nullptr;
  return g;
}

// Fails when a byte of `out` from `routed_bytes` on (the rows past the last offset) lost the poison.
inline Expected<void> rows_past_routed_untouched(const std::vector<uint8_t>& out, size_t routed_bytes) {
  for (size_t i = routed_bytes; i < out.size(); ++i)
    if (out[i] != Buffers::kPoison) return fail(KJIT_ERROR_INTERNAL, "a row past the last offset was written");
  return {};
}

// ||got - want|| / ||want|| over the rows added.
class RelativeError {
 public:
  // Row `row` of the downloaded output `out` (N = want.size() elements of
  // `out_bytes`: f32 or bf16) against `want`.
  void add_row(const std::vector<uint8_t>& out, int out_bytes, int64_t row, std::span<const double> want) {
    const int64_t n = static_cast<int64_t>(want.size());
    for (int64_t col = 0; col < n; ++col) {
      const size_t at = static_cast<size_t>((row * n + col) * out_bytes);
      double got;
      if (out_bytes == 4) {
        float f;
        std::memcpy(&f, &out[at], 4);
        got = f;
      } else {
        uint16_t b;
        std::memcpy(&b, &out[at], 2);
        got = reference::bf16_to_float(b);
      }
      const double ref = want[static_cast<size_t>(col)];
      diff_ += (got - ref) * (got - ref);
      norm_ += ref * ref;
    }
  }
  double value() const { return std::sqrt(diff_ / std::max(norm_, 1e-30)); }

 private:
  double diff_ = 0, norm_ = 0;
};

}  // namespace kjit::harness
