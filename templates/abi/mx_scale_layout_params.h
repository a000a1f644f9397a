/* The kernel-parameter block of the MX scale-layout conversion (linear <->
 * swizzled 128x4): one definition, read by the host when it launches and
 * embedded into every generated kernel. Plain C types only (NVRTC). */
#ifndef KJIT_ABI_MX_SCALE_LAYOUT_PARAMS_H
#define KJIT_ABI_MX_SCALE_LAYOUT_PARAMS_H

struct kjit_mx_scale_layout_params {
  const unsigned char* in;
  unsigned char* out;
  const int* offsets;         /* NULL: every expert has `rows` rows */
  unsigned int* device_error; /* kjit's per-device error word pair (see kjit_device_errors) */
  long long experts;
  long long rows;             /* rows per expert (no offsets) or the total rows (offsets) */
  long long swizzled_words;   /* 4-byte words of the swizzled side: exact (no offsets) or the worst case */
  unsigned int pad;           /* the byte written into the swizzled padding */
};

#endif
