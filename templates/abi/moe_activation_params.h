/* Kernel-parameter block of the MoE activation (the gate_up GEMM's bf16 output
 * h [rows, 2I] -> act(gate, up) [rows, I] in bf16, or e4m3fn codes with one
 * fp32 scale per row per 128 columns). Shared by the host and the generated
 * kernel; plain C types only. */
#ifndef KJIT_ABI_MOE_ACTIVATION_PARAMS_H
#define KJIT_ABI_MOE_ACTIVATION_PARAMS_H

struct kjit_moe_activation_params {
  const void* in;          /* bf16 [rows, in_row_stride], 16-byte aligned */
  void* out;               /* bf16 or e4m3fn [rows, I], 16-byte aligned */
  float* scales;           /* FP8 out only: [rows, I / 128] row-major */
  const int* valid_rows;   /* optional: rows at or past *valid_rows are written as zeros */
  unsigned int* device_error;
  long long rows;
  long long in_row_stride; /* elements, a multiple of 8 and >= 2I */
  float alpha;             /* swiglu_oai only */
  float limit;             /* swiglu_oai only */
  const void* grad;        /* the gradient (spec's `gradient`): bf16 [rows, I] of the activation's output; `out` is
                              then bf16 [rows, 2I], the gradient of h in its layout */
};

#endif
