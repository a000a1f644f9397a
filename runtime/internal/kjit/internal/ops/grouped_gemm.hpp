// The grouped GEMM op: argument checks, the problem they describe, the
// configuration chosen for the device, and the launch.
#pragma once

#include "kjit/internal/runtime.hpp"
#include "grouped_gemm_params.h"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/kjit.h"

namespace kjit::ops {

// The workspace: one 32-bit tile counter (16 bytes leave room to grow).
inline constexpr uint64_t kGroupedGemmWorkspaceBytes = 16;

struct GroupedGemmPlan {
  codegen::GroupedGemmSpec problem;  // no configuration yet: that depends on the device
  codegen::GemmRequest request;
  kjit_grouped_gemm_params params{};
  bool empty = false;  // no rows: nothing to do
};

// Checks everything that can be checked without the driver. With
// `for_prepare`, pointers are not required.
Expected<GroupedGemmPlan> plan_grouped_gemm(const kjit_grouped_gemm_desc& desc, bool for_prepare);

Expected<void> grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream);
// Loads every configuration a launch of `desc` may pick on `device`, whatever
// its row count, so that capturing any batch size needs no compile.
Expected<void> prepare_grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int device);

}  // namespace kjit::ops
