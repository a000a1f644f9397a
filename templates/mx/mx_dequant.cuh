// MX-format dequantisation (NVFP4, MXFP4, MXFP8) of [R, K] matrices or expert
// stacks [E, R, K] to bf16 / f16 / f32, with linear or swizzled 128x4 scales.
//
// Work split (as fp8_dequant): each thread handles kUnroll vectors of kVec
// consecutive elements of one row; consecutive threads take consecutive
// vectors. The host picks kVec so that a vector's output is one 16-byte store
// (8 bf16/f16, 4 f32): a warp's store is then 512 contiguous bytes, whole
// sectors (codegen/src/families/mx_dequant.cpp says why). All loads (codes
// and the vector's one or two scale bytes, found once per vector in either
// layout) are issued before anything is converted. gridDim.y walks the output
// slots; every index is 64-bit (32-bit vector arithmetic only where the
// slot's count fits).
//
// Exactness (kjit.h, kjit/reference/fp4_mx.hpp): NVFP4 computes
// e2m1 * e4m3(scale) in fp32 (exact), then ONE IEEE multiply or divide by the
// expert's global scale; MX formats multiply the exact element by 2^(s - 127)
// (exact, or inf; subnormals kept: NVRTC's default -ftz=false). One
// round-to-nearest-even to bf16/f16 follows; f32 is stored as is.
#pragma once

#include "../abi/device_errors.h"
#include "../abi/mx_dequant_params.h"
#include "../common/fp8_convert.cuh"
#include "../common/mx_formats.cuh"
#include "../common/vector_io.cuh"

namespace kjit {

enum class MxElements { nvfp4, mxfp4, mxfp8 };
enum class MxOut { bf16, f16, f32 };

template <MxElements kFormat_, Fp8Format kFp8_, MxOut kOut_, long long kK_, bool kSwizzled_, bool kDivide_,
          int kVec_, bool kSelected_, int kThreads_, int kUnroll_>
struct MxDequantConfig {
  static constexpr MxElements kFormat = kFormat_;
  static constexpr Fp8Format kFp8 = kFp8_;  // MXFP8's element format
  static constexpr MxOut kOut = kOut_;
  static constexpr long long kK = kK_;
  static constexpr bool kSwizzled = kSwizzled_;
  static constexpr bool kDivide = kDivide_;  // NVFP4: divide by the global scale
  static constexpr int kVec = kVec_;
  static constexpr bool kSelected = kSelected_;
  static constexpr int kThreads = kThreads_;
  static constexpr int kUnroll = kUnroll_;

  static constexpr bool kFp4 = kFormat != MxElements::mxfp8;
  static constexpr int kBlock = kFormat == MxElements::nvfp4 ? 16 : 32;
  static constexpr long long kScaleCols = kK / kBlock;
  static constexpr long long kVectorsPerRow = kK / kVec;
  static constexpr int kInBytes = kFp4 ? kVec / 2 : kVec;
  static constexpr int kOutBytes = kOut == MxOut::f32 ? 4 : 2;
  // A vector spans one block, or (NVFP4, 32 elements) two adjacent ones.
  static constexpr int kScalesPerVector = kVec > kBlock ? kVec / kBlock : 1;
  // Elements per store: 16 bytes, or the whole vector when it is narrower.
  static constexpr int kStoreElements = kVec * kOutBytes < 16 ? kVec : 16 / kOutBytes;
  static_assert(kK % kBlock == 0 && kK % kVec == 0, "the host checks k against the block and the vector");
  static_assert(kScalesPerVector <= 2 && kVec % kStoreElements == 0, "the host picks at most 16 input bytes");
  static_assert(!kFp4 || kVec % 2 == 0, "FP4 vectors are whole bytes");
};

// Offset of scale (row, scale_col) of one expert's scales. Two scales of one
// vector (NVFP4, an even scale_col) are adjacent bytes in both layouts: in the
// swizzled one, columns 4t..4t+3 of a row are four consecutive bytes.
template <class Cfg>
__device__ __forceinline__ long long mx_scale_offset(long long row, long long scale_col) {
  if constexpr (Cfg::kSwizzled) return swizzled_scale_offset(row, scale_col, Cfg::kScaleCols);
  else return row * Cfg::kScaleCols + scale_col;
}

// The value of element i of a vector, before its scale: e2m1 (low nibble
// first) or the fp8 code, exactly.
template <class Cfg>
__device__ __forceinline__ void decode_pair(const Bytes<Cfg::kInBytes>& codes, int i, float& first, float& second) {
  if constexpr (Cfg::kFp4) {
    decode_e2m1x2(codes.b[i / 2], first, second);
  } else {
    decode_fp8x2<Cfg::kFp8>(static_cast<unsigned short>(codes.b[i] | codes.b[i + 1] << 8), first, second);
  }
}

// value * scale, exactly as the reference: NVFP4 (element * block scale), exact,
// then one IEEE operation with the global scale; MX one (exact) multiply.
template <class Cfg>
__device__ __forceinline__ float scaled(float element, float block_scale, float global_scale) {
  const float local = __fmul_rn(element, block_scale);
  if constexpr (Cfg::kFormat != MxElements::nvfp4) return local;
  else if constexpr (Cfg::kDivide) return __fdiv_rn(local, global_scale);
  else return __fmul_rn(local, global_scale);
}

// Rounds kStoreElements floats to the output type and stores them.
template <class Cfg>
__device__ __forceinline__ void store_values(unsigned char* dst, const float (&v)[Cfg::kStoreElements]) {
  constexpr int kN = Cfg::kStoreElements;
  Bytes<kN * Cfg::kOutBytes> packed;
  if constexpr (Cfg::kOut == MxOut::f32) {
#pragma unroll
    for (int i = 0; i < kN; ++i) reinterpret_cast<float*>(packed.b)[i] = v[i];
  } else if constexpr (kN == 1) {
    const unsigned int pair = Cfg::kOut == MxOut::bf16 ? cvt_rn_bf16x2_f32(v[0], 0.0f) : cvt_rn_f16x2_f32(v[0], 0.0f);
    *reinterpret_cast<unsigned short*>(packed.b) = static_cast<unsigned short>(pair & 0xffffu);
  } else {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i)
      reinterpret_cast<unsigned int*>(packed.b)[i] = Cfg::kOut == MxOut::bf16
                                                         ? cvt_rn_bf16x2_f32(v[2 * i], v[2 * i + 1])
                                                         : cvt_rn_f16x2_f32(v[2 * i], v[2 * i + 1]);
  }
  store_bytes(dst, packed);
}

// Every block checks every id before anything is written, so one bad id means
// the whole launch writes nothing; the first block to see it records it.
template <class Cfg>
__device__ __forceinline__ bool mx_expert_ids_valid(const kjit_mx_dequant_params& p) {
  int bad = 0;
  for (long long i = threadIdx.x; i < p.output_slots; i += Cfg::kThreads) {
    const int id = p.expert_ids[i];
    if (id < 0 || id >= p.experts) {
      bad = 1;
      if (atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_EXPERT_ID_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned int>(id);
    }
  }
  return __syncthreads_or(bad) == 0;
}

// One expert slot's vectors [first, first + kUnroll * kThreads); Index is
// 32-bit when the slot's vector count fits (cheap division by a constant).
template <class Cfg, class Index>
__device__ __forceinline__ void mx_dequant_slot(const kjit_mx_dequant_params& p, long long slot, Index first,
                                                Index vectors) {
  constexpr int kVec = Cfg::kVec;
  const long long expert = Cfg::kSelected ? static_cast<long long>(p.expert_ids[slot]) : slot;
  const unsigned char* in = p.in + expert * p.in_expert_stride;
  const unsigned char* scales = p.scales + expert * p.scale_expert_stride;
  unsigned char* out = static_cast<unsigned char*>(p.out) + slot * p.out_expert_stride * Cfg::kOutBytes;
  float global_scale = 1.0f;
  if constexpr (Cfg::kFormat == MxElements::nvfp4) global_scale = __ldg(p.global_scales + expert);

  // First pass: issue every load, keep only what the second pass needs.
  Bytes<Cfg::kInBytes> codes[Cfg::kUnroll];
  unsigned int scale_bytes[Cfg::kUnroll];
  long long out_offset[Cfg::kUnroll];
  // Row and vector column of vector `first`, then steps of kThreads vectors
  // (constants): one division per thread, not one per vector.
  constexpr Index kPerRow = static_cast<Index>(Cfg::kVectorsPerRow);
  Index row = first / kPerRow;
  Index column = first - row * kPerRow;
#pragma unroll
  for (int u = 0; u < Cfg::kUnroll; ++u) {
    const Index v = first + static_cast<Index>(u * Cfg::kThreads);
    if (u > 0) {
      row += static_cast<Index>(Cfg::kThreads) / kPerRow;
      column += static_cast<Index>(Cfg::kThreads) % kPerRow;
      if (column >= kPerRow) {
        column -= kPerRow;
        ++row;
      }
    }
    const long long r = static_cast<long long>(row);
    const long long c = static_cast<long long>(column) * kVec;
    out_offset[u] = r * p.out_row_stride + c;
    if (v < vectors) {
      load_bytes<Cfg::kInBytes>(codes[u], in + r * p.in_row_stride + (Cfg::kFp4 ? c / 2 : c));
      const unsigned char* scale = scales + mx_scale_offset<Cfg>(r, c / Cfg::kBlock);
      scale_bytes[u] = __ldg(scale);
      if constexpr (Cfg::kScalesPerVector == 2) scale_bytes[u] |= static_cast<unsigned int>(__ldg(scale + 1)) << 8;
    }
  }
  // Second pass: decode, scale, round, store.
#pragma unroll
  for (int u = 0; u < Cfg::kUnroll; ++u) {
    const Index v = first + static_cast<Index>(u * Cfg::kThreads);
    if (v >= vectors) break;
    float block_scale[2];
    if constexpr (Cfg::kFormat == MxElements::nvfp4) {
      decode_fp8x2<Fp8Format::e4m3fn>(static_cast<unsigned short>(scale_bytes[u]), block_scale[0], block_scale[1]);
    } else {
      block_scale[0] = decode_ue8m0(scale_bytes[u]);
      block_scale[1] = block_scale[0];
    }
#pragma unroll
    for (int s = 0; s < kVec / Cfg::kStoreElements; ++s) {
      float values[Cfg::kStoreElements];
      if constexpr (Cfg::kStoreElements == 1) {
        float unused;
        decode_fp8x2<Cfg::kFp8>(codes[u].b[s], values[0], unused);
        values[0] = scaled<Cfg>(values[0], block_scale[0], global_scale);
      } else {
#pragma unroll
        for (int i = 0; i < Cfg::kStoreElements; i += 2) {
          const int element = s * Cfg::kStoreElements + i;
          decode_pair<Cfg>(codes[u], element, values[i], values[i + 1]);
          const float scale = block_scale[element / Cfg::kBlock];
          values[i] = scaled<Cfg>(values[i], scale, global_scale);
          values[i + 1] = scaled<Cfg>(values[i + 1], scale, global_scale);
        }
      }
      store_values<Cfg>(out + (out_offset[u] + s * Cfg::kStoreElements) * Cfg::kOutBytes, values);
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void mx_dequant(const kjit_mx_dequant_params& p) {
  if constexpr (Cfg::kSelected) {
    if (!mx_expert_ids_valid<Cfg>(p)) return;
  }
  const long long vectors = p.rows * Cfg::kVectorsPerRow;
  const long long first = static_cast<long long>(blockIdx.x) * (Cfg::kThreads * Cfg::kUnroll) + threadIdx.x;
  // The same for every thread of the launch, so the branch never diverges.
  const bool narrow = vectors + Cfg::kThreads * Cfg::kUnroll < (1LL << 32);
  for (long long slot = blockIdx.y; slot < p.output_slots; slot += gridDim.y) {
    if (narrow)
      mx_dequant_slot<Cfg, unsigned int>(p, slot, static_cast<unsigned int>(first),
                                         static_cast<unsigned int>(vectors));
    else
      mx_dequant_slot<Cfg, long long>(p, slot, first, vectors);
  }
}

}  // namespace kjit
