// The MoE activation between the two grouped GEMMs, in one pass: the gate_up
// GEMM's bf16 output h [rows, 2I] -> act(gate, up) [rows, I], rounded once to
// bf16, or (FP8 output) those bf16 values quantized exactly as kjit_fp8_quantize
// quantizes them (e4m3fn codes, one scale per row per 128 columns), so the
// fused pass writes the bits the unfused pair would. kjit.h states the
// arithmetic (kjit_moe_activation_desc); common/activation.cuh evaluates it.
//
// Each thread owns kColumns consecutive output columns of one row: 8 for bf16
// output (one 16-byte store), 16 for FP8 (8 threads per 128-column group, one
// 16-byte store of codes each, the group's amax over shuffles). Gate and up
// arrive in 16-byte loads, all issued before any math: "halves" reads gate at
// column c and up at I + c, "alternating" reads the interleaved pairs
// (gate 2c, up 2c + 1) in one contiguous run, "groups_of_8" the same run
// holding 8 gate then their 8 up. With valid_rows, rows at or past
// *valid_rows read nothing and are written as zeros (FP8: codes 0, scale 0).
// Indices are 64-bit.
//
// The gradient (kGradient): the same thread owns the same 8 columns of act,
// reads their gate and up as above and the incoming gradient's 8 (one 16-byte
// load), and writes the gradients of gate and up, bf16, where h holds them in
// the contiguous [rows, 2I] out: two 16-byte stores (halves) or one 32-byte
// run of pairs (alternating).
#pragma once

#include "../abi/moe_activation_params.h"
#include "../common/activation.cuh"
#include "../common/fp8_group_quantize.cuh"
#include "../common/vector_io.cuh"

namespace kjit {

enum class GateUpLayout { halves, alternating, groups_of_8 };

template <long long kI_, GateUpLayout kLayout_, Activation kActivation_, bool kFp8Out_, bool kUe8m0_, int kThreads_,
          bool kGradient_ = false>
struct MoeActivationConfig {
  static constexpr long long kI = kI_;
  static constexpr GateUpLayout kLayout = kLayout_;
  static constexpr Activation kActivation = kActivation_;
  static constexpr bool kFp8Out = kFp8Out_;
  static constexpr bool kUe8m0 = kUe8m0_;
  static constexpr int kThreads = kThreads_;
  static constexpr bool kGradient = kGradient_;
  static_assert(!kGradient || !kFp8Out, "the gradient is bf16");
  static constexpr int kColumns = kFp8Out ? 16 : 8;          // outputs (of act) per thread
  static constexpr int kTeam = kFp8Out ? 128 / kColumns : 1;  // threads per scale group
  static constexpr long long kChunks = kI / kColumns;         // threads per row
  static_assert(kI % (kFp8Out ? 128 : 8) == 0, "codegen admits I a multiple of 8 (bf16) or 128 (FP8)");
  static_assert(kThreads % 32 == 0, "whole warps: the amax shuffle takes every lane");
};

// Gate and up (bf16 bits) of the thread's output column e from its loads:
// halves' two runs, or the one contiguous run of alternating pairs or of
// groups of 8 (8 gate, then their 8 up).
template <class Cfg, int kHalfBytes, int kRunBytes>
__device__ __forceinline__ void gate_up_bits(const Bytes<kHalfBytes>& gate, const Bytes<kHalfBytes>& up,
                                             const Bytes<kRunBytes>& run, int e, unsigned int& gate_bits,
                                             unsigned int& up_bits) {
  if constexpr (Cfg::kLayout == GateUpLayout::halves) {
    gate_bits = reinterpret_cast<const unsigned short*>(gate.b)[e];
    up_bits = reinterpret_cast<const unsigned short*>(up.b)[e];
  } else if constexpr (Cfg::kLayout == GateUpLayout::alternating) {
    const unsigned int both = reinterpret_cast<const unsigned int*>(run.b)[e];
    gate_bits = both & 0xffffu;
    up_bits = both >> 16;
  } else {
    gate_bits = reinterpret_cast<const unsigned short*>(run.b)[16 * (e / 8) + e % 8];
    up_bits = reinterpret_cast<const unsigned short*>(run.b)[16 * (e / 8) + 8 + e % 8];
  }
}

// A row's gate and up (the row at `in_row`) for kColumns outputs from `column` on, as the layout stores them:
// two runs of bf16 (halves), or one run of their pairs (alternating, groups of 8).
template <class Cfg, int kColumns>
__device__ __forceinline__ void load_gate_up(const unsigned char* in_row, long long column, Bytes<2 * kColumns>& gate,
                                             Bytes<2 * kColumns>& up, Bytes<4 * kColumns>& pairs) {
  if constexpr (Cfg::kLayout == GateUpLayout::halves) {
    load_bytes(gate, in_row + 2 * column);
    load_bytes(up, in_row + 2 * (Cfg::kI + column));
  } else {
    load_bytes(pairs, in_row + 4 * column);
  }
}

// The gradient of h from the activation's (Cfg::kGradient).
template <class Cfg>
__device__ __forceinline__ void moe_activation_gradient(const kjit_moe_activation_params& p) {
  const long long chunk = static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  const long long row = chunk / Cfg::kChunks;
  const long long column = chunk % Cfg::kChunks * 8;
  const bool active = row < p.rows;
  const bool live = active && (p.valid_rows == nullptr || row < static_cast<long long>(__ldg(p.valid_rows)));

  Bytes<16> gate_bytes{}, up_bytes{}, grad_bytes{};
  Bytes<32> pair_bytes{};
  const unsigned char* in_row = static_cast<const unsigned char*>(p.in) + 2 * row * p.in_row_stride;
  if (live) {
    load_gate_up<Cfg, 8>(in_row, column, gate_bytes, up_bytes, pair_bytes);
    load_bytes(grad_bytes, static_cast<const unsigned char*>(p.grad) + 2 * (row * Cfg::kI + column));
  }

  unsigned short d_gate[8] = {}, d_up[8] = {};  // bf16 bits; zeros past valid_rows
  if (live) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      unsigned int gate_bits, up_bits;
      gate_up_bits<Cfg>(gate_bytes, up_bytes, pair_bytes, e, gate_bits, up_bits);
      const unsigned int d_bits = reinterpret_cast<const unsigned short*>(grad_bytes.b)[e];
      float dg, du;
      activate_gradient<Cfg::kActivation>(__uint_as_float(gate_bits << 16), __uint_as_float(up_bits << 16),
                                          __uint_as_float(d_bits << 16), p.alpha, p.limit, dg, du);
      const unsigned int both = cvt_rn_bf16x2_f32(dg, du);
      d_gate[e] = static_cast<unsigned short>(both & 0xffffu);
      d_up[e] = static_cast<unsigned short>(both >> 16);
    }
  }
  if (!active) return;
  unsigned short* out_row = static_cast<unsigned short*>(p.out) + row * 2 * Cfg::kI;
  unsigned int words[8];
  if constexpr (Cfg::kLayout != GateUpLayout::alternating) {  // gate's 8, then up's 8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      words[i] = d_gate[2 * i] | static_cast<unsigned int>(d_gate[2 * i + 1]) << 16;
      words[4 + i] = d_up[2 * i] | static_cast<unsigned int>(d_up[2 * i + 1]) << 16;
    }
    const long long up_at = Cfg::kLayout == GateUpLayout::halves ? Cfg::kI + column : 2 * column + 8;
    *reinterpret_cast<uint4*>(out_row + (Cfg::kLayout == GateUpLayout::halves ? column : 2 * column)) =
        make_uint4(words[0], words[1], words[2], words[3]);
    *reinterpret_cast<uint4*>(out_row + up_at) = make_uint4(words[4], words[5], words[6], words[7]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) words[e] = d_gate[e] | static_cast<unsigned int>(d_up[e]) << 16;
    *reinterpret_cast<uint4*>(out_row + 2 * column) = make_uint4(words[0], words[1], words[2], words[3]);
    *reinterpret_cast<uint4*>(out_row + 2 * column + 8) = make_uint4(words[4], words[5], words[6], words[7]);
  }
}

template <class Cfg>
__device__ __forceinline__ void moe_activation_forward(const kjit_moe_activation_params& p) {
  constexpr int kWords = Cfg::kColumns / 2;  // output bf16 pairs per thread
  const long long chunk = static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x;
  const long long row = chunk / Cfg::kChunks;
  const long long column = chunk % Cfg::kChunks * Cfg::kColumns;
  const bool active = row < p.rows;
  const bool live = active && (p.valid_rows == nullptr || row < static_cast<long long>(__ldg(p.valid_rows)));

  // Gate and up as bf16 pairs, the first element in the low half of a word.
  Bytes<2 * Cfg::kColumns> gate_bytes{}, up_bytes{};
  Bytes<4 * Cfg::kColumns> pair_bytes{};
  const unsigned char* in_row = static_cast<const unsigned char*>(p.in) + 2 * row * p.in_row_stride;
  if (live) load_gate_up<Cfg, Cfg::kColumns>(in_row, column, gate_bytes, up_bytes, pair_bytes);

  unsigned int words[kWords] = {};  // the rounded activations, two per word; zeros past valid_rows
  if (live) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      float value[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int element = 2 * i + j;
        unsigned int gate_bits, up_bits;
        gate_up_bits<Cfg>(gate_bytes, up_bytes, pair_bytes, element, gate_bits, up_bits);
        value[j] = activate<Cfg::kActivation>(__uint_as_float(gate_bits << 16), __uint_as_float(up_bits << 16), p.alpha,
                                              p.limit);
      }
      words[i] = cvt_rn_bf16x2_f32(value[0], value[1]);
    }
  }

  const long long out_index = row * Cfg::kI + column;
  if constexpr (!Cfg::kFp8Out) {
    if (active) *reinterpret_cast<uint4*>(static_cast<unsigned short*>(p.out) + out_index) =
        make_uint4(words[0], words[1], words[2], words[3]);
  } else {
    // Every lane shuffles (the team's rows agree on `live`: a group lies in one row).
    const unsigned int magnitude = group_magnitude_bits<Cfg::kTeam>(words);
    if (!active) return;
    float scale = 0.0f;
    uint4 codes = make_uint4(0u, 0u, 0u, 0u);
    if (live) codes = quantize_group16<Cfg::kUe8m0>(words, magnitude, scale);
    *reinterpret_cast<uint4*>(static_cast<unsigned char*>(p.out) + out_index) = codes;
    if (threadIdx.x % Cfg::kTeam == 0) p.scales[out_index / 128] = scale;
  }
}

template <class Cfg>
__device__ __forceinline__ void moe_activation(const kjit_moe_activation_params& p) {
  if constexpr (Cfg::kGradient) moe_activation_gradient<Cfg>(p);
  else moe_activation_forward<Cfg>(p);
}

}  // namespace kjit
