// MX quantizer: bf16 [E, rows, K] -> NVFP4 / MXFP4 (packed e2m1 pairs) or
// MXFP8 (fp8 codes), one scale byte per block of 16 (NVFP4, e4m3fn) or 32
// (MX, UE8M0) in a linear or swizzled 128x4 layout, bit-exact with
// runtime/include/kjit/reference/fp4_mx.hpp (quantize_*_block, and
// nvfp4_global_scale for a computed global scale).
//
// Each thread loads kChunksPerThread 16-byte chunks (8 bf16) before converting
// any; consecutive lanes hold consecutive chunks, so every warp load reads 512
// contiguous bytes and the 2 (NVFP4) or 4 (MX) lanes of one scale block are
// neighbours: the block's amax is a max over bf16 magnitude bits (monotonic for
// non-negative values; inf and NaN compare above every finite value) and one or
// two shuffles. Each lane stores its 8 elements' codes (4 or 8 bytes; a warp
// stores a contiguous 128 or 256 bytes), the first lane of a block its scale.
// Grid: x over the expert's chunks, y = the expert (no division to find it).
// Indices are 64-bit.
#pragma once

#include "../abi/mx_quantize_params.h"
#include "../common/mx_encode.cuh"
#include "../common/vector_io.cuh"

namespace kjit {

enum class MxFormat { nvfp4, mxfp4, mxfp8 };
enum class MxElement { e2m1, f8_e4m3fn, f8_e5m2 };
enum class MxGlobal { none, given, compute };

template <MxFormat kFormat_, MxElement kElement_, long long kK_, bool kSwizzled_, MxGlobal kGlobal_, bool kDivide_,
          int kThreads_, int kChunksPerThread_>
struct MxQuantizeConfig {
  static constexpr MxFormat kFormat = kFormat_;
  static constexpr MxElement kElement = kElement_;
  static constexpr long long kK = kK_;
  static constexpr bool kSwizzled = kSwizzled_;
  static constexpr MxGlobal kGlobal = kGlobal_;
  static constexpr bool kDivide = kDivide_;  // NVFP4: dequant divides by the global scale
  static constexpr int kThreads = kThreads_;
  static constexpr int kChunksPerThread = kChunksPerThread_;
  static constexpr bool kFp4 = kFormat != MxFormat::mxfp8;
  static constexpr int kBlock = kFormat == MxFormat::nvfp4 ? 16 : 32;
  static constexpr int kLanesPerBlock = kBlock / 8;
  static constexpr long long kChunksPerRow = kK / 8;
  static constexpr long long kScaleCols = kK / kBlock;
  static constexpr long long kPaddedScaleCols = (kScaleCols + 3) / 4 * 4;
  // emax of the element format (OCP MX): 6 = 1.5 * 2^2, 448 = 1.75 * 2^8, 57344 = 1.75 * 2^15.
  static constexpr int kEmax = kElement == MxElement::e2m1 ? 2 : kElement == MxElement::f8_e4m3fn ? 8 : 15;
  static_assert(kK % kBlock == 0, "codegen admits K a multiple of the block");
  static_assert(kFp4 == (kElement == MxElement::e2m1), "FP4 formats hold e2m1, MXFP8 fp8");
  static_assert((kFormat == MxFormat::nvfp4) == (kGlobal != MxGlobal::none), "only NVFP4 has a global scale");
  static_assert(kThreads % 32 == 0, "whole warps: the shuffles take every lane");
};

// 448 * 6: the largest e4m3 block scale times the largest e2m1 value.
constexpr float kNvfp4Range = 2688.0f;

// The two bf16 of a 32-bit word as exact floats (the first element is the low half).
__device__ __forceinline__ float bf16_low(unsigned int word) { return __uint_as_float(word << 16); }
__device__ __forceinline__ float bf16_high(unsigned int word) { return __uint_as_float(word & 0xffff0000u); }

// Writes one scale byte of expert `expert` (rows per expert `rows`) at (row, col).
template <class Cfg>
__device__ __forceinline__ void store_scale(const kjit_mx_quantize_params& p, long long expert, long long row,
                                            long long col, unsigned int byte) {
  if constexpr (Cfg::kSwizzled) {
    const long long base = expert * ((p.rows + 127) / 128 * 128) * Cfg::kPaddedScaleCols;
    p.scales[base + swizzled_scale_offset(row, col, Cfg::kScaleCols)] = static_cast<unsigned char>(byte);
  } else {
    p.scales[(expert * p.rows + row) * Cfg::kScaleCols + col] = static_cast<unsigned char>(byte);
  }
}

// Offset of swizzled scale (row, scale_col) within one expert's block
// (swizzled_scale_offset), with the 64-bit arithmetic only where rows need it.
template <class Cfg>
__device__ __forceinline__ long long swizzled_offset(long long row, int scale_col) {
  constexpr long long kTiles = Cfg::kPaddedScaleCols / 4;
  const unsigned int low = static_cast<unsigned int>(row);
  const unsigned int inner = (low & 31u) * 16u + ((low >> 5) & 3u) * 4u + (scale_col & 3);
  return ((row >> 7) * kTiles + (scale_col >> 2)) * 512 + inner;
}

// Stores the swizzled scale byte of the block whose first chunk this lane
// holds (a block lead: lane % kLanesPerBlock == 0). Scale columns 4t..4t+3 of
// a row are one aligned 32-bit word (bytes past the last column are padding,
// written 0), and their blocks' leads are kLanesPerBlock lanes apart: where
// all of them are in this warp, the lead of column 4t gathers the other three
// bytes by shuffles (every lane takes part) and stores the word; elsewhere (a
// word split between warps, an unaligned scale pointer) each lead stores its
// byte. One store instead of four, and no partial words.
template <class Cfg>
__device__ __forceinline__ void store_swizzled_scale(const kjit_mx_quantize_params& p, long long base, long long row,
                                                     int col, unsigned int scale, bool valid) {
  constexpr int kStep = Cfg::kLanesPerBlock;
  const unsigned int next1 = __shfl_down_sync(0xffffffffu, scale, kStep);
  const unsigned int next2 = __shfl_down_sync(0xffffffffu, scale, 2 * kStep);
  const unsigned int next3 = __shfl_down_sync(0xffffffffu, scale, 3 * kStep);
  const int lane = threadIdx.x % 32;
  if (!valid || lane % kStep != 0) return;
  const int scale_col = col / kStep;
  const int position = scale_col & 3;
  // The word's real bytes: 4, or fewer in the last (padded) column group.
  const int bytes = Cfg::kScaleCols % 4 == 0 ? 4 : min(4, static_cast<int>(Cfg::kScaleCols) - (scale_col - position));
  const int word_lead = lane - position * kStep;
  const bool words = (reinterpret_cast<unsigned long long>(p.scales) & 3u) == 0;
  const long long word_offset = base + swizzled_offset<Cfg>(row, scale_col - position);
  if (words && word_lead >= 0 && word_lead + (bytes - 1) * kStep < 32) {
    if (position != 0) return;  // the word's lead stores it
    const unsigned int word = (scale & 0xFFu) | (next1 & 0xFFu) << 8 | (next2 & 0xFFu) << 16 | next3 << 24;
    *reinterpret_cast<unsigned int*>(p.scales + word_offset) =
        bytes == 4 ? word : word & ((1u << (8 * bytes)) - 1u);  // padding columns 0
  } else {
    p.scales[word_offset + position] = static_cast<unsigned char>(scale);
  }
}

// The swizzled layout's padding (rows up to a multiple of 128, scale columns
// up to 4), written 0 by the threads that own the last real row and column.
template <class Cfg>
__device__ __forceinline__ void store_scale_padding(const kjit_mx_quantize_params& p, long long expert, long long row,
                                                    long long col) {
  const bool last_col = col == Cfg::kScaleCols - 1;
  if (last_col)
    for (long long c = Cfg::kScaleCols; c < Cfg::kPaddedScaleCols; ++c) store_scale<Cfg>(p, expert, row, c, 0u);
  if (row == p.rows - 1) {
    const long long padded_rows = (p.rows + 127) / 128 * 128;
    const long long col_end = last_col ? Cfg::kPaddedScaleCols : col + 1;
    for (long long r = p.rows; r < padded_rows; ++r)
      for (long long c = col; c < col_end; ++c) store_scale<Cfg>(p, expert, r, c, 0u);
  }
}

// The largest finite bf16 magnitude of the block's chunks (bits), into
// global_scales[expert] by atomicMax on the bits (non-negative floats order as
// their bits; the op zeroed the array first). NaN and inf are left out.
template <class Cfg>
__device__ __forceinline__ void expert_amax(const kjit_mx_quantize_params& p, const uint4 (&x)[Cfg::kChunksPerThread]) {
  unsigned int magnitude = 0;
#pragma unroll
  for (int u = 0; u < Cfg::kChunksPerThread; ++u) {
    const unsigned int words[4] = {x[u].x, x[u].y, x[u].z, x[u].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int halves = words[i] & 0x7fff7fffu;
      magnitude = __vmaxu2(magnitude, halves & __vcmpltu2(halves, 0x7f807f80u));  // finite halves only
    }
  }
  magnitude = max(magnitude & 0xffffu, magnitude >> 16);
  magnitude = __reduce_max_sync(0xffffffffu, magnitude);
  __shared__ unsigned int warp_amax[Cfg::kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = magnitude;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < Cfg::kThreads / 32; ++w) magnitude = max(magnitude, warp_amax[w]);
    if (magnitude != 0)
      atomicMax(reinterpret_cast<unsigned int*>(p.global_scales) + blockIdx.y, magnitude << 16);
  }
}

// Expert amax -> global scale in place: one IEEE division (nvfp4_global_scale).
template <class Cfg>
__device__ __forceinline__ void finalize_global_scale(const kjit_mx_quantize_params& p) {
  const long long expert = static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  if (expert >= p.experts) return;
  const float amax = p.global_scales[expert];
  p.global_scales[expert] =
      amax == 0.0f ? 1.0f : (Cfg::kDivide ? __fdiv_rn(kNvfp4Range, amax) : __fdiv_rn(amax, kNvfp4Range));
}

// NVFP4's 8 codes of one chunk, e2m1(RN(x / d)) as quantize_nvfp4_block
// states, with one reciprocal per block instead of an IEEE division per
// element: RN(|x| / d) = quotient_from_reciprocal(|x|, d, RN(1 / d)) exactly
// (never -0), x's sign put back on the code (that keeps -0's; every x is
// finite here: a block holding NaN or inf never gets here).
// No branch per element: an earlier fast path that fell back to __fdiv_rn
// for the chunk whenever an approximate quotient lay near an e2m1 rounding
// boundary fell back on ~4% of real chunks (bf16 x over d built from e4m3 and
// a bf16-derived global scale often divides to a boundary or 1 ulp from it),
// and its branch made most warps run both paths. The block falls back only
// where the corrections' range (see quotient_from_reciprocal) is not met: r
// outside [2^-126, 2^96] or amax r above 2^100, i.e. global scales that are
// extreme for the data (the same for both lanes of a block).
template <class Cfg>
__device__ __forceinline__ unsigned int nvfp4_codes(const unsigned int (&words)[4], float d, float amax) {
  const float r = __frcp_rn(d);
  unsigned int codes = 0;
  if (r >= 0x1p-126f && r <= 0x1p96f && __fmul_rn(amax, r) <= 0x1p100f) {  // NaN r fails too
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int low = encode_e2m1_of_magnitude(quotient_from_reciprocal(fabsf(bf16_low(words[i])), d, r));
      const unsigned int high = encode_e2m1_of_magnitude(quotient_from_reciprocal(fabsf(bf16_high(words[i])), d, r));
      const unsigned int signs = ((words[i] >> 12) & 0x8u) | ((words[i] >> 24) & 0x80u);  // bf16 sign bits 15, 31
      codes |= (low | high << 4 | signs) << (8 * i);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      codes |= (encode_e2m1_satfinite(__fdiv_rn(bf16_low(words[i]), d)) |
                encode_e2m1_satfinite(__fdiv_rn(bf16_high(words[i]), d)) << 4)
               << (8 * i);
  }
  return codes;
}

// One chunk's 8 codes (4 packed bytes, or 8 fp8 codes in a uint2) and its
// block's scale byte, from the block's amax bits. NVFP4 follows
// quantize_nvfp4_block (IEEE divisions for the block scale; the codes through
// nvfp4_codes); MX divides by a power of two, which multiplying by its exact
// reciprocal reproduces.
template <class Cfg>
__device__ __forceinline__ uint2 encode_chunk(const uint4& x, unsigned int magnitude, float global,
                                              unsigned int& scale) {
  const unsigned int words[4] = {x.x, x.y, x.z, x.w};
  uint2 codes = make_uint2(0u, 0u);
  if constexpr (Cfg::kFormat == MxFormat::nvfp4) {
    if (magnitude >= 0x7f80u) {  // NaN or inf in the block
      scale = 0x7Fu;
      return codes;
    }
    const float per_block = bf16_over_6(__uint_as_float(magnitude << 16));  // RN(amax / 6), exactly
    scale = encode_e4m3fn_satfinite(Cfg::kDivide ? __fmul_rn(per_block, global) : __fdiv_rn(per_block, global));
    const float d = Cfg::kDivide ? __fdiv_rn(decode_e4m3fn(scale), global) : __fmul_rn(decode_e4m3fn(scale), global);
    if (d == 0.0f) return codes;
    codes.x = nvfp4_codes<Cfg>(words, d, __uint_as_float(magnitude << 16));
  } else {
    if (magnitude >= 0x7f80u) {
      scale = 0xFFu;
      return codes;
    }
    scale = mx_scale_byte(magnitude, Cfg::kEmax);
    if constexpr (Cfg::kFp4) {
      const float prescale = mxfp4_prescale(scale);  // 2^-E * 2^-14: x * prescale is exact
#pragma unroll
      for (int i = 0; i < 4; ++i)
        codes.x |= e2m1x2_of_prescaled_f16x2(cvt_rn_f16x2_f32(__fmul_rn(bf16_low(words[i]), prescale),
                                                              __fmul_rn(bf16_high(words[i]), prescale)))
                   << (8 * i);
    } else {
      const float inverse = ue8m0_reciprocal(scale);
      unsigned int pairs[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float low = __fmul_rn(bf16_low(words[i]), inverse);
        const float high = __fmul_rn(bf16_high(words[i]), inverse);
        pairs[i] = Cfg::kElement == MxElement::f8_e4m3fn ? cvt_rn_satfinite_e4m3x2_f32(low, high)
                                                         : cvt_rn_satfinite_e5m2x2_f32(low, high);
      }
      codes = make_uint2(pairs[0] | pairs[1] << 16, pairs[2] | pairs[3] << 16);
    }
  }
  return codes;
}

template <class Cfg>
__device__ __forceinline__ void mx_quantize(const kjit_mx_quantize_params& p) {
  if constexpr (Cfg::kGlobal == MxGlobal::compute) {
    if (p.phase == KJIT_MX_QUANTIZE_PHASE_FINALIZE) {
      finalize_global_scale<Cfg>(p);
      return;
    }
  }
  const long long expert = blockIdx.y;
  const long long chunks = p.rows * Cfg::kChunksPerRow;
  const long long first = static_cast<long long>(blockIdx.x) * Cfg::kThreads * Cfg::kChunksPerThread + threadIdx.x;
  const unsigned char* in = static_cast<const unsigned char*>(p.in);

  // Row (within the expert) and chunk column of each of the thread's chunks:
  // one division, then steps of kThreads chunks (constants).
  long long rows[Cfg::kChunksPerThread];
  int cols[Cfg::kChunksPerThread];
  rows[0] = first / Cfg::kChunksPerRow;
  cols[0] = static_cast<int>(first % Cfg::kChunksPerRow);
#pragma unroll
  for (int u = 1; u < Cfg::kChunksPerThread; ++u) {
    constexpr int kColStep = static_cast<int>(Cfg::kThreads % Cfg::kChunksPerRow);
    const int col = cols[u - 1] + kColStep;
    const bool wraps = col >= Cfg::kChunksPerRow;
    cols[u] = wraps ? col - static_cast<int>(Cfg::kChunksPerRow) : col;
    rows[u] = rows[u - 1] + Cfg::kThreads / Cfg::kChunksPerRow + (wraps ? 1 : 0);
  }

  uint4 x[Cfg::kChunksPerThread];
#pragma unroll
  for (int u = 0; u < Cfg::kChunksPerThread; ++u) {
    const long long chunk = first + static_cast<long long>(u) * Cfg::kThreads;
    x[u] = make_uint4(0u, 0u, 0u, 0u);
    if (chunk < chunks) {
      Bytes<16> loaded;
      load_bytes(loaded, in + 2 * ((expert * p.rows + rows[u]) * p.in_row_stride + cols[u] * 8LL));
      x[u] = *reinterpret_cast<const uint4*>(loaded.b);
    }
  }
  if constexpr (Cfg::kGlobal == MxGlobal::compute) {
    if (p.phase == KJIT_MX_QUANTIZE_PHASE_AMAX) {
      expert_amax<Cfg>(p, x);
      return;
    }
  }

  float global = 1.0f;
  if constexpr (Cfg::kGlobal != MxGlobal::none) global = p.global_scales[expert];
  const long long swizzled_base = expert * ((p.rows + 127) / 128 * 128) * Cfg::kPaddedScaleCols;
#pragma unroll
  for (int u = 0; u < Cfg::kChunksPerThread; ++u) {
    // The block's amax over its lanes (all of them in or past the end together:
    // the chunk count is a multiple of the lanes per block).
    unsigned int magnitude = __vmaxu2(__vmaxu2(x[u].x & 0x7fff7fffu, x[u].y & 0x7fff7fffu),
                                      __vmaxu2(x[u].z & 0x7fff7fffu, x[u].w & 0x7fff7fffu));
    magnitude = max(magnitude & 0xffffu, magnitude >> 16);
#pragma unroll
    for (int offset = 1; offset < Cfg::kLanesPerBlock; offset *= 2)
      magnitude = max(magnitude, __shfl_xor_sync(0xffffffffu, magnitude, offset));

    const long long chunk = first + static_cast<long long>(u) * Cfg::kThreads;
    const bool valid = chunk < chunks;
    const long long row = rows[u];
    const int col = cols[u];
    unsigned int scale = 0;
    if (valid) {
      const uint2 codes = encode_chunk<Cfg>(x[u], magnitude, global, scale);
      const long long flat_row = expert * p.rows + row;
      if constexpr (Cfg::kFp4) {
        *reinterpret_cast<unsigned int*>(p.out + flat_row * (Cfg::kK / 2) + col * 4LL) = codes.x;
      } else {
        *reinterpret_cast<uint2*>(p.out + flat_row * Cfg::kK + col * 8LL) = codes;
      }
    }
    if constexpr (Cfg::kSwizzled) {
      store_swizzled_scale<Cfg>(p, swizzled_base, row, col, scale, valid);  // every lane: it shuffles
      if (valid && threadIdx.x % Cfg::kLanesPerBlock == 0)
        store_scale_padding<Cfg>(p, expert, row, col / Cfg::kLanesPerBlock);
    } else if (valid && threadIdx.x % Cfg::kLanesPerBlock == 0) {
      // Linear: the warp's block leads write consecutive bytes, one sector per store already.
      p.scales[(expert * p.rows + row) * Cfg::kScaleCols + col / Cfg::kLanesPerBlock] = static_cast<unsigned char>(scale);
    }
  }
}

}  // namespace kjit
