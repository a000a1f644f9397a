// The block-scaled "MX" formats on the device (NVFP4, MXFP4, MXFP8): exact
// decoders of e2m1 elements and UE8M0 scales, and the swizzled 128x4 scale
// layout's offsets. The CPU twin of every function here is in
// runtime/include/kjit/reference/fp4_mx.hpp; docs/formats.md states the formulas.
//
// Exactness relies on fp32 subnormals being kept (NVRTC's default -ftz=false):
// the e2m1 bit trick below builds fp32 subnormals, and UE8M0's 0x00 is 2^-127.
#pragma once

namespace kjit {

// e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 from the nibble's three low bits
// `eem` (exponent bias 1, one mantissa bit) placed in an fp32's exponent's two
// low bits and its first mantissa bit: that fp32 is 2^(ee - 127) · 1.m (ee > 0)
// or m · 2^-127 (ee = 0, a subnormal), so times 2^126 it is the e2m1 value,
// exactly, subnormal 0.5 included. The nibble's bit 3 is the sign.
__device__ __forceinline__ float decode_e2m1(unsigned int nibble) {
  const unsigned int bits = ((nibble & 0x8u) << 28) | ((nibble & 0x7u) << 22);
  return __uint_as_float(bits) * 0x1p126f;
}

// Two elements of a packed byte: element 2i is the LOW nibble (FORMATS.md).
__device__ __forceinline__ void decode_e2m1x2(unsigned int byte, float& even, float& odd) {
  even = decode_e2m1(byte & 0xFu);
  odd = decode_e2m1((byte >> 4) & 0xFu);
}

// UE8M0 (OCP MX): byte e is 2^(e - 127): 0x00 is 2^-127 (an fp32 subnormal,
// NOT zero), 0xFE is 2^127, 0xFF is NaN.
__device__ __forceinline__ float decode_ue8m0(unsigned int byte) {
  if (byte == 0xFFu) return __uint_as_float(0x7FC00000u);
  if (byte == 0u) return __uint_as_float(0x00400000u);  // 2^-127
  return __uint_as_float(byte << 23);
}

// The swizzled "128x4" layout: byte offset of scale (row, scale_col) inside
// one expert's block, rows counted from the expert's first row; scale_cols is
// the unpadded count (K / block).
__device__ __forceinline__ long long swizzled_scale_offset(long long row, long long scale_col, long long scale_cols) {
  const long long k_tiles = (scale_cols + 3) / 4;
  return (row / 128 * k_tiles + scale_col / 4) * 512 + row % 32 * 16 + row / 32 % 4 * 4 + scale_col % 4;
}

}  // namespace kjit
