/* The kernel-parameter blocks of the mixed-input (W8A16, W4A16) grouped GEMM
 * kernels, shared by the host (runtime/) and every generated kernel:
 *   out[rows of e] = A[rows of e] . convert(W_e) (^T for [E, N, K] weights)
 * A bf16 [total_rows, K], W fp8 codes stored [E, N, K] or [E, K, N] with fp32
 * scales over the stored [E, R, C] (per 128 x 128 block, per stored row, or
 * one per expert: the spec says which), or FP4 pairs stored [E, N, K / 2]
 * with their format's scale bytes [E, N, K / group] (NVFP4 also fp32 global
 * scales [E]); each weight converted to bf16 as kjit's dequant converts it.
 * Plain C types only (NVRTC, no headers). */
#ifndef KJIT_ABI_GROUPED_GEMM_MIXED_PARAMS_H
#define KJIT_ABI_GROUPED_GEMM_MIXED_PARAMS_H

#include "grouped_gemm_params.h"

/* The portable (mma.sync) kernel's parameters: gemm.b holds the fp8 codes. */
struct kjit_grouped_gemm_mixed_params {
  struct kjit_grouped_gemm_params gemm;
  const float* b_scales; /* fp8: block [E, ceil(R/128), ceil(C/128)], row [E, R] or tensor [E] */
  const unsigned char* b_block_scales; /* FP4: e4m3fn (NVFP4) or UE8M0 (MXFP4) bytes [E, N, K / group] */
  const float* b_global_scales;        /* NVFP4: [E] */
};

/* The SM90 kernel's: the bf16 kernels' block (A's maps as the bf16 swap-AB
 * kernel's; b_map over the weight bytes: fp8 [E, N, K] in boxes of 128 codes
 * x 128 rows and [E, K, N] in boxes of 128 codes x 128 k-rows, both with a
 * 128-byte swizzle; FP4 [E, N, K / 2] in boxes of 64 bytes x 128 rows with a
 * 64-byte swizzle; the converter kernel's [E, N, K] in boxes of 64 k, 64 codes or 32 bytes of FP4 pairs, x 128
 * rows, unswizzled), then the scales. */
struct kjit_grouped_gemm_mixed_sm90_params {
  struct kjit_grouped_gemm_sm90_params sm90;
  const float* b_scales;
  const unsigned char* b_block_scales;
  const float* b_global_scales;
};

/* k per pipeline stage of the SM90 kernel: [E, N, K] tiles of rows of that many codes (one 128-byte swizzle
 * row), [E, K, N] tiles of that many k-rows. */
#define KJIT_MIXED_K_BLOCK 128

/* The weights' block scales cover KJIT_MIXED_SCALE_BLOCK x KJIT_MIXED_SCALE_BLOCK stored elements. */
#define KJIT_MIXED_SCALE_BLOCK 128

#endif
