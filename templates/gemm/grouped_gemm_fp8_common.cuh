// What the FP8 (W8A8) grouped GEMM kernels share: the problem's constants
// and where each operand's scale lives. The recipe (DeepSeek-V3's): every
// 128-column block kb of K is multiplied on its own, in fp32, and added to
// the fp32 accumulator times a_scale[row, kb] * b_scale; the tensor cores'
// reduced-precision FP8 accumulation never spans more than one block.
#pragma once

#include "../abi/grouped_gemm_fp8_params.h"
#include "grouped_gemm_common.cuh"

namespace kjit {

// GemmProblem's constants (FP8 weights are always [E, N, K]: wgmma reads
// 8-bit operands K-major only) and how B is scaled.
template <long long kN_, long long kK_, bool kOffsetsWithZero_, bool kRowScale_, bool kOutF32_, bool kBlockScales_>
struct Fp8GemmProblem : GemmProblem<kN_, kK_, false, kOffsetsWithZero_, kRowScale_, kOutF32_> {
  static constexpr bool kBlockScales = kBlockScales_;  // B per 128 x 128 block; else per output channel
  static constexpr int kScaleBlock = KJIT_FP8_SCALE_BLOCK;
  static constexpr long long kKScaleBlocks = kK_ / KJIT_FP8_SCALE_BLOCK;  // columns of a_scales and of B's blocks
  static constexpr long long kNScaleBlocks = (kN_ + KJIT_FP8_SCALE_BLOCK - 1) / KJIT_FP8_SCALE_BLOCK;
  static_assert(kK_ % KJIT_FP8_SCALE_BLOCK == 0, "the host admits only K divisible by 128 (whole scale blocks)");
};

// A's scale of `row` for k-block kb.
template <class Cfg>
__device__ __forceinline__ float a_scale(const kjit_fp8_gemm_scales& s, long long row, int kb) {
  return s.a[row * Cfg::kKScaleBlocks + kb];
}

// B's block scale of `expert`, column n, k-block kb (block scales only).
template <class Cfg>
__device__ __forceinline__ float b_block_scale(const kjit_fp8_gemm_scales& s, int expert, long long n, int kb) {
  return s.b[(expert * Cfg::kNScaleBlocks + n / KJIT_FP8_SCALE_BLOCK) * Cfg::kKScaleBlocks + kb];
}

// B's scale of `expert`'s output channel n (channel scales only).
template <class Cfg>
__device__ __forceinline__ float b_channel_scale(const kjit_fp8_gemm_scales& s, int expert, long long n) {
  return s.b[expert * Cfg::kN + n];
}

}  // namespace kjit
