// Grouped GEMM for MoE experts at decode (a few rows per expert): bf16
// weights, or fp8 weights converted in registers (W8A16), [E, N, K] only.
// The cost at decode is reading the touched experts' weights once, so the
// kernel is built to stream them:
// - Work only for non-empty (expert, row chunk) pairs: block x of the grid is
//   a slot, and each block finds its pair from the device-resident offsets
//   (expert e has ceil(rows_e / kRows) chunks; a block scan of those counts),
//   so an empty expert costs no block, no loop trip and no load. The grid's x
//   is an upper bound the host knows without the offsets (surplus blocks find
//   no pair and exit); y is the weight tile (kTileN weight rows).
// - Weights on mma.sync's M, tokens on its N (m16n8k16, "swap AB"): a warp
//   owns 16 weight rows and kRows / 8 token tiles; the block's 8 warps split
//   kTileN rows x K between them, kTileN / 16 along the rows and the rest
//   along K (k-warps take chunks kw, kw + kKWarps, ...), and the k-warps'
//   fp32 partials are summed in shared memory in k-warp order: no atomics,
//   no workspace, the same bits every run.
// - Each thread loads 16-byte pieces of its two weight rows straight from
//   global memory into registers, one chunk of 128 k ahead of the one it
//   multiplies (fp8: 2 loads a row, bf16: 4), and its tokens' activations
//   the same way (bf16: 4 loads a token). A thread's fragments hold its own
//   32 of each 128 k, not mma's layout: element j of quad t's set is
//   k = 64 (j / 16) + 16 t + j % 16, and step s of a chunk multiplies
//   elements 4s .. 4s + 3 as mma's (2t, 2t + 1, 2t + 8, 2t + 9). The weights
//   and the activations use the same map, so each product is a true
//   W[n][k] A[r][k], summed in another order than the wgmma kernels.
// - fp8: each code is converted with its 128 x 128 block's multiplier exactly
//   as kjit's dequant does (grouped_gemm_mixed_common.cuh), so this kernel on
//   fp8 weights gives the bits of this kernel on the dequantised bf16 weights.
// - Every block checks every offset first (bad offsets: nothing written).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "grouped_gemm_mixed_common.cuh"
#include "grouped_gemm_mma.cuh"

namespace kjit {

// Problem: GemmProblem (bf16 weights) or MixedGemmProblem (fp8 weights).
template <class Problem, bool kFp8Weights_, int kRows_, int kTileN_>
struct GroupedGemmDecodeConfig : Problem {
  static constexpr bool kFp8Weights = kFp8Weights_;
  static constexpr int kThreads = 256, kWarps = kThreads / 32;
  static constexpr int kRows = kRows_;    // rows of an expert per block (tokens on mma's N)
  static constexpr int kTileN = kTileN_;  // weight rows per block
  static constexpr int kRowWarps = kTileN / 16, kKWarps = kWarps / kRowWarps;
  static constexpr int kTokenTiles = kRows / 8;
  static constexpr int kChunk = 128;  // k per step of the loop: one 128 x 128 scale block's columns
  static constexpr long long kChunks = (Problem::kK + kChunk - 1) / kChunk;
  // 16-byte loads per row and chunk: 32 elements a thread.
  static constexpr int kWeightLoads = kFp8Weights ? 2 : 4;
  static constexpr int kTileOutN = Problem::kFusedActivation ? kTileN / 2 : kTileN;
  static_assert(kRows == 8 || kRows == 16 || kRows == 32, "token tiles of 8");
  static_assert(kTileN == 16 || kTileN == 32 || kTileN == 64 || kTileN == 128, "whole warps over the tile");
  static_assert(!Problem::kWeightsKN, "the decode kernel reads [E, N, K] weights");
};

// The bound on (expert, chunk) pairs the host launches: each non-empty expert
// adds at most one partial chunk, and at most min(E, rows) are non-empty.
// Block x walks slots x, x + grid, ...; find_decode_pair says which pair slot
// `slot` is (false: none, the walk ends).
template <class Cfg>
__device__ __forceinline__ bool find_decode_pair(const kjit_grouped_gemm_params& p, long long slot,
                                                 long long* warp_totals,
                                                 long long* found, int& expert, long long& row0, int& rows) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long before = 0;
  if (threadIdx.x == 0) found[0] = -1;
  for (int base = 0; base < Cfg::kExperts; base += Cfg::kThreads) {
    const int e = base + threadIdx.x;
    long long start = 0, end = 0;
    if (e < Cfg::kExperts) expert_rows<Cfg>(p, e, start, end);
    const long long chunks = (end - start + Cfg::kRows - 1) / Cfg::kRows;
    // Inclusive scan over the block: lanes, then warps' totals.
    long long inclusive = chunks;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const long long up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    __syncthreads();  // the previous round's totals are read
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    long long warp_before = 0, total = 0;
    for (int w = 0; w < Cfg::kWarps; ++w) {
      if (w < warp) warp_before += warp_totals[w];
      total += warp_totals[w];
    }
    const long long first = before + warp_before + inclusive - chunks;
    if (chunks > 0 && slot >= first && slot < first + chunks) {
      found[0] = e;
      found[1] = start + (slot - first) * Cfg::kRows;
      found[2] = end;
    }
    before += total;
    if (slot < before) break;  // uniform: every thread has the same `before`
  }
  __syncthreads();
  if (found[0] < 0) return false;
  expert = static_cast<int>(found[0]);
  row0 = found[1];
  rows = static_cast<int>(found[2] - found[1] < Cfg::kRows ? found[2] - found[1] : Cfg::kRows);
  return true;
}

// One warp's chunk of weights as loaded: two rows (quad group g and g + 8).
template <class Cfg>
struct DecodeWeightChunk {
  uint4 piece[2][Cfg::kWeightLoads];
};
// Its tokens' activations: one token per quad group and token tile.
template <class Cfg>
struct DecodeActivationChunk {
  uint4 piece[Cfg::kTokenTiles][4];
};

// 32-bit word i (elements 2i, 2i + 1 of the thread's set) of four bf16 loads.
__device__ __forceinline__ unsigned decode_bf16_word(const uint4 (&loads)[4], int i) {
  const uint4& v = loads[i / 4];
  const int c = i % 4;
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// The two codes of word i (elements 2i, 2i + 1) of two fp8 loads (16 codes each).
__device__ __forceinline__ unsigned short decode_fp8_pair(const uint4 (&loads)[2], int i) {
  const uint4& v = loads[i / 8];
  const int c = i % 8 / 2;
  const unsigned word = c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
  return static_cast<unsigned short>(word >> (16 * (i % 2)));
}

// The k of a thread's 16-byte load `load` (of 2, fp8 codes, or 4, bf16) within a chunk.
template <int kLoads>
__device__ __forceinline__ int decode_load_k(int load, int quad) {
  constexpr int kElements = 32 / kLoads;  // per load
  const int element = load * kElements;   // first of the thread's set
  return 64 * (element / 16) + 16 * quad + element % 16;
}

template <class Cfg>
__device__ __forceinline__ uint4 decode_load(const void* base, bool in_range) {
  if (!in_range) return make_uint4(0u, 0u, 0u, 0u);
  return __ldg(static_cast<const uint4*>(base));
}

template <class Cfg>
__device__ void grouped_gemm_decode_body(const kjit_grouped_gemm_params& p, const float* b_scales) {
  if (!offsets_valid<Cfg>(p)) return;
  __shared__ long long warp_totals[Cfg::kWarps];
  __shared__ long long found[3];
  __shared__ float partials[Cfg::kKWarps][Cfg::kRows][Cfg::kTileN + 1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int row_warp = warp % Cfg::kRowWarps, k_warp = warp / Cfg::kRowWarps;
  const long long n0 = static_cast<long long>(blockIdx.y) * Cfg::kTileN;
  const long long weight_row[2] = {n0 + row_warp * 16 + group, n0 + row_warp * 16 + group + 8};
  const unsigned short* a = static_cast<const unsigned short*>(p.a);

  for (long long slot = blockIdx.x;; slot += gridDim.x) {
    int expert = 0, rows = 0;
    long long row0 = 0;
    if (!find_decode_pair<Cfg>(p, slot, warp_totals, found, expert, row0, rows)) return;

    // This thread's weight rows and token rows (-1: zeros).
    const unsigned char* weights = static_cast<const unsigned char*>(p.b) +
                                   static_cast<long long>(expert) * Cfg::kN * Cfg::kK * (Cfg::kFp8Weights ? 1 : 2);
    long long source[Cfg::kTokenTiles];
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t)
      source[t] = t * 8 + group < rows ? a_source_row<Cfg>(p, row0 + t * 8 + group) : -1;

    auto load_chunk = [&](long long chunk, DecodeWeightChunk<Cfg>& w, DecodeActivationChunk<Cfg>& x) {
      const long long k0 = chunk * Cfg::kChunk;
      const bool chunk_in = chunk < Cfg::kChunks;
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int l = 0; l < Cfg::kWeightLoads; ++l) {
          const long long k = k0 + decode_load_k<Cfg::kWeightLoads>(l, quad);
          const bool in = chunk_in && weight_row[r] < Cfg::kN && k < Cfg::kK;
          const long long element = weight_row[r] * Cfg::kK + k;
          w.piece[r][l] = decode_load<Cfg>(weights + element * (Cfg::kFp8Weights ? 1 : 2), in);
        }
#pragma unroll
      for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const long long k = k0 + decode_load_k<4>(l, quad);
          x.piece[t][l] = decode_load<Cfg>(a + source[t] * Cfg::kK + k, chunk_in && source[t] >= 0 && k < Cfg::kK);
        }
    };

    float acc[Cfg::kTokenTiles][4];
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[t][c] = 0.0f;

    auto multiply_chunk = [&](long long chunk, const DecodeWeightChunk<Cfg>& w, const DecodeActivationChunk<Cfg>& x) {
      // The thread's 32 weights of each row as 16 bf16 pairs.
      unsigned pairs[2][16];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (Cfg::kFp8Weights) {
          const float s = weight_multiplier<Cfg>(b_scales, expert, weight_row[r], chunk * Cfg::kChunk);
#pragma unroll
          for (int i = 0; i < 16; ++i) pairs[r][i] = convert_weight_pair<Cfg>(decode_fp8_pair(w.piece[r], i), s, s);
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) pairs[r][i] = decode_bf16_word(w.piece[r], i);
        }
      }
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const unsigned af[4] = {pairs[0][2 * s], pairs[1][2 * s], pairs[0][2 * s + 1], pairs[1][2 * s + 1]};
#pragma unroll
        for (int t = 0; t < Cfg::kTokenTiles; ++t) {
          const unsigned bf[2] = {decode_bf16_word(x.piece[t], 2 * s), decode_bf16_word(x.piece[t], 2 * s + 1)};
          mma_m16n8k16_bf16(acc[t], af, bf);
        }
      }
    };

    // Two chunks in flight: chunk c + kKWarps loads while chunk c multiplies.
    DecodeWeightChunk<Cfg> w0, w1;
    DecodeActivationChunk<Cfg> x0, x1;
    load_chunk(k_warp, w0, x0);
    for (long long c = k_warp; c < Cfg::kChunks; c += 2 * Cfg::kKWarps) {
      load_chunk(c + Cfg::kKWarps, w1, x1);
      multiply_chunk(c, w0, x0);
      if (c + Cfg::kKWarps >= Cfg::kChunks) break;
      load_chunk(c + 2 * Cfg::kKWarps, w0, x0);
      multiply_chunk(c + Cfg::kKWarps, w1, x1);
    }

    // The k-warps' partials, then their sum in k-warp order.
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        partials[k_warp][t * 8 + 2 * quad + c % 2][row_warp * 16 + group + 8 * (c / 2)] = acc[t][c];
    __syncthreads();
    for (int i = threadIdx.x; i < rows * Cfg::kTileOutN; i += Cfg::kThreads) {
      const int r = i / Cfg::kTileOutN, col = i % Cfg::kTileOutN;
      const long long out_col = n0 / (Cfg::kFusedActivation ? 2 : 1) + col;
      if (out_col >= Cfg::kOutN) continue;
      // With the fused activation, output column 8G + j is gate 16G + j and up 16G + 8 + j.
      const int n = Cfg::kFusedActivation ? col / 8 * 16 + col % 8 : col;
      float v = 0.0f, up = 0.0f;
#pragma unroll
      for (int kw = 0; kw < Cfg::kKWarps; ++kw) {
        v += partials[kw][r][n];
        if constexpr (Cfg::kFusedActivation) up += partials[kw][r][n + 8];
      }
      if constexpr (Cfg::kFusedActivation) v = activate<Cfg::kActivation>(v, up, p.activation_alpha, p.activation_limit);
      const long long row = row0 + r;
      if constexpr (Cfg::kRowScale) v *= p.row_scale[row];
      if constexpr (Cfg::kOutF32) {
        static_cast<float*>(p.out)[row * Cfg::kOutN + out_col] = v;
      } else {
        static_cast<unsigned short*>(p.out)[row * Cfg::kOutN + out_col] =
            static_cast<unsigned short>(cvt_rn_bf16x2_f32(v, 0.0f) & 0xffffu);
      }
    }
    __syncthreads();  // partials and `found` are reused by the next slot
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_decode(const kjit_grouped_gemm_params& p) {
  grouped_gemm_decode_body<Cfg>(p, nullptr);
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_mixed_decode(const kjit_grouped_gemm_mixed_params& p) {
  grouped_gemm_decode_body<Cfg>(p.gemm, p.b_scales);
}

}  // namespace kjit
