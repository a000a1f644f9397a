// The MoE routing helpers: argument checks, specs and launches of
// moe_routing, moe_combine and moe_dispatch.
#pragma once

#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "moe_routing_params.h"

namespace kjit::ops {

// Each helper's checks that do not depend on pointers (sizes, the expert range, the offsets convention, the
// dtypes), and the spec they produce.
Expected<codegen::MoeRoutingSpec> plan_moe_routing_shapes(const kjit_moe_routing_desc& desc);
Expected<codegen::MoeCombineSpec> plan_moe_combine_shapes(const kjit_moe_combine_desc& desc);
Expected<codegen::MoeCombineSpec> plan_moe_dispatch_shapes(const kjit_moe_dispatch_desc& desc);

Expected<void> moe_routing(Runtime& runtime, const kjit_moe_routing_desc& desc, CUstream stream);
Expected<void> prepare_moe_routing(Runtime& runtime, const kjit_moe_routing_desc& desc, int device);
// Bytes of workspace that let `entries` ids route over many blocks (0: one block suffices).
uint64_t moe_routing_workspace_bytes(int64_t entries, int64_t experts_local);
Expected<void> moe_combine(Runtime& runtime, const kjit_moe_combine_desc& desc, CUstream stream);
Expected<void> prepare_moe_combine(Runtime& runtime, const kjit_moe_combine_desc& desc, int device);
Expected<void> moe_dispatch(Runtime& runtime, const kjit_moe_dispatch_desc& desc, CUstream stream);
Expected<void> prepare_moe_dispatch(Runtime& runtime, const kjit_moe_dispatch_desc& desc, int device);

}  // namespace kjit::ops
