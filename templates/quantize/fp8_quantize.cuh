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
#include "../common/fp8_group_quantize.cuh"
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

  unsigned int words[Cfg::kColumns / 2];
#pragma unroll
  for (int i = 0; i < Cfg::kColumns / 2; ++i) words[i] = reinterpret_cast<const unsigned int*>(x.b)[i];
  const unsigned int magnitude = group_magnitude_bits<Cfg::kThreadsPerGroup>(words);
  if (!active) return;

  uint4 codes;  // 16 codes, the first in the lowest byte
  float scale;
  if (empty_row) {
    scale = 0.0f;
    codes = make_uint4(0u, 0u, 0u, 0u);
  } else {
    codes = quantize_group16<Cfg::kUe8m0>(words, magnitude, scale);
  }
  *reinterpret_cast<uint4*>(p.out + row * Cfg::kK + column) = codes;
  if (member == 0) p.scales[row * Cfg::kGroups + group] = scale;
}

}  // namespace kjit
