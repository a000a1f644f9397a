// CPU reference of the MoE activation (kjit_moe_activation; kjit.h states the
// arithmetic): the same IEEE fp32 operations in the same order as the kernel
// (templates/common/activation.cuh), so the two agree bit for bit. Every
// product that meets an addition goes through std::fma or a library call, so
// no compiler's contraction can change a result; the FP8 output is the bf16
// output quantized by kjit/reference/fp8_quantize.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kjit/reference/fp8_quantize.hpp"

namespace kjit::reference {

enum class GateUp { halves, alternating, groups_of_8 };

// The columns of h holding output column c's gate and up (of I).
inline int64_t gate_column(GateUp layout, int64_t c) {
  return layout == GateUp::halves ? c : layout == GateUp::alternating ? 2 * c : 16 * (c / 8) + c % 8;
}
inline int64_t up_column(GateUp layout, int64_t i_cols, int64_t c) {
  return layout == GateUp::halves ? i_cols + c : layout == GateUp::alternating ? 2 * c + 1 : 16 * (c / 8) + 8 + c % 8;
}
enum class Activation { silu_mul, swiglu_oai };

// e^x as kjit.h states it: within 0.92 ulp of the exact value, not correctly
// rounded, and the same bits as the kernel's.
inline float activation_exp(float x) {
  if (std::isnan(x)) return x;
  x = std::clamp(x, -104.0f, 89.0f);
  const float n = std::nearbyint(x * 0x1.715476p+0f);  // round half to even, the default mode
  float r = std::fma(-n, 0x1.62e4p-1f, x);
  r = std::fma(-n, 0x1.7f7d1cp-20f, r);
  float p = 0x1.a01a02p-13f;
  p = std::fma(p, r, 0x1.6c16c2p-10f);
  p = std::fma(p, r, 0x1.111112p-7f);
  p = std::fma(p, r, 0x1.555556p-5f);
  p = std::fma(p, r, 0x1.555556p-3f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return std::ldexp(p, static_cast<int>(n));  // p * 2^n rounded once
}

inline float silu_mul(float gate, float up) { return gate / (1.0f + activation_exp(-gate)) * up; }

inline float swiglu_oai(float gate, float up, float alpha, float limit) {
  gate = gate > limit ? limit : gate;  // NaN passes through
  up = up > limit ? limit : (up < -limit ? -limit : up);
  const float sigmoid = 1.0f / (1.0f + activation_exp(-(alpha * gate)));
  return gate * sigmoid * (up + 1.0f);
}

// The gradients with respect to gate and up, times d (kjit.h, the gradient of kjit_moe_activation).
inline void silu_mul_gradient(float gate, float up, float d, float& d_gate, float& d_up) {
  const float den = 1.0f + activation_exp(-gate);
  const float s = 1.0f / den;
  d_up = d * (gate / den);
  d_gate = (d * up) * (s * std::fma(gate, 1.0f - s, 1.0f));
}

inline void swiglu_oai_gradient(float gate, float up, float d, float alpha, float limit, float& d_gate, float& d_up) {
  const float clamped_gate = gate > limit ? limit : gate;  // NaN passes through
  const float clamped_up = up > limit ? limit : (up < -limit ? -limit : up);
  const float z = alpha * clamped_gate;
  const float s = 1.0f / (1.0f + activation_exp(-z));
  d_up = up > -limit && up < limit ? d * (clamped_gate * s) : 0.0f;
  d_gate = gate < limit ? (d * (clamped_up + 1.0f)) * (s * std::fma(z, 1.0f - s, 1.0f)) : 0.0f;
}

// fp32 -> bf16 bits, nearest even; NaN -> 0x7FFF (the kernel's NaN bits are
// not specified: compare NaN as NaN).
inline uint16_t activation_bf16_bits(float f) { return std::isnan(f) ? uint16_t{0x7FFF} : bf16_bits_rne(f); }

struct MoeActivationProblem {
  int64_t rows = 0, intermediate = 0;
  int64_t in_row_stride = 0;  // elements, >= 2 * intermediate
  GateUp layout = GateUp::halves;
  Activation activation = Activation::silu_mul;
  float alpha = 1.702f, limit = 7.0f;  // swiglu_oai
  std::optional<int64_t> valid_rows{}; // none: every row; else rows at or past it (all, if negative) are zeros
  int64_t live_rows() const { return valid_rows ? std::clamp<int64_t>(*valid_rows, 0, rows) : rows; }
};

// The bf16 output bits [rows, I] of `in` (bf16 bits [rows, in_row_stride]).
inline std::vector<uint16_t> moe_activation_bf16(const MoeActivationProblem& p, std::span<const uint16_t> in) {
  const int64_t i_cols = p.intermediate;
  std::vector<uint16_t> out(static_cast<size_t>(p.rows * i_cols), 0);
  for (int64_t r = 0; r < p.live_rows(); ++r)
    for (int64_t c = 0; c < i_cols; ++c) {
      const int64_t base = r * p.in_row_stride;
      const int64_t g_at = base + gate_column(p.layout, c), u_at = base + up_column(p.layout, i_cols, c);
      const float g = bf16_to_float(in[static_cast<size_t>(g_at)]), u = bf16_to_float(in[static_cast<size_t>(u_at)]);
      const float v = p.activation == Activation::silu_mul ? silu_mul(g, u) : swiglu_oai(g, u, p.alpha, p.limit);
      out[static_cast<size_t>(r * i_cols + c)] = activation_bf16_bits(v);
    }
  return out;
}

// The gradient of h, bf16 bits [rows, 2I] in h's layout, from `in` (h, bf16 bits [rows, in_row_stride]) and
// `grad` (the activation's output's gradient, bf16 bits [rows, I]); rows past valid_rows are zeros.
inline std::vector<uint16_t> moe_activation_gradient(const MoeActivationProblem& p, std::span<const uint16_t> in,
                                                     std::span<const uint16_t> grad) {
  const int64_t i_cols = p.intermediate;
  std::vector<uint16_t> out(static_cast<size_t>(p.rows * 2 * i_cols), 0);
  for (int64_t r = 0; r < p.live_rows(); ++r)
    for (int64_t c = 0; c < i_cols; ++c) {
      const int64_t g_col = gate_column(p.layout, c), u_col = up_column(p.layout, i_cols, c);
      const float g = bf16_to_float(in[static_cast<size_t>(r * p.in_row_stride + g_col)]);
      const float u = bf16_to_float(in[static_cast<size_t>(r * p.in_row_stride + u_col)]);
      const float d = bf16_to_float(grad[static_cast<size_t>(r * i_cols + c)]);
      float d_gate, d_up;
      if (p.activation == Activation::silu_mul) silu_mul_gradient(g, u, d, d_gate, d_up);
      else swiglu_oai_gradient(g, u, d, p.alpha, p.limit, d_gate, d_up);
      out[static_cast<size_t>(r * 2 * i_cols + g_col)] = activation_bf16_bits(d_gate);
      out[static_cast<size_t>(r * 2 * i_cols + u_col)] = activation_bf16_bits(d_up);
    }
  return out;
}

// The FP8 output: the bf16 output quantized per row per 128 columns as
// fp8_quantize does; rows past valid_rows get zero codes and scale 0.
inline void moe_activation_fp8(const MoeActivationProblem& p, std::span<const uint16_t> in, bool ue8m0,
                               std::span<uint8_t> codes, std::span<float> scales) {
  const auto act = moe_activation_bf16(p, in);
  const int64_t valid = p.live_rows();
  std::vector<int32_t> rows_kept(static_cast<size_t>(p.rows));  // quantize's gather: -1 rows come out zero
  for (int64_t r = 0; r < p.rows; ++r) rows_kept[static_cast<size_t>(r)] = r < valid ? static_cast<int32_t>(r) : -1;
  fp8_quantize(act, p.intermediate, p.rows, p.intermediate, ue8m0, rows_kept, p.rows, 1, codes, scales);
}

}  // namespace kjit::reference
