// Loads and stores of kBytes contiguous bytes with the widest single
// instructions the size allows (16-byte accesses are what saturate HBM).
// The caller guarantees the alignment: the host picks the vector width from
// the pointers' and strides' alignment before it chooses the kernel.
#pragma once

namespace kjit {

template <int kBytes>
struct Bytes {
  static_assert(kBytes == 1 || kBytes == 2 || kBytes % 4 == 0, "unsupported width");
  unsigned char b[kBytes];
};

// Streaming read-only load: the input is read once, so keep it out of L1.
template <int kBytes>
__device__ __forceinline__ void load_bytes(Bytes<kBytes>& dst, const unsigned char* src) {
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) {
      uint4 v;
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(src + 16 * i));
      *reinterpret_cast<uint4*>(dst.b + 16 * i) = v;
    }
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(dst.b) = __ldg(reinterpret_cast<const uint2*>(src));
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned int*>(dst.b) = __ldg(reinterpret_cast<const unsigned int*>(src));
  } else if constexpr (kBytes == 2) {
    *reinterpret_cast<unsigned short*>(dst.b) = __ldg(reinterpret_cast<const unsigned short*>(src));
  } else {
    dst.b[0] = __ldg(src);
  }
}

template <int kBytes>
__device__ __forceinline__ void store_bytes(unsigned char* dst, const Bytes<kBytes>& src) {
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i)
      *reinterpret_cast<uint4*>(dst + 16 * i) = *reinterpret_cast<const uint4*>(src.b + 16 * i);
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(src.b);
  } else if constexpr (kBytes == 4) {
    *reinterpret_cast<unsigned int*>(dst) = *reinterpret_cast<const unsigned int*>(src.b);
  } else if constexpr (kBytes == 2) {
    *reinterpret_cast<unsigned short*>(dst) = *reinterpret_cast<const unsigned short*>(src.b);
  } else {
    dst[0] = src.b[0];
  }
}

}  // namespace kjit
