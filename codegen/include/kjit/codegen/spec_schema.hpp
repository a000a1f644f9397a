// What each field of a family's JSON form may hold: derived, as the parser is,
// from the family's field table (Family<Spec>::fields, spec_fields.hpp), and
// manifests check every field of every entry against it before expanding
// list-valued fields, so a manifest learns of a new family or field from the
// family alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace kjit::codegen {

// The largest dimension (cols, N, K, hidden, a block side) any spec accepts.
// The largest in released models is about 1e5 (Llama-3.1-405B's intermediate
// 53248, Mixtral's gate_up N 28672), so 2^20 leaves a wide margin while the
// products kernels form (rows x cols, experts x N x K) stay far from 64-bit
// overflow; cols 2^62 and hidden 2^40 compiled before this bound.
inline constexpr int64_t kMaxDimension = int64_t{1} << 20;
// Experts one kernel may address (the largest MoE models have a few hundred).
inline constexpr int64_t kMaxExperts = 4096;

struct FieldRule {
  enum class Kind : uint8_t { text, integer, boolean, integers };
  std::string_view name;
  Kind kind;
  bool required = false;
  std::vector<std::string_view> values = {};  // text
  int64_t min = 0, max = 0;                   // integer, and each of integers
  std::string_view shape = {};                // integers, e.g. "[rows, cols]"
  size_t count = 0;                           // integers: a fixed-length list that is one value (a block, a tile)
};

}  // namespace kjit::codegen
