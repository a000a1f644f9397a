// MX quantizer: bf16 [E, rows, K] -> NVFP4 / MXFP4 (packed e2m1 pairs) or
// MXFP8 (fp8 codes), one scale byte per block of 16 (NVFP4, e4m3fn) or 32
// (MX, UE8M0) in a linear or swizzled 128x4 layout, bit-exact with
// runtime/include/kjit/reference/fp4_mx.hpp (quantize_*_block, and
// nvfp4_global_scale for a computed global scale).
//
// Each thread loads kChunksPerThread 16-byte chunks (8 bf16) before converting
// any; the kLanesPerBlock = 2 (NVFP4) or 4 (MX) lanes of one scale block are
// neighbours holding consecutive chunks: the block's amax is a max over bf16
// magnitude bits (monotonic for non-negative values; inf and NaN compare above
// every finite value) and one or two shuffles. Each lane stores its 8
// elements' codes (4 or 8 bytes; the lanes of a row piece store contiguous
// bytes). Which chunks a thread takes depends on the scale layout: linear
// scales (mx_quantize_linear) take the expert's chunks in order, swizzled ones
// (mx_quantize_swizzled) one 128x4 scale tile per thread block, so that the
// tile's 512 bytes go out whole in 16-byte stores. Grid: y = the expert (no
// division to find it). Indices are 64-bit where rows need it.
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
// (never -0), encoded by e2m1_code_plus_2p23, x's sign put back on the code
// (that keeps -0's; every x is finite here: a block holding NaN or inf never
// gets here). The codes are summed at their nibbles, 2^23 + code shifted left
// by 4e for element e: the 0x4B000000 of elements e >= 2 leaves 32 bits, that
// of elements 0 and 1 (0x4B000000 + 0xB0000000, mod 2^32) is subtracted.
// No branch per element: a fallback to __fdiv_rn near e2m1 rounding
// boundaries is taken often on real data (e4m3 divisors have short
// significands) and makes warps run both paths (docs/decisions/0016). The
// block falls back only
// where the correction's range (see quotient_from_reciprocal) is not met: r
// outside [2^-126, 2^96] or amax r above 2^100, i.e. global scales that are
// extreme for the data (the same for both lanes of a block).
template <class Cfg>
__device__ __forceinline__ unsigned int nvfp4_codes(const unsigned int (&words)[4], float d, float amax) {
  const float r = __frcp_rn(d);
  unsigned int codes = 0;
  if (r >= 0x1p-126f && r <= 0x1p96f && __fmul_rn(amax, r) <= 0x1p100f) {  // NaN r fails too
    unsigned int sum = 0u - (0x4B000000u + 0xB0000000u);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      sum += e2m1_code_plus_2p23(quotient_from_reciprocal(fabsf(bf16_low(words[i])), d, r)) << (8 * i);
      sum += e2m1_code_plus_2p23(quotient_from_reciprocal(fabsf(bf16_high(words[i])), d, r)) << (8 * i + 4);
    }
    codes = sum | e2m1_signs(words);
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

// The amax bits of the block a chunk belongs to: the chunk's own, then a max
// over the block's kLanesPerBlock neighbouring lanes (every lane takes part).
template <class Cfg>
__device__ __forceinline__ unsigned int block_magnitude(const uint4& x) {
  unsigned int magnitude = __vmaxu2(__vmaxu2(x.x & 0x7fff7fffu, x.y & 0x7fff7fffu),
                                    __vmaxu2(x.z & 0x7fff7fffu, x.w & 0x7fff7fffu));
  magnitude = max(magnitude & 0xffffu, magnitude >> 16);
#pragma unroll
  for (int offset = 1; offset < Cfg::kLanesPerBlock; offset *= 2)
    magnitude = max(magnitude, __shfl_xor_sync(0xffffffffu, magnitude, offset));
  return magnitude;
}

// Stores one chunk's codes (4 packed bytes for FP4, 8 fp8 codes for MXFP8) at
// chunk column `col` of flat row `flat_row`.
template <class Cfg>
__device__ __forceinline__ void store_codes(const kjit_mx_quantize_params& p, long long flat_row, int col,
                                            const uint2& codes) {
  if constexpr (Cfg::kFp4) {
    *reinterpret_cast<unsigned int*>(p.out + flat_row * (Cfg::kK / 2) + col * 4LL) = codes.x;
  } else {
    *reinterpret_cast<uint2*>(p.out + flat_row * Cfg::kK + col * 8LL) = codes;
  }
}

// Linear scales: the grid's x runs over the expert's 16-byte chunks, each
// thread taking kChunksPerThread of them kThreads apart, consecutive lanes
// consecutive chunks (every warp load reads 512 contiguous bytes). The block
// leads of a warp write consecutive scale bytes, whole sectors per store.
template <class Cfg>
__device__ __forceinline__ void mx_quantize_linear(const kjit_mx_quantize_params& p) {
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
#pragma unroll
  for (int u = 0; u < Cfg::kChunksPerThread; ++u) {
    // All lanes of a block are in or past the end together (the chunk count
    // is a multiple of the lanes per block); all of them take the shuffles.
    const unsigned int magnitude = block_magnitude<Cfg>(x[u]);
    if (first + static_cast<long long>(u) * Cfg::kThreads < chunks) {
      unsigned int scale = 0;
      const long long flat_row = expert * p.rows + rows[u];
      store_codes<Cfg>(p, flat_row, cols[u], encode_chunk<Cfg>(x[u], magnitude, global, scale));
      if (threadIdx.x % Cfg::kLanesPerBlock == 0)
        p.scales[flat_row * Cfg::kScaleCols + cols[u] / Cfg::kLanesPerBlock] = static_cast<unsigned char>(scale);
    }
  }
}

// Swizzled 128x4 scales: one thread block per tile, the 128 rows (padding
// included) x 4 scale columns of one expert whose 512 scale bytes are
// contiguous in the layout (docs/formats.md: offset (m % 32) * 16 + (m / 32 % 4) *
// 4 + k % 4 inside the tile; the tiles of an expert row-major, band by band,
// from the expert's 128-row-padded base), so the grid's x is the expert's
// tile index and the block writes its tile whole with 16-byte stores, padding
// bytes (rows past the expert's end, scale columns past K) as 0.
//
// A tile row is kTileChunks = 4 * kLanesPerBlock chunks. In pass u thread t
// takes row m = u * kRowsPerPass + t / kTileChunks, chunk t % kTileChunks
// (a warp loads 4 or 2 whole 128- or 256-byte row pieces). Scale column k and
// m % 32 stay the same across a thread's passes, and m / 32 runs over 0..3
// (NVFP4: one pass each; MX: every other pass), so the 16-byte segment at
// (m % 32) * 16 holds scale byte k of 4 of the thread's passes: each lane
// packs those 4 bytes into a word (byte m / 32), and the lane of column 0
// gathers the words of columns 1..3 by shuffles and transposes the 4x4 bytes
// into the segment.
template <class Cfg>
__device__ __forceinline__ void mx_quantize_swizzled(const kjit_mx_quantize_params& p) {
  constexpr int kTileChunks = 4 * Cfg::kLanesPerBlock;
  constexpr int kRowsPerPass = Cfg::kThreads / kTileChunks;
  constexpr int kSegments = 32 / kRowsPerPass;  // segments (16-byte tile rows) per thread: 1 (NVFP4) or 2 (MX)
  constexpr unsigned int kTiles = static_cast<unsigned int>(Cfg::kPaddedScaleCols / 4);
  static_assert(Cfg::kThreads % kTileChunks == 0 && 32 % kRowsPerPass == 0, "a pass takes whole tile rows");
  static_assert(kRowsPerPass * Cfg::kChunksPerThread == 128, "a thread block takes one 128-row tile");
  const long long expert = blockIdx.y;
  const unsigned int band = blockIdx.x / kTiles;  // the tile's 128 rows, within the expert
  const int tile_col = static_cast<int>(blockIdx.x % kTiles);
  const int lane_col = static_cast<int>(threadIdx.x % kTileChunks);
  const int first_row = static_cast<int>(threadIdx.x / kTileChunks);  // in the tile, pass 0
  const int col = tile_col * kTileChunks + lane_col;                   // chunk column in the row
  const bool col_valid = Cfg::kChunksPerRow % kTileChunks == 0 || col < Cfg::kChunksPerRow;
  const long long row = band * 128LL + first_row;  // within the expert, pass 0
  // Passes whose row exists: u * kRowsPerPass < rows_left.
  const int rows_left = static_cast<int>(min(p.rows - row, 128LL));
  const long long flat_row = expert * p.rows + row;
  const unsigned char* in = static_cast<const unsigned char*>(p.in) + 2 * (flat_row * p.in_row_stride + col * 8LL);
  const long long pass_stride = 2LL * kRowsPerPass * p.in_row_stride;  // bytes

  uint4 x[Cfg::kChunksPerThread];
#pragma unroll
  for (int u = 0; u < Cfg::kChunksPerThread; ++u) {
    x[u] = make_uint4(0u, 0u, 0u, 0u);
    if (col_valid && u * kRowsPerPass < rows_left) {
      Bytes<16> loaded;
      load_bytes(loaded, in + u * pass_stride);
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
  unsigned int packed[kSegments] = {};  // byte g: the scale of row group m / 32 = g
#pragma unroll
  for (int u = 0; u < Cfg::kChunksPerThread; ++u) {
    const unsigned int magnitude = block_magnitude<Cfg>(x[u]);
    unsigned int scale = 0;  // padding rows and columns: 0
    if (col_valid && u * kRowsPerPass < rows_left) {
      const uint2 codes = encode_chunk<Cfg>(x[u], magnitude, global, scale);
      store_codes<Cfg>(p, flat_row + u * kRowsPerPass, col, codes);
    }
    packed[u % kSegments] |= scale << (8 * (u / kSegments));
  }

  const long long tile = (expert * ((p.rows + 127) / 128) + band) * kTiles + tile_col;
  unsigned char* segments = p.scales + tile * 512 + first_row * 16;
#pragma unroll
  for (int h = 0; h < kSegments; ++h) {
    constexpr int kStep = Cfg::kLanesPerBlock;  // lanes from one scale column to the next
    const unsigned int column0 = packed[h];
    const unsigned int column1 = __shfl_down_sync(0xffffffffu, column0, kStep);
    const unsigned int column2 = __shfl_down_sync(0xffffffffu, column0, 2 * kStep);
    const unsigned int column3 = __shfl_down_sync(0xffffffffu, column0, 3 * kStep);
    if (lane_col != 0) continue;
    // Word g of the segment: byte g of columns 0..3 (the 4x4 byte transpose).
    const unsigned int low01 = __byte_perm(column0, column1, 0x5140);   // c0.b0 c1.b0 c0.b1 c1.b1
    const unsigned int low23 = __byte_perm(column2, column3, 0x5140);   // c2.b0 c3.b0 c2.b1 c3.b1
    const unsigned int high01 = __byte_perm(column0, column1, 0x7362);  // c0.b2 c1.b2 c0.b3 c1.b3
    const unsigned int high23 = __byte_perm(column2, column3, 0x7362);
    const uint4 segment = make_uint4(__byte_perm(low01, low23, 0x5410), __byte_perm(low01, low23, 0x7632),
                                     __byte_perm(high01, high23, 0x5410), __byte_perm(high01, high23, 0x7632));
    unsigned char* to = segments + h * kRowsPerPass * 16;
    if ((reinterpret_cast<unsigned long long>(p.scales) & 15u) == 0) {
      *reinterpret_cast<uint4*>(to) = segment;
    } else {  // an unaligned scale pointer (the op allows any): byte by byte
      const unsigned int words[4] = {segment.x, segment.y, segment.z, segment.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) to[i] = static_cast<unsigned char>(words[i / 4] >> (8 * (i % 4)));
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void mx_quantize(const kjit_mx_quantize_params& p) {
  if constexpr (Cfg::kGlobal == MxGlobal::compute) {
    if (p.phase == KJIT_MX_QUANTIZE_PHASE_FINALIZE) {
      finalize_global_scale<Cfg>(p);
      return;
    }
  }
  if constexpr (Cfg::kSwizzled) {
    mx_quantize_swizzled<Cfg>(p);
  } else {
    mx_quantize_linear<Cfg>(p);
  }
}

}  // namespace kjit
