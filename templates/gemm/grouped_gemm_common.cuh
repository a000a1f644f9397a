// What both grouped GEMM kernels share: the expert segments in either offsets
// convention, and the check every block makes of every offset before it
// writes anything (bad offsets are reported in the device error words).
// Cfg provides kOffsetsWithZero and kThreads; the expert count is the launch's (p.experts).
#pragma once

#include "../abi/device_errors.h"
#include "../abi/grouped_gemm_params.h"
#include "../common/activation.cuh"

namespace kjit {

// A [rows, N] tensor added to the product in fp32 before the output's rounding (the spec's addend).
enum class Addend { none, bf16, f32 };

// The problem's constants, shared by both kernels' Configs (which add the tile).
template <long long kN_, long long kK_, bool kWeightsKN_, bool kOffsetsWithZero_, bool kRowScale_, bool kOutF32_,
          Activation kActivation_ = Activation::none, bool kGather_ = false, Addend kAddend_ = Addend::none>
struct GemmProblem {
  static constexpr long long kN = kN_, kK = kK_;
  static constexpr bool kWeightsKN = kWeightsKN_, kOffsetsWithZero = kOffsetsWithZero_;
  static constexpr bool kRowScale = kRowScale_, kOutF32 = kOutF32_;
  // A fused activation: weight rows (and so accumulator columns) come in
  // groups of 8, gate then up (kjit.gate_up_interleaved's order); the output
  // has kOutN = N / 2 columns, out[:, 8g + i] = act(col 16g + i, col 16g + 8 + i).
  static constexpr Activation kActivation = kActivation_;
  static constexpr bool kFusedActivation = kActivation_ != Activation::none;
  static constexpr long long kOutN = kFusedActivation ? kN / 2 : kN;
  // A's rows read through the routing's sorted_to_flat (a_source_row).
  static constexpr bool kGather = kGather_;
  static constexpr Addend kAddend = kAddend_;
  static_assert(kN % 8 == 0 && kK % 8 == 0, "the host admits only N and K divisible by 8 (16-byte rows)");
  static_assert(!kFusedActivation || kN % 16 == 0, "whole gate/up groups");
  static_assert(!kFusedActivation || kAddend == Addend::none, "the addend has the product's columns");
};

// The product (times its row scale) plus its addend: an fp32 add of its own, never fused with the product's
// multiply, so that out = round(fp32(product) + addend) on every kernel.
__device__ __forceinline__ float addend_sum(float product, float addend) { return __fadd_rn(product, addend); }

// v plus the addend's element `index` ([rows, kOutN] row-major: addend_sum); v itself without an addend.
template <class Cfg>
__device__ __forceinline__ float plus_addend(const kjit_grouped_gemm_params& p, float v, long long index) {
  if constexpr (Cfg::kAddend == Addend::f32) {
    return addend_sum(v, static_cast<const float*>(p.addend)[index]);
  } else if constexpr (Cfg::kAddend == Addend::bf16) {
    return addend_sum(v, __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(p.addend)[index])
                                         << 16));
  } else {
    return v;
  }
}

// plus_addend of elements `index` and `index` + 1 (index even: one 8- or 4-byte load).
template <class Cfg>
__device__ __forceinline__ float2 plus_addend_pair(const kjit_grouped_gemm_params& p, float v0, float v1,
                                                   long long index) {
  if constexpr (Cfg::kAddend == Addend::f32) {
    const float2 add = *reinterpret_cast<const float2*>(static_cast<const float*>(p.addend) + index);
    return make_float2(addend_sum(v0, add.x), addend_sum(v1, add.y));
  } else if constexpr (Cfg::kAddend == Addend::bf16) {
    const unsigned both = *reinterpret_cast<const unsigned*>(static_cast<const unsigned short*>(p.addend) + index);
    return make_float2(addend_sum(v0, __uint_as_float(both << 16)),
                       addend_sum(v1, __uint_as_float(both & 0xffff0000u)));
  } else {
    return make_float2(v0, v1);
  }
}

// Elements [index, index + 4) of the addend as fp32 (index a multiple of 4: one 16- or 8-byte load), for a
// kernel that loads them before its product exists (then addend_sum).
template <class Cfg>
__device__ __forceinline__ float4 addend_quad(const kjit_grouped_gemm_params& p, long long index) {
  if constexpr (Cfg::kAddend == Addend::f32) {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(p.addend) + index);
  } else {
    const uint2 both = *reinterpret_cast<const uint2*>(static_cast<const unsigned short*>(p.addend) + index);
    return make_float4(__uint_as_float(both.x << 16), __uint_as_float(both.x & 0xffff0000u),
                       __uint_as_float(both.y << 16), __uint_as_float(both.y & 0xffff0000u));
  }
}

// Rows [start, end) of expert e, in either offsets convention.
template <class Cfg>
__device__ __forceinline__ void expert_rows(const kjit_grouped_gemm_params& p, int e, long long& start,
                                            long long& end) {
  if constexpr (Cfg::kOffsetsWithZero) {
    start = p.offsets[e];
    end = p.offsets[e + 1];
  } else {
    start = e == 0 ? 0 : p.offsets[e - 1];
    end = p.offsets[e];
  }
}

// Which row of `a` holds row `row` of the GEMM's A: the row itself, or with
// gather the token of its sorted_to_flat entry (flat / top_k). -1: the row
// reads zeros (a negative entry: past the routed rows; or one at or past
// tokens * top_k, which is reported).
template <class Cfg>
__device__ __forceinline__ long long a_source_row(const kjit_grouped_gemm_params& p, long long row) {
  if constexpr (!Cfg::kGather) {
    return row;
  } else {
    const int flat = p.gather[row];
    if (flat < 0) return -1;
    if (flat >= p.gather_tokens * p.gather_top_k) {
      if (atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_GEMM_GATHER_INDEX_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned>(flat);
      return -1;
    }
    return flat / static_cast<int>(p.gather_top_k);  // top_k * tokens fits int32 (the host checks)
  }
}

// Where tile `local` of an expert's m_tiles x n_tiles grid of tiles lies, for
// the persistent kernels: in bands of kRasterBand row tiles, each band walked
// column by column with its row tiles fastest (an expert of at most
// kRasterBand row tiles: column by column, as a band).
// Why bands: a persistent grid runs about an SM count of consecutive tiles at
// once, and a tile finds its operands in L2 only if tiles near it in the walk
// read them. With the row tiles fastest over all of an expert's rows, every
// column of tiles reads all of the expert's A again, and a tall expert's A
// (59 MB of e4m3 at 8192 rows, K 7168) is more than L2 holds: its operands
// then come from DRAM many times over (docs/decisions/0009). A band of 16
// tiles of 128 rows holds 15 MB of that A, and the weight tiles in flight
// beside it another ~15 MB: both stay in L2.
inline constexpr long long kRasterBand = 16;
__device__ __forceinline__ void raster(long long local, long long m_tiles, long long n_tiles, long long& m,
                                       long long& n) {
  const long long band = local / (kRasterBand * n_tiles), first = band * kRasterBand;
  const long long height = m_tiles - first < kRasterBand ? m_tiles - first : kRasterBand;
  const long long within = local - first * n_tiles;
  m = first + within % height;
  n = within / height;
}

// The portable kernels' grid walks every expert's m-tiles of Cfg::kBM rows
// in order: block `tile` of that walk is expert `expert`'s rows [m0, m0 +
// rows). False for a surplus block of the upper-bound grid (no such tile).
template <class Cfg>
__device__ __forceinline__ bool find_m_tile(const kjit_grouped_gemm_params& p, long long tile, int& expert,
                                            long long& m0, long long& rows) {
  for (int e = 0; e < p.experts; ++e) {
    long long start, end;
    expert_rows<Cfg>(p, e, start, end);
    const long long tiles = (end - start + Cfg::kBM - 1) / Cfg::kBM;
    if (tile < tiles) {
      expert = e;
      m0 = start + tile * Cfg::kBM;
      rows = end - m0 < Cfg::kBM ? end - m0 : Cfg::kBM;
      return true;
    }
    tile -= tiles;
  }
  return false;
}

template <class Cfg>
__device__ __forceinline__ bool offsets_valid(const kjit_grouped_gemm_params& p) {
  int bad = 0;
  for (int e = threadIdx.x; e < p.experts; e += Cfg::kThreads) {
    long long start, end;
    expert_rows<Cfg>(p, e, start, end);
    unsigned code = 0;
    if (start < 0 || end > p.total_rows || (Cfg::kOffsetsWithZero && e == 0 && start != 0))
      code = KJIT_DEVICE_ERROR_OFFSETS_OUT_OF_RANGE;
    else if (end < start)
      code = KJIT_DEVICE_ERROR_OFFSETS_NOT_MONOTONIC;
    if (code != 0) {
      bad = 1;
      if (atomicCAS(&p.device_error[0], 0u, code) == 0u) p.device_error[1] = static_cast<unsigned>(e);
    }
  }
  return __syncthreads_or(bad) == 0;
}

}  // namespace kjit
