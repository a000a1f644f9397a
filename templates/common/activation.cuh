// The MoE activations in fp32, exactly as kjit.h states them
// (kjit_moe_activation_desc) and as runtime/include/kjit/reference/
// moe_activation.hpp evaluates them on the CPU: every operation is an IEEE
// fp32 operation with round-to-nearest-even, written as an intrinsic so that
// the compiler neither contracts nor reorders it, so kernel and reference
// agree bit for bit. e^x is kjit's own (not expf, whose last bits are the
// toolkit's): within 0.92 ulp of the exact value (tests/unit measure it).
#pragma once

namespace kjit {

// Which activation (codegen's Activation, in its order; none: the grouped
// GEMM's plain epilogue).
enum class Activation { none, silu_mul, swiglu_oai };

// e^x: n = rint(x log2 e) on x clamped to [-104, 89] (NaN passes through),
// r = x - n ln2 in two fma steps (ln2 split in a 16-bit head and a tail), the
// degree-7 Taylor polynomial of e^r by Horner in fma, then p * 2^n rounded
// once (two exact-then-rounded multiplies by powers of two: overflow gives
// inf, tiny results round into the subnormals).
__device__ __forceinline__ float activation_exp(float x) {
  if (x != x) return x;
  x = fminf(fmaxf(x, -104.0f), 89.0f);
  const float n = rintf(__fmul_rn(x, 0x1.715476p+0f));
  float r = __fmaf_rn(-n, 0x1.62e4p-1f, x);
  r = __fmaf_rn(-n, 0x1.7f7d1cp-20f, r);
  float p = 0x1.a01a02p-13f;  // 1/7!
  p = __fmaf_rn(p, r, 0x1.6c16c2p-10f);  // 1/6!
  p = __fmaf_rn(p, r, 0x1.111112p-7f);   // 1/5!
  p = __fmaf_rn(p, r, 0x1.555556p-5f);   // 1/4!
  p = __fmaf_rn(p, r, 0x1.555556p-3f);   // 1/3!
  p = __fmaf_rn(p, r, 0.5f);
  p = __fmaf_rn(p, r, 1.0f);
  p = __fmaf_rn(p, r, 1.0f);
  const int exponent = static_cast<int>(n);  // [-150, 128]
  const int half = exponent >> 1;            // both factors are normal powers of two
  const float exact = __fmul_rn(p, __int_as_float((half + 127) << 23));
  return __fmul_rn(exact, __int_as_float((exponent - half + 127) << 23));
}

// silu(g) * u, silu(g) = g / (1 + e^-g).
__device__ __forceinline__ float silu_mul(float gate, float up) {
  const float silu = __fdiv_rn(gate, __fadd_rn(1.0f, activation_exp(-gate)));
  return __fmul_rn(silu, up);
}

// gpt-oss's clamped SwiGLU: g = min(g, limit), u = clamp(u, -limit, limit)
// (NaN passes through both), (g * sigmoid(alpha g)) * (u + 1) with
// sigmoid(z) = 1 / (1 + e^-z).
__device__ __forceinline__ float swiglu_oai(float gate, float up, float alpha, float limit) {
  gate = gate > limit ? limit : gate;
  up = up > limit ? limit : (up < -limit ? -limit : up);
  const float sigmoid = __fdiv_rn(1.0f, __fadd_rn(1.0f, activation_exp(-__fmul_rn(alpha, gate))));
  return __fmul_rn(__fmul_rn(gate, sigmoid), __fadd_rn(up, 1.0f));
}

// The gradients of silu_mul with respect to gate and up, times the incoming
// gradient d: e = e^-g, den = 1 + e, s = 1 / den, silu = g / den (the forward's);
// d_up = d * silu, d_gate = (d * u) * (s * fma(g, 1 - s, 1)).
__device__ __forceinline__ void silu_mul_gradient(float gate, float up, float d, float& d_gate, float& d_up) {
  const float den = __fadd_rn(1.0f, activation_exp(-gate));
  const float s = __fdiv_rn(1.0f, den);
  d_up = __fmul_rn(d, __fdiv_rn(gate, den));
  d_gate = __fmul_rn(__fmul_rn(d, up), __fmul_rn(s, __fmaf_rn(gate, __fsub_rn(1.0f, s), 1.0f)));
}

// swiglu_oai's: g' = min(g, limit), u' = clamp(u, -limit, limit), z = alpha g',
// s = 1 / (1 + e^-z) (the forward's); d_up = d * (g' * s) where -limit < u <
// limit, else 0; d_gate = (d * (u' + 1)) * (s * fma(z, 1 - s, 1)) where g <
// limit, else 0 (the clamps' zero gradient at and past their bounds, NaN's too).
__device__ __forceinline__ void swiglu_oai_gradient(float gate, float up, float d, float alpha, float limit,
                                                    float& d_gate, float& d_up) {
  const float clamped_gate = gate > limit ? limit : gate;
  const float clamped_up = up > limit ? limit : (up < -limit ? -limit : up);
  const float z = __fmul_rn(alpha, clamped_gate);
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, activation_exp(-z)));
  d_up = up > -limit && up < limit ? __fmul_rn(d, __fmul_rn(clamped_gate, s)) : 0.0f;
  d_gate = gate < limit ? __fmul_rn(__fmul_rn(d, __fadd_rn(clamped_up, 1.0f)),
                                    __fmul_rn(s, __fmaf_rn(z, __fsub_rn(1.0f, s), 1.0f)))
                        : 0.0f;
}

// The activation codegen named, of one gate/up pair.
template <Activation kActivation>
__device__ __forceinline__ float activate(float gate, float up, float alpha, float limit) {
  static_assert(kActivation != Activation::none, "an activation to apply");
  if constexpr (kActivation == Activation::silu_mul) return silu_mul(gate, up);
  else return swiglu_oai(gate, up, alpha, limit);
}

// Its gradients with respect to gate and up, times d.
template <Activation kActivation>
__device__ __forceinline__ void activate_gradient(float gate, float up, float d, float alpha, float limit,
                                                  float& d_gate, float& d_up) {
  static_assert(kActivation != Activation::none, "an activation to differentiate");
  if constexpr (kActivation == Activation::silu_mul) silu_mul_gradient(gate, up, d, d_gate, d_up);
  else swiglu_oai_gradient(gate, up, d, alpha, limit, d_gate, d_up);
}

}  // namespace kjit
