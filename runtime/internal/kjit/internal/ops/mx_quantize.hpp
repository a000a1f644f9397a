// The MX quantize op: argument checks (one checker for the C ABI, the C++ API
// and Python), the spec and parameter block they produce, and the launches.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "mx_quantize_params.h"

namespace kjit::ops {

struct MxQuantizePlan {
  codegen::MxQuantizeSpec spec;
  kjit_mx_quantize_params params{};
  bool empty = false;  // no rows: nothing to launch
};

// Checks everything that does not depend on pointers: format, element,
// layout, global-scale mode and convention, sizes, stride. The params hold no
// pointers.
Expected<MxQuantizePlan> plan_mx_quantize_shapes(const kjit_mx_quantize_desc& desc);

// Checks the pointers (presence, alignment) and puts them in the params.
Expected<MxQuantizePlan> bind_mx_quantize(const kjit_mx_quantize_desc& desc, MxQuantizePlan plan);

// plan_mx_quantize_shapes + bind_mx_quantize: the plan of a launch.
Expected<MxQuantizePlan> plan_mx_quantize(const kjit_mx_quantize_desc& desc);

// plan_mx_quantize, then the launches on the device owning the pointers (with
// a computed global scale: a memset of global_scales, amax, finalize, quantize;
// all in `stream`, so a prepared call can be captured).
Expected<void> mx_quantize(Runtime& runtime, const kjit_mx_quantize_desc& desc, CUstream stream);
Expected<void> prepare_mx_quantize(Runtime& runtime, const kjit_mx_quantize_desc& desc, int device);

}  // namespace kjit::ops
