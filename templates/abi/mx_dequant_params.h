/* The kernel-parameter block of the MX dequant kernels (NVFP4, MXFP4, MXFP8):
 * one definition, read by the host when it launches and embedded into every
 * generated kernel. Plain C types only (NVRTC, no headers). Counts and strides
 * are 64-bit; input and scale strides in BYTES, output strides in elements. */
#ifndef KJIT_ABI_MX_DEQUANT_PARAMS_H
#define KJIT_ABI_MX_DEQUANT_PARAMS_H

struct kjit_mx_dequant_params {
  const unsigned char* in;     /* packed pairs or fp8 codes, expert e at in + e * in_expert_stride */
  const unsigned char* scales; /* expert e's scale bytes at scales + e * scale_expert_stride */
  const float* global_scales;  /* NVFP4: [experts]; NULL otherwise */
  void* out;                   /* output slot s at out + s * out_expert_stride elements */
  const int* expert_ids;       /* NULL: slot s is expert s; else slot s is expert_ids[s] */
  unsigned int* device_error;  /* kjit's per-device error word pair (see kjit_device_errors) */
  long long rows;
  long long in_row_stride;       /* bytes */
  long long out_row_stride;      /* elements */
  long long in_expert_stride;    /* bytes */
  long long out_expert_stride;   /* elements */
  long long scale_expert_stride; /* bytes: rows * K / block (linear) or the padded swizzled block */
  long long experts;             /* experts present in `in` (the valid id range) */
  long long output_slots;        /* experts written: `experts`, or the number of ids */
};

#endif
