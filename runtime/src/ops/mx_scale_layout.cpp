// The MX scale-layout op (linear <-> swizzled 128x4).
#include "kjit/internal/ops/mx_scale_layout.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "launch.hpp"

namespace kjit::ops {
namespace {

using codegen::MxScaleLayout;

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

Expected<MxScaleLayout> layout(kjit_scale_layout l, const char* field) {
  if (l == KJIT_SCALE_LAYOUT_LINEAR) return MxScaleLayout::linear;
  if (l == KJIT_SCALE_LAYOUT_SWIZZLED_128X4) return MxScaleLayout::swizzled_128x4;
  return invalid(fmt::format("{} must be KJIT_SCALE_LAYOUT_LINEAR or KJIT_SCALE_LAYOUT_SWIZZLED_128X4 (got {})", field,
                             static_cast<int>(l)));
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

bool overlap(const void* a, uint64_t a_bytes, const void* b, uint64_t b_bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

uint64_t swizzled_scale_bytes_bound(int64_t total_rows, int64_t scale_cols, int64_t experts) {
  if (total_rows < 0 || scale_cols < 0 || experts < 0) return 0;
  // Each expert that holds rows pads them up to 128: at most 127 padding rows each.
  const auto holding = static_cast<uint64_t>(std::min(experts, total_rows));
  const uint64_t padded_rows = (static_cast<uint64_t>(total_rows) + 127u * holding) / 128u * 128u;
  return padded_rows * static_cast<uint64_t>(round_up(scale_cols, 4));
}

Expected<MxScaleLayoutPlan> plan_mx_scale_layout_shapes(const kjit_scale_layout_desc& d) {
  if (d.struct_size < sizeof(kjit_scale_layout_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_scale_layout_desc_init first",
                               d.struct_size, sizeof(kjit_scale_layout_desc)));
  codegen::MxScaleLayoutSpec spec;
  spec.from = KJIT_TRY(layout(d.from, "from"));
  spec.to = KJIT_TRY(layout(d.to, "to"));
  if (spec.from == spec.to) return invalid("from and to are the same layout: there is nothing to convert");
  spec.scale_cols = d.scale_cols;
  // The convention says whether rows come from offsets (prepare has no pointers to look at).
  switch (d.offsets_convention) {
    case KJIT_OFFSETS_UNSET: break;
    case KJIT_OFFSETS_CUMULATIVE_END:
      spec.with_offsets = true;
      spec.offsets = codegen::OffsetsConvention::cumulative_end;
      break;
    case KJIT_OFFSETS_WITH_LEADING_ZERO:
      spec.with_offsets = true;
      spec.offsets = codegen::OffsetsConvention::with_leading_zero;
      break;
    default:
      return invalid(fmt::format("offsets_convention must be KJIT_OFFSETS_CUMULATIVE_END or "
                                 "KJIT_OFFSETS_WITH_LEADING_ZERO with offsets, UNSET without (got {})",
                                 static_cast<int>(d.offsets_convention)));
  }
  if (d.experts < 1) return invalid(fmt::format("experts must be >= 1, got {}", d.experts));
  if (spec.with_offsets && d.experts > codegen::kScaleLayoutMaxOffsetExperts)
    return invalid(fmt::format("experts must be at most {} with offsets, got {}",
                               codegen::kScaleLayoutMaxOffsetExperts, d.experts));
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (spec.with_offsets && d.rows > std::numeric_limits<int32_t>::max())
    return invalid(fmt::format("rows {} do not fit the int32 offsets", d.rows));
  if (d.scale_cols < 1 || d.scale_cols > codegen::kMaxDimension)
    return invalid(fmt::format("scale_cols must be 1 to {} (K / block), got {}", codegen::kMaxDimension,
                               d.scale_cols));
  KJIT_TRY(codegen::validate(codegen::KernelSpec{spec}));

  // Sizes of both sides; with offsets the swizzled one is the worst case.
  const int64_t linear_rows = spec.with_offsets ? d.rows : d.experts * d.rows;
  const uint64_t linear_bytes = static_cast<uint64_t>(linear_rows) * static_cast<uint64_t>(d.scale_cols);
  const uint64_t swizzled_bytes =
      spec.with_offsets ? swizzled_scale_bytes_bound(d.rows, d.scale_cols, d.experts)
                        : static_cast<uint64_t>(d.experts * round_up(d.rows, 128) * round_up(d.scale_cols, 4));
  MxScaleLayoutPlan plan;
  plan.empty = !spec.with_offsets && d.rows == 0;
  plan.spec = spec;
  plan.linear_bytes = linear_bytes;
  plan.swizzled_bytes = swizzled_bytes;
  auto& p = plan.params;
  p.experts = d.experts;
  p.rows = d.rows;
  p.swizzled_words = static_cast<long long>(swizzled_bytes / 4);
  p.pad = d.pad;
  plan.geometry = codegen::mx_scale_layout_geometry(p.swizzled_words);
  return plan;
}

Expected<MxScaleLayoutPlan> bind_mx_scale_layout(const kjit_scale_layout_desc& d, MxScaleLayoutPlan plan) {
  const auto& spec = plan.spec;
  if (spec.with_offsets && d.offsets == nullptr)
    return invalid("offsets_convention is set but 'offsets' is NULL (leave the convention UNSET for uniform rows)");
  if (d.offsets != nullptr && !spec.with_offsets)
    return invalid("offsets are given without offsets_convention: KJIT_OFFSETS_CUMULATIVE_END (E entries, no "
                   "leading 0) or KJIT_OFFSETS_WITH_LEADING_ZERO (E + 1 entries); there is no default");
  const bool to_swizzled = spec.to == MxScaleLayout::swizzled_128x4;
  const uint64_t need = to_swizzled ? plan.swizzled_bytes : plan.linear_bytes;
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.in, "in"}, {d.out, "out"}}));
    if (d.out_bytes < need)
      return invalid(fmt::format("out_bytes {} is too small: the {} scales can need {} bytes{}", d.out_bytes,
                                 to_swizzled ? "swizzled" : "linear", need,
                                 spec.with_offsets && to_swizzled ? " (kjit_swizzled_scale_bytes)" : ""));
    const void* swizzled_side = to_swizzled ? static_cast<const void*>(d.out) : static_cast<const void*>(d.in);
    if (reinterpret_cast<uintptr_t>(swizzled_side) % 4 != 0)
      return invalid(fmt::format("'{}' (the swizzled side) must be 4-byte aligned: it is read and written in words",
                                 to_swizzled ? "out" : "in"));
    if (spec.with_offsets && reinterpret_cast<uintptr_t>(d.offsets) % alignof(int32_t) != 0)
      return invalid("'offsets' is not 4-byte aligned");
    // The input's size is known except for a swizzled input with offsets (the host knows only its bound, which
    // may pass the caller's allocation): then only the same start is caught.
    const uint64_t in_bytes = to_swizzled ? plan.linear_bytes : spec.with_offsets ? 1 : plan.swizzled_bytes;
    if (overlap(d.in, in_bytes, d.out, d.out_bytes))
      return invalid("'in' and 'out' overlap: the conversion cannot run in place");
  }
  auto& p = plan.params;
  p.in = d.in;
  p.out = d.out;
  p.offsets = d.offsets;
  return plan;
}

Expected<MxScaleLayoutPlan> plan_mx_scale_layout(const kjit_scale_layout_desc& d) {
  return bind_mx_scale_layout(d, KJIT_TRY(plan_mx_scale_layout_shapes(d)));
}

Expected<void> convert_scale_layout(Runtime& runtime, const kjit_scale_layout_desc& desc, CUstream stream) {
  auto plan = KJIT_TRY(plan_mx_scale_layout(desc));
  if (plan.empty) return {};
  auto& p = plan.params;
  return launch_on_owning_device(runtime, plan.spec, {{p.in, "in"}, {p.out, "out"}, {p.offsets, "offsets"}},
                                 p.device_error, plan.geometry, &p, stream);
}

Expected<void> prepare_convert_scale_layout(Runtime& runtime, const kjit_scale_layout_desc& desc, int ordinal) {
  // Its kernel does not depend on the pointers (words: the swizzled side must be 4-byte aligned).
  const auto plan = KJIT_TRY(plan_mx_scale_layout_shapes(desc));
  return prepare_on_device(runtime, plan.spec, ordinal);
}

}  // namespace kjit::ops
