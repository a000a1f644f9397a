// Grouped GEMM for MoE experts with FP8 (W8A8) operands, the portable path
// (sm_89 and newer: Ada, Blackwell, and Hopper when the wgmma kernel is not
// wanted): A e4m3fn [total_rows, K], B e4m3fn [E, N, K], fp32 accumulation
// through mma.sync m16n8k32 .e4m3, bf16 or fp32 output. NOTES: only sm_89 and
// sm_120/121 run that mma natively (QMMA.16832); for sm_90 and sm_100/103/110
// ptxas unpacks the codes to f16 and issues two HMMA.16816 per mma (exact, but
// no faster than bf16).
//
// DeepSeek-V3's recipe (grouped_gemm_fp8_common.cuh): each 128-column k-block
// kb is multiplied into a fresh fp32 partial sum, then promoted into the
// accumulator, one fma per element:
//   block scales:   acc = fma(part, a_scale[row, kb] * b_scale[expert, col / 128, kb], acc)
//   channel scales: acc = fma(part, a_scale[row, kb], acc), and the epilogue multiplies by b_scale[expert, col];
// then (acc * row_scale[row] if asked) rounds to nearest-even bf16, or stays fp32.
//
// Grid as the bf16 portable kernel (grouped_gemm_mma.cuh): x walks the m-tiles
// of all experts (ceil(rows / BM) + E is an upper bound; surplus blocks exit),
// y the n-tiles; every block checks every offset before writing anything.
// BN divides 128, so a block's columns share one weight scale block.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32", 8-bit types):
// lane = 4 * group + quad; each register holds four consecutive k, lowest k in the low byte.
//   A (16x32, row): a0 (group, 4q..4q+3), a1 (group+8, 4q..), a2 (group, 16+4q..), a3 (group+8, 16+4q..)
//   B (32x8, col):  b0 (k 4q..4q+3, n group), b1 (k 16+4q.., n group)
//   C (16x8):       c0,c1 (group, 2q..2q+1), c2,c3 (group+8, 2q..2q+1)
// Tiles are staged K-contiguous, one 128-byte row (a whole k-block) per tile
// row, with 16-byte chunk c of row r stored at chunk c ^ (r % 8): the 8 rows x
// 4 words a fragment load touches, and the 8 chunks a 128-byte store phase
// writes, fall on distinct banks, with no padding. cp.async double-buffers the
// k-blocks where two stages fit the 48 KB of static shared memory (every tile
// but 128 x 128, which runs one stage).
#pragma once

#include "../abi/grouped_gemm_fp8_params.h"
#include "../common/fp8_convert.cuh"
#include "grouped_gemm_common.cuh"
#include "grouped_gemm_fp8_common.cuh"
#include "grouped_gemm_mma.cuh"

namespace kjit {

template <class Problem, int kBM_, int kBN_>
struct GroupedGemmFp8MmaConfig : Problem {
  static constexpr int kBM = kBM_, kBN = kBN_;
  static constexpr int kBK = Problem::kScaleBlock;  // one k-block per stage
  static constexpr int kThreads = 128;              // 4 warps, 2 x 2 over the block tile
  static constexpr int kWarpM = kBM / 2, kWarpN = kBN / 2;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;
  // A k-block's partial sums live beside the accumulator: up to 64 per
  // thread, but 32 beside the 128 of 128 x 128, whose warp tile then takes
  // four passes of 16 rows (each re-reading B's fragments), so nothing spills.
  static constexpr int kPartials = kFragsM * kFragsN * 4 >= 128 ? 32 : 64;
  static constexpr int kPassFragsM = kFragsM < kPartials / (4 * kFragsN) ? kFragsM : kPartials / (4 * kFragsN);
  static constexpr int kPasses = kFragsM / kPassFragsM;
  static constexpr int kStageBytes = (kBM + kBN) * kBK;
  static constexpr int kStages = 2 * kStageBytes <= 48 * 1024 ? 2 : 1;
  static_assert((kBM == 32 || kBM == 64 || kBM == 128) && (kBN == 32 || kBN == 64 || kBN == 128), "tile shape");
  static_assert(kBK == 128, "the swizzle permutes the eight 16-byte chunks of a 128-byte row");
  static_assert(Problem::kScaleBlock % kBN == 0, "a block's columns lie in one weight scale block");
};

// 16 bytes global -> shared, bypassing L1; zeros instead when !valid (nothing is read).
__device__ __forceinline__ void cp_async_cg_16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                   static_cast<unsigned>(__cvta_generic_to_shared(shared))),
               "l"(global), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile (row_mod_8 == row % 8).
__device__ __forceinline__ int fp8_tile_chunk(int row, int row_mod_8, int chunk) {
  return row * 128 + ((chunk ^ row_mod_8) << 4);
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_fp8_mma(const kjit_grouped_gemm_fp8_params& p) {
  if (!offsets_valid<Cfg>(p.gemm)) return;

  // Which expert and m-tile this block owns.
  long long m0 = 0, rows = 0;
  int expert = -1;
  if (!find_m_tile<Cfg>(p.gemm, blockIdx.x, expert, m0, rows)) return;  // surplus block of the upper-bound grid
  const long long n0 = static_cast<long long>(blockIdx.y) * Cfg::kBN;
  const int b_rows = Cfg::kN - n0 < Cfg::kBN ? static_cast<int>(Cfg::kN - n0) : Cfg::kBN;

  __shared__ __align__(128) unsigned char a_tile[Cfg::kStages][Cfg::kBM * Cfg::kBK];
  __shared__ __align__(128) unsigned char b_tile[Cfg::kStages][Cfg::kBN * Cfg::kBK];

  // Copies: thread t moves chunk t % 8 of tile rows t / 8 + 16 s (s = 0, 1, ...),
  // so its shared offset within each 16-row band is fixed. Rows past the
  // expert's segment (A) or past N (B) are zero-filled.
  const int copy_row = threadIdx.x / 8, copy_chunk = threadIdx.x % 8;
  const int copy_offset = fp8_tile_chunk(copy_row, copy_row % 8, copy_chunk);
  const unsigned char* a_src =
      static_cast<const unsigned char*>(p.gemm.a) + (m0 + copy_row) * Cfg::kK + copy_chunk * 16;
  const unsigned char* b_src = static_cast<const unsigned char*>(p.gemm.b) +
                               (expert * Cfg::kN + n0 + copy_row) * Cfg::kK + copy_chunk * 16;
  auto copy_k_block = [&](int stage, int kb) {
    const long long k0 = static_cast<long long>(kb) * Cfg::kBK;
#pragma unroll
    for (int s = 0; s < Cfg::kBM / 16; ++s) {
      const bool valid = copy_row + 16 * s < rows;
      cp_async_cg_16(&a_tile[stage][copy_offset + 16 * s * Cfg::kBK],
                     valid ? a_src + 16 * s * Cfg::kK + k0 : p.gemm.a, valid);
    }
#pragma unroll
    for (int s = 0; s < Cfg::kBN / 16; ++s) {
      const bool valid = copy_row + 16 * s < b_rows;
      cp_async_cg_16(&b_tile[stage][copy_offset + 16 * s * Cfg::kBK],
                     valid ? b_src + 16 * s * Cfg::kK + k0 : p.gemm.b, valid);
    }
    cp_async_commit_group();
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int warp_m = (warp / 2) * Cfg::kWarpM, warp_n = (warp % 2) * Cfg::kWarpN;
  // Fragment rows are warp_m + 16 i + group (+ 8) and warp_n + 8 j + group, all
  // == group mod 8: chunk c of any of them lies at (c ^ group) * 16 in its row.
  const int a_frag = (warp_m + group) * Cfg::kBK + 4 * quad;
  const int b_frag = (warp_n + group) * Cfg::kBK + 4 * quad;

  // A's scales from the thread's first fragment row on (64-bit rows would stay live in registers).
  const int frag_rows = static_cast<int>(rows) - (warp_m + group);
  kjit_fp8_gemm_scales a_scales = p.scales;
  a_scales.a += (m0 + warp_m + group) * Cfg::kKScaleBlocks;

  float acc[Cfg::kFragsM][Cfg::kFragsN][4];
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

  constexpr int kKBlocks = static_cast<int>(Cfg::kKScaleBlocks);
  copy_k_block(0, 0);
  for (int kb = 0; kb < kKBlocks; ++kb) {
    const int stage = kb % Cfg::kStages;
    // This k-block's multipliers of each of the thread's rows (zero past the
    // segment: those rows are never stored, and their scales may not exist).
    float b_scale = 1.0f;
    if constexpr (Cfg::kBlockScales) b_scale = b_block_scale<Cfg>(p.scales, expert, n0, kb);
    float row_mult[Cfg::kFragsM][2];
#pragma unroll
    for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = i * 16 + half * 8;  // from the thread's first fragment row
        row_mult[i][half] = r < frag_rows ? a_scale<Cfg>(a_scales, r, kb) * b_scale : 0.0f;
      }

    if constexpr (Cfg::kStages == 2) {
      if (kb + 1 < kKBlocks) copy_k_block((kb + 1) % 2, kb + 1);
      else cp_async_commit_group();  // an empty group keeps the count: wait for all but the newest
      cp_async_wait_group<1>();
    } else {
      cp_async_wait_group<0>();
    }
    __syncthreads();

    const unsigned char* as = a_tile[stage];
    const unsigned char* bs = b_tile[stage];
#pragma unroll
    for (int pass = 0; pass < Cfg::kPasses; ++pass) {
      float part[Cfg::kPassFragsM][Cfg::kFragsN][4];
#pragma unroll
      for (int i = 0; i < Cfg::kPassFragsM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) part[i][j][c] = 0.0f;
      // 32 k per mma: two chunks. Not unrolled: ptxas would hoist a whole
      // k-block's fragment loads and spill (the mma's latency hides the loads').
#pragma unroll 1
      for (int chunk = 0; chunk < Cfg::kBK / 16; chunk += 2) {
        const int lo = fp8_tile_chunk(0, group, chunk), hi = fp8_tile_chunk(0, group, chunk + 1);
        unsigned af[Cfg::kPassFragsM][4];
#pragma unroll
        for (int i = 0; i < Cfg::kPassFragsM; ++i) {
          const unsigned char* r = as + a_frag + (pass * Cfg::kPassFragsM + i) * 16 * Cfg::kBK;
          af[i][0] = *reinterpret_cast<const unsigned*>(r + lo);
          af[i][1] = *reinterpret_cast<const unsigned*>(r + 8 * Cfg::kBK + lo);
          af[i][2] = *reinterpret_cast<const unsigned*>(r + hi);
          af[i][3] = *reinterpret_cast<const unsigned*>(r + 8 * Cfg::kBK + hi);
        }
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j) {
          const unsigned char* n = bs + b_frag + j * 8 * Cfg::kBK;
          const unsigned bf[2] = {*reinterpret_cast<const unsigned*>(n + lo),
                                  *reinterpret_cast<const unsigned*>(n + hi)};
#pragma unroll
          for (int i = 0; i < Cfg::kPassFragsM; ++i) mma_m16n8k32_e4m3(part[i][j], af[i], bf);
        }
      }
      // Promotion: the k-block's partial sums join the accumulator, scaled.
#pragma unroll
      for (int i = 0; i < Cfg::kPassFragsM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int fi = pass * Cfg::kPassFragsM + i;
            acc[fi][j][c] = __fmaf_rn(part[i][j][c], row_mult[fi][c / 2], acc[fi][j][c]);
          }
    }
    __syncthreads();  // every warp is done with this stage before it is refilled
    if constexpr (Cfg::kStages == 1) {
      if (kb + 1 < kKBlocks) copy_k_block(0, kb + 1);
    }
  }

  // Epilogue: channel scale, optional per-row scale, round, store two columns per register pair.
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp_m + i * 16 + half * 8 + group;
      if (r >= rows) continue;
      const long long row = m0 + r;
      const float scale = Cfg::kRowScale ? p.gemm.row_scale[row] : 1.0f;
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; ++j) {
        const long long col = n0 + warp_n + j * 8 + 2 * quad;
        if (col >= Cfg::kN) continue;
        float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
        if constexpr (!Cfg::kBlockScales) {
          v0 *= b_channel_scale<Cfg>(p.scales, expert, col);
          v1 *= b_channel_scale<Cfg>(p.scales, expert, col + 1);
        }
        v0 *= scale;
        v1 *= scale;
        if constexpr (Cfg::kOutF32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.gemm.out) + row * Cfg::kN + col) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<unsigned*>(static_cast<unsigned short*>(p.gemm.out) + row * Cfg::kN + col) =
              cvt_rn_bf16x2_f32(v0, v1);
        }
      }
    }
}

}  // namespace kjit
