// The fp8 dequant op: argument checks (one checker for the C ABI, the C++ API
// and Python), the spec and parameter block they produce, and the launch.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/kjit.h"
#include "dequant_params.h"
#include "kjit/internal/runtime.hpp"

namespace kjit::ops {

struct DequantPlan {
  codegen::DequantSpec spec;
  kjit_dequant_params params{};
  codegen::LaunchGeometry geometry;
  bool empty = false;  // nothing to do (no rows, or no ids)
};

// Checks everything that can be checked without the driver: dtypes, sizes,
// strides, scale layout and shape, convention, pointer presence and alignment.
// With `for_prepare`, pointers are not required and are assumed aligned.
Expected<DequantPlan> plan_dequant(const kjit_dequant_desc& desc, bool for_prepare);

// Resolves the device owning the plan's pointers, checks the stream, loads
// the plan's kernel (never compiling while `stream` captures) and launches.
Expected<void> launch_dequant(Runtime& runtime, DequantPlan& plan, CUstream stream);

// plan_dequant + launch_dequant.
Expected<void> dequant_fp8(Runtime& runtime, const kjit_dequant_desc& desc, CUstream stream);

// Compiles (or finds) and loads the kernel `desc` needs on `device`.
Expected<void> prepare_dequant_fp8(Runtime& runtime, const kjit_dequant_desc& desc, int device);

}  // namespace kjit::ops
