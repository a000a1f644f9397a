// The fp8 quantize op: argument checks (one checker for the C ABI, the C++ API
// and Python), the spec and parameter block they produce, and the launch.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "fp8_quantize_params.h"

namespace kjit::ops {

struct Fp8QuantizePlan {
  codegen::Fp8QuantizeSpec spec;
  kjit_fp8_quantize_params params{};
  codegen::LaunchGeometry geometry;
  bool empty = false;  // no rows: nothing to launch
};

// Checks everything that does not depend on pointers: dtypes, sizes, stride,
// the gather's arguments. The params hold no pointers.
Expected<Fp8QuantizePlan> plan_fp8_quantize_shapes(const kjit_fp8_quantize_desc& desc);

// Checks the pointers (presence, alignment) and puts them in the params.
Expected<Fp8QuantizePlan> bind_fp8_quantize(const kjit_fp8_quantize_desc& desc, Fp8QuantizePlan plan);

// plan_fp8_quantize_shapes + bind_fp8_quantize: the plan of a launch.
Expected<Fp8QuantizePlan> plan_fp8_quantize(const kjit_fp8_quantize_desc& desc);

// plan_fp8_quantize, then the launch on the device owning the pointers.
Expected<void> fp8_quantize(Runtime& runtime, const kjit_fp8_quantize_desc& desc, CUstream stream);
Expected<void> prepare_fp8_quantize(Runtime& runtime, const kjit_fp8_quantize_desc& desc, int device);

}  // namespace kjit::ops
