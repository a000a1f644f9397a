/* Kernel-parameter block of the fp8 activation quantizer (bf16 rows -> e4m3fn
 * codes and one fp32 scale per row per 128 columns, optionally gathered
 * through the routing's permutation). Shared by the host and the generated
 * kernel; plain C types only. */
#ifndef KJIT_ABI_FP8_QUANTIZE_PARAMS_H
#define KJIT_ABI_FP8_QUANTIZE_PARAMS_H

struct kjit_fp8_quantize_params {
  const void* in;            /* bf16 [input rows, in_row_stride], 16-byte aligned */
  unsigned char* out;        /* e4m3fn [rows, K], 16-byte aligned */
  float* scales;             /* [rows, K / 128] row-major */
  const int* sorted_to_flat; /* gather only: [rows]; input row = value / top_k; negative = no row */
  unsigned int* device_error;
  long long rows;            /* output rows */
  long long in_row_stride;   /* elements, a multiple of 8 */
  long long top_k;           /* gather only */
  long long entries;         /* gather only: input rows * top_k; a value at or past it is an error */
};

#endif
