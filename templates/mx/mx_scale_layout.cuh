// Scale bytes LINEAR <-> SWIZZLED_128X4 (kjit.h, kjit_scale_layout_desc) for
// a stack of experts with uniform rows or with device expert offsets.
//
// The walk is over the swizzled side's 4-byte words: word w of an expert's
// block holds row r = (w / 128 / kTiles) * 128 + (w % 4) * 32 + (w % 128) / 4,
// scale columns 4t..4t+3 with t = (w / 128) % kTiles (the inverse of
// swizzled_scale_offset). To swizzled, each thread gathers its word's four
// linear bytes (or `pad` where the row or column is padding) and stores one
// word; to linear, it loads one word and stores the bytes that are not
// padding. With offsets, every block first checks every offset (a bad one:
// nothing written, the device error recorded) and scans the experts' padded
// tile counts into shared memory: expert e's block starts at the sum of
// round_up(rows_j, 128) * round_up(scale_cols, 4) over j < e, with no host
// synchronisation.
#pragma once

#include "../abi/device_errors.h"
#include "../abi/mx_scale_layout_params.h"
#include "../common/mx_formats.cuh"

namespace kjit {

template <bool kToSwizzled_, long long kScaleCols_, int kOffsets_, int kThreads_, int kMaxExperts_>
struct ScaleLayoutConfig {
  static constexpr bool kToSwizzled = kToSwizzled_;
  static constexpr long long kScaleCols = kScaleCols_;
  static constexpr int kOffsets = kOffsets_;  // 0: uniform rows; 1: cumulative ends; 2: with a leading zero
  static constexpr int kThreads = kThreads_;
  static constexpr int kMaxExperts = kMaxExperts_;
  static constexpr long long kTiles = (kScaleCols + 3) / 4;  // 4-column tiles per 128 rows
  static constexpr long long kWordsPerTile = 128;           // 512 bytes
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, one scan level of warp totals");
};

// Converts word `w` of one expert's swizzled block (at byte `base` of the
// swizzled side), whose rows are linear rows [first_row, first_row + rows).
template <class Cfg>
__device__ __forceinline__ void convert_word(const kjit_mx_scale_layout_params& p, long long base, long long w,
                                             long long first_row, long long rows) {
  const long long tile = w / Cfg::kWordsPerTile;
  const int inner = static_cast<int>(w % Cfg::kWordsPerTile);
  const long long r = tile / Cfg::kTiles * 128 + (inner & 3) * 32 + (inner >> 2);
  const long long c0 = tile % Cfg::kTiles * 4;
  const long long swizzled = base + w * 4;
  const long long linear = (first_row + r) * Cfg::kScaleCols + c0;
  if constexpr (Cfg::kToSwizzled) {
    unsigned int word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned int byte = r < rows && c0 + j < Cfg::kScaleCols ? p.in[linear + j] : p.pad;
      word |= (byte & 0xFFu) << (8 * j);
    }
    *reinterpret_cast<unsigned int*>(p.out + swizzled) = word;
  } else {
    if (r >= rows) return;
    const unsigned int word = *reinterpret_cast<const unsigned int*>(p.in + swizzled);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (c0 + j < Cfg::kScaleCols) p.out[linear + j] = static_cast<unsigned char>(word >> (8 * j));
  }
}

template <class Cfg>
__device__ __forceinline__ void uniform_scale_layout(const kjit_mx_scale_layout_params& p) {
  const long long words_per_expert = (p.rows + 127) / 128 * Cfg::kTiles * Cfg::kWordsPerTile;
  for (long long w = static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x; w < p.swizzled_words;
       w += static_cast<long long>(gridDim.x) * Cfg::kThreads) {
    const long long expert = w / words_per_expert;
    const long long in_expert = w - expert * words_per_expert;
    convert_word<Cfg>(p, expert * words_per_expert * 4, in_expert, expert * p.rows, p.rows);
  }
}

// Expert e's rows [start, end) from the offsets.
template <class Cfg>
__device__ __forceinline__ void offset_rows(const kjit_mx_scale_layout_params& p, long long e, long long& start,
                                            long long& end) {
  if constexpr (Cfg::kOffsets == 2) {
    start = p.offsets[e];
    end = p.offsets[e + 1];
  } else {
    start = e == 0 ? 0 : p.offsets[e - 1];
    end = p.offsets[e];
  }
}

// Exclusive block-wide prefix sum of one value per thread (all threads call it).
template <class Cfg>
__device__ __forceinline__ long long block_exclusive_sum(long long value, long long* warp_totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  long long inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const long long other = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += other;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    long long total = lane < Cfg::kThreads / 32 ? warp_totals[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const long long other = __shfl_up_sync(0xffffffffu, total, d);
      if (lane >= d) total += other;
    }
    if (lane < Cfg::kThreads / 32) warp_totals[lane] = total;  // inclusive over warps
  }
  __syncthreads();
  return inclusive - value + (warp > 0 ? warp_totals[warp - 1] : 0);
}

template <class Cfg>
__device__ __forceinline__ void offsets_scale_layout(const kjit_mx_scale_layout_params& p) {
  __shared__ long long first_tile[Cfg::kMaxExperts + 1];  // expert e's swizzled block, in 512-byte tiles
  __shared__ int first_row[Cfg::kMaxExperts], row_count[Cfg::kMaxExperts];
  __shared__ long long warp_totals[32];
  const int experts = static_cast<int>(p.experts);

  // Every offset checked before anything is written: one bad offset, no writes.
  // Each entry is expert e's end (and, with a leading zero, entry 0 expert 0's
  // start), so one bad entry is reported for one expert only.
  int bad = 0;
  for (int e = threadIdx.x; e < experts; e += Cfg::kThreads) {
    long long start, end;
    offset_rows<Cfg>(p, e, start, end);
    unsigned int code = 0;
    if (end < 0 || end > p.rows || (Cfg::kOffsets == 2 && e == 0 && start != 0))
      code = KJIT_DEVICE_ERROR_SCALE_OFFSETS_OUT_OF_RANGE;
    else if (end < start)
      code = KJIT_DEVICE_ERROR_SCALE_OFFSETS_NOT_MONOTONIC;
    if (code != 0) {
      bad = 1;
      if (atomicCAS(&p.device_error[0], 0u, code) == 0u) p.device_error[1] = static_cast<unsigned int>(e);
    }
    first_row[e] = static_cast<int>(start);
    row_count[e] = static_cast<int>(end - start);
  }
  if (__syncthreads_or(bad) != 0) return;

  // Each thread scans a run of consecutive experts; the runs' sums are scanned across the block.
  const int per_thread = (experts + Cfg::kThreads - 1) / Cfg::kThreads;
  const int run_begin = threadIdx.x * per_thread;
  const int run_end = run_begin + per_thread < experts ? run_begin + per_thread : experts;
  long long run_tiles = 0;
  for (int e = run_begin; e < run_end; ++e) run_tiles += (row_count[e] + 127) / 128 * Cfg::kTiles;
  long long tile = block_exclusive_sum<Cfg>(run_tiles, warp_totals);
  for (int e = run_begin; e < run_end; ++e) {
    first_tile[e] = tile;
    tile += (row_count[e] + 127) / 128 * Cfg::kTiles;
  }
  if (run_begin < experts && run_end == experts) first_tile[experts] = tile;  // one thread: the last run's
  __syncthreads();

  const long long words = first_tile[experts] * Cfg::kWordsPerTile;
  for (long long w = static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x; w < words;
       w += static_cast<long long>(gridDim.x) * Cfg::kThreads) {
    // The last expert whose block starts at or before this word's tile (empty experts start where the next does).
    const long long word_tile = w / Cfg::kWordsPerTile;
    int lo = 0, hi = experts;  // first_tile[lo] <= word_tile < first_tile[hi]
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (first_tile[mid] <= word_tile) lo = mid;
      else hi = mid;
    }
    const long long base_word = first_tile[lo] * Cfg::kWordsPerTile;
    convert_word<Cfg>(p, base_word * 4, w - base_word, first_row[lo], row_count[lo]);
  }
}

template <class Cfg>
__device__ __forceinline__ void mx_scale_layout(const kjit_mx_scale_layout_params& p) {
  if constexpr (Cfg::kOffsets == 0) uniform_scale_layout<Cfg>(p);
  else offsets_scale_layout<Cfg>(p);
}

}  // namespace kjit
