// MoE routing helpers, on the device and graph-safe (no host sync, no
// allocation, sizes fixed by the token count).
//
// moe_routing: one block, or (large batches, given a workspace) three launches
// of many blocks that give the same result (see moe_routing below). (1) Every global id is checked against
// [0, experts_total); a bad one writes nothing and is recorded. (2) Ids in this
// rank's range [expert_base, expert_base + kExperts) are counted per local
// expert; others are skipped, never used as an index. (3) A block-wide scan
// gives the offsets. (4) Rows are placed stably: sorted order within an expert
// is the order of the flat index t * top_k + j, so the permutation is exactly
// reproducible. Chunks of the block size are placed one at a time; within a
// warp, lanes of one expert rank themselves with __match_any_sync. Up to 256
// local experts, each warp's count per expert goes into shared memory and
// one pass per expert turns them into each warp's first row (two barriers a
// chunk); with more, warps take turns on a shared cursor per expert (32).
//
// moe_combine: a block per token and slice of 2048 columns; out[t] = sum_j w[t, j] * expert_out[row(t, j)]
// over the j routed to this rank, accumulated in fp32, rounded once. Its weights' gradient (kGradient): a warp
// per pair, out[t, j] = <grad[t], expert_out[row(t, j)]> in fp32 in the order kjit.h states.
//
// moe_dispatch (the combine's transpose): a block per token and slice of 2048 columns copies the token's row
// to each of its rows in expert order, reading it once (a gather in expert order rereads each token top_k
// times, mostly from DRAM once the tokens outgrow L2).
#pragma once

#include "../abi/device_errors.h"
#include "../abi/moe_routing_params.h"
#include "../common/fp8_convert.cuh"

namespace kjit {

template <long long kExperts_, bool kOffsetsWithZero_>
struct RoutingConfig {
  static constexpr long long kExperts = kExperts_;
  static constexpr bool kOffsetsWithZero = kOffsetsWithZero_;
  static constexpr int kThreads = 1024;
  // Per-warp counts of every local expert fit in shared memory (32 KB at 256).
  static constexpr bool kWarpHistograms = kExperts <= 256;
};

// Exclusive scan of counts[0, n) in shared memory, in place; returns the total.
template <int kThreads>
__device__ __forceinline__ int block_exclusive_scan(int* counts, long long n) {
  __shared__ int warp_sums[32];
  __shared__ int carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (long long base = 0; base < n; base += kThreads) {
    const long long i = base + threadIdx.x;
    const int value = i < n ? counts[i] : 0;
    int inclusive = value;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= d) inclusive += up;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      const int s = lane < kThreads / 32 ? warp_sums[lane] : 0;
      int scanned = s;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int up = __shfl_up_sync(0xffffffffu, scanned, d);
        if (lane >= d) scanned += up;
      }
      warp_sums[lane] = scanned - s;  // exclusive prefix of the warps
    }
    __syncthreads();
    const int exclusive = carry + warp_sums[warp] + inclusive - value;
    __syncthreads();  // everyone has read carry
    if (i < n) counts[i] = exclusive;
    if (threadIdx.x == kThreads - 1) carry = exclusive + value;
    __syncthreads();
  }
  return carry;
}

// Counts the ids [first, last) per local expert into `running` (zeroed here)
// and checks each against [0, experts_total). Returns, in every thread,
// whether any was out of range (those are recorded in device_error).
template <class Cfg>
__device__ __forceinline__ bool count_ids(const kjit_moe_routing_params& p, long long first, long long last,
                                          int* running) {
  for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads) running[e] = 0;
  __syncthreads();
  int bad = 0;
  for (long long i = first + threadIdx.x; i < last; i += Cfg::kThreads) {
    const int id = p.topk_ids[i];
    if (id < 0 || id >= p.experts_total) {
      bad = 1;
      if (atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_GLOBAL_EXPERT_ID_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned>(id);
      continue;
    }
    const long long local = id - p.expert_base;
    if (local >= 0 && local < Cfg::kExperts) atomicAdd(&running[local], 1);
  }
  return __syncthreads_or(bad) != 0;
}

// Writes counts and offsets from the totals in `running` and leaves each
// expert's first row there; returns the routed row count.
template <class Cfg>
__device__ __forceinline__ int write_offsets(const kjit_moe_routing_params& p, int* running) {
  for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads) p.counts[e] = running[e];
  __syncthreads();
  const int routed = block_exclusive_scan<Cfg::kThreads>(running, Cfg::kExperts);
  for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads) {
    if constexpr (Cfg::kOffsetsWithZero) p.offsets[e] = running[e];
    else p.offsets[e] = running[e] + p.counts[e];  // cumulative ends
  }
  if (Cfg::kOffsetsWithZero && threadIdx.x == 0) p.offsets[Cfg::kExperts] = routed;
  __syncthreads();
  return routed;
}

// Places the ids [first, last) stably from each expert's next free row in
// `running`, and marks the rows [routed, entries) within [first, last) of
// sorted_to_flat empty.
template <class Cfg>
__device__ __forceinline__ void place_ids(const kjit_moe_routing_params& p, long long first, long long last,
                                          int* running, int routed) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned lanes_before = (1u << lane) - 1u;
  // [warp][expert]: the warp's count, then its first row; 0 between chunks.
  __shared__ int warp_rows[Cfg::kWarpHistograms ? 32 * Cfg::kExperts : 1];
  if constexpr (Cfg::kWarpHistograms) {
    for (long long x = threadIdx.x; x < 32 * Cfg::kExperts; x += Cfg::kThreads) warp_rows[x] = 0;
    __syncthreads();
  }
  for (long long base = first; base < last; base += Cfg::kThreads) {
    const long long i = base + threadIdx.x;
    long long local = -1;
    if (i < last) {
      local = p.topk_ids[i] - p.expert_base;
      if (local < 0 || local >= Cfg::kExperts) local = -1;
    }
    const unsigned same = __match_any_sync(0xffffffffu, static_cast<int>(local));
    const int rank = __popc(same & lanes_before), members = __popc(same);
    if constexpr (Cfg::kWarpHistograms) {
      if (local >= 0 && rank == 0) warp_rows[warp * Cfg::kExperts + local] = members;
      __syncthreads();
      // One thread per expert: the warps' first rows in warp order (entries
      // of absent experts stay 0), and the cursor past this chunk.
      for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads) {
        int next = running[e];
        for (int w = 0; w < Cfg::kThreads / 32; ++w) {
          const int count = warp_rows[w * Cfg::kExperts + e];
          if (count != 0) warp_rows[w * Cfg::kExperts + e] = next;
          next += count;
        }
        running[e] = next;
      }
      __syncthreads();
      if (local >= 0) {
        const int row = warp_rows[warp * Cfg::kExperts + local] + rank;
        p.sorted_to_flat[row] = static_cast<int>(i);
        p.flat_to_sorted[i] = row;
      }
      __syncwarp();
      // Only this warp reads its row of the table: reset it for the next chunk.
      if (local >= 0 && rank == 0) warp_rows[warp * Cfg::kExperts + local] = 0;
      // Another lane of this warp may write the same entry at the next chunk's
      // start; __match_any_sync orders execution there, not memory (racecheck).
      __syncwarp();
    } else {
      for (int turn = 0; turn < Cfg::kThreads / 32; ++turn) {
        if (warp == turn && local >= 0) {
          const int row = running[local] + rank;
          p.sorted_to_flat[row] = static_cast<int>(i);
          p.flat_to_sorted[i] = row;
        }
        __syncwarp();
        if (warp == turn && local >= 0 && rank == members - 1) running[local] += members;
        __syncthreads();
      }
    }
    if (i < last && local < 0) p.flat_to_sorted[i] = -1;
  }
  for (long long row = (routed > first ? routed : first) + threadIdx.x; row < last; row += Cfg::kThreads)
    p.sorted_to_flat[row] = -1;
}

// Large batches run in three launches over a workspace of ints (see
// kjit_moe_routing_params): blocks count their slices, one block turns the
// counts into every block's first row per expert, then blocks place their
// slices from those rows, so the permutation is the one-block one. A bad id
// anywhere leaves every output untouched: the counts go to the workspace
// only, and the scan and placement check the blocks' flags first.
template <class Cfg>
__device__ __forceinline__ void moe_routing(const kjit_moe_routing_params& p) {
  __shared__ int running[Cfg::kExperts];  // counts, then each expert's next free row
  if (p.phase == KJIT_ROUTING_PHASE_ONE_BLOCK) {
    if (count_ids<Cfg>(p, 0, p.entries, running)) return;
    const int routed = write_offsets<Cfg>(p, running);
    place_ids<Cfg>(p, 0, p.entries, running, routed);
    return;
  }
  const long long blocks = (p.entries + p.ids_per_block - 1) / p.ids_per_block;
  int* const valid = p.workspace;       // [1]: the scan found no bad id
  int* const bad = p.workspace + 1;     // [blocks]: a block's slice held a bad id
  int* const rows = bad + blocks;       // [blocks][experts]: counts, then first rows
  const long long first = blockIdx.x * p.ids_per_block;
  const long long last = first + p.ids_per_block < p.entries ? first + p.ids_per_block : p.entries;
  if (p.phase == KJIT_ROUTING_PHASE_COUNT) {
    const bool any_bad = count_ids<Cfg>(p, first, last, running);
    if (threadIdx.x == 0) bad[blockIdx.x] = any_bad;
    for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads)
      rows[blockIdx.x * Cfg::kExperts + e] = running[e];
  } else if (p.phase == KJIT_ROUTING_PHASE_SCAN) {
    int any_bad = 0;
    for (long long b = threadIdx.x; b < blocks; b += Cfg::kThreads) any_bad |= bad[b];
    if (__syncthreads_or(any_bad)) {
      if (threadIdx.x == 0) *valid = 0;
      return;
    }
    // Per expert: each block's count becomes the count of the blocks before it.
    for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads) {
      int total = 0;
      for (long long b = 0; b < blocks; ++b) {
        const int count = rows[b * Cfg::kExperts + e];
        rows[b * Cfg::kExperts + e] = total;
        total += count;
      }
      running[e] = total;
    }
    __syncthreads();
    write_offsets<Cfg>(p, running);  // running: each expert's first row
    for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads)
      for (long long b = 0; b < blocks; ++b) rows[b * Cfg::kExperts + e] += running[e];
    if (threadIdx.x == 0) *valid = 1;
  } else {  // KJIT_ROUTING_PHASE_PLACE
    if (*valid == 0) return;
    for (long long e = threadIdx.x; e < Cfg::kExperts; e += Cfg::kThreads)
      running[e] = rows[blockIdx.x * Cfg::kExperts + e];
    const int routed = p.offsets[Cfg::kExperts - 1 + (Cfg::kOffsetsWithZero ? 1 : 0)];
    __syncthreads();
    place_ids<Cfg>(p, first, last, running, routed);
  }
}

template <int kTopK_, long long kHidden_, bool kOutF32_, bool kGradient_ = false, bool kDispatch_ = false>
struct CombineConfig {
  static constexpr int kTopK = kTopK_;
  static constexpr long long kHidden = kHidden_;
  static constexpr bool kOutF32 = kOutF32_;
  static constexpr bool kGradient = kGradient_;
  static constexpr bool kDispatch = kDispatch_;
  static constexpr int kThreads = 256;
  static_assert(kHidden % 8 == 0, "the host admits hidden sizes divisible by 8");
  static_assert(!kGradient || kOutF32, "the weights' gradient is fp32");
  static_assert(!kDispatch || (!kOutF32 && !kGradient), "the dispatch copies bf16 rows");
};

// The gradient of the combine's weights: out[t * top_k + j] = the dot product of grad[t] and
// expert_out[row(t, j)] (0 for a pair of another rank). A warp per pair: lane l takes the 8-column chunks l,
// l + 32, ... (one 16-byte load of each operand a chunk) and fma's their products into its fp32 sum in column
// order; the lanes' sums meet in a butterfly (xor 16, 8, 4, 2, 1, each an fp32 add) and lane 0 writes its
// result. A fixed order: the same bits every run, and kjit/reference/moe_routing.hpp's.
template <class Cfg>
__device__ __forceinline__ void moe_combine_gradient(const kjit_moe_combine_params& p) {
  const long long pair = (static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (pair >= p.tokens * Cfg::kTopK) return;  // uniform over the warp
  int row = p.flat_to_sorted[pair];
  if (row >= p.rows) {
    if (lane == 0 && atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_COMBINE_INDEX_OUT_OF_RANGE) == 0u)
      p.device_error[1] = static_cast<unsigned>(row);
    row = -1;
  }
  float sum = 0.0f;
  if (row >= 0) {
    const unsigned short* x = static_cast<const unsigned short*>(p.expert_out) + row * Cfg::kHidden;
    const unsigned short* g = static_cast<const unsigned short*>(p.grad) + pair / Cfg::kTopK * Cfg::kHidden;
    for (long long c = lane; c < Cfg::kHidden / 8; c += 32) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + 8 * c));
      const uint4 gv = __ldg(reinterpret_cast<const uint4*>(g + 8 * c));
      const unsigned xw[4] = {xv.x, xv.y, xv.z, xv.w}, gw[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        sum = __fmaf_rn(__uint_as_float(gw[q] << 16), __uint_as_float(xw[q] << 16), sum);
        sum = __fmaf_rn(__uint_as_float(gw[q] & 0xffff0000u), __uint_as_float(xw[q] & 0xffff0000u), sum);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, offset));
  if (lane == 0) static_cast<float*>(p.out)[pair] = sum;
}

template <class Cfg>
__device__ __forceinline__ void moe_combine_forward(const kjit_moe_combine_params& p) {
  const long long t = blockIdx.x;
  int rows[Cfg::kTopK];
  float weights[Cfg::kTopK];
#pragma unroll
  for (int j = 0; j < Cfg::kTopK; ++j) {
    rows[j] = p.flat_to_sorted[t * Cfg::kTopK + j];
    weights[j] = p.topk_weights[t * Cfg::kTopK + j];
    if (rows[j] >= p.rows) {
      if (atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_COMBINE_INDEX_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned>(rows[j]);
      rows[j] = -1;
    }
  }
  const unsigned short* x = static_cast<const unsigned short*>(p.expert_out);
  // Block y's slice of the columns, 8 a thread (gridDim.y slices cover kHidden: one pass at most).
  for (long long h = (static_cast<long long>(blockIdx.y) * Cfg::kThreads + threadIdx.x) * 8LL; h < Cfg::kHidden;
       h += static_cast<long long>(gridDim.y) * Cfg::kThreads * 8LL) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < Cfg::kTopK; ++j) {
      if (rows[j] < 0) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(x + static_cast<long long>(rows[j]) * Cfg::kHidden + h);
      const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        acc[2 * q] += weights[j] * __uint_as_float(words[q] << 16);
        acc[2 * q + 1] += weights[j] * __uint_as_float(words[q] & 0xffff0000u);
      }
    }
    if constexpr (Cfg::kOutF32) {
      float4* out = reinterpret_cast<float4*>(static_cast<float*>(p.out) + t * Cfg::kHidden + h);
      out[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      out[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    } else {
      uint4 packed;
      packed.x = cvt_rn_bf16x2_f32(acc[0], acc[1]);
      packed.y = cvt_rn_bf16x2_f32(acc[2], acc[3]);
      packed.z = cvt_rn_bf16x2_f32(acc[4], acc[5]);
      packed.w = cvt_rn_bf16x2_f32(acc[6], acc[7]);
      *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.out) + t * Cfg::kHidden + h) = packed;
    }
  }
}

// The dispatch: out[row(t, j)] = x[t] for each pair of this rank; with valid_rows, block t also zeroes rows
// valid + t * top_k .. + top_k - 1 below `rows` (the tail past the routed rows: at most tokens * top_k rows).
template <class Cfg>
__device__ __forceinline__ void moe_dispatch(const kjit_moe_dispatch_params& p) {
  const long long t = blockIdx.x;
  int rows[Cfg::kTopK];
#pragma unroll
  for (int j = 0; j < Cfg::kTopK; ++j) {
    rows[j] = p.flat_to_sorted[t * Cfg::kTopK + j];
    if (rows[j] >= p.rows) {
      if (atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_COMBINE_INDEX_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned>(rows[j]);
      rows[j] = -1;
    }
  }
  const long long tail = p.valid_rows != nullptr ? *p.valid_rows + t * Cfg::kTopK : p.rows;
  const unsigned short* x = static_cast<const unsigned short*>(p.x) + t * Cfg::kHidden;
  unsigned short* out = static_cast<unsigned short*>(p.out);
  for (long long h = (static_cast<long long>(blockIdx.y) * Cfg::kThreads + threadIdx.x) * 8LL; h < Cfg::kHidden;
       h += static_cast<long long>(gridDim.y) * Cfg::kThreads * 8LL) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(x + h));
#pragma unroll
    for (int j = 0; j < Cfg::kTopK; ++j)
      if (rows[j] >= 0) *reinterpret_cast<uint4*>(out + static_cast<long long>(rows[j]) * Cfg::kHidden + h) = v;
    for (long long r = max(tail, 0LL); r < tail + Cfg::kTopK && r < p.rows; ++r)
      *reinterpret_cast<uint4*>(out + r * Cfg::kHidden + h) = make_uint4(0u, 0u, 0u, 0u);
  }
}

template <class Cfg>
__device__ __forceinline__ void moe_combine(const kjit_moe_combine_params& p) {
  if constexpr (Cfg::kGradient) moe_combine_gradient<Cfg>(p);
  else moe_combine_forward<Cfg>(p);
}

}  // namespace kjit
