// The MX scale-layout op (linear <-> swizzled 128x4): argument checks, the
// spec and parameter block they produce, and the launch.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "mx_scale_layout_params.h"

namespace kjit::ops {

struct MxScaleLayoutPlan {
  // First: the fake driver of the unit tests copies a launch's parameters as
  // kjit_dequant_params, which is larger, and must not read past the plan.
  kjit_mx_scale_layout_params params{};
  codegen::MxScaleLayoutSpec spec;
  codegen::LaunchGeometry geometry;
  bool empty = false;  // uniform rows, none of them: nothing to launch
  uint64_t linear_bytes = 0, swizzled_bytes = 0;  // each side's size (swizzled with offsets: its bound)
};

// Checks everything that does not depend on pointers: layouts, sizes, the
// offsets' convention. The params hold no pointers.
Expected<MxScaleLayoutPlan> plan_mx_scale_layout_shapes(const kjit_scale_layout_desc& desc);

// Checks the pointers (offsets against their convention, presence, alignment,
// overlap) and out_bytes against what the output can need, and puts the
// pointers in the params.
Expected<MxScaleLayoutPlan> bind_mx_scale_layout(const kjit_scale_layout_desc& desc, MxScaleLayoutPlan plan);

// plan_mx_scale_layout_shapes + bind_mx_scale_layout: the plan of a launch.
Expected<MxScaleLayoutPlan> plan_mx_scale_layout(const kjit_scale_layout_desc& desc);

// plan_mx_scale_layout, then the launch on the device owning the pointers.
Expected<void> convert_scale_layout(Runtime& runtime, const kjit_scale_layout_desc& desc, CUstream stream);
Expected<void> prepare_convert_scale_layout(Runtime& runtime, const kjit_scale_layout_desc& desc, int device);

// kjit_swizzled_scale_bytes: the swizzled size a stack can need at most (0 for negative arguments).
uint64_t swizzled_scale_bytes_bound(int64_t total_rows, int64_t scale_cols, int64_t experts);

}  // namespace kjit::ops
