// CPU reference of the MoE routing helpers, written from the C ABI's contract
// (kjit.h: kjit_moe_routing_desc, kjit_moe_combine_desc), independent of the
// kernels: routing as a plain serial counting sort, combine as a serial fp32
// loop over j. The GPU tests and jitctl selftest both check against it, so
// they check the same contract.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"

namespace kjit::reference {

// What kjit_moe_routing writes, as host arrays of the sizes the ABI gives.
struct MoeRouting {
  std::vector<int32_t> counts;          // [experts_local]
  std::vector<int32_t> offsets;         // [experts_local] ends, or [experts_local + 1] with a leading 0
  std::vector<int32_t> sorted_to_flat;  // [tokens * top_k]: flat index of each sorted row, -1 past the routed rows
  std::vector<int32_t> flat_to_sorted;  // [tokens * top_k]: sorted row of each flat index, -1 for other ranks
};

// `ids` are the flat top-k global ids [tokens * top_k]; all must lie in
// [0, experts_total), since a launch with a bad one writes nothing (there is
// no result to compare). Visiting the flat indices in order and giving each
// the next free row of its expert is what makes the order within an expert
// the order of the flat index, as the ABI promises.
inline MoeRouting moe_routing(const std::vector<int32_t>& ids, int64_t expert_base, int64_t experts_local,
                              kjit_expert_offsets convention) {
  // The local expert of a global id, or -1 when another rank owns it.
  const auto local_expert = [&](int32_t id) -> int64_t {
    const int64_t e = int64_t{id} - expert_base;
    return e >= 0 && e < experts_local ? e : -1;
  };
  MoeRouting r;
  r.counts.assign(static_cast<size_t>(experts_local), 0);
  for (int32_t id : ids)
    if (const int64_t e = local_expert(id); e >= 0) ++r.counts[static_cast<size_t>(e)];
  // next[e]: the first row of expert e (the rows of the experts before it),
  // then its next free row as rows are placed.
  std::vector<int32_t> next(static_cast<size_t>(experts_local), 0);
  for (size_t e = 1; e < next.size(); ++e) next[e] = next[e - 1] + r.counts[e - 1];
  if (convention == KJIT_OFFSETS_WITH_LEADING_ZERO) r.offsets.push_back(0);
  for (size_t e = 0; e < next.size(); ++e) r.offsets.push_back(next[e] + r.counts[e]);
  r.sorted_to_flat.assign(ids.size(), -1);
  r.flat_to_sorted.assign(ids.size(), -1);
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t e = local_expert(ids[i]);
    if (e < 0) continue;
    const int32_t row = next[static_cast<size_t>(e)]++;
    r.sorted_to_flat[static_cast<size_t>(row)] = static_cast<int32_t>(i);
    r.flat_to_sorted[i] = row;
  }
  return r;
}

// The value kjit_moe_combine writes at out[t, h], as a float (for a bf16
// output, already rounded to bf16). `expert_out` holds bf16 bits [rows, hidden],
// `weights` and `flat_to_sorted` [tokens * top_k]. The sum runs in fp32 in
// order of j, each step one fused multiply-add, and is rounded once to the
// output type at the end, never per step. A token with no row on this rank
// sums to +0.
inline float moe_combine_value(const std::vector<uint16_t>& expert_out, const std::vector<float>& weights,
                               const std::vector<int32_t>& flat_to_sorted, int64_t top_k, int64_t hidden, int64_t t,
                               int64_t h, kjit_dtype out_dtype) {
  float sum = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    const int32_t row = flat_to_sorted[static_cast<size_t>(t * top_k + j)];
    if (row < 0) continue;  // another rank's row: not an index
    sum = std::fma(weights[static_cast<size_t>(t * top_k + j)],
                   bf16_to_float(expert_out[static_cast<size_t>(row * hidden + h)]), sum);
  }
  return out_dtype == KJIT_DTYPE_BF16 ? bf16_to_float(bf16_bits_rne(sum)) : sum;
}

// The weights' gradient kjit_moe_combine writes at out[t, j] (kjit.h: grad given): the dot product of
// grad[t] and expert_out[row(t, j)] (bf16 bits, [tokens, hidden] and [rows, hidden]) in kjit.h's order, 32
// lanes' fma partial sums over interleaved 8-column chunks, then the xor butterfly's adds as lane 0 sees them.
// Bit for bit the kernel's; +0 for a pair of another rank.
inline float moe_combine_weight_gradient(const std::vector<uint16_t>& expert_out, const std::vector<uint16_t>& grad,
                                         const std::vector<int32_t>& flat_to_sorted, int64_t top_k, int64_t hidden,
                                         int64_t t, int64_t j) {
  const int32_t row = flat_to_sorted[static_cast<size_t>(t * top_k + j)];
  float lanes[32] = {};
  if (row >= 0)
    for (int l = 0; l < 32; ++l)
      for (int64_t c = l; c < hidden / 8; c += 32)
        for (int64_t h = 8 * c; h < 8 * c + 8; ++h)
          lanes[l] = std::fma(bf16_to_float(grad[static_cast<size_t>(t * hidden + h)]),
                              bf16_to_float(expert_out[static_cast<size_t>(row * hidden + h)]), lanes[l]);
  for (int d = 16; d > 0; d /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ d];
    std::copy(next, next + 32, lanes);
  }
  return lanes[0];
}

// Whether a combine output element matches the reference value. Not bit for
// bit: the contract fixes the order of j and fp32 accumulation, not whether
// the device fuses each multiply and add as the reference does. NaN never
// matches.
inline bool combine_close(float got, float want) {
  return std::abs(got - want) <= 1e-5f * std::abs(want) + 1e-6f;
}

}  // namespace kjit::reference
