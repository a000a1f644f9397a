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
//   along K (k-warps take chunks of 128 k kw, kw + kKWarps, ...), and the
//   k-warps' fp32 partials are summed in shared memory in k-warp order: no
//   atomics, no workspace, the same bits every run.
// - The weights stream into a ring in dynamic shared memory, each warp or
//   thread reading back only what it copied, so the ring needs no block
//   barrier (docs/decisions/0023 has both measured on an H200):
//   - bf16 (kBulkCopies): each warp's 16 rows' chunks (256 bytes a row) come
//     by bulk copies (sm_90's cp.async.bulk, one a row, issued by 16 lanes)
//     into the warp's ring of kStages chunks, each with an mbarrier counting
//     the bytes landed; every stage but the one multiplied is in flight.
//     Twice the rate of per-thread copies: 80-100% of copy bandwidth.
//   - fp8: each thread copies 16-byte pieces of its two rows (2 a row and
//     chunk) and the chunk's two scales with cp.async into its own ring,
//     kStages - 1 chunks ahead, waiting with cp.async.wait_group. Its
//     conversions, not the copies, set fp8's pace; the bulk copies measured
//     10-25% slower here.
//   Its tokens' activations (L2 hits) come into registers one chunk ahead.
//   A thread's fragments hold its own 32 of each 128 k, not mma's layout:
//   element j of quad t's set is k = 64 (j / 16) + 16 t + j % 16, and step s
//   of a chunk multiplies elements 4s .. 4s + 3 as mma's (2t, 2t + 1,
//   2t + 8, 2t + 9). The weights and the activations use the same map, so
//   each product is a true W[n][k] A[r][k], summed in another order than the
//   wgmma kernels.
// - In flight (Little's law: an H200's ~4.3 TB/s over ~1 us of latency is
//   ~4.5 MB, ~33 KB per SM): a block keeps up to 64 KB (bf16) or 48 KB
//   (fp8) of weights in flight, and at 8 rows (the decode bucket's tile) two
//   blocks fit an SM.
// - fp8: each code is converted with its 128 x 128 block's multiplier exactly
//   as kjit's dequant does (grouped_gemm_mixed_common.cuh), so this kernel on
//   fp8 weights gives the bits of this kernel on the dequantised bf16 weights.
// - Every block checks every offset first (bad offsets: nothing written).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "../common/cp_async.cuh"
#include "../common/ptx.cuh"
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
  static constexpr bool kBulkCopies = !kFp8Weights;
  static constexpr int kStages = kFp8Weights ? 4 : 3;
  // fp8, the threads' ring: kStages chunks of each thread's 2 x kWeightLoads 16-byte pieces,
  // [stage][piece][thread], then its two rows' scales, [stage][row][thread].
  static constexpr int kPieces = 2 * kWeightLoads;
  static constexpr int kPieceBytes = kStages * kPieces * kThreads * 16;
  // bf16, the warps' ring: [stage][warp] 16 rows of a chunk, then the mbarriers, [warp][stage].
  static constexpr int kRowBytes = kChunk * 2;
  static constexpr int kWarpStageBytes = 16 * kRowBytes;
  static constexpr int kRingBytes =
      kBulkCopies ? kStages * kWarps * kWarpStageBytes : kPieceBytes + kStages * 2 * kThreads * 4;
  static constexpr int kSharedBytes = kRingBytes + (kBulkCopies ? kStages * kWarps * 8 : 0);  // 96 KB, 72 KB
  // The k-warps' partials, summed after the loop, take the ring's place (nothing is in flight then).
  static constexpr int kPartialsBytes = kKWarps * kRows * (kTileN + 1) * 4;
  static_assert(kPartialsBytes <= kRingBytes, "the partials fit in the ring");
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
      const unsigned bf[2] = {decode_bf16_word(x.piece[t], 2 * s), decode_bf16_word(x.piece[t], 2 * s + 1)};
      mma_m16n8k16_bf16(acc[t], af, bf);
    }
  }
}

// The k-warps' partials (in the ring, once every warp is done with it), then their sum in k-warp order, the
// activation, the row scale and the store of the pair's `rows` rows.
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
  if constexpr (Cfg::kBulkCopies) ptx::fence_proxy_async_shared_cta();  // before the next pair's copies land
  __syncthreads();  // the partials (the ring) and `found` are reused by the next slot
}

template <class Cfg>
__device__ void grouped_gemm_decode_body(const kjit_grouped_gemm_params& p, const float* b_scales) {
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
  const unsigned short* a = static_cast<const unsigned short*>(p.a);
  constexpr int kElementBytes = Cfg::kFp8Weights ? 1 : 2;
  // This warp's chunks: k_warp, k_warp + kKWarps, ...; local chunk i is chunk k_warp + i kKWarps.
  const int chunks = Cfg::kChunks > k_warp ? static_cast<int>((Cfg::kChunks - k_warp + Cfg::kKWarps - 1) / Cfg::kKWarps) : 0;
  auto chunk_k0 = [&](int i) { return (k_warp + static_cast<long long>(i) * Cfg::kKWarps) * Cfg::kChunk; };

  // bf16: the warp's stages' barriers, each completed by its chunk's bytes (one arrival: the expect_tx).
  unsigned long long* full = reinterpret_cast<unsigned long long*>(decode_ring + Cfg::kRingBytes) + warp * Cfg::kStages;
  if constexpr (Cfg::kBulkCopies) {
    if (lane == 0) {
#pragma unroll
      for (int s = 0; s < Cfg::kStages; ++s) ptx::mbarrier_init(&full[s], 1u);
      ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);  // seen by the copies' async proxy
    }
    __syncwarp();
  }
  unsigned through = 0;  // bf16: chunks this warp has taken through its ring (earlier pairs): stage and phase

  for (long long slot = blockIdx.x;; slot += gridDim.x) {
    int expert = 0, rows = 0;
    long long row0 = 0;
    if (!find_decode_pair<Cfg>(p, slot, warp_totals, found, expert, row0, rows)) return;

    const unsigned char* weights =
        static_cast<const unsigned char*>(p.b) + static_cast<long long>(expert) * Cfg::kN * Cfg::kK * kElementBytes;
    // Local chunk i into the ring, one stage's worth.
    // - bf16: into stage (through + i) % kStages: lane 0 sets the bytes to expect, lanes 0-15 copy a row each
    //   (a row past N copies the last row: finite, and its products unused).
    // - fp8: into stage i % kStages, as one cp.async group (past the warp's chunks an empty group, so that
    //   wait_group's count holds).
    auto issue_chunk = [&](int i) {
      if constexpr (Cfg::kBulkCopies) {
        if (i >= chunks) return;
        const long long row = n0 + at.row_warp * 16 + lane % 16, copy_row = row < Cfg::kN ? row : Cfg::kN - 1;
        const long long k0 = chunk_k0(i);
        const unsigned row_bytes =
            static_cast<unsigned>((Cfg::kK - k0 < Cfg::kChunk ? Cfg::kK - k0 : Cfg::kChunk) * kElementBytes);
        const int stage = static_cast<int>((through + i) % Cfg::kStages);
        if (lane == 0)
          ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, &full[stage],
                                         16 * row_bytes);
        __syncwarp();
        if (lane < 16)
          ptx::cp_async_bulk(ptx::space_cluster, ptx::space_global,
                             decode_ring_stage<Cfg>(decode_ring, stage, warp) + lane * Cfg::kRowBytes,
                             weights + (copy_row * Cfg::kK + k0) * kElementBytes, row_bytes, &full[stage]);
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
                             in ? weights + (weight_row[r] * Cfg::kK + k) * kElementBytes : weights, in);
            }
            const float* source = weight_scale_source<Cfg>(b_scales, expert, weight_row[r], k0);
            cp_async_ca_4(decode_ring_scale<Cfg>(decode_ring, stage, r), source != nullptr ? source : b_scales,
                          source != nullptr);
          }
        }
        cp_async_commit_group();
      }
    };
    // The weights first: they do not wait for the token rows.
#pragma unroll
    for (int i = 0; i < (Cfg::kBulkCopies ? Cfg::kStages : Cfg::kStages - 1); ++i) issue_chunk(i);

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
          const long long k = k0 + decode_load_k<4>(l, quad);
          x.piece[t][l] = decode_load<Cfg>(a + source[t] * Cfg::kK + k, source[t] >= 0 && k < Cfg::kK);
        }
    };

    float acc[Cfg::kTokenTiles][4];
#pragma unroll
    for (int t = 0; t < Cfg::kTokenTiles; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[t][c] = 0.0f;

    // Local chunk i from the ring.
    auto multiply_chunk = [&](int i, const DecodeActivationChunk<Cfg>& x) {
      if constexpr (Cfg::kBulkCopies) {
        const unsigned char* stage =
            decode_ring_stage<Cfg>(decode_ring, static_cast<int>((through + i) % Cfg::kStages), warp);
        uint4 w[2][Cfg::kWeightLoads];
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int l = 0; l < Cfg::kWeightLoads; ++l) {
            const int k = decode_load_k<Cfg::kWeightLoads>(l, quad);
            // A partial last chunk: the ring past K holds an older chunk's bytes, read as zeros.
            const bool in = Cfg::kK % Cfg::kChunk == 0 || chunk_k0(i) + k < Cfg::kK;
            w[r][l] = in ? *reinterpret_cast<const uint4*>(stage + (at.group + 8 * r) * Cfg::kRowBytes +
                                                           k * kElementBytes)
                         : make_uint4(0u, 0u, 0u, 0u);
          }
        decode_multiply<Cfg>(acc, x, [&](int r, int j) { return decode_bf16_word(w[r], j); });
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

    // Chunk i multiplies while the ring's other stages stream in (and chunk i + 1's activations).
    DecodeActivationChunk<Cfg> next;
    if (chunks > 0) load_activations(0, next);
    for (int i = 0; i < chunks; ++i) {
      if constexpr (Cfg::kBulkCopies) {
        const unsigned seq = through + i;
        while (!ptx::mbarrier_try_wait_parity(&full[seq % Cfg::kStages], (seq / Cfg::kStages) % 2)) {
        }
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
    if constexpr (Cfg::kBulkCopies) through += chunks;
    else cp_async_wait_group<0>();  // nothing of this pair's still lands in the ring

    decode_store<Cfg>(p, decode_ring, acc, at, n0, row0, rows);
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
