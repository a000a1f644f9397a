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
#include <numeric>
#include <random>
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

// A check's gathered A (a spec with `gather`): the kernel reads GEMM row r
// as token sorted_to_flat[r] / kTopK, and the tokens are the rows of `a` in
// a shuffled order, so what it gathers is `a` itself, which the reference
// reads. Rows past the routed ones get -1 (they belong to no expert).
struct GatherCheck {
  static constexpr int64_t kTopK = 2;
  std::vector<uint16_t> tokens;  // [rows, K]
  std::vector<int32_t> sorted_to_flat;

  GatherCheck(const std::vector<uint16_t>& a, int64_t rows, int64_t routed, int64_t k, std::mt19937_64& rng)
      : tokens(a.size()), sorted_to_flat(static_cast<size_t>(rows), -1) {
    std::vector<int32_t> token_of(static_cast<size_t>(rows));
    std::iota(token_of.begin(), token_of.end(), 0);
    std::shuffle(token_of.begin(), token_of.end(), rng);
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t t = token_of[static_cast<size_t>(r)];
      std::copy_n(a.begin() + r * k, k, tokens.begin() + t * k);
      if (r < routed) sorted_to_flat[static_cast<size_t>(r)] = static_cast<int32_t>(t * kTopK + r % kTopK);
    }
  }
  // `g` reading its rows from `tokens_on_device` through `index_on_device` (this check's, uploaded).
  void apply(kjit_grouped_gemm_desc& g, CUdeviceptr tokens_on_device, CUdeviceptr index_on_device) const {
    g.a = reinterpret_cast<const void*>(tokens_on_device);
    g.sorted_to_flat = reinterpret_cast<const int32_t*>(index_on_device);
    g.tokens = static_cast<int64_t>(sorted_to_flat.size());
    g.top_k = kTopK;
  }
};

// A spec's fused activation in the descriptor (kjit.h's default alpha and limit).
// With block-scaled W8A16, the checkpoint's gate/up layout too.
template <class Spec>
void set_activation(kjit_grouped_gemm_desc& g, const Spec& spec) {
  g.activation = spec.activation == codegen::Activation::silu_mul     ? KJIT_ACTIVATION_SILU_MUL
                 : spec.activation == codegen::Activation::swiglu_oai ? KJIT_ACTIVATION_SWIGLU_OAI
                                                                      : KJIT_ACTIVATION_NONE;
  if constexpr (requires { spec.gate_up_layout; }) {
    if (spec.gate_up_layout)
      g.activation_gate_up_layout =
          *spec.gate_up_layout == codegen::GateUpLayout::halves ? KJIT_GATE_UP_HALVES : KJIT_GATE_UP_ALTERNATING;
  }
}

// The checkpoint's row of the gate_up_interleaved row n of an N-row stack
// whose gate and up rows lie in `layout` (kjit.h): group n / 16, gate
// rows n % 16 < 8, up the others.
inline int64_t gate_up_source_row(int64_t n, int64_t rows, codegen::GateUpLayout layout) {
  const int64_t j = n / 16 * 8 + n % 8;
  const bool up = n % 16 >= 8;
  return layout == codegen::GateUpLayout::halves ? (up ? rows / 2 + j : j) : 2 * j + (up ? 1 : 0);
}

// The fused activation's reference row, in float64: the product row `h` (N
// columns in gate/up groups of 8, no row scale) -> N / 2 columns
// act(h[16g + i], h[16g + 8 + i]) * scale, kjit.h's formulas.
inline std::vector<double> activated_row(std::span<const double> h, codegen::Activation activation, double scale,
                                         const kjit_grouped_gemm_desc& g) {
  std::vector<double> out(h.size() / 2);
  for (size_t j = 0; j < out.size(); ++j) {
    const double gate = h[j / 8 * 16 + j % 8], up = h[j / 8 * 16 + 8 + j % 8];
    double v;
    if (activation == codegen::Activation::silu_mul) {
      v = gate / (1.0 + std::exp(-gate)) * up;
    } else {
      const double gc = std::min(gate, double(g.activation_limit));
      const double uc = std::clamp(up, -double(g.activation_limit), double(g.activation_limit));
      v = (uc + 1.0) * gc / (1.0 + std::exp(-double(g.activation_alpha) * gc));
    }
    out[j] = v * scale;
  }
  return out;
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
