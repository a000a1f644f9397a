/* The kernel-parameter blocks of the FP8 (W8A8) grouped GEMM kernels, shared
 * by the host (runtime/) and every generated kernel:
 *   out[rows of e] = (A . diag(a_scales) per 128 columns) . (B_e scaled)^T
 * A e4m3fn [total_rows, K] with one fp32 multiplier per row per 128 columns,
 * B e4m3fn [E, N, K] with fp32 multipliers per 128 x 128 block or per output
 * channel. Plain C types only (NVRTC, no headers). */
#ifndef KJIT_ABI_GROUPED_GEMM_FP8_PARAMS_H
#define KJIT_ABI_GROUPED_GEMM_FP8_PARAMS_H

#include "grouped_gemm_params.h"

/* Both operands' scales, fp32 multipliers (x = code * scale). */
struct kjit_fp8_gemm_scales {
  const float* a; /* [total_rows, K / 128] row-major: a[r * K/128 + kb] covers A[r, 128 kb : 128 kb + 128] */
  const float* b; /* block: [E, ceil(N / 128), K / 128] (DeepSeek's weight_scale_inv); channel: [E, N] */
};

/* The portable (mma.sync) kernel's parameters: gemm.a and gemm.b hold e4m3fn codes. */
struct kjit_grouped_gemm_fp8_params {
  struct kjit_grouped_gemm_params gemm;
  struct kjit_fp8_gemm_scales scales;
};

/* The SM90 kernel's: the bf16 kernels' block with its TMA maps over bytes
 * (A boxes of 128 codes x 32 (rows on M: 64) or 128 rows, B boxes of 128 codes x tile_n
 * rows: one 128-byte swizzle row per box row), then the scales. */
struct kjit_grouped_gemm_fp8_sm90_params {
  struct kjit_grouped_gemm_sm90_params sm90;
  struct kjit_fp8_gemm_scales scales;
};

/* K columns per scale of A and per block of B: one k-block of the kernels. */
#define KJIT_FP8_SCALE_BLOCK 128
/* The rows-on-M SM90 kernel's narrow A box (a_map): one consumer warpgroup's
 * 64 rows, the step of its tile heights (the wide box stays 128 rows). */
#define KJIT_FP8_ROWS_ON_M_ROW_BOX 64

#endif
