// The MoE activation op: argument checks (one checker for the C ABI, the C++
// API and Python), the spec and parameter block they produce, and the launch.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "moe_activation_params.h"

namespace kjit::ops {

struct MoeActivationPlan {
  codegen::MoeActivationSpec spec;
  kjit_moe_activation_params params{};
  codegen::LaunchGeometry geometry;
  bool empty = false;  // no rows: nothing to launch
};

// Checks everything that can be checked without the driver: dtypes, the
// activation and layout, sizes, stride, alpha and limit, pointer presence and
// alignment. With `for_prepare`, pointers are not required.
Expected<MoeActivationPlan> plan_moe_activation(const kjit_moe_activation_desc& desc, bool for_prepare);

// plan_moe_activation, then the launch on the device owning the pointers.
Expected<void> moe_activation(Runtime& runtime, const kjit_moe_activation_desc& desc, CUstream stream);
Expected<void> prepare_moe_activation(Runtime& runtime, const kjit_moe_activation_desc& desc, int device);

}  // namespace kjit::ops
