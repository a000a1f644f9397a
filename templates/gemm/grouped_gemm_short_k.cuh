// Grouped GEMM for a short K (at most 32: the rank of a LoRA branch), bf16 operands, sm_80 and newer:
// out[rows of e] = A[rows of e] . W_e^T (W stacked [E, N, K] or [E, K, N]) times an optional row scale, plus an
// optional addend, bf16 or fp32 out. A LoRA branch's B product (u B^T, K = rank) and its dX part (g A) are such
// GEMMs: with K this short the output and its addend are nearly all the bytes and one mma.sync per k-step of 16
// is all the arithmetic, so the kernel is built as a copy is: many warps, each with its whole share of the
// addend in flight before its product exists, and every global access a row-contiguous vector.
//
// Grid: x walks the m-tiles of kBM rows of all experts (the portable kernel's upper bound and find_m_tile), y the
// column blocks of kBN. Each warp owns 16 rows of its block's tile and walks the block's columns 64 at a time:
//   1. loads the addend of its 16 x 64 outputs (lane l: rows 2i + l / 16, columns 4 (l % 16) .. + 3);
//   2. multiplies its A fragments (loaded once, straight from global memory: a row is 16-64 bytes) by the
//      weights' fragments (from L1/L2: all of an expert's blocks read the same kN x kK bytes), mma.sync
//      m16n8k16, fp32 accumulators, k past K zero;
//   3. passes the accumulators through shared memory (its own [16][72] floats: stride 72 keeps the fragment
//      writes and the row reads free of bank conflicts) to the lanes of step 1, which scale, add and store.
// Warps never wait for each other after the offsets' check: a warp whose rows lie past its expert's segment
// leaves. Fragment layouts: grouped_gemm_mma.cuh.
#pragma once

#include "../abi/grouped_gemm_params.h"
#include "grouped_gemm_common.cuh"
#include "grouped_gemm_mma.cuh"

namespace kjit {

template <class Problem, int kBN_>
struct GroupedGemmShortKConfig : Problem {
  static constexpr int kBM = 64, kBN = kBN_;
  static constexpr int kThreads = 128;                // 4 warps of 16 rows
  static constexpr int kWarpColumns = 64;             // a warp's columns per step: 8 fragments of 8
  static constexpr int kKSteps = (Problem::kK + 15) / 16;
  static constexpr int kStageStride = kWarpColumns + 8;
  static constexpr int kItems = 16 * kWarpColumns / 4 / 32;  // a lane's 4-column items per step
  static_assert(Problem::kK <= 32, "the short-K kernel serves K up to 32");
  static_assert(!Problem::kFusedActivation, "the short-K kernel has no fused activation");
  static_assert(kBN % kWarpColumns == 0, "whole warp steps per column block");
};

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_short_k(const kjit_grouped_gemm_params& p) {
  if (!offsets_valid<Cfg>(p)) return;
  long long m0 = 0, rows = 0;
  int expert = -1;
  if (!find_m_tile<Cfg>(p, blockIdx.x, expert, m0, rows)) return;  // surplus block of the upper-bound grid

  __shared__ __align__(16) float staged[Cfg::kThreads / 32][16][Cfg::kStageStride];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const long long warp_row0 = m0 + warp * 16;
  const long long warp_rows = rows - warp * 16 < 16 ? rows - warp * 16 : 16;
  if (warp_rows <= 0) return;
  float(&stage)[16][Cfg::kStageStride] = staged[warp];

  // A's fragments: a0 (group, k 2q..2q+1), a1 (group + 8, ..), a2 (group, 8 + 2q..), a3 (group + 8, 8 + 2q..).
  const unsigned short* a = static_cast<const unsigned short*>(p.a);
  unsigned af[Cfg::kKSteps][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = group + 8 * half;
    const long long source = r < warp_rows ? a_source_row<Cfg>(p, warp_row0 + r) : -1;
#pragma unroll
    for (int s = 0; s < Cfg::kKSteps; ++s)
#pragma unroll
      for (int high = 0; high < 2; ++high) {
        const int k = 16 * s + 8 * high + 2 * quad;
        af[s][half + 2 * high] =
            source >= 0 && k < Cfg::kK ? *reinterpret_cast<const unsigned*>(a + source * Cfg::kK + k) : 0u;
      }
  }
  // The scales of the lane's rows in steps 1 and 3.
  float row_scale[Cfg::kItems];
#pragma unroll
  for (int i = 0; i < Cfg::kItems; ++i) {
    const int r = 2 * i + lane / 16;
    row_scale[i] = Cfg::kRowScale && r < warp_rows ? p.row_scale[warp_row0 + r] : 1.0f;
  }

  const unsigned short* w = static_cast<const unsigned short*>(p.b) + expert * Cfg::kN * Cfg::kK;
  // Columns in int (N is below 2^31): 64-bit column arithmetic cost registers enough to spill.
  const int n_end = (blockIdx.y + 1) * Cfg::kBN < Cfg::kN ? (blockIdx.y + 1) * Cfg::kBN : static_cast<int>(Cfg::kN);
  for (int n0 = blockIdx.y * Cfg::kBN; n0 < n_end; n0 += Cfg::kWarpColumns) {
    const int column = 4 * (lane % 16);
    float4 addend[Cfg::kItems];
    if constexpr (Cfg::kAddend != Addend::none) {
#pragma unroll
      for (int i = 0; i < Cfg::kItems; ++i) {
        const int r = 2 * i + lane / 16;
        addend[i] = r < warp_rows && n0 + column < Cfg::kN
                        ? addend_quad<Cfg>(p, (warp_row0 + r) * Cfg::kN + n0 + column)
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }

    float acc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[j][c] = 0.0f;
      const int n = n0 + 8 * j + group;
#pragma unroll
      for (int s = 0; s < Cfg::kKSteps; ++s) {
        // b0 (k 2q..2q+1, n group), b1 (k 8 + 2q.., n group); zeros past N and K.
        unsigned bf[2];
#pragma unroll
        for (int high = 0; high < 2; ++high) {
          const int k = 16 * s + 8 * high + 2 * quad;
          unsigned v = 0u;
          if (n < Cfg::kN && k < Cfg::kK) {
            if constexpr (Cfg::kWeightsKN)
              v = static_cast<unsigned>(w[k * Cfg::kN + n]) | static_cast<unsigned>(w[(k + 1) * Cfg::kN + n]) << 16;
            else
              v = *reinterpret_cast<const unsigned*>(w + n * Cfg::kK + k);
          }
          bf[high] = v;
        }
        mma_m16n8k16_bf16(acc[j], af[s], bf);
      }
    }

    __syncwarp();  // the previous step's reads of the stage are done
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      *reinterpret_cast<float2*>(&stage[group][8 * j + 2 * quad]) = make_float2(acc[j][0], acc[j][1]);
      *reinterpret_cast<float2*>(&stage[group + 8][8 * j + 2 * quad]) = make_float2(acc[j][2], acc[j][3]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < Cfg::kItems; ++i) {
      const int r = 2 * i + lane / 16;
      if (r >= warp_rows || n0 + column >= Cfg::kN) continue;  // N is a multiple of 8: items are whole
      float4 v = *reinterpret_cast<const float4*>(&stage[r][column]);
      if constexpr (Cfg::kRowScale) {
        v.x *= row_scale[i];
        v.y *= row_scale[i];
        v.z *= row_scale[i];
        v.w *= row_scale[i];
      }
      if constexpr (Cfg::kAddend != Addend::none)
        v = make_float4(addend_sum(v.x, addend[i].x), addend_sum(v.y, addend[i].y), addend_sum(v.z, addend[i].z),
                        addend_sum(v.w, addend[i].w));
      const long long index = (warp_row0 + r) * Cfg::kN + n0 + column;
      if constexpr (Cfg::kOutF32)
        *reinterpret_cast<float4*>(static_cast<float*>(p.out) + index) = v;
      else
        *reinterpret_cast<uint2*>(static_cast<unsigned short*>(p.out) + index) =
            make_uint2(cvt_rn_bf16x2_f32(v.x, v.y), cvt_rn_bf16x2_f32(v.z, v.w));
    }
  }
}

}  // namespace kjit
