// The grouped weight-gradient GEMM op: argument checks (one checker for the C
// ABI, the C++ API and Python), the spec and parameter block they produce,
// and the launch.
#pragma once

#include "grouped_gemm_wgrad_params.h"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"

namespace kjit::ops {

struct GroupedGemmWgradPlan {
  codegen::GroupedGemmWgradSpec problem;  // unconfigured: the configuration depends on the device's arch
  codegen::GemmRequest::Kernel request = codegen::GemmRequest::Kernel::arch_default;
  kjit_grouped_gemm_wgrad_params params{};
};

// Checks everything that does not depend on pointers: dtypes, the offsets
// convention, the kernel, sizes. The params hold no pointers.
Expected<GroupedGemmWgradPlan> plan_grouped_gemm_wgrad_shapes(const kjit_grouped_gemm_wgrad_desc& desc);

// Checks the pointers (presence, alignment) and puts them in the params.
Expected<GroupedGemmWgradPlan> bind_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc& desc,
                                                       GroupedGemmWgradPlan plan);

// plan_grouped_gemm_wgrad_shapes + bind_grouped_gemm_wgrad: the plan of a launch.
Expected<GroupedGemmWgradPlan> plan_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc& desc);

// plan_grouped_gemm_wgrad, then the launch on the device owning the pointers
// (also with rows = 0: out is written with zeros).
Expected<void> grouped_gemm_wgrad(Runtime& runtime, const kjit_grouped_gemm_wgrad_desc& desc, CUstream stream);
Expected<void> prepare_grouped_gemm_wgrad(Runtime& runtime, const kjit_grouped_gemm_wgrad_desc& desc, int device);

}  // namespace kjit::ops
