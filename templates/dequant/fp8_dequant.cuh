// FP8 -> bf16 / f16 / f32 dequantisation of [R, C] matrices or expert stacks
// [E, R, C], with per-tensor, per-row or 2-D block fp32 scales.
//
// Work split: each thread handles kUnroll vectors of kVec consecutive columns
// of one row; vector v of an expert is row v / (C / kVec), column
// (v % (C / kVec)) * kVec. Consecutive threads take consecutive vectors, so a
// warp reads 32 * kVec contiguous bytes. All loads are issued before the first
// conversion so that kUnroll 16-byte loads per thread are in flight. gridDim.y
// walks the output slots (experts); every index is 64-bit.
//
// Exactness: out = round_to_out(fp32(code) op scale) with op an IEEE fp32
// multiply or divide, rounded once to nearest-even: a CPU reference that does
// the same is matched bit for bit. NaN codes give NaN, e5m2 inf gives inf.
#pragma once

#include "../abi/device_errors.h"
#include "../abi/dequant_params.h"
#include "../common/fp8_convert.cuh"
#include "../common/vector_io.cuh"

namespace kjit {

enum class OutType { bf16, f16, f32 };
enum class ScaleKind { per_tensor, per_row, per_block };

template <Fp8Format kIn_, OutType kOut_, ScaleKind kScale_, long long kBlockRows_,
          long long kBlockCols_, long long kCols_, int kVec_, bool kDivide_, bool kSelected_,
          int kThreads_, int kUnroll_>
struct DequantConfig {
  static constexpr Fp8Format kIn = kIn_;
  static constexpr OutType kOut = kOut_;
  static constexpr ScaleKind kScale = kScale_;
  static constexpr long long kBlockRows = kBlockRows_;
  static constexpr long long kBlockCols = kBlockCols_;
  static constexpr long long kCols = kCols_;
  static constexpr int kVec = kVec_;
  static constexpr bool kDivide = kDivide_;
  static constexpr bool kSelected = kSelected_;
  static constexpr int kThreads = kThreads_;
  static constexpr int kUnroll = kUnroll_;

  static constexpr long long kVectorsPerRow = kCols / kVec;
  static constexpr long long kScaleCols = kScale == ScaleKind::per_block
                                              ? (kCols + kBlockCols - 1) / kBlockCols : 1;
  // One scale serves a whole vector when blocks never split a vector.
  static constexpr bool kScalePerVector =
      kScale != ScaleKind::per_block || kBlockCols % kVec == 0;
  static constexpr int kOutBytes = kOut == OutType::f32 ? 4 : 2;
  static_assert(kCols % kVec == 0, "the host picks kVec dividing the column count");
};

// Index of the scale covering (row, col) within one expert's scale tensor.
template <class Cfg>
__device__ __forceinline__ long long scale_index(long long row, long long col) {
  if constexpr (Cfg::kScale == ScaleKind::per_tensor) return 0;
  else if constexpr (Cfg::kScale == ScaleKind::per_row) return row;
  else return (row / Cfg::kBlockRows) * Cfg::kScaleCols + col / Cfg::kBlockCols;
}

template <class Cfg>
__device__ __forceinline__ float apply_scale(float value, float scale) {
  if constexpr (Cfg::kDivide) return __fdiv_rn(value, scale);
  else return __fmul_rn(value, scale);
}

// Converts kVec scaled floats into the output bytes.
template <class Cfg>
__device__ __forceinline__ void pack_output(const float (&v)[Cfg::kVec],
                                            Bytes<Cfg::kVec * Cfg::kOutBytes>& out) {
  if constexpr (Cfg::kOut == OutType::f32) {
#pragma unroll
    for (int i = 0; i < Cfg::kVec; ++i) reinterpret_cast<float*>(out.b)[i] = v[i];
  } else if constexpr (Cfg::kVec == 1) {
    const unsigned int pair = Cfg::kOut == OutType::bf16 ? cvt_rn_bf16x2_f32(v[0], 0.0f)
                                                         : cvt_rn_f16x2_f32(v[0], 0.0f);
    *reinterpret_cast<unsigned short*>(out.b) = static_cast<unsigned short>(pair & 0xffffu);
  } else {
#pragma unroll
    for (int i = 0; i < Cfg::kVec / 2; ++i)
      reinterpret_cast<unsigned int*>(out.b)[i] =
          Cfg::kOut == OutType::bf16 ? cvt_rn_bf16x2_f32(v[2 * i], v[2 * i + 1])
                                     : cvt_rn_f16x2_f32(v[2 * i], v[2 * i + 1]);
  }
}

// Every block checks every id before anything is written, so one bad id means
// the whole launch writes nothing; the first block to see it records it.
template <class Cfg>
__device__ __forceinline__ bool expert_ids_valid(const kjit_dequant_params& p) {
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

// One expert slot's vectors [first, first + kUnroll * kThreads). Index is the
// integer type of the vector index: 32-bit when the slot's vector count fits
// (cheap division by the constant vectors-per-row), else 64-bit.
template <class Cfg, class Index>
__device__ __forceinline__ void dequant_slot(const kjit_dequant_params& p, long long slot, Index first,
                                             Index vectors) {
  constexpr int kVec = Cfg::kVec;
  const long long expert = Cfg::kSelected ? static_cast<long long>(p.expert_ids[slot]) : slot;
  const unsigned char* in = p.in + expert * p.in_expert_stride;
  const float* scales = p.scales + expert * p.scale_expert_stride;
  unsigned char* out = static_cast<unsigned char*>(p.out) + slot * p.out_expert_stride * Cfg::kOutBytes;

  // First pass: issue every load (codes and, when one serves the vector, its
  // scale) and remember where each result goes. Only what the second pass
  // needs is kept live, which keeps registers low and occupancy high.
  Bytes<kVec> codes[Cfg::kUnroll];
  float vector_scale[Cfg::kUnroll];
  long long out_offset[Cfg::kUnroll];
#pragma unroll
  for (int u = 0; u < Cfg::kUnroll; ++u) {
    const Index v = first + static_cast<Index>(u * Cfg::kThreads);
    const Index row = v / static_cast<Index>(Cfg::kVectorsPerRow);
    const long long r = static_cast<long long>(row);
    const long long c = static_cast<long long>(v - row * static_cast<Index>(Cfg::kVectorsPerRow)) * kVec;
    out_offset[u] = r * p.out_row_stride + c;
    if (v < vectors) {
      load_bytes<kVec>(codes[u], in + r * p.in_row_stride + c);
      if constexpr (Cfg::kScalePerVector) vector_scale[u] = __ldg(scales + scale_index<Cfg>(r, c));
    }
  }
  // Second pass: convert, scale, round and store.
#pragma unroll
  for (int u = 0; u < Cfg::kUnroll; ++u) {
    const Index v = first + static_cast<Index>(u * Cfg::kThreads);
    if (v >= vectors) break;
    float values[kVec];
    if constexpr (kVec == 1) {
      float unused;
      decode_fp8x2<Cfg::kIn>(codes[u].b[0], values[0], unused);
    } else {
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i)
        decode_fp8x2<Cfg::kIn>(reinterpret_cast<const unsigned short*>(codes[u].b)[i], values[2 * i],
                               values[2 * i + 1]);
    }
    if constexpr (Cfg::kScalePerVector) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) values[i] = apply_scale<Cfg>(values[i], vector_scale[u]);
    } else {
      // Blocks split this vector: each element finds its own scale.
      const Index row = v / static_cast<Index>(Cfg::kVectorsPerRow);
      const long long r = static_cast<long long>(row);
      const long long c = static_cast<long long>(v - row * static_cast<Index>(Cfg::kVectorsPerRow)) * kVec;
#pragma unroll
      for (int i = 0; i < kVec; ++i) values[i] = apply_scale<Cfg>(values[i], __ldg(scales + scale_index<Cfg>(r, c + i)));
    }
    Bytes<kVec * Cfg::kOutBytes> packed;
    pack_output<Cfg>(values, packed);
    store_bytes(out + out_offset[u] * Cfg::kOutBytes, packed);
  }
}

template <class Cfg>
__device__ __forceinline__ void fp8_dequant(const kjit_dequant_params& p) {
  if constexpr (Cfg::kSelected) {
    if (!expert_ids_valid<Cfg>(p)) return;
  }
  const long long vectors = p.rows * Cfg::kVectorsPerRow;
  const long long first = static_cast<long long>(blockIdx.x) * (Cfg::kThreads * Cfg::kUnroll) + threadIdx.x;
  // The same for every thread of the launch, so the branch never diverges.
  const bool narrow = vectors + Cfg::kThreads * Cfg::kUnroll < (1LL << 32);
  for (long long slot = blockIdx.y; slot < p.output_slots; slot += gridDim.y) {
    if (narrow)
      dequant_slot<Cfg, unsigned int>(p, slot, static_cast<unsigned int>(first), static_cast<unsigned int>(vectors));
    else
      dequant_slot<Cfg, long long>(p, slot, first, vectors);
  }
}

}  // namespace kjit
