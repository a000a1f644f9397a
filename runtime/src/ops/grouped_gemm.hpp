// The grouped GEMM op: argument checks, the spec and parameter block they
// produce, and the launch.
#pragma once

#include "../runtime.hpp"
#include "grouped_gemm_params.h"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/kjit.h"

namespace kjit::ops {

struct GroupedGemmPlan {
  codegen::GroupedGemmSpec spec;
  kjit_grouped_gemm_params params{};
  codegen::LaunchGeometry geometry;
  bool empty = false;  // no rows: nothing to do
};

// Checks everything that can be checked without the driver. With
// `for_prepare`, pointers are not required.
Expected<GroupedGemmPlan> plan_grouped_gemm(const kjit_grouped_gemm_desc& desc, bool for_prepare);

Expected<void> launch_grouped_gemm(Runtime& runtime, GroupedGemmPlan& plan, CUstream stream);
Expected<void> grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream);
Expected<void> prepare_grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int device);

}  // namespace kjit::ops
