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

// Checks everything that can be checked without the driver: dtypes, sizes,
// stride, the gather's arguments, pointer presence and alignment. With
// `for_prepare`, pointers are not required.
Expected<Fp8QuantizePlan> plan_fp8_quantize(const kjit_fp8_quantize_desc& desc, bool for_prepare);

// plan_fp8_quantize, then the launch on the device owning the pointers.
Expected<void> fp8_quantize(Runtime& runtime, const kjit_fp8_quantize_desc& desc, CUstream stream);
Expected<void> prepare_fp8_quantize(Runtime& runtime, const kjit_fp8_quantize_desc& desc, int device);

}  // namespace kjit::ops
