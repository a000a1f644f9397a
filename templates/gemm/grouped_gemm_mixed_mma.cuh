// Mixed-input (W8A16, W4A16) grouped GEMM for MoE experts, the portable path (sm_89
// and newer: SM100 and SM120 until they have their own kernels, and Hopper
// when forced): the bf16 portable kernel (grouped_gemm_mma.cuh: tiles,
// fragments, epilogue) with its weight tile staged from fp8 codes, each
// converted with its scale into bf16 as kjit's dequant does
// (grouped_gemm_mixed_common.cuh) on its way into shared memory. Each thread
// converts runs of 8 codes of one stored row, which lie in one scale block
// (under a fused activation the block of the row's checkpoint row:
// weight_multiplier maps it).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "grouped_gemm_mixed_common.cuh"
#include "grouped_gemm_mma.cuh"

namespace kjit {

template <class Problem, int kBM_, int kBN_, int kBK_>
struct GroupedGemmMixedMmaConfig : GroupedGemmConfig<Problem, kBM_, kBN_, kBK_> {
  static_assert(kBK_ % 8 == 0 && kBN_ % 8 == 0, "runs of 8 codes along either axis");
};

// Eight codes (8 bytes, the lowest first) times their one multiplier, as 8 bf16.
template <class Cfg>
__device__ __forceinline__ uint4 convert_weight_run(uint2 codes, float scale) {
  return make_uint4(convert_weight_pair<Cfg>(static_cast<unsigned short>(codes.x), scale, scale),
                    convert_weight_pair<Cfg>(static_cast<unsigned short>(codes.x >> 16), scale, scale),
                    convert_weight_pair<Cfg>(static_cast<unsigned short>(codes.y), scale, scale),
                    convert_weight_pair<Cfg>(static_cast<unsigned short>(codes.y >> 16), scale, scale));
}

template <class Cfg>
__device__ __forceinline__ void stage_fp8_weights(const kjit_grouped_gemm_mixed_params& p,
                                                  unsigned short (&b_tile)[Cfg::kBN][Cfg::kStride], int expert,
                                                  long long n0, long long k0) {
  const unsigned char* w = static_cast<const unsigned char*>(p.gemm.b) + expert * Cfg::kN * Cfg::kK;
  if constexpr (!Cfg::kWeightsKN) {
    // Stored [N, K]: tile rows are stored rows.
    constexpr int kRunsK = Cfg::kBK / 8;
    for (int c = threadIdx.x; c < Cfg::kBN * kRunsK; c += Cfg::kThreads) {
      const int n = c / kRunsK, kc = (c % kRunsK) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (n0 + n < Cfg::kN && k0 + kc < Cfg::kK) {
        const uint2 codes = *reinterpret_cast<const uint2*>(w + (n0 + n) * Cfg::kK + k0 + kc);
        v = convert_weight_run<Cfg>(codes, weight_multiplier<Cfg>(p.b_scales, expert, n0 + n, k0 + kc));
      }
      *reinterpret_cast<uint4*>(&b_tile[n][kc]) = v;
    }
  } else {
    // Stored [K, N]: runs along n, transposed into the K-contiguous tile.
    constexpr int kRunsN = Cfg::kBN / 8;
    for (int c = threadIdx.x; c < Cfg::kBK * kRunsN; c += Cfg::kThreads) {
      const int kr = c / kRunsN, nc = (c % kRunsN) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k0 + kr < Cfg::kK && n0 + nc < Cfg::kN) {
        const uint2 codes = *reinterpret_cast<const uint2*>(w + (k0 + kr) * Cfg::kN + n0 + nc);
        v = convert_weight_run<Cfg>(codes, weight_multiplier<Cfg>(p.b_scales, expert, k0 + kr, n0 + nc));
      }
      const unsigned short* h = reinterpret_cast<const unsigned short*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) b_tile[nc + i][kr] = h[i];
    }
  }
}

// Eight FP4 elements (4 bytes of pairs, the lowest element in the lowest
// nibble) times their group's scale byte: e2m1 x group scale, exact in bf16,
// as the SM90 kernels convert them (NVFP4's global multiplies the
// accumulator: expert_multiplier).
template <class Cfg>
__device__ __forceinline__ uint4 convert_fp4_run(unsigned pairs, unsigned scale_byte) {
  float scale;
  if constexpr (Cfg::kScale == MixedScale::nvfp4) {
    float unused;
    decode_fp8x2<Fp8Format::e4m3fn>(static_cast<unsigned short>(scale_byte), scale, unused);
  } else {
    scale = decode_ue8m0(scale_byte);
  }
  unsigned out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float even, odd;
    decode_e2m1x2((pairs >> (8 * i)) & 0xFFu, even, odd);
    out[i] = cvt_rn_bf16x2_f32(even * scale, odd * scale);  // exact: the group product has 6 significant bits
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// FP4 weights: runs of 8 elements (4 bytes) of one stored row, which lie in
// one scale group (16 or 32). Stored [N, K / 2] ([E, N, K]): tile rows are
// stored rows; stored [K, N / 2] ([E, K, N], the same storage read for dX):
// runs along n, transposed into the K-contiguous tile.
template <class Cfg>
__device__ __forceinline__ void stage_fp4_weights(const kjit_grouped_gemm_mixed_params& p,
                                                  unsigned short (&b_tile)[Cfg::kBN][Cfg::kStride], int expert,
                                                  long long n0, long long k0) {
  static_assert(Cfg::kBK % 8 == 0 && Cfg::kBN % 8 == 0, "runs of 8 elements");
  const unsigned char* w = static_cast<const unsigned char*>(p.gemm.b) + expert * Cfg::kN * (Cfg::kK / 2);
  // The run of 8 stored elements from (row, col) on, converted.
  auto run = [&](long long row, long long col) {
    const unsigned pairs = *reinterpret_cast<const unsigned*>(w + row * (Cfg::kStoredCols / 2) + col / 2);
    const unsigned byte =
        p.b_block_scales[(expert * Cfg::kStoredRows + row) * Cfg::kGroupsPerRow + col / Cfg::kGroup];
    return convert_fp4_run<Cfg>(pairs, byte);
  };
  if constexpr (!Cfg::kWeightsKN) {
    constexpr int kRunsK = Cfg::kBK / 8;
    for (int c = threadIdx.x; c < Cfg::kBN * kRunsK; c += Cfg::kThreads) {
      const int n = c / kRunsK, kc = (c % kRunsK) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (n0 + n < Cfg::kN && k0 + kc < Cfg::kK) v = run(n0 + n, k0 + kc);
      *reinterpret_cast<uint4*>(&b_tile[n][kc]) = v;
    }
  } else {
    constexpr int kRunsN = Cfg::kBN / 8;
    for (int c = threadIdx.x; c < Cfg::kBK * kRunsN; c += Cfg::kThreads) {
      const int kr = c / kRunsN, nc = (c % kRunsN) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k0 + kr < Cfg::kK && n0 + nc < Cfg::kN) v = run(k0 + kr, n0 + nc);
      const unsigned short* h = reinterpret_cast<const unsigned short*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) b_tile[nc + i][kr] = h[i];
    }
  }
}

template <class Cfg>
__device__ __forceinline__ void grouped_gemm_mixed_mma(const kjit_grouped_gemm_mixed_params& p) {
  grouped_gemm_mma_with<Cfg>(
      p.gemm,
      [&](unsigned short(&b_tile)[Cfg::kBN][Cfg::kStride], int expert, long long n0, long long k0) {
        if constexpr (Cfg::kFp4) {
          stage_fp4_weights<Cfg>(p, b_tile, expert, n0, k0);
        } else {
          stage_fp8_weights<Cfg>(p, b_tile, expert, n0, k0);
        }
      },
      [&](int expert) { return expert_multiplier<Cfg>(p.b_global_scales, expert); });
}

}  // namespace kjit
