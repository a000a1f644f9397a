// The grouped weight-gradient GEMM, the portable kernel (sm_80 and newer):
//   out[e] (N x K) = dy[s_e:t_e]^T . x[s_e:t_e]
// bf16 operands, fp32 accumulation through mma.sync m16n8k16, fp32 or bf16
// output (rounded once).
//
// Grid: x over the output tiles of N x K, y over experts; a block sums its
// tile over its expert's rows in ascending chunks of kBK rows, so every
// output element is one fixed sequence of fp32 additions (the same bits on
// every run) and no block reads another's rows. An empty expert's blocks
// write zeros. Rows past the last offset are never read.
//
// Both operands are MN-major here (the reduction runs over rows, which are
// the slow axis of dy and x): each stage holds kBK rows x kBM columns of dy
// and kBK rows x kBN columns of x as they lie in memory, copied by cp.async
// (rows outside the segment and columns past N or K are zero-filled: src-size
// 0 reads nothing), each row padded by 16 bytes so the 8 rows one ldmatrix
// reads fall on distinct banks. ldmatrix.trans turns them into the MMA's
// fragments (PTX ISA, mma.m16n8k16 .bf16; lane = 4 group + quad):
//   A = dy^T (16 out rows x 16 dy rows): a0 (m group, r 2q..2q+1), a1 (m group+8, r 2q..),
//     a2 (m group, r 8+2q..), a3 (m group+8, r 8+2q..) -- .trans of the 8x8 blocks
//     (r 0-7, m 0-7), (r 0-7, m 8-15), (r 8-15, m 0-7), (r 8-15, m 8-15);
//   B = x (16 dy rows x 8 out columns): b0 (r 2q..2q+1, n group), b1 (r 8+2q.., n group) --
//     .trans of (r 0-7, n 0-7) and (r 8-15, n 0-7); one x4 load gives two n8 fragments.
//   C (16x8): c0,c1 (m group, n 2q..2q+1), c2,c3 (m group+8, n 2q..2q+1).
#pragma once

#include "../abi/grouped_gemm_wgrad_params.h"
#include "grouped_gemm_fp8_mma.cuh"
#include "grouped_gemm_mma.cuh"

namespace kjit {

template <long long kN_, long long kK_, bool kOffsetsWithZero_, bool kOutF32_, int kBM_, int kBN_, int kBK_,
          int kStages_>
struct GroupedGemmWgradConfig {
  static constexpr long long kN = kN_, kK = kK_;
  static constexpr bool kOffsetsWithZero = kOffsetsWithZero_, kOutF32 = kOutF32_;
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = kBK_, kStages = kStages_;
  // Warps of 64 x 32 output elements (32 x 32 in the narrow 32-row tile).
  static constexpr int kWarpM = kBM >= 64 ? 64 : kBM, kWarpN = 32;
  static constexpr int kWarpsM = kBM / kWarpM, kWarpsN = kBN / kWarpN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;
  // Shared row strides in bf16 elements: 16 bytes of padding per row.
  static constexpr int kDyStride = kBM + 8, kXStride = kBN + 8;
  static constexpr int kStageElements = kBK * (kDyStride + kXStride);
  static constexpr int kSharedBytes = kStages * kStageElements * 2;
  static_assert(kN % 8 == 0 && kK % 8 == 0, "the host admits only N and K divisible by 8 (16-byte rows)");
  static_assert(kBM % 32 == 0 && kBN % 32 == 0 && kBK % 16 == 0 && kStages >= 2, "tile shape");
  static_assert(kFragsN % 2 == 0, "x fragments load in pairs");
};

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&d)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(static_cast<unsigned>(__cvta_generic_to_shared(shared))));
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_wgrad_mma(const kjit_grouped_gemm_wgrad_params& p) {
  // The grouped GEMM's offsets check (every offset, every block, before any write) over a view of its block.
  kjit_grouped_gemm_params segments{};
  segments.offsets = p.offsets;
  segments.total_rows = p.total_rows;
  segments.device_error = p.device_error;
  segments.experts = p.experts;
  if (!offsets_valid<Cfg>(segments)) return;

  const int expert = blockIdx.y;
  long long start, end;
  expert_rows<Cfg>(segments, expert, start, end);
  constexpr long long kTilesM = (Cfg::kN + Cfg::kBM - 1) / Cfg::kBM;
  const long long m0 = (blockIdx.x % kTilesM) * Cfg::kBM;  // out rows (dy columns)
  const long long n0 = (blockIdx.x / kTilesM) * Cfg::kBN;  // out columns (x columns)

  extern __shared__ __align__(16) unsigned short wgrad_shared[];
  auto dy_tile = [&](int stage) { return wgrad_shared + stage * Cfg::kStageElements; };
  auto x_tile = [&](int stage) { return wgrad_shared + stage * Cfg::kStageElements + Cfg::kBK * Cfg::kDyStride; };

  const unsigned short* dy = static_cast<const unsigned short*>(p.dy);
  const unsigned short* x = static_cast<const unsigned short*>(p.x);
  const long long chunks = (end - start + Cfg::kBK - 1) / Cfg::kBK;
  // Copies chunk c's rows [start + c kBK, + kBK) into `stage`, zeros outside the segment, N and K.
  auto copy_chunk = [&](int stage, long long c) {
    const long long r0 = start + c * Cfg::kBK;
    constexpr int kDyUnits = Cfg::kBM / 8, kXUnits = Cfg::kBN / 8;  // 16-byte units per tile row
    for (int u = threadIdx.x; u < Cfg::kBK * kDyUnits; u += Cfg::kThreads) {
      const int r = u / kDyUnits, col = (u % kDyUnits) * 8;
      const bool valid = r0 + r < end && m0 + col < Cfg::kN;
      cp_async_cg_16(dy_tile(stage) + r * Cfg::kDyStride + col, valid ? dy + (r0 + r) * Cfg::kN + m0 + col : dy,
                     valid);
    }
    for (int u = threadIdx.x; u < Cfg::kBK * kXUnits; u += Cfg::kThreads) {
      const int r = u / kXUnits, col = (u % kXUnits) * 8;
      const bool valid = r0 + r < end && n0 + col < Cfg::kK;
      cp_async_cg_16(x_tile(stage) + r * Cfg::kXStride + col, valid ? x + (r0 + r) * Cfg::kK + n0 + col : x, valid);
    }
  };

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int warp_m = (warp / Cfg::kWarpsN) * Cfg::kWarpM, warp_n = (warp % Cfg::kWarpsN) * Cfg::kWarpN;
  // ldmatrix x4: lane l gives row l % 8 of block l / 8 (the blocks listed in the header).
  const int block = lane / 8, block_row = lane % 8;
  const int a_row = (block / 2) * 8 + block_row, a_col = (block % 2) * 8;
  const int b_row = (block % 2) * 8 + block_row, b_col = (block / 2) * 8;

  float acc[Cfg::kFragsM][Cfg::kFragsN][4] = {};

  // The cp.async ring: kStages - 1 chunks in flight ahead of the one being
  // multiplied; every iteration commits one group (empty past the last chunk)
  // so wait_group's count stays the chunk's.
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < chunks) copy_chunk(s, s);
    cp_async_commit_group();
  }
  for (long long c = 0; c < chunks; ++c) {
    cp_async_wait_group<Cfg::kStages - 2>();
    __syncthreads();  // chunk c landed for every thread; the stage refilled below is no longer read
    const long long next = c + Cfg::kStages - 1;
    if (next < chunks) copy_chunk(static_cast<int>(next % Cfg::kStages), next);
    cp_async_commit_group();

    const int stage = static_cast<int>(c % Cfg::kStages);
    const unsigned short* dy_s = dy_tile(stage);
    const unsigned short* x_s = x_tile(stage);
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK; kk += 16) {
      unsigned af[Cfg::kFragsM][4], bf[Cfg::kFragsN][2];
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i)
        ldmatrix_x4_trans(af[i], dy_s + (kk + a_row) * Cfg::kDyStride + warp_m + 16 * i + a_col);
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; j += 2) {
        unsigned d[4];
        ldmatrix_x4_trans(d, x_s + (kk + b_row) * Cfg::kXStride + warp_n + 8 * j + b_col);
        bf[j][0] = d[0];
        bf[j][1] = d[1];
        bf[j + 1][0] = d[2];
        bf[j + 1][1] = d[3];
      }
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j) mma_m16n8k16_bf16(acc[i][j], af[i], bf[j]);
    }
  }
  cp_async_wait_group<0>();  // nothing is left in flight when the block exits

  // Epilogue: two adjacent columns per register pair; K divisible by 8 keeps a pair whole.
  const long long out_base = static_cast<long long>(expert) * Cfg::kN * Cfg::kK;
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const long long row = m0 + warp_m + 16 * i + group + 8 * half;
      if (row >= Cfg::kN) continue;
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; ++j) {
        const long long col = n0 + warp_n + 8 * j + 2 * quad;
        if (col >= Cfg::kK) continue;
        const float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
        const long long at = out_base + row * Cfg::kK + col;
        if constexpr (Cfg::kOutF32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + at) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<unsigned*>(static_cast<unsigned short*>(p.out) + at) = cvt_rn_bf16x2_f32(v0, v1);
        }
      }
    }
}

}  // namespace kjit
