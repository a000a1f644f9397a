/* The kernel-parameter block of the grouped weight-gradient GEMM, shared by
 * the host (runtime/) and every generated kernel:
 *   out[e] (N x K) = dy[rows of e]^T . x[rows of e]
 * rows grouped by expert with device-resident int32 offsets (the grouped
 * GEMM's conventions). Plain C types only (NVRTC, no headers). */
#ifndef KJIT_ABI_GROUPED_GEMM_WGRAD_PARAMS_H
#define KJIT_ABI_GROUPED_GEMM_WGRAD_PARAMS_H

/* kjit_tensor_map */
#include "grouped_gemm_params.h"

struct kjit_grouped_gemm_wgrad_params {
  const void* dy;             /* [total_rows, N] bf16, row-major, rows sorted by expert */
  const void* x;              /* [total_rows, K] bf16, row-major, the same rows */
  void* out;                  /* [E, N, K] fp32 or bf16 */
  const int* offsets;         /* E cumulative ends, or E + 1 starts with a leading 0 (spec) */
  unsigned int* device_error; /* kjit's per-device error words */
  long long total_rows;       /* rows of dy and x; every offset must lie in [0, total_rows] */
  int experts;                /* E: a launch argument, so one kernel serves every expert count */
};

/* The SM90 kernel's parameters: the common block and the two TMA descriptors,
 * encoded by the host for each launch. Both are 2-D row-major views of all
 * rows, in boxes of 64 columns x 64 rows (KJIT_SM90_K_BLOCK), 128-byte swizzle. */
struct kjit_grouped_gemm_wgrad_sm90_params {
  struct kjit_grouped_gemm_wgrad_params wgrad;
  struct kjit_tensor_map dy_map; /* dy as [total_rows, N] */
  struct kjit_tensor_map x_map;  /* x as [total_rows, K] */
};

#endif
