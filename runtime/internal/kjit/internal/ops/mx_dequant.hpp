// The MX dequant op (NVFP4, MXFP4, MXFP8): argument checks (one checker for
// the C ABI, the C++ API and Python), the spec and parameter block they
// produce, and the launch.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "mx_dequant_params.h"

namespace kjit::ops {

struct MxDequantPlan {
  codegen::MxDequantSpec spec;
  kjit_mx_dequant_params params{};
  codegen::LaunchGeometry geometry;
  bool empty = false;  // nothing to do (no rows, or no ids)
};

// Checks everything that can be checked without the driver: format, dtypes,
// layout, convention, K, strides, the global scales, pointer presence and
// alignment. With `for_prepare`, pointers are not required and are assumed
// aligned.
Expected<MxDequantPlan> plan_mx_dequant(const kjit_mx_dequant_desc& desc, bool for_prepare);

// Launches the plan on the device owning its pointers (never compiling while
// `stream` captures).
Expected<void> launch_mx_dequant(Runtime& runtime, MxDequantPlan& plan, CUstream stream);

// plan_mx_dequant + launch_mx_dequant.
Expected<void> dequant_mx(Runtime& runtime, const kjit_mx_dequant_desc& desc, CUstream stream);

// Compiles (or finds) and loads the kernel `desc` needs on `device`.
Expected<void> prepare_dequant_mx(Runtime& runtime, const kjit_mx_dequant_desc& desc, int device);

}  // namespace kjit::ops
