/* Kernel-parameter block of the MX quantizer (bf16 [E, rows, K] -> NVFP4,
 * MXFP4 or MXFP8 codes and scale bytes; NVFP4's global scale per expert read
 * or computed). Shared by the host and the generated kernel; plain C types only. */
#ifndef KJIT_ABI_MX_QUANTIZE_PARAMS_H
#define KJIT_ABI_MX_QUANTIZE_PARAMS_H

/* What one launch does. A computed global scale takes three launches after a
 * memset of global_scales to 0: AMAX (atomicMax of each expert's finite
 * magnitudes' bits into global_scales[e]), FINALIZE (amax -> the global
 * scale, in place), QUANTIZE. Otherwise QUANTIZE alone. */
enum kjit_mx_quantize_phase {
  KJIT_MX_QUANTIZE_PHASE_QUANTIZE = 0,
  KJIT_MX_QUANTIZE_PHASE_AMAX = 1,
  KJIT_MX_QUANTIZE_PHASE_FINALIZE = 2
};

struct kjit_mx_quantize_params {
  const void* in;             /* bf16 [E * rows, in_row_stride], 16-byte aligned */
  unsigned char* out;         /* packed [E * rows, K / 2] (FP4) or codes [E * rows, K] (MXFP8) */
  unsigned char* scales;      /* scale bytes in the spec's layout */
  float* global_scales;       /* NVFP4: [experts]; NULL otherwise */
  unsigned int* device_error; /* unused (no device-checked input) but every op's block has it */
  long long experts;
  long long rows;             /* per expert */
  long long in_row_stride;    /* elements, a multiple of 8 */
  int phase;                  /* kjit_mx_quantize_phase */
};

#endif
