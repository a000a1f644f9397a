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

// The activation codegen named, of one gate/up pair.
template <Activation kActivation>
__device__ __forceinline__ float activate(float gate, float up, float alpha, float limit) {
  static_assert(kActivation != Activation::none, "an activation to apply");
  if constexpr (kActivation == Activation::silu_mul) return silu_mul(gate, up);
  else return swiglu_oai(gate, up, alpha, limit);
}

}  // namespace kjit
