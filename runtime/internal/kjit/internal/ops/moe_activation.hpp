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

// Checks everything that does not depend on pointers: dtypes, the activation
// and layout, sizes, stride, alpha and limit. The params hold no pointers.
Expected<MoeActivationPlan> plan_moe_activation_shapes(const kjit_moe_activation_desc& desc);

// Checks the pointers (presence, alignment) and puts them in the params.
Expected<MoeActivationPlan> bind_moe_activation(const kjit_moe_activation_desc& desc, MoeActivationPlan plan);

// plan_moe_activation_shapes + bind_moe_activation: the plan of a launch.
Expected<MoeActivationPlan> plan_moe_activation(const kjit_moe_activation_desc& desc);

// plan_moe_activation, then the launch on the device owning the pointers.
Expected<void> moe_activation(Runtime& runtime, const kjit_moe_activation_desc& desc, CUstream stream);
Expected<void> prepare_moe_activation(Runtime& runtime, const kjit_moe_activation_desc& desc, int device);

}  // namespace kjit::ops
