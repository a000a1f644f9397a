/* The kernel-parameter block of the grouped GEMM kernels, shared by the host
 * (runtime/) and every generated kernel. out[rows of expert e] =
 * A[rows of e] . B_e (^T for [E, N, K] weights), rows grouped by expert with
 * device-resident int32 offsets. Plain C++ types only (NVRTC, no headers). */
#ifndef KJIT_ABI_GROUPED_GEMM_PARAMS_H
#define KJIT_ABI_GROUPED_GEMM_PARAMS_H

struct kjit_grouped_gemm_params {
  const void* a;           /* [total_rows, K] bf16 (e4m3fn in the FP8 kernels), row-major, rows sorted by expert */
  const void* b;           /* [E, N, K] or [E, K, N] bf16 (the spec says which), or [E, N, K] e4m3fn */
  void* out;               /* [total_rows, N] bf16 or fp32 */
  const int* offsets;      /* E cumulative ends, or E + 1 starts with a leading 0 (spec) */
  const float* row_scale;  /* optional [total_rows] fp32 epilogue scale (routing weights) */
  unsigned int* device_error; /* kjit's per-device error words */
  long long total_rows;    /* rows of A and out; every offset must lie in [0, total_rows] */
  unsigned int* tile_counter; /* optional, zeroed before each launch: tiles handed out on demand (swap AB);
                                 null: a static round robin */
  float activation_alpha;  /* a fused swiglu_oai's alpha and limit (bf16 family; unused otherwise) */
  float activation_limit;
  /* Gather (the spec's `gather`): row r of the GEMM's A is row gather[r] / gather_top_k of `a` ([gather_tokens,
   * K]): the routing's sorted_to_flat, so no gathered copy of the activations exists. A negative entry reads
   * zeros; one at or past gather_tokens * gather_top_k reads zeros and is reported. */
  const int* gather;
  long long gather_tokens;
  long long gather_top_k;
  /* The spec's addend (bf16 family): [total_rows, N] bf16 or fp32, added to the product before the rounding. */
  const void* addend;
  int experts; /* E, the offsets' experts: a launch argument, so one kernel serves every expert count */
};

/* TMA box facts the host's tensor-map encoder and the SM90 kernels share (in
 * elements). Every box is KJIT_SM90_K_BLOCK bf16 wide along its contiguous
 * axis: one 128-byte swizzle row. */
#define KJIT_SM90_K_BLOCK 64               /* k-block of a pipeline stage */
#define KJIT_SM90_KN_CHUNK 64              /* [E, K, N] weights: N columns per box (one swizzle row) */
#define KJIT_SWAP_AB_ROW_BOX 32            /* swap AB: rows per narrow box, the step of its tile heights */
#define KJIT_SWAP_AB_WIDE_ROW_BOX 128      /* swap AB: rows per wide box (a_wide_map) */

/* A CUtensorMap (the driver's 128-byte TMA descriptor, 128-byte aligned as cuda.h declares it), opaque to kernels:
 * NVRTC has no cuda.h. The host static_asserts the size and alignment. */
struct alignas(128) kjit_tensor_map {
  unsigned long long opaque[16];
};

/* The SM90 kernel's parameters: the common block and the two TMA descriptors,
 * encoded by the host for each launch (they hold the A and B addresses). */
struct kjit_grouped_gemm_sm90_params {
  struct kjit_grouped_gemm_params gemm;
  struct kjit_tensor_map a_map; /* A as [total_rows, K], box [BM, 64], 128-byte swizzle */
  struct kjit_tensor_map b_map; /* B as [E, N, K] (box [1, BN, 64]) or [E, K, N] (box [1, 64, 64]) */
  struct kjit_tensor_map a_wide_map; /* swap AB only: A in boxes of [128, 64] (a_map's are [32, 64]) */
};


#endif
