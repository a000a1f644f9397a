// The fp8 dequant op: argument checks (one checker for the C ABI, the C++ API
// and Python), the spec and parameter block they produce, and the launch.
#pragma once

#include <vector>

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

// Checks everything that does not depend on pointers: dtypes, sizes, strides,
// scale layout and shape, convention. The spec's vector width is the one
// 16-byte-aligned pointers get; the params hold no pointers.
Expected<DequantPlan> plan_dequant_shapes(const kjit_dequant_desc& desc);

// Checks the pointers (presence, alignment, expert_ids against
// num_expert_ids), narrows the vector width to what their alignment allows,
// and puts them in the params.
Expected<DequantPlan> bind_dequant(const kjit_dequant_desc& desc, DequantPlan plan);

// plan_dequant_shapes + bind_dequant: the plan of a launch.
Expected<DequantPlan> plan_dequant(const kjit_dequant_desc& desc);

// Every vector width bind_dequant can pick for `plan`'s shapes and strides,
// whatever the pointers' alignment, widest first.
std::vector<int> dequant_vectors(const DequantPlan& plan);

// Resolves the device owning the plan's pointers, checks the stream, loads
// the plan's kernel (never compiling while `stream` captures) and launches.
Expected<void> launch_dequant(Runtime& runtime, DequantPlan& plan, CUstream stream);

// plan_dequant + launch_dequant.
Expected<void> dequant_fp8(Runtime& runtime, const kjit_dequant_desc& desc, CUstream stream);

// Compiles (or finds) and loads every kernel a launch of `desc`'s shapes may
// need on `device`: one per vector width in dequant_vectors.
Expected<void> prepare_dequant_fp8(Runtime& runtime, const kjit_dequant_desc& desc, int device);

}  // namespace kjit::ops
