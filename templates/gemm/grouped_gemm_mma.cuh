// Grouped GEMM for MoE experts, the portable path (sm_80 and newer):
// out[rows of e] = A[rows of e] . W_e^T, with W stacked [E, N, K] (or [E, K, N]),
// bf16 operands, fp32 accumulation through mma.sync m16n8k16, an optional
// per-row fp32 scale in the epilogue, bf16 or fp32 output.
//
// Grid: x walks the m-tiles of all experts (ceil(rows/BM) + E is an upper bound
// the host can compute without reading offsets; surplus blocks exit), y the
// n-tiles. Each block finds its expert by scanning the device-resident offsets,
// so segments of any length (0 included) need no padding and no host sync.
// Every block checks every offset before writing: bad offsets write nothing.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): lane = 4 * group + quad;
//   A (16x16, row): a0 (group, 2q..2q+1), a1 (group+8, 2q..), a2 (group, 8+2q..), a3 (group+8, 8+2q..)
//   B (16x8, col):  b0 (k 2q..2q+1, n group), b1 (k 8+2q.., n group)
//   C (16x8):       c0,c1 (group, 2q..2q+1), c2,c3 (group+8, 2q..2q+1)
// Both tiles are staged K-contiguous in shared memory ([rows][BK + 8], the pad
// spreads the 8 rows a fragment load touches over distinct banks), so every
// fragment register is one 32-bit shared load.
#pragma once

#include "../abi/grouped_gemm_params.h"
#include "../common/fp8_convert.cuh"
#include "grouped_gemm_common.cuh"

namespace kjit {

template <class Problem, int kBM_, int kBN_, int kBK_>
struct GroupedGemmConfig : Problem {
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = kBK_;
  static constexpr int kThreads = 128;  // 4 warps, 2 x 2 over the block tile
  static constexpr int kWarpM = kBM / 2, kWarpN = kBN / 2;
  static constexpr int kFragsM = kWarpM / 16, kFragsN = kWarpN / 8;
  static constexpr int kStride = kBK + 8;  // shared row stride in bf16 elements (16-byte multiple)
  static_assert(kBM % 32 == 0 && kBN % 16 == 0 && kBK % 16 == 0, "tile shape");
};

__device__ __forceinline__ void mma_m16n8k16_bf16(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// e4m3 operands (sm_89 and newer; on sm_90 ptxas unpacks the codes to f16 for two HMMA.16816, exactly).
__device__ __forceinline__ void mma_m16n8k32_e4m3(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Copies k-block k0 of bf16 weights into the tile.
template <class Cfg>
__device__ __forceinline__ void stage_bf16_weights(const kjit_grouped_gemm_params& p,
                                                   unsigned short (&b_tile)[Cfg::kBN][Cfg::kStride], int expert,
                                                   long long n0, long long k0) {
  constexpr int kChunksK = Cfg::kBK / 8;  // 16-byte chunks per tile row
  const unsigned short* w = static_cast<const unsigned short*>(p.b) + expert * Cfg::kN * Cfg::kK;
  if constexpr (!Cfg::kWeightsKN) {
    // W_e is [N, K]: tile rows are n, already K-contiguous.
    for (int c = threadIdx.x; c < Cfg::kBN * kChunksK; c += Cfg::kThreads) {
      const int n = c / kChunksK, kc = (c % kChunksK) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (n0 + n < Cfg::kN && k0 + kc < Cfg::kK)
        v = *reinterpret_cast<const uint4*>(w + (n0 + n) * Cfg::kK + k0 + kc);
      *reinterpret_cast<uint4*>(&b_tile[n][kc]) = v;
    }
  } else {
    // W_e is [K, N]: read N-contiguous chunks, transpose into the K-contiguous tile.
    constexpr int kChunksN = Cfg::kBN / 8;
    for (int c = threadIdx.x; c < Cfg::kBK * kChunksN; c += Cfg::kThreads) {
      const int kr = c / kChunksN, nc = (c % kChunksN) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k0 + kr < Cfg::kK && n0 + nc < Cfg::kN)
        v = *reinterpret_cast<const uint4*>(w + (k0 + kr) * Cfg::kN + n0 + nc);
      const unsigned short* h = reinterpret_cast<const unsigned short*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) b_tile[nc + i][kr] = h[i];
    }
  }
}

// The kernel, with `stage_weights(b_tile, expert, n0, k0)` filling the
// weight tile (kBN rows of n, kBK k each, bf16, zeros past N and K) for
// k-block k0: bf16 weights are copied, the mixed-input kernel's converted;
// `expert_multiplier(expert)` multiplies the expert's fp32 accumulators
// before the epilogue (the mixed-input kernel's NVFP4 global; 1 otherwise).
template <class Cfg, class StageWeights, class ExpertMultiplier>
__device__ __forceinline__ void grouped_gemm_mma_with(const kjit_grouped_gemm_params& p, StageWeights stage_weights,
                                                      ExpertMultiplier expert_multiplier) {
  if (!offsets_valid<Cfg>(p)) return;

  // Which expert and m-tile this block owns.
  long long m0 = 0, rows = 0;
  int expert = -1;
  if (!find_m_tile<Cfg>(p, blockIdx.x, expert, m0, rows)) return;  // surplus block of the upper-bound grid
  const long long n0 = static_cast<long long>(blockIdx.y) * Cfg::kBN;

  __shared__ __align__(16) unsigned short a_tile[Cfg::kBM][Cfg::kStride];
  __shared__ __align__(16) unsigned short b_tile[Cfg::kBN][Cfg::kStride];
  const unsigned short* a = static_cast<const unsigned short*>(p.a);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int warp_m = (warp / 2) * Cfg::kWarpM, warp_n = (warp % 2) * Cfg::kWarpN;

  float acc[Cfg::kFragsM][Cfg::kFragsN][4];
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;

  constexpr int kChunksK = Cfg::kBK / 8;  // 16-byte chunks per tile row
  for (long long k0 = 0; k0 < Cfg::kK; k0 += Cfg::kBK) {
    // A tile: rows past the expert's segment and columns past K are zeros
    // (and, with gather, rows whose entry reads none).
    for (int c = threadIdx.x; c < Cfg::kBM * kChunksK; c += Cfg::kThreads) {
      const int r = c / kChunksK, kc = (c % kChunksK) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && k0 + kc < Cfg::kK) {
        const long long source = a_source_row<Cfg>(p, m0 + r);
        if (source >= 0) v = *reinterpret_cast<const uint4*>(a + source * Cfg::kK + k0 + kc);
      }
      *reinterpret_cast<uint4*>(&a_tile[r][kc]) = v;
    }
    stage_weights(b_tile, expert, n0, k0);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < Cfg::kBK; kk += 16) {
      unsigned af[Cfg::kFragsM][4], bf[Cfg::kFragsN][2];
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i) {
        const int r = warp_m + i * 16 + group;
        af[i][0] = *reinterpret_cast<const unsigned*>(&a_tile[r][kk + 2 * quad]);
        af[i][1] = *reinterpret_cast<const unsigned*>(&a_tile[r + 8][kk + 2 * quad]);
        af[i][2] = *reinterpret_cast<const unsigned*>(&a_tile[r][kk + 8 + 2 * quad]);
        af[i][3] = *reinterpret_cast<const unsigned*>(&a_tile[r + 8][kk + 8 + 2 * quad]);
      }
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; ++j) {
        const int n = warp_n + j * 8 + group;
        bf[j][0] = *reinterpret_cast<const unsigned*>(&b_tile[n][kk + 2 * quad]);
        bf[j][1] = *reinterpret_cast<const unsigned*>(&b_tile[n][kk + 8 + 2 * quad]);
      }
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < Cfg::kFragsN; ++j) mma_m16n8k16_bf16(acc[i][j], af[i], bf[j]);
    }
    __syncthreads();
  }

  // Epilogue: optional per-row scale, round, store two columns per register
  // pair. With the fused activation, fragments 2g (gate) and 2g + 1 (up) of
  // a warp give output fragment g, columns from (n0 + warp_n) / 2.
  constexpr int kStep = Cfg::kFusedActivation ? 2 : 1;
  static_assert(Cfg::kFragsN % kStep == 0 && Cfg::kWarpN % (8 * kStep) == 0, "whole gate/up fragment pairs");
  const float product_scale = expert_multiplier(expert);
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] *= product_scale;
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = warp_m + i * 16 + group + half * 8;
      if (r >= rows) continue;
      const long long row = m0 + r;
      const float scale = Cfg::kRowScale ? p.row_scale[row] : 1.0f;
#pragma unroll
      for (int j = 0; j < Cfg::kFragsN; j += kStep) {
        const long long col = (n0 + warp_n) / kStep + j / kStep * 8 + 2 * quad;
        if (col >= Cfg::kOutN) continue;
        float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
        if constexpr (Cfg::kFusedActivation) {
          v0 = activate<Cfg::kActivation>(v0, acc[i][j + 1][2 * half], p.activation_alpha, p.activation_limit);
          v1 = activate<Cfg::kActivation>(v1, acc[i][j + 1][2 * half + 1], p.activation_alpha, p.activation_limit);
        }
        v0 *= scale;
        v1 *= scale;
        if constexpr (Cfg::kAddend != Addend::none) {
          const float2 v = plus_addend_pair<Cfg>(p, v0, v1, row * Cfg::kOutN + col);
          v0 = v.x;
          v1 = v.y;
        }
        if constexpr (Cfg::kOutF32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + row * Cfg::kOutN + col) = make_float2(v0, v1);
        } else {
          *reinterpret_cast<unsigned*>(static_cast<unsigned short*>(p.out) + row * Cfg::kOutN + col) =
              cvt_rn_bf16x2_f32(v0, v1);
        }
      }
    }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_mma(const kjit_grouped_gemm_params& p) {
  grouped_gemm_mma_with<Cfg>(
      p,
      [&](unsigned short(&b_tile)[Cfg::kBN][Cfg::kStride], int expert, long long n0, long long k0) {
        stage_bf16_weights<Cfg>(p, b_tile, expert, n0, k0);
      },
      [](int) { return 1.0f; });
}

}  // namespace kjit
