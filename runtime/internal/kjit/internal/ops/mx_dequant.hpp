// The MX dequant op (NVFP4, MXFP4, MXFP8): argument checks (one checker for
// the C ABI, the C++ API and Python), the spec and parameter block they
// produce, and the launch.
#pragma once

#include <vector>

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

// Checks everything that does not depend on pointers: format, dtypes, layout,
// convention, K, strides. The spec's vector width is the one 16-byte-aligned
// pointers get; the params hold no pointers.
Expected<MxDequantPlan> plan_mx_dequant_shapes(const kjit_mx_dequant_desc& desc);

// Checks the pointers (presence, alignment, the global scales, expert_ids
// against num_expert_ids), narrows the vector width to what their alignment
// allows, and puts them in the params.
Expected<MxDequantPlan> bind_mx_dequant(const kjit_mx_dequant_desc& desc, MxDequantPlan plan);

// plan_mx_dequant_shapes + bind_mx_dequant: the plan of a launch.
Expected<MxDequantPlan> plan_mx_dequant(const kjit_mx_dequant_desc& desc);

// Every vector width bind_mx_dequant can pick for `plan`'s shapes and
// strides, whatever the pointers' alignment, widest first.
std::vector<int> mx_dequant_vectors(const MxDequantPlan& plan);

// Launches the plan on the device owning its pointers (never compiling while
// `stream` captures).
Expected<void> launch_mx_dequant(Runtime& runtime, MxDequantPlan& plan, CUstream stream);

// plan_mx_dequant + launch_mx_dequant.
Expected<void> dequant_mx(Runtime& runtime, const kjit_mx_dequant_desc& desc, CUstream stream);

// Compiles (or finds) and loads every kernel a launch of `desc`'s shapes may
// need on `device`: one per vector width in mx_dequant_vectors.
Expected<void> prepare_dequant_mx(Runtime& runtime, const kjit_mx_dequant_desc& desc, int device);

}  // namespace kjit::ops
