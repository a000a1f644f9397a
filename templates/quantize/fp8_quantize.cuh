// fp8 activation quantizer: bf16 rows -> e4m3fn codes and one fp32 scale per
// row per 128 columns (the arithmetic is stated in kjit.h, kjit_fp8_quantize_desc,
// and mirrored by runtime/include/kjit/reference/fp8_quantize.hpp).
//
// Eight threads own one 128-column group: each loads 16 columns (two 16-byte
// loads), the group's amax is a max over the bf16 magnitudes' bits (monotonic
// for non-negative values; inf and NaN compare above every finite value, so a
// non-finite group is one comparison) reduced with three shuffles, and each
// thread stores its 16 codes with one 16-byte store. Indices are 64-bit.
// With gather, output row r reads input row sorted_to_flat[r] / top_k; a
// negative entry (past the routed rows) gives zero codes and scale 0.
#pragma once

#include "../abi/device_errors.h"
#include "../abi/fp8_quantize_params.h"
#include "../common/fp8_convert.cuh"
#include "../common/vector_io.cuh"

namespace kjit {

template <long long kK_, int kGroup_, bool kUe8m0_, bool kGather_, int kThreads_>
struct QuantizeConfig {
  static constexpr long long kK = kK_;
  static constexpr int kGroup = kGroup_;
  static constexpr long long kGroups = kK / kGroup;
  static constexpr bool kUe8m0 = kUe8m0_;
  static constexpr bool kGather = kGather_;
  static constexpr int kThreads = kThreads_;
  static constexpr int kThreadsPerGroup = 8;
  static constexpr int kColumns = kGroup / kThreadsPerGroup;  // per thread: 32 bytes in, 16 out
  static_assert(kGroup == 128 && kK % kGroup == 0 && kColumns == 16,
                "codegen admits K a multiple of 128, groups of 128");
  static_assert(kThreads % 32 == 0, "whole warps: the amax shuffle takes every lane");
};

// amax / 448 in fp32 (IEEE division), or that rounded up to a power of two.
template <bool kUe8m0>
__device__ __forceinline__ float quantize_scale(float amax) {
  const float scale = __fdiv_rn(fmaxf(amax, 1e-10f), 448.0f);
  if constexpr (!kUe8m0) {
    return scale;
  } else {
    const unsigned int bits = __float_as_uint(scale);
    return __uint_as_float((bits & 0x007fffffu) ? (bits & 0x7f800000u) + 0x00800000u : bits);
  }
}

template <class Cfg>
__device__ __forceinline__ void fp8_quantize(const kjit_fp8_quantize_params& p) {
  const long long team = (static_cast<long long>(blockIdx.x) * Cfg::kThreads + threadIdx.x) / Cfg::kThreadsPerGroup;
  const int member = threadIdx.x % Cfg::kThreadsPerGroup;
  const bool active = team < p.rows * Cfg::kGroups;
  const long long row = team / Cfg::kGroups;
  const long long group = team % Cfg::kGroups;

  long long source = row;
  bool empty_row = false;
  if (Cfg::kGather && active) {
    const int flat = p.sorted_to_flat[row];
    if (flat < 0) {
      empty_row = true;
    } else if (flat >= p.entries) {
      empty_row = true;
      const bool reporter = group == 0 && member == 0;  // one report per row
      if (reporter && atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_QUANTIZE_INDEX_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned>(flat);
    } else {
      source = flat / p.top_k;
    }
  }

  Bytes<2 * Cfg::kColumns> x{};
  const long long column = group * Cfg::kGroup + member * Cfg::kColumns;
  if (active && !empty_row)
    load_bytes(x, static_cast<const unsigned char*>(p.in) + 2 * (source * p.in_row_stride + column));
  const unsigned int* words = reinterpret_cast<const unsigned int*>(x.b);

  unsigned int magnitude = 0;  // two bf16 magnitudes per word, compared as unsigned halves
#pragma unroll
  for (int i = 0; i < Cfg::kColumns / 2; ++i) magnitude = __vmaxu2(magnitude, words[i] & 0x7fff7fffu);
  magnitude = max(magnitude & 0xffffu, magnitude >> 16);
#pragma unroll
  for (int offset = Cfg::kThreadsPerGroup / 2; offset > 0; offset /= 2)
    magnitude = max(magnitude, __shfl_xor_sync(0xffffffffu, magnitude, offset));
  if (!active) return;

  uint4 codes;  // 16 codes, the first in the lowest byte
  float scale;
  if (empty_row) {
    scale = 0.0f;
    codes = make_uint4(0u, 0u, 0u, 0u);
  } else if (magnitude >= 0x7f80u) {  // inf or NaN in the group
    scale = __uint_as_float(0x7fc00000u);
    codes = make_uint4(0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu);
  } else {
    scale = quantize_scale<Cfg::kUe8m0>(__uint_as_float(magnitude << 16));
    // x / scale, one IEEE division; a UE8M0 scale is a power of two in
    // [2^-42, 2^120], whose reciprocal is exact, and x * (1 / scale) rounds the
    // same real number as x / scale: the same bits, without the divisions.
    const float inverse = __frcp_rn(scale);
    auto scaled = [&](float value) { return Cfg::kUe8m0 ? __fmul_rn(value, inverse) : __fdiv_rn(value, scale); };
    unsigned int packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned int low = words[2 * i], high = words[2 * i + 1];
      packed[i] = cvt_rn_satfinite_e4m3x2_f32(scaled(__uint_as_float(low << 16)),
                                              scaled(__uint_as_float(low & 0xffff0000u))) |
                  static_cast<unsigned int>(cvt_rn_satfinite_e4m3x2_f32(scaled(__uint_as_float(high << 16)),
                                                                        scaled(__uint_as_float(high & 0xffff0000u))))
                      << 16;
    }
    codes = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  *reinterpret_cast<uint4*>(p.out + row * Cfg::kK + column) = codes;
  if (member == 0) p.scales[row * Cfg::kGroups + group] = scale;
}

}  // namespace kjit
