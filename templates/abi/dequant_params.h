/* The kernel-parameter block of the fp8 dequant kernels: one definition, read
 * by the host (runtime/) when it launches and embedded into every generated
 * kernel, so the two sides cannot disagree on the layout. Plain C types only:
 * NVRTC compiles it with no system headers. All counts and strides are in
 * elements and 64-bit (tensors over 2^31 elements are ordinary). */
#ifndef KJIT_ABI_DEQUANT_PARAMS_H
#define KJIT_ABI_DEQUANT_PARAMS_H

struct kjit_dequant_params {
  const unsigned char* in;    /* fp8 codes, expert e at in + e * in_expert_stride */
  const float* scales;        /* expert e's scales at scales + e * scale_expert_stride */
  void* out;                  /* output slot s at out + s * out_expert_stride */
  const int* expert_ids;      /* NULL: slot s is expert s; else slot s is expert_ids[s] */
  unsigned int* device_error; /* kjit's per-device error word pair (see kjit_device_errors) */
  long long rows;
  long long in_row_stride;
  long long out_row_stride;
  long long in_expert_stride;
  long long out_expert_stride;
  long long scale_expert_stride;
  long long experts;      /* experts present in `in` (the valid id range) */
  long long output_slots; /* experts written: `experts`, or the number of ids */
};


#endif
