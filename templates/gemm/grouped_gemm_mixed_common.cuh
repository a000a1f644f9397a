// What the mixed-input (W8A16, W4A16) grouped GEMM kernels share: the
// problem's constants, where a weight's scale lives, and the conversion of
// the stored weights to the bf16 the tensor cores multiply:
//   fp8:   w = code x scale (fp32; DIVIDE multiplies by the fp32 reciprocal),
//          rounded to nearest-even bf16, as kjit's dequant does;
//   NVFP4: w = e2m1 x e4m3 scale, exact in bf16; the fp32 accumulator is
//          multiplied by the expert's global (expert_multiplier): the tensor
//          cores add exact products, where dequant + bf16 rounds every
//          e2m1 x scale x global to bf16;
//   MXFP4: w = e2m1 x 2^(ue8m0 - 127), exact in bf16 (or +-inf, NaN for 0xFF).
// Scales index the stored tensor [E, R, C]: (R, C) = (N, K) for [E, N, K]
// weights and (K, N) for [E, K, N] (the same storage read for dX = dY . W).
#pragma once

#include "../abi/grouped_gemm_mixed_params.h"
#include "../common/fp8_convert.cuh"
#include "../common/mx_formats.cuh"
#include "grouped_gemm_common.cuh"

namespace kjit {

// fp8 weights: fp32 scales per 128 x 128 block, stored row, or expert. The
// FP4 weights (e2m1 pairs along the stored row, the even element in the low
// nibble) carry their format's scale bytes per group of the stored row.
enum class MixedScale { block, row, tensor, nvfp4, mxfp4 };

// The rows 128 x 128 block scales index. Stored: the weights' own rows. With
// a fused activation the weights' rows are in gate_up_interleaved's order
// (gate/up groups of 8) while the block scales stay over the checkpoint's
// rows, whose gate/up layout this names: halves (gate rows [0, N/2), up
// [N/2, N)) or alternating (gate even, up odd).
enum class BlockScaleRows { stored, halves, alternating };

template <long long kN_, long long kK_, bool kWeightsKN_, bool kOffsetsWithZero_, bool kRowScale_, bool kOutF32_,
          Fp8Format kWeightFormat_, MixedScale kScale_, bool kDivide_, Activation kActivation_ = Activation::none,
          BlockScaleRows kBlockScaleRows_ = BlockScaleRows::stored, bool kGather_ = false>
struct MixedGemmProblem
    : GemmProblem<kN_, kK_, kWeightsKN_, kOffsetsWithZero_, kRowScale_, kOutF32_, kActivation_, kGather_> {
  static constexpr Fp8Format kWeightFormat = kWeightFormat_;  // fp8 weights only
  static constexpr MixedScale kScale = kScale_;
  static constexpr BlockScaleRows kBlockScaleRows = kBlockScaleRows_;
  static constexpr bool kDivide = kDivide_;
  static constexpr bool kFp4 = kScale_ == MixedScale::nvfp4 || kScale_ == MixedScale::mxfp4;
  static constexpr int kGroup = kScale_ == MixedScale::nvfp4 ? 16 : 32;  // FP4: stored elements per scale byte
  // The stored tensor's rows and columns (elements).
  static constexpr long long kStoredRows = kWeightsKN_ ? kK_ : kN_, kStoredCols = kWeightsKN_ ? kN_ : kK_;
  static constexpr long long kScaleRows = (kStoredRows + KJIT_MIXED_SCALE_BLOCK - 1) / KJIT_MIXED_SCALE_BLOCK;
  static constexpr long long kScaleCols = (kStoredCols + KJIT_MIXED_SCALE_BLOCK - 1) / KJIT_MIXED_SCALE_BLOCK;
  static constexpr long long kGroupsPerRow = kStoredCols / kGroup;  // FP4: scale bytes per stored row
  static_assert(kN_ % 16 == 0 && kK_ % 16 == 0, "the host admits only N and K divisible by 16");
  static_assert(!kFp4 || kStoredCols % 32 == 0, "FP4 weights: stored rows of whole 32-element units");
  // The fused activation pairs columns 8 apart in swap_ab_store_activated; per-row scales follow their rows,
  // block scales are found through the checkpoint's layout.
  static_assert(kActivation_ == Activation::none || !kWeightsKN_, "a fused activation: [E, N, K] weights");
  static_assert((kActivation_ != Activation::none && kScale_ == MixedScale::block) ==
                    (kBlockScaleRows_ != BlockScaleRows::stored),
                "the checkpoint's gate/up layout exactly with block scales and a fused activation");
};

// The checkpoint row whose block scales serve stored row `row` (BlockScaleRows
// says why they differ): in group r / 16, pair r % 8, gate for r % 16 < 8.
template <class Cfg>
__device__ __forceinline__ long long block_scale_row(long long row) {
  if constexpr (Cfg::kBlockScaleRows == BlockScaleRows::stored) {
    return row;
  } else {
    const long long pair = row / 16 * 8 + row % 8;  // the gate/up pair: output column of the activation
    const bool up = row % 16 >= 8;
    if constexpr (Cfg::kBlockScaleRows == BlockScaleRows::halves) return up ? Cfg::kN / 2 + pair : pair;
    else return 2 * pair + (up ? 1 : 0);
  }
}

// Whether the rows of one tile of KJIT_MIXED_SCALE_BLOCK stored rows (starting
// at a multiple of it) can find their scales in more than one block row. Only
// halves' can (a tile's gate and up rows lie N / 2 apart in the checkpoint);
// alternating rows are the checkpoint's rows of the same tile, reordered.
template <class Cfg>
inline constexpr bool kTileSpansBlockRows = Cfg::kBlockScaleRows == BlockScaleRows::halves;

// Where `expert`'s stored element (row, col) finds its scale (nullptr: rows
// and columns past the stored tensor's, a tile's edge, read none).
template <class Cfg>
__device__ __forceinline__ const float* weight_scale_source(const float* scales, int expert, long long row,
                                                            long long col) {
  if constexpr (Cfg::kScale == MixedScale::block) {
    if (row >= Cfg::kStoredRows || col >= Cfg::kStoredCols) return nullptr;
    return scales + (expert * Cfg::kScaleRows + block_scale_row<Cfg>(row) / KJIT_MIXED_SCALE_BLOCK) * Cfg::kScaleCols +
           col / KJIT_MIXED_SCALE_BLOCK;
  } else if constexpr (Cfg::kScale == MixedScale::row) {
    if (row >= Cfg::kStoredRows) return nullptr;
    return scales + expert * Cfg::kStoredRows + row;
  } else {
    return scales + expert;
  }
}

// The multiplier a stored scale gives: itself, or its reciprocal under the DIVIDE convention.
template <class Cfg>
__device__ __forceinline__ float multiplier_of_scale(float s) {
  if constexpr (Cfg::kDivide) s = __frcp_rn(s);
  return s;
}

// The multiplier of `expert`'s stored element (row, col): its scale, or the
// scale's reciprocal under the DIVIDE convention; 0 where weight_scale_source has none.
template <class Cfg>
__device__ __forceinline__ float weight_multiplier(const float* scales, int expert, long long row, long long col) {
  const float* source = weight_scale_source<Cfg>(scales, expert, row, col);
  return source != nullptr ? multiplier_of_scale<Cfg>(*source) : 0.0f;
}

// Two codes (low byte first) times their multipliers, as a bf16 pair (first in the low half).
template <class Cfg>
__device__ __forceinline__ unsigned convert_weight_pair(unsigned short codes, float first_scale, float second_scale) {
  float first, second;
  decode_fp8x2<Cfg::kWeightFormat>(codes, first, second);
  return cvt_rn_bf16x2_f32(first * first_scale, second * second_scale);
}

// ------------------------------------------------------------ FP4 weights

// Bytes of {high, low} chosen by prmt's selector (result byte i = source byte of nibble i).
__device__ __forceinline__ unsigned byte_permute(unsigned low, unsigned high, unsigned selector) {
  unsigned out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(low), "r"(high), "r"(selector));
  return out;
}

// bf16x2 multiply, round to nearest even (sm_90 and newer).
__device__ __forceinline__ unsigned mul_bf16x2(unsigned a, unsigned b) {
  unsigned out;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(out) : "r"(a), "r"(b));
  return out;
}

// Two packed bytes of e2m1 pairs, bytes 2 half and 2 half + 1 of `word` ->
// their values as exact bf16 pairs (`first` the lower byte's, each byte's low
// nibble in the low half). The three magnitude bits index byte tables of the
// eight bf16 values (prmt takes a 3-bit index per result byte). The signs
// come from prmt's sign mode (selector bit 3: the chosen byte's bit 7 in all
// eight bits): an odd nibble's sign is bit 7 of its byte of `word`, an even
// one's of `word << 4`; masked to 0x80, they join the high bytes. Per byte
// pair that is a prmt and a lop3 (and a shift per word) where moving the
// signs with multiplies took six instructions (the same bits: checked for
// every 16-bit input against the old code and the e2m1 values).
__device__ __forceinline__ void e2m1x4_to_bf16x2x2(unsigned word, int half, unsigned& first, unsigned& second) {
  // bf16 of 0, 0.5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40, low bytes 00 00 80 C0 00 40 80 C0.
  // prmt reads the low 16 bits of its selector: one mask serves both halves.
  const unsigned magnitudes = (word & 0x77777777u) >> (16 * half);
  const unsigned low = byte_permute(0xC0800000u, 0xC0804000u, magnitudes);
  // Result byte i (nibble 4 half + i) replicates bit 7 of byte 2 half + i / 2 of word << 4 (i even) or word (odd).
  const unsigned signs = byte_permute(word << 4, word, half == 0 ? 0xD9C8u : 0xFBEAu);
  const unsigned high = byte_permute(0x3F3F3F00u, 0x40404040u, magnitudes) | (signs & 0x80808080u);
  first = byte_permute(low, high, 0x5140u);
  second = byte_permute(low, high, 0x7362u);
}

// A group's scale as a bf16 pair for mul_bf16x2: NVFP4's e4m3fn scale (exact
// in bf16: 4 significant bits, 2^-9 .. 448; NaN stays NaN), MXFP4's UE8M0
// 2^(byte - 127) (0x00: the bf16 subnormal 2^-127; 0xFF: NaN).
template <MixedScale kScale>
__device__ __forceinline__ unsigned group_scale_bf16x2(unsigned byte) {
  if constexpr (kScale == MixedScale::nvfp4) {
    float value, unused;
    decode_fp8x2<Fp8Format::e4m3fn>(static_cast<unsigned short>(byte), value, unused);
    return cvt_rn_bf16x2_f32(value, value);
  } else {
    const unsigned bits = byte == 0xFFu ? 0x7FC0u : byte == 0u ? 0x0040u : byte << 7;
    return bits | bits << 16;
  }
}

// NVFP4's scales of two consecutive groups (bytes 0 and 1 of `bytes`) as
// group_scale_bf16x2's pairs, both decoded by one cvt.
__device__ __forceinline__ void nvfp4_group_scales_bf16x2(unsigned bytes, unsigned& first, unsigned& second) {
  float low, high;
  decode_fp8x2<Fp8Format::e4m3fn>(static_cast<unsigned short>(bytes), low, high);
  first = cvt_rn_bf16x2_f32(low, low);
  second = cvt_rn_bf16x2_f32(high, high);
}

// ------------------------------------------------------------ FP4 lookup tables

// A 32-bit shared-memory load.
__device__ __forceinline__ unsigned load_shared_u32(unsigned address) {
  unsigned v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(address));
  return v;
}

// Byte j of `word` alone (the other three bytes 0): one prmt, j may vary by lane.
__device__ __forceinline__ unsigned byte_alone(unsigned word, unsigned j) { return byte_permute(word, 0u, j | 0x4440u); }

// A block's FP4 conversion tables in shared memory, filled once by every
// thread before the pipeline starts (fill), read by the converting threads:
// - pairs: e2m1x4_to_bf16x2x2's exact bf16 pair of every byte of two codes,
//   byte b's copy for lane l at 256 b + 4 l (32 copies in the first half of
//   each 256-byte row), so a warp's 32 lookups fall on 32 distinct banks
//   whatever bytes they look up, and one prmt builds a lookup's offset from
//   the code byte and 4 l (ptxas folds the table's base into the load);
// - scales: group_scale_bf16x2 of every scale byte (a warp looks up at most
//   8 rows' bytes: few conflicts).
// Why: a pair took ~9 ALU-pipe instructions (prmt tables, signs, interleave),
// which bounded the W4A16 register kernel at decode (the ALU pipe busy, DRAM
// not); a lookup is a prmt and a load. (Rows of 128 bytes, half the table,
// need a multiply-add per lookup: slower at decode. docs/decisions/0012.)
struct Fp4Tables {
  static constexpr int kPairBytes = 256 * 256, kScaleBytes = 256 * 4, kBytes = kPairBytes + kScaleBytes;
  unsigned pair_base = 0;    // the pairs
  unsigned lane_offset = 0;  // 4 lane: this lane's copy in a row
  unsigned scale_base = 0;   // the scales

  template <MixedScale kScale>
  static __device__ void fill(unsigned char* table, int thread, int threads) {
    fill_pairs(table, thread, threads);
    auto* words = reinterpret_cast<unsigned*>(table);
    for (int i = thread; i < 256; i += threads) words[kPairBytes / 4 + i] = group_scale_bf16x2<kScale>(i);
  }
  // The pairs alone (the first kPairBytes), for a kernel that converts its scales in registers.
  static __device__ void fill_pairs(unsigned char* table, int thread, int threads) {
    auto* words = reinterpret_cast<unsigned*>(table);
    for (int i = thread; i < 256 * 32; i += threads) {  // byte i / 32's copy for lane i % 32 (the rows' first halves)
      unsigned pair, unused;
      e2m1x4_to_bf16x2x2(static_cast<unsigned>(i) / 32, 0, pair, unused);
      words[i / 32 * 64 + i % 32] = pair;
    }
  }

  Fp4Tables() = default;
  __device__ explicit Fp4Tables(const unsigned char* table) {
    pair_base = static_cast<unsigned>(__cvta_generic_to_shared(table));
    lane_offset = 4 * (threadIdx.x % 32);
    scale_base = pair_base + kPairBytes;
  }
  // The bf16 pair of byte j of `word` (the offset: 4 lane as its first byte, the code byte as its second).
  __device__ unsigned pair(unsigned word, unsigned j) const {
    return load_shared_u32(pair_base + byte_permute(word, lane_offset, 0x5504u | j << 4));
  }
  // The bf16 pair of a scale byte, alone in its word (byte_alone's).
  __device__ unsigned scale(unsigned byte) const { return load_shared_u32(multiply_add(byte, 4u, scale_base)); }

 private:
  // An integer multiply-add, which the FMA pipe runs (a shift and add would take the ALU pipe).
  static __device__ __forceinline__ unsigned multiply_add(unsigned a, unsigned b, unsigned c) {
    unsigned out;
    asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(c));
    return out;
  }
};

// The multiplier of an expert's whole product: NVFP4's global (DIVIDE: the
// fp32 reciprocal of the stored one), 1 for the other weights. Every kernel
// multiplies the fp32 accumulator by it after the k-loop, before the
// epilogue's activation, row scale and rounding: the tensor cores see
// e2m1 x e4m3 scale, exact in bf16, so the products carry no rounding of the
// global (dequant + bf16 rounds each weight x global to bf16 instead).
template <class Cfg>
__device__ __forceinline__ float expert_multiplier(const float* globals, int expert) {
  if constexpr (Cfg::kScale == MixedScale::nvfp4) {
    const float global = globals[expert];
    return Cfg::kDivide ? __frcp_rn(global) : global;
  } else {
    return 1.0f;
  }
}

// acc x s (nothing for s known to be 1 at compile time: the multiply by 1.0f folds).
template <int kRegs>
__device__ __forceinline__ void scale_accumulators(float (&acc)[kRegs], float s) {
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc[i] *= s;
}

}  // namespace kjit
