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
#include "sampling.hpp"
#include "kjit/codegen/types.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"

namespace kjit::harness {

// The experts a check routes rows to: the second, the middle and the last
// (quick: the second and the last; fewer where they coincide). The others stay
// empty, so only these experts' weights need filling: a DeepSeek spec holds
// 256 x 4096 x 7168 weights, too many to generate on the host.
inline std::vector<int64_t> routed_experts(int64_t experts, Depth depth = Depth::exhaustive) {
  std::vector<int64_t> candidates = {std::min<int64_t>(1, experts - 1), experts - 1};
  if (depth == Depth::exhaustive) candidates.insert(candidates.begin() + 1, experts / 2);
  std::vector<int64_t> routed;
  for (int64_t e : candidates)
    if (std::find(routed.begin(), routed.end(), e) == routed.end()) routed.push_back(e);
  return routed;
}
// The routed expert given many rows (several row tiles): the middle one, quick the last.
inline int64_t busy_expert(int64_t experts, Depth depth) { return depth == Depth::quick ? experts - 1 : experts / 2; }

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

// The product column of output column j's gate under a fused activation
// (gate/up groups of 8); its up is 8 further.
inline int64_t gate_column(int64_t j) { return j / 8 * 16 + j % 8; }

// The fused activation's reference value, in float64: act(gate, up) * scale
// of a gate and an up product (no row scale), kjit.h's formulas.
inline double activated(double gate, double up, codegen::Activation activation, double scale,
                        const kjit_grouped_gemm_desc& g) {
  double v;
  if (activation == codegen::Activation::silu_mul) {
    v = gate / (1.0 + std::exp(-gate)) * up;
  } else {
    const double gc = std::min(gate, double(g.activation_limit));
    const double uc = std::clamp(up, -double(g.activation_limit), double(g.activation_limit));
    v = (uc + 1.0) * gc / (1.0 + std::exp(-double(g.activation_alpha) * gc));
  }
  return v * scale;
}

// The columns a check compares of each sampled row: `out`, of the output's
// columns (N, or N / 2 with a fused activation), and `product`, the columns of
// the N-column product they read (output column j of a fused activation reads
// its gate_column and the up 8 further). Exhaustive: every column;
// quick: sampled_columns over the output's tiles (tile_n product columns; 128
// where the spec has no tile), 64 more spread evenly.
struct ColumnPlan {
  std::vector<int64_t> out, product;

  ColumnPlan(int64_t n, codegen::Activation activation, int tile_n, Depth depth) {
    const bool fused = activation != codegen::Activation::none;
    const int64_t cols = fused ? n / 2 : n, tile = (tile_n > 0 ? tile_n : 128) / (fused ? 2 : 1);
    out = sampled_columns(cols, tile, depth == Depth::exhaustive ? cols : 64);
    for (int64_t j : out) {
      if (!fused) {
        product.push_back(j);
      } else {
        product.push_back(gate_column(j));
        product.push_back(gate_column(j) + 8);
      }
    }
    std::sort(product.begin(), product.end());
  }
};

// Fails when a byte of `out` from `routed_bytes` on (the rows past the last offset) lost the poison.
inline Expected<void> rows_past_routed_untouched(const std::vector<uint8_t>& out, size_t routed_bytes) {
  for (size_t i = routed_bytes; i < out.size(); ++i)
    if (out[i] != Buffers::kPoison) return fail(KJIT_ERROR_INTERNAL, "a row past the last offset was written");
  return {};
}

// Element `index` of a downloaded output of `out_bytes`-byte elements (f32 or bf16), in fp64.
inline double output_value(const std::vector<uint8_t>& out, int out_bytes, size_t index) {
  if (out_bytes == 4) {
    float f;
    std::memcpy(&f, &out[index * 4], 4);
    return f;
  }
  uint16_t b;
  std::memcpy(&b, &out[index * 2], 2);
  return reference::bf16_to_float(b);
}

// ||got - want|| / ||want|| over the elements added.
class RelativeError {
 public:
  void add(double got, double want) {
    diff_ += (got - want) * (got - want);
    norm_ += want * want;
  }
  // Row `row` of the downloaded output `out` (N = want.size() elements of
  // `out_bytes`: f32 or bf16) against `want`.
  void add_row(const std::vector<uint8_t>& out, int out_bytes, int64_t row, std::span<const double> want) {
    const int64_t n = static_cast<int64_t>(want.size());
    for (int64_t col = 0; col < n; ++col)
      add(output_value(out, out_bytes, static_cast<size_t>(row * n + col)), want[static_cast<size_t>(col)]);
  }
  // Row `row` of a grouped GEMM's output `out` (`out_cols` columns) at
  // `plan.out`, against `product` (the row's N product columns, no row scale;
  // those of `plan.product` filled) through `activation` and times `scale`.
  void add_row(const std::vector<uint8_t>& out, int out_bytes, int64_t out_cols, int64_t row, const ColumnPlan& plan,
               std::span<const double> product, codegen::Activation activation, double scale,
               const kjit_grouped_gemm_desc& g) {
    for (int64_t j : plan.out) {
      const auto at = [&](int64_t c) { return product[static_cast<size_t>(c)]; };
      const double want = activation == codegen::Activation::none
                              ? at(j) * scale
                              : activated(at(gate_column(j)), at(gate_column(j) + 8), activation, scale, g);
      add(output_value(out, out_bytes, static_cast<size_t>(row * out_cols + j)), want);
    }
  }
  double value() const { return std::sqrt(diff_ / std::max(norm_, 1e-30)); }

 private:
  double diff_ = 0, norm_ = 0;
};

}  // namespace kjit::harness
