// Grouped GEMM for MoE experts at decode (a few rows per expert), [E, N, K]
// weights only (DecodeOperands): bf16 weights and activations; fp8 weights
// converted in registers to meet bf16 activations (W8A16); fp8 weights and
// fp8 activations (W8A8, each operand's scale per 128 k, multiplied in after
// each 128-k block's product as the other W8A8 kernels do); or FP4 weights
// (NVFP4, MXFP4: e2m1 pairs and their groups' scale bytes) converted in
// registers to meet bf16 activations (W4A16).
// The cost at decode is reading the touched experts' weights once, so the
// kernel is built to stream them:
// - Work only for non-empty (expert, row chunk) pairs: block x of the grid is
//   a slot, and each block finds its pair from the device-resident offsets
//   (expert e has ceil(rows_e / kRows) chunks; a block scan of those counts),
//   so an empty expert costs no block, no loop trip and no load. The grid's x
//   is an upper bound the host knows without the offsets (surplus blocks find
//   no pair and exit); y is the weight tile (kTileN weight rows).
// - Weights on mma.sync's M, tokens on its N (m16n8k16, W8A8 m16n8k32 e4m3; "swap AB"): a warp
//   owns 16 weight rows and kRows / 8 token tiles; the block's 8 warps split
//   kTileN rows x K between them, kTileN / 16 along the rows and the rest
//   along K (k-warps take chunks of 128 k kw, kw + kKWarps, ...), and the
//   k-warps' fp32 partials are summed in shared memory in k-warp order: no
//   atomics, no workspace, the same bits every run.
// - The weights stream into a ring in dynamic shared memory, each warp or
//   thread reading back only what it copied, so the ring needs no block
//   barrier (docs/decisions/0023 has both measured on an H200):
//   - bf16, W8A8 and W4A16 (kBulkCopies): each warp's 16 rows' chunks (256 bytes a row: 128 k of bf16, 256 of
//     fp8; W4A16 128 bytes, 256 k of FP4) come by bulk copies (sm_90's cp.async.bulk, one a row, issued by 16 lanes)
//     into the warp's ring of kStages chunks, each with an mbarrier counting
//     the bytes landed; every stage but the one multiplied is in flight.
//     Twice the rate of per-thread copies: 80-100% of copy bandwidth.
//   - W8A16: each thread copies 16-byte pieces of its two rows (2 a row and
//     chunk) and the chunk's two scales with cp.async into its own ring,
//     kStages - 1 chunks ahead, waiting with cp.async.wait_group. Its
//     conversions, not the copies, set fp8's pace; the bulk copies measured
//     10-25% slower here.
//   Its tokens' activations (L2 hits) come into registers one chunk ahead
//   (W4A16: 128 k ahead, with its rows' group scale bytes).
//   A thread's fragments hold its own quarter of each chunk, not mma's
//   layout: of a 256-byte row, quad t reads the 16-byte loads at bytes
//   128 (l / 2) + 32 t + 16 (l % 2) (decode_load_k), and mma step s takes
//   its 32-bit words 2s and 2s + 1 as the words mma gives quad t (m16n8k16:
//   k 2t, 2t + 1 and 2t + 8, 2t + 9; m16n8k32: 4t .. 4t + 3 and
//   16 + 4t ..). The weights and the activations use the same map, so each
//   product is a true W[n][k] A[r][k], summed in another order than the
//   wgmma kernels. W8A8's steps 0-3 cover the chunk's first 128 k, 4-7 its
//   second: one scale block each. (W8A16's codes: element j of the thread's
//   32 per row meets bf16 element j.)
// - In flight (Little's law: an H200's ~4.3 TB/s over ~1 us of latency is
//   ~4.5 MB, ~33 KB per SM): a block keeps up to 64 KB (bf16) or 48 KB
//   (fp8) of weights in flight, and at 8 rows (the decode bucket's tile) two
//   blocks fit an SM.
// - W8A16: each code is converted with its 128 x 128 block's multiplier exactly
//   as kjit's dequant does (grouped_gemm_mixed_common.cuh), so this kernel on
//   fp8 weights gives the bits of this kernel on the dequantised bf16 weights.
// - W4A16: 128 k (half a chunk) at a time, quad t takes the 32 k from 32 t
//   (16 bytes of a ring row, one MXFP4 group or two NVFP4 ones) and mma step
//   s its bytes 2s and 2s + 1 (k 4s .. 4s + 3), the activations' words 2s and
//   2s + 1 of the same 32 k. A byte of two codes becomes its exact bf16 pair
//   by a lookup (Fp4Tables' pairs, in shared memory after the ring: 112 KB a
//   block, two an SM for MXFP4; NVFP4's two scales a thread need more than
//   128 registers, so one) times its group's scale, as the other W4A16
//   kernels convert; NVFP4's expert global multiplies the accumulator after
//   the loop.
// - Every block checks every offset first (bad offsets: nothing written).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "../common/cp_async.cuh"
#include "../common/mbarrier_ring.cuh"
#include "../common/ptx.cuh"
#include "grouped_gemm_fp8_common.cuh"
#include "grouped_gemm_mixed_common.cuh"
#include "grouped_gemm_mma.cuh"

namespace kjit {

// The operands: the bf16 family's, the mixed family's fp8 weights (W8A16), the FP8 family's (W8A8) or the
// mixed family's FP4 weights (W4A16).
enum class DecodeOperands { bf16, w8a16, w8a8, w4a16 };

// Problem: GemmProblem (bf16), MixedGemmProblem (W8A16, W4A16) or Fp8GemmProblem (W8A8).
template <class Problem, DecodeOperands kOperands_, int kRows_, int kTileN_>
struct GroupedGemmDecodeConfig : Problem {
  static constexpr DecodeOperands kOperands = kOperands_;
  static constexpr bool kW8A8 = kOperands == DecodeOperands::w8a8;
  static constexpr bool kFp4Weights = kOperands == DecodeOperands::w4a16;
  static constexpr bool kFp8Weights = kOperands == DecodeOperands::w8a16 || kW8A8;
  static constexpr int kWeightBits = kFp4Weights ? 4 : kFp8Weights ? 8 : 16;
  static constexpr int kThreads = 256, kWarps = kThreads / 32;
  static constexpr int kRows = kRows_;    // rows of an expert per block (tokens on mma's N)
  static constexpr int kTileN = kTileN_;  // weight rows per block
  static constexpr int kRowWarps = kTileN / 16, kKWarps = kWarps / kRowWarps;
  static constexpr int kTokenTiles = kRows / 8;
  // k per step of the loop: one 128 x 128 scale block's columns (W8A8: two, 256 bytes a row as bf16's 128 k;
  // W4A16: 256 in 128-byte rows, multiplied 128 k at a time so that their activations fit in registers).
  static constexpr int kChunk = kW8A8 ? 256 : kFp4Weights ? 256 : 128;
  static constexpr int kSlices = kFp4Weights ? 2 : 1, kSliceK = kChunk / kSlices;
  static constexpr long long kChunks = (Problem::kK + kChunk - 1) / kChunk;
  // A thread's 16-byte loads per row and chunk (not W4A16's): a quarter of the row.
  static constexpr int kWeightLoads = kOperands == DecodeOperands::w8a16 ? 2 : 4;
  static constexpr int kTileOutN = Problem::kFusedActivation ? kTileN / 2 : kTileN;
  static constexpr bool kBulkCopies = kOperands != DecodeOperands::w8a16;
  static constexpr int kStages = kBulkCopies ? 3 : 4;
  // W8A16, the threads' ring: kStages chunks of each thread's 2 x kWeightLoads 16-byte pieces,
  // [stage][piece][thread], then its two rows' scales, [stage][row][thread].
  static constexpr int kPieces = 2 * kWeightLoads;
  static constexpr int kPieceBytes = kStages * kPieces * kThreads * 16;
  // bf16 and W8A8, the warps' ring: [stage][warp] 16 rows of a chunk, then the mbarriers, [warp][stage].
  // W4A16's rows are half as long, so that its ring and tables leave room for two blocks an SM.
  static constexpr int kRowBytes = kFp4Weights ? 128 : 256;
  static constexpr int kWarpStageBytes = 16 * kRowBytes;
  static constexpr int kRingBytes =
      kBulkCopies ? kStages * kWarps * kWarpStageBytes : kPieceBytes + kStages * 2 * kThreads * 4;
  static constexpr int kBarrierBytes = kBulkCopies ? kStages * kWarps * 8 : 0;
  // W4A16's code-pair table follows the barriers (64 KB; its scales are converted in registers).
  static constexpr int kTableBytes = kFp4Weights ? Fp4Tables::kPairBytes : 0;
  static constexpr int kSharedBytes = kRingBytes + kBarrierBytes + kTableBytes;  // 96 KB; W8A16 72 KB; W4A16 112 KB
  // The k-warps' partials, summed after the loop, take the ring's place (nothing is in flight then).
  static constexpr int kPartialsBytes = kKWarps * kRows * (kTileN + 1) * 4;
  static_assert(kPartialsBytes <= kRingBytes, "the partials fit in the ring");
  static_assert(kRows == 8 || kRows == 16 || kRows == 32, "token tiles of 8");
  static_assert(kTileN == 16 || kTileN == 32 || kTileN == 64 || kTileN == 128, "whole warps over the tile");
  static_assert(!Problem::kWeightsKN, "the decode kernel reads [E, N, K] weights");
  static_assert(!kBulkCopies || kChunk * kWeightBits / 8 == kRowBytes, "a chunk's row fills a ring row");
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
  for (int base = 0; base < p.experts; base += Cfg::kThreads) {
    const int e = base + threadIdx.x;
    long long start = 0, end = 0;
    if (e < p.experts) expert_rows<Cfg>(p, e, start, end);
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

// Its tokens' activations: one token per quad group and token tile. W8A8 adds the chunk's multipliers
// of its two scale blocks: the weights' for its rows (group, group + 8) and the activations' for its
// accumulator's tokens (2 quad, 2 quad + 1 of each token tile). W4A16 adds its rows' group scales.
template <class Cfg, DecodeOperands kOperands = Cfg::kOperands>
struct DecodeActivationChunk {
  uint4 piece[Cfg::kTokenTiles][4];
};
template <class Cfg>
struct DecodeActivationChunk<Cfg, DecodeOperands::w8a8> {
  uint4 piece[Cfg::kTokenTiles][4];
  float weight_scale[2][2];                 // [row][block]
  float token_scale[Cfg::kTokenTiles][2][2];  // [tile][token][block]
};
template <class Cfg>
struct DecodeActivationChunk<Cfg, DecodeOperands::w4a16> {
  uint4 piece[Cfg::kTokenTiles][4];
  unsigned scale_bytes[2];  // [row]: the group scale byte of the thread's 32 k (NVFP4: its two groups' bytes)
};

// 32-bit word i of 16-byte loads (bf16: elements 2i, 2i + 1 of the thread's set; fp8: 4i .. 4i + 3).
template <int kLoads>
__device__ __forceinline__ unsigned decode_word(const uint4 (&loads)[kLoads], int i) {
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

// The k of a thread's 16-byte load `load` (of 2, W8A16's codes, or 4, bf16) within a chunk.
template <int kLoads>
__device__ __forceinline__ int decode_load_k(int load, int quad) {
  constexpr int kElements = 32 / kLoads;  // per load
  const int element = load * kElements;   // first of the thread's set
  return 64 * (element / 16) + 16 * quad + element % 16;
}

// The k of a thread's load `load` of 4 within a chunk of Cfg's operands: W8A8 takes bf16's bytes of a
// 256-byte row, so its k (a byte each) is twice bf16's.
template <class Cfg>
__device__ __forceinline__ int decode_row_load_k(int load, int quad) {
  return (Cfg::kW8A8 ? 2 : 1) * decode_load_k<4>(load, quad);
}

template <class Cfg>
__device__ __forceinline__ uint4 decode_load(const void* base, bool in_range) {
  if (!in_range) return make_uint4(0u, 0u, 0u, 0u);
  return __ldg(static_cast<const uint4*>(base));
}

// fp8's ring: this thread's slots (GroupedGemmDecodeConfig::kPieceBytes's layout).
template <class Cfg>
__device__ __forceinline__ uint4* decode_ring_piece(unsigned char* ring, int stage, int piece) {
  return reinterpret_cast<uint4*>(ring) + (stage * Cfg::kPieces + piece) * Cfg::kThreads + threadIdx.x;
}
template <class Cfg>
__device__ __forceinline__ float* decode_ring_scale(unsigned char* ring, int stage, int row) {
  return reinterpret_cast<float*>(ring + Cfg::kPieceBytes) + (stage * 2 + row) * Cfg::kThreads + threadIdx.x;
}
// bf16's ring: warp `warp`'s stage `stage`, 16 rows of kRowBytes.
template <class Cfg>
__device__ __forceinline__ unsigned char* decode_ring_stage(unsigned char* ring, int stage, int warp) {
  return ring + (stage * Cfg::kWarps + warp) * Cfg::kWarpStageBytes;
}

// Where this thread is in the block's tile.
struct DecodeLanes {
  int warp, lane, group, quad, row_warp, k_warp;
};

// Chunk k0's product into acc: mma step s takes the thread's weight pairs 2s and 2s + 1 of each row (`pair`,
// converted from fp8 there, so only the raw codes stay in registers) and its tokens' activations.
template <class Cfg, class Pair>
__device__ __forceinline__ void decode_multiply(float (&acc)[Cfg::kTokenTiles][4], const DecodeActivationChunk<Cfg>& x,
                                                Pair pair) {
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    const unsigned af[4] = {pair(0, 2 * s), pair(1, 2 * s), pair(0, 2 * s + 1), pair(1, 2 * s + 1)};
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t) {
      const unsigned bf[2] = {decode_word(x.piece[t], 2 * s), decode_word(x.piece[t], 2 * s + 1)};
      mma_m16n8k16_bf16(acc[t], af, bf);
    }
  }
}

// W8A8: scale block b of the chunk (its k 128 b .. 128 b + 127: the thread's loads 2b and 2b + 1 of each row,
// `w`, and words 8b .. 8b + 7 of its activations) multiplied on its own (four m16n8k32 steps) into a fresh fp32
// partial, then added to acc times the block's weight and token multipliers, as the other W8A8 kernels promote
// (grouped_gemm_fp8_common.cuh). A block at a time: half the weights in registers at once.
template <class Cfg>
__device__ __forceinline__ void decode_multiply_w8a8(float (&acc)[Cfg::kTokenTiles][4],
                                                     const DecodeActivationChunk<Cfg>& x, const uint4 (&w)[2][2],
                                                     int b) {
  float part[Cfg::kTokenTiles][4];
#pragma unroll
  for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c) part[t][c] = 0.0f;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const unsigned af[4] = {decode_word(w[0], 2 * s), decode_word(w[1], 2 * s), decode_word(w[0], 2 * s + 1),
                            decode_word(w[1], 2 * s + 1)};
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t) {
      const unsigned bf[2] = {decode_word(x.piece[t], 8 * b + 2 * s), decode_word(x.piece[t], 8 * b + 2 * s + 1)};
      mma_m16n8k32_e4m3(part[t], af, bf);
    }
  }
#pragma unroll
  for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      acc[t][c] = fmaf(part[t][c], x.weight_scale[c / 2][b] * x.token_scale[t][c % 2][b], acc[t][c]);
}

// Output element (row, col): times the row's scale where there is one, as fp32 or rounded to bf16.
template <class Cfg>
__device__ __forceinline__ void decode_store_value(const kjit_grouped_gemm_params& p, long long row, long long col,
                                                   float v) {
  if constexpr (Cfg::kRowScale) v *= p.row_scale[row];
  v = plus_addend<Cfg>(p, v, row * Cfg::kOutN + col);
  if constexpr (Cfg::kOutF32) {
    static_cast<float*>(p.out)[row * Cfg::kOutN + col] = v;
  } else {
    static_cast<unsigned short*>(p.out)[row * Cfg::kOutN + col] =
        static_cast<unsigned short>(cvt_rn_bf16x2_f32(v, 0.0f) & 0xffffu);
  }
}

// The pair's output from the k-splits' fp32 partials, [Cfg::kKWarps][Cfg::kRows][Cfg::kTileN + 1] at `ring`
// (every split's written, the block synchronised): their sum in split order, the activation, the row scale
// and the store of the pair's `rows` rows. The wgmma decode kernel (grouped_gemm_fp8_decode_sm90.cuh) shares it.
template <class Cfg>
__device__ __forceinline__ void decode_sum_store(const kjit_grouped_gemm_params& p, const unsigned char* ring,
                                                 long long n0, long long row0, int rows) {
  auto partials = reinterpret_cast<const float(*)[Cfg::kRows][Cfg::kTileN + 1]>(ring);
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
    decode_store_value<Cfg>(p, row0 + r, out_col, v);
  }
}

// The k-warps' partials (in the ring, once every warp is done with it), then decode_sum_store.
template <class Cfg>
__device__ __forceinline__ void decode_store(const kjit_grouped_gemm_params& p, unsigned char* ring,
                                             const float (&acc)[Cfg::kTokenTiles][4], const DecodeLanes& at,
                                             long long n0, long long row0, int rows) {
  auto partials = reinterpret_cast<float(*)[Cfg::kRows][Cfg::kTileN + 1]>(ring);
  __syncthreads();  // every warp's ring reads are done
#pragma unroll
  for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c)
      partials[at.k_warp][t * 8 + 2 * at.quad + c % 2][at.row_warp * 16 + at.group + 8 * (c / 2)] = acc[t][c];
  __syncthreads();
  decode_sum_store<Cfg>(p, ring, n0, row0, rows);
  if constexpr (Cfg::kBulkCopies) ptx::fence_proxy_async_shared_cta();  // before the next pair's copies land
  __syncthreads();  // the partials (the ring) and `found` are reused by the next slot
}

// The scales each operand set reads (null where it has none).
struct DecodeScales {
  const float* a = nullptr;                 // W8A8: the activations' per-128-k scales
  const float* b = nullptr;                 // W8A16, W8A8: the weights' fp32 scales
  const unsigned char* b_groups = nullptr;  // W4A16: the weights' group scale bytes [E, N, K / group]
  const float* b_globals = nullptr;         // NVFP4: the experts' global scales [E]
};

template <class Cfg>
__device__ void grouped_gemm_decode_body(const kjit_grouped_gemm_params& p, const DecodeScales& scales) {
  if constexpr (Cfg::kFp4Weights)
    static_assert(Cfg::kFp4 && Cfg::kK % 32 == 0, "W4A16: FP4 weights of whole 32-k units");
  if (!offsets_valid<Cfg>(p)) return;
  __shared__ long long warp_totals[Cfg::kWarps];
  __shared__ long long found[3];
  extern __shared__ __align__(128) unsigned char decode_ring[];

  DecodeLanes at;
  at.warp = threadIdx.x / 32;
  at.lane = threadIdx.x % 32;
  at.group = at.lane / 4;
  at.quad = at.lane % 4;
  at.row_warp = at.warp % Cfg::kRowWarps;
  at.k_warp = at.warp / Cfg::kRowWarps;
  const int quad = at.quad, lane = at.lane, warp = at.warp, k_warp = at.k_warp;
  const long long n0 = static_cast<long long>(blockIdx.y) * Cfg::kTileN;
  const long long weight_row[2] = {n0 + at.row_warp * 16 + at.group, n0 + at.row_warp * 16 + at.group + 8};
  const unsigned char* a = static_cast<const unsigned char*>(p.a);
  constexpr int kActivationBytes = Cfg::kW8A8 ? 1 : 2;
  // The bytes of `elements` consecutive weights (FP4: an even count, two a byte).
  auto weight_bytes = [](long long elements) { return elements * Cfg::kWeightBits / 8; };
  // This warp's chunks: k_warp, k_warp + kKWarps, ...; local chunk i is chunk k_warp + i kKWarps.
  const int chunks = Cfg::kChunks > k_warp ? static_cast<int>((Cfg::kChunks - k_warp + Cfg::kKWarps - 1) / Cfg::kKWarps) : 0;
  auto chunk_k0 = [&](int i) { return (k_warp + static_cast<long long>(i) * Cfg::kKWarps) * Cfg::kChunk; };
  // Whether a 16-byte load at k (within local chunk i, of the thread's load l) lies within K: a partial chunk
  // only at the end, and W8A8's is half of one (K in whole 128-k blocks), known from l.
  auto load_in_k = [&](int i, int l, int k) {
    if constexpr (Cfg::kK % Cfg::kChunk == 0) return true;
    else if constexpr (Cfg::kW8A8) return l < 2 || chunk_k0(i) + Cfg::kChunk / 2 < Cfg::kK;
    else return chunk_k0(i) + k < Cfg::kK;
  };

  // Bulk copies: the warp's stages' barriers, each completed by its chunk's bytes (one arrival: the expect_tx).
  unsigned long long* full = reinterpret_cast<unsigned long long*>(decode_ring + Cfg::kRingBytes) + warp * Cfg::kStages;
  if constexpr (Cfg::kBulkCopies) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < Cfg::kStages; ++s) ptx::mbarrier_init(&full[s], 1u);
      ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // seen by the copies' async proxy
    }
    __syncwarp();
  }
  unsigned through = 0;  // bulk copies: chunks this warp has taken through its ring (earlier pairs): stage and phase
  // W4A16: the conversion tables, filled while the first pair's first chunks are in flight.
  unsigned char* table_bytes = decode_ring + Cfg::kRingBytes + Cfg::kBarrierBytes;
  const Fp4Tables tables(table_bytes);
  bool tables_filled = false;

  for (long long slot = blockIdx.x;; slot += gridDim.x) {
    int expert = 0, rows = 0;
    long long row0 = 0;
    if (!find_decode_pair<Cfg>(p, slot, warp_totals, found, expert, row0, rows)) return;

    const unsigned char* weights =
        static_cast<const unsigned char*>(p.b) + weight_bytes(static_cast<long long>(expert) * Cfg::kN * Cfg::kK);
    // Local chunk i into the ring, one stage's worth.
    // - bulk copies (bf16, W8A8, W4A16): into stage (through + i) % kStages: lane 0 sets the bytes to expect,
    //   lanes 0-15 copy a row each (a row past N copies the last row: finite, and its products unused).
    // - W8A16: into stage i % kStages, as one cp.async group (past the warp's chunks an empty group, so that
    //   wait_group's count holds).
    auto issue_chunk = [&](int i) {
      if constexpr (Cfg::kBulkCopies) {
        if (i >= chunks) return;
        const long long row = n0 + at.row_warp * 16 + lane % 16, copy_row = row < Cfg::kN ? row : Cfg::kN - 1;
        const long long k0 = chunk_k0(i);
        const unsigned row_bytes =
            static_cast<unsigned>(weight_bytes(Cfg::kK - k0 < Cfg::kChunk ? Cfg::kK - k0 : Cfg::kChunk));
        const int stage = static_cast<int>((through + i) % Cfg::kStages);
        if (lane == 0)
          ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &full[stage],
                                         16 * row_bytes);
        __syncwarp();
        if (lane < 16)
          ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global,
                             decode_ring_stage<Cfg>(decode_ring, stage, warp) + lane * Cfg::kRowBytes,
                             weights + weight_bytes(copy_row * Cfg::kK + k0), row_bytes, &full[stage]);
      } else {
        if (i < chunks) {
          const long long k0 = chunk_k0(i);
          const int stage = i % Cfg::kStages;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int l = 0; l < Cfg::kWeightLoads; ++l) {
              const long long k = k0 + decode_load_k<Cfg::kWeightLoads>(l, quad);
              const bool in = weight_row[r] < Cfg::kN && k < Cfg::kK;
              cp_async_cg_16(decode_ring_piece<Cfg>(decode_ring, stage, r * Cfg::kWeightLoads + l),
                             in ? weights + weight_bytes(weight_row[r] * Cfg::kK + k) : weights, in);
            }
            const float* source = weight_scale_source<Cfg>(scales.b, expert, weight_row[r], k0);
            cp_async_ca_4(decode_ring_scale<Cfg>(decode_ring, stage, r), source != nullptr ? source : scales.b,
                          source != nullptr);
          }
        }
        cp_async_commit_group();
      }
    };
    // The weights first: they do not wait for the token rows.
#pragma unroll
    for (int i = 0; i < (Cfg::kBulkCopies ? Cfg::kStages : Cfg::kStages - 1); ++i) issue_chunk(i);
    if constexpr (Cfg::kFp4Weights) {
      if (!tables_filled) {  // uniform: every thread walks the same slots
        Fp4Tables::fill_pairs(table_bytes, threadIdx.x, Cfg::kThreads);
        __syncthreads();
        tables_filled = true;
      }
    }

    // This thread's token rows (-1: zeros).
    long long source[Cfg::kTokenTiles];
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t)
      source[t] = t * 8 + at.group < rows ? a_source_row<Cfg>(p, row0 + t * 8 + at.group) : -1;
    auto load_activations = [&](int i, DecodeActivationChunk<Cfg>& x) {
      const long long k0 = chunk_k0(i);
#pragma unroll
      for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
        for (int l = 0; l < 4; ++l) {
          const int k = decode_row_load_k<Cfg>(l, quad);
          x.piece[t][l] = decode_load<Cfg>(a + (source[t] * Cfg::kK + k0 + k) * kActivationBytes,
                                           source[t] >= 0 && load_in_k(i, l, k));
        }
      if constexpr (Cfg::kW8A8) {
        // The chunk's two scale blocks. Past K, N or the pair's rows the last block's, row's or the pair's first
        // row's (finite; their products are zeros or never stored): no predicates, so nothing spills.
        const kjit_fp8_gemm_scales fp8_scales{scales.a, scales.b};
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const long long block = k0 / Cfg::kScaleBlock + b;
          const int kb = static_cast<int>(block < Cfg::kKScaleBlocks ? block : Cfg::kKScaleBlocks - 1);
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const long long row = weight_row[r] < Cfg::kN ? weight_row[r] : Cfg::kN - 1;
            if constexpr (Cfg::kBlockScales) x.weight_scale[r][b] = b_block_scale<Cfg>(fp8_scales, expert, row, kb);
            else x.weight_scale[r][b] = b_channel_scale<Cfg>(fp8_scales, expert, row);
          }
#pragma unroll
          for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int token = t * 8 + 2 * quad + j;
              x.token_scale[t][j][b] = a_scale<Cfg>(fp8_scales, row0 + (token < rows ? token : 0), kb);
            }
        }
      }
    };

    float acc[Cfg::kTokenTiles][4];
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[t][c] = 0.0f;

    // Local chunk i from the ring (not W4A16's: multiply_slice below).
    auto multiply_chunk = [&](int i, const DecodeActivationChunk<Cfg>& x) {
      if constexpr (Cfg::kBulkCopies) {
        const unsigned char* stage =
            decode_ring_stage<Cfg>(decode_ring, static_cast<int>((through + i) % Cfg::kStages), warp);
        // Row r's load l; a partial last chunk: the ring past K holds an older chunk's bytes, read as zeros.
        auto read = [&](int r, int l) {
          const int k = decode_row_load_k<Cfg>(l, quad);
          return load_in_k(i, l, k) ? *reinterpret_cast<const uint4*>(stage + (at.group + 8 * r) * Cfg::kRowBytes +
                                                                      weight_bytes(k))
                                    : make_uint4(0u, 0u, 0u, 0u);
        };
        if constexpr (Cfg::kW8A8) {
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            const uint4 w[2][2] = {{read(0, 2 * b), read(0, 2 * b + 1)}, {read(1, 2 * b), read(1, 2 * b + 1)}};
            decode_multiply_w8a8<Cfg>(acc, x, w, b);
          }
        } else {
          const uint4 w[2][4] = {{read(0, 0), read(0, 1), read(0, 2), read(0, 3)},
                                 {read(1, 0), read(1, 1), read(1, 2), read(1, 3)}};
          decode_multiply<Cfg>(acc, x, [&](int r, int j) { return decode_word(w[r], j); });
        }
      } else {
        const int stage = i % Cfg::kStages;
        uint4 w[2][Cfg::kWeightLoads];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int l = 0; l < Cfg::kWeightLoads; ++l)
            w[r][l] = *decode_ring_piece<Cfg>(decode_ring, stage, r * Cfg::kWeightLoads + l);
        // weight_multiplier's value: the copied scale's multiplier, 0 where weight_scale_source has no scale,
        // which for [E, N, K] weights and a chunk's first k (always < K) is a row past N.
        float scale[2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
          scale[r] = weight_row[r] < Cfg::kN
                         ? multiplier_of_scale<Cfg>(*decode_ring_scale<Cfg>(decode_ring, stage, r))
                         : 0.0f;
        decode_multiply<Cfg>(acc, x, [&](int r, int j) {
          return convert_weight_pair<Cfg>(decode_fp8_pair(w[r], j), scale[r], scale[r]);
        });
      }
    };

    if constexpr (Cfg::kFp4Weights) {
      // W4A16, a slice of 128 k (half a chunk) at a time: quad t's 32 k from 32 t, whole within K or past it
      // (K % 32 == 0), its activations and its rows' group scale bytes read a slice ahead (into the other of two
      // buffers: the slices are unrolled, so both are named statically). Past N a row's scales are the last row's
      // (its products are never stored); past K codes and activations read as zeros.
      const unsigned char* a_row[Cfg::kTokenTiles];
#pragma unroll
      for (int t = 0; t < Cfg::kTokenTiles; ++t)
        a_row[t] = source[t] >= 0 ? a + source[t] * Cfg::kK * kActivationBytes : nullptr;
      const unsigned char* scale_row[2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
        scale_row[r] = scales.b_groups + (static_cast<long long>(expert) * Cfg::kN +
                                          (weight_row[r] < Cfg::kN ? weight_row[r] : Cfg::kN - 1)) *
                                             Cfg::kGroupsPerRow;
      auto slice_k = [&](int i, int sub) { return static_cast<int>(chunk_k0(i)) + sub * Cfg::kSliceK; };
      auto load_slice = [&](int i, int sub, DecodeActivationChunk<Cfg>& x) {
        const int k = slice_k(i, sub) + 32 * quad;
        const bool in_k = k < Cfg::kK;
#pragma unroll
        for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
          for (int l = 0; l < 4; ++l)
            x.piece[t][l] = decode_load<Cfg>(a_row[t] + (k + 8 * l) * kActivationBytes, a_row[t] != nullptr && in_k);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const unsigned char* run = scale_row[r] + k / Cfg::kGroup;
          if constexpr (Cfg::kScale == MixedScale::nvfp4)
            x.scale_bytes[r] = in_k ? __ldg(run) | static_cast<unsigned>(__ldg(run + 1)) << 8 : 0u;
          else
            x.scale_bytes[r] = in_k ? __ldg(run) : 0u;
        }
      };
      // Byte j of the thread's 16 bytes of a row holds its k 2j, 2j + 1: pair j of decode_multiply, times its
      // group's scale as a bf16 pair (NVFP4: pairs 0-7 the first group, 8-15 the second).
      auto multiply_slice = [&](int i, int sub, const DecodeActivationChunk<Cfg>& x) {
        const unsigned char* stage =
            decode_ring_stage<Cfg>(decode_ring, static_cast<int>((through + i) % Cfg::kStages), warp);
        const bool in_k = slice_k(i, sub) + 32 * quad < Cfg::kK;
        uint4 w[2][1];
        unsigned scale[2][2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          w[r][0] = in_k ? *reinterpret_cast<const uint4*>(stage + (at.group + 8 * r) * Cfg::kRowBytes +
                                                           weight_bytes(sub * Cfg::kSliceK + 32 * quad))
                         : make_uint4(0u, 0u, 0u, 0u);
          if constexpr (Cfg::kScale == MixedScale::nvfp4)
            nvfp4_group_scales_bf16x2(x.scale_bytes[r], scale[r][0], scale[r][1]);
          else
            scale[r][0] = scale[r][1] = group_scale_bf16x2<MixedScale::mxfp4>(x.scale_bytes[r]);
        }
        decode_multiply<Cfg>(acc, x, [&](int r, int j) {
          return mul_bf16x2(tables.pair(decode_word(w[r], j / 4), j % 4), scale[r][j / 8]);
        });
      };

      DecodeActivationChunk<Cfg> slice[2];
      if (chunks > 0) load_slice(0, 0, slice[0]);
      for (int i = 0; i < chunks; ++i) {
        Ring<Cfg::kStages>::wait_filled(full, through + i);
#pragma unroll
        for (int sub = 0; sub < Cfg::kSlices; ++sub) {
          if (slice_k(i, sub) >= Cfg::kK) break;  // the last chunk's slices past K: uniform over the warp
          if (sub + 1 < Cfg::kSlices) load_slice(i, sub + 1, slice[(sub + 1) % 2]);
          else if (i + 1 < chunks) load_slice(i + 1, 0, slice[0]);
          multiply_slice(i, sub, slice[sub % 2]);
        }
        __syncwarp();  // every lane's reads of the stage are done before the copy overwrites it
        issue_chunk(i + Cfg::kStages);
      }
      const float global = expert_multiplier<Cfg>(scales.b_globals, expert);  // 1 for MXFP4: folds away
#pragma unroll
      for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[t][c] *= global;
    } else {
      // Chunk i multiplies while the ring's other stages stream in (and the next chunk's activations).
      DecodeActivationChunk<Cfg> next;
      if (chunks > 0) load_activations(0, next);
      for (int i = 0; i < chunks; ++i) {
        if constexpr (Cfg::kBulkCopies) {
          Ring<Cfg::kStages>::wait_filled(full, through + i);
        } else {
          cp_async_wait_group<Cfg::kStages - 2>();  // chunk i's group is complete
          issue_chunk(i + Cfg::kStages - 1);         // into the stage chunk i - 1 left (read before this point)
        }
        const DecodeActivationChunk<Cfg> x = next;
        if (i + 1 < chunks) load_activations(i + 1, next);
        multiply_chunk(i, x);
        if constexpr (Cfg::kBulkCopies) {
          __syncwarp();  // every lane's reads of the stage are done before the copy overwrites it
          issue_chunk(i + Cfg::kStages);
        }
      }
    }
    if constexpr (Cfg::kBulkCopies) through += chunks;
    else cp_async_wait_group<0>();  // nothing of this pair's still lands in the ring

    decode_store<Cfg>(p, decode_ring, acc, at, n0, row0, rows);
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_decode(const kjit_grouped_gemm_params& p) {
  grouped_gemm_decode_body<Cfg>(p, DecodeScales{});
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_mixed_decode(const kjit_grouped_gemm_mixed_params& p) {
  DecodeScales scales;
  scales.b = p.b_scales;
  scales.b_groups = p.b_block_scales;
  scales.b_globals = p.b_global_scales;
  grouped_gemm_decode_body<Cfg>(p.gemm, scales);
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_fp8_decode(const kjit_grouped_gemm_fp8_params& p) {
  DecodeScales scales;
  scales.a = p.scales.a;
  scales.b = p.scales.b;
  grouped_gemm_decode_body<Cfg>(p.gemm, scales);
}

}  // namespace kjit
