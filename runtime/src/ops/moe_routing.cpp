// The MoE routing helpers.
#include "kjit/internal/ops/moe_routing.hpp"

#include "launch.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

constexpr int64_t kIdsPerBlock = codegen::kRoutingIdsPerBlock;

}  // namespace

Expected<codegen::MoeRoutingSpec> plan_moe_routing_shapes(const kjit_moe_routing_desc& d) {
  if (d.struct_size < sizeof(kjit_moe_routing_desc))
    return invalid("desc.struct_size is too small: call kjit_moe_routing_desc_init first");
  if (d.tokens < 0 || d.top_k < 1) return invalid(fmt::format("need tokens >= 0 and top_k >= 1, got {} and {}", d.tokens, d.top_k));
  // Divided, not multiplied: top_k is not bounded here, and the product could overflow int64.
  if (d.tokens > 0 && d.top_k > INT32_MAX / d.tokens)
    return invalid("tokens * top_k must fit in int32 (the permutation's type)");
  if (d.expert_base < 0 || d.expert_base + d.experts_local > d.experts_total)
    return invalid(fmt::format("this rank's experts [{}, {}) must lie in [0, experts_total = {})", d.expert_base,
                               d.expert_base + d.experts_local, d.experts_total));
  if (d.offsets_convention != KJIT_OFFSETS_CUMULATIVE_END && d.offsets_convention != KJIT_OFFSETS_WITH_LEADING_ZERO)
    return invalid("offsets_convention must be KJIT_OFFSETS_CUMULATIVE_END or KJIT_OFFSETS_WITH_LEADING_ZERO");
  codegen::MoeRoutingSpec s;
  s.experts = d.experts_local;
  s.offsets = d.offsets_convention == KJIT_OFFSETS_WITH_LEADING_ZERO ? codegen::OffsetsConvention::with_leading_zero
                                                                     : codegen::OffsetsConvention::cumulative_end;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{s}));
  return s;
}

Expected<codegen::MoeCombineSpec> plan_moe_combine_shapes(const kjit_moe_combine_desc& d) {
  if (d.struct_size < sizeof(kjit_moe_combine_desc))
    return invalid("desc.struct_size is too small: call kjit_moe_combine_desc_init first");
  if (d.in_dtype != KJIT_DTYPE_BF16) return invalid("moe_combine in_dtype must be KJIT_DTYPE_BF16");
  if (d.out_dtype != KJIT_DTYPE_BF16 && d.out_dtype != KJIT_DTYPE_F32)
    return invalid("moe_combine out_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F32");
  if (d.tokens < 0 || d.rows < 0) return invalid("tokens and rows must be >= 0");
  if (d.tokens > INT32_MAX) return invalid("tokens must fit in a grid dimension (2^31 - 1)");
  codegen::MoeCombineSpec s;
  s.top_k = d.top_k;
  s.hidden = d.hidden;
  s.out = d.out_dtype == KJIT_DTYPE_F32 ? codegen::DType::f32 : codegen::DType::bf16;
  s.gradient = d.grad != nullptr;
  if (s.gradient) {
    if (d.out_dtype != KJIT_DTYPE_F32)
      return invalid("the weights' gradient (grad given) is fp32: out_dtype must be KJIT_DTYPE_F32, out [tokens, "
                     "top_k]");
    if (d.topk_weights != nullptr) return invalid("the weights' gradient does not read topk_weights: leave it NULL");
    if (d.tokens > INT64_C(0x7fffffff) * 8 / std::max<int64_t>(d.top_k, 1))
      return invalid("tokens * top_k pairs must fit in 8 a block over a grid dimension");
  }
  KJIT_TRY(codegen::validate(codegen::KernelSpec{s}));
  return s;
}

Expected<codegen::MoeCombineSpec> plan_moe_dispatch_shapes(const kjit_moe_dispatch_desc& d) {
  if (d.struct_size < sizeof(kjit_moe_dispatch_desc))
    return invalid("desc.struct_size is too small: call kjit_moe_dispatch_desc_init first");
  if (d.dtype != KJIT_DTYPE_BF16) return invalid("moe_dispatch dtype must be KJIT_DTYPE_BF16");
  if (d.tokens < 0) return invalid("tokens must be >= 0");
  if (d.tokens > INT32_MAX) return invalid("tokens must fit in a grid dimension (2^31 - 1)");
  codegen::MoeCombineSpec s;
  s.top_k = d.top_k;
  s.hidden = d.hidden;
  s.dispatch = true;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{s}));  // top_k in [1, 32] before the product below
  if (d.tokens * d.top_k > INT32_MAX) return invalid("tokens * top_k must fit in int32 (the permutation's type)");
  return s;
}

Expected<void> moe_routing(Runtime& runtime, const kjit_moe_routing_desc& d, CUstream stream) {
  const auto spec = KJIT_TRY(plan_moe_routing_shapes(d));
  const std::initializer_list<NamedPointer> pointers = {{d.topk_ids, "topk_ids"},
                                                        {d.counts, "counts"},
                                                        {d.offsets, "offsets"},
                                                        {d.sorted_to_flat, "sorted_to_flat"},
                                                        {d.flat_to_sorted, "flat_to_sorted"}};
  // A rank without tokens still gets its (zero) counts and offsets, which the GEMMs read; its id arrays are
  // empty, and an empty torch tensor's pointer is null.
  if (d.tokens == 0)
    KJIT_TRY(require_non_null({{d.counts, "counts"}, {d.offsets, "offsets"}}));
  else
    KJIT_TRY(require_non_null(pointers));
  kjit_moe_routing_params p{};
  p.topk_ids = d.topk_ids;
  p.counts = d.counts;
  p.offsets = d.offsets;
  p.sorted_to_flat = d.sorted_to_flat;
  p.flat_to_sorted = d.flat_to_sorted;
  p.entries = d.tokens * d.top_k;
  p.experts_total = d.experts_total;
  p.expert_base = d.expert_base;
  auto g = codegen::moe_routing_geometry();
  const uint64_t needed = moe_routing_workspace_bytes(p.entries, d.experts_local);
  if (d.workspace == nullptr || needed == 0) {
    p.phase = KJIT_ROUTING_PHASE_ONE_BLOCK;
    return launch_on_owning_device(runtime, spec, pointers, p.device_error, g, &p, stream);
  }
  if (d.workspace_bytes < needed)
    return invalid(fmt::format("workspace_bytes is {}, {} tokens x top_k {} over {} experts need {} "
                               "(kjit_moe_routing_workspace_bytes)",
                               d.workspace_bytes, d.tokens, d.top_k, d.experts_local, needed));
  if (reinterpret_cast<uintptr_t>(d.workspace) % 4 != 0) return invalid("'workspace' must be 4-byte aligned");
  const std::initializer_list<NamedPointer> with_workspace = {
      {d.topk_ids, "topk_ids"},           {d.counts, "counts"},
      {d.offsets, "offsets"},             {d.sorted_to_flat, "sorted_to_flat"},
      {d.flat_to_sorted, "flat_to_sorted"}, {d.workspace, "workspace"}};
  p.workspace = static_cast<int*>(d.workspace);
  p.ids_per_block = kIdsPerBlock;
  const auto blocks = static_cast<uint32_t>((p.entries + kIdsPerBlock - 1) / kIdsPerBlock);
  // Stream order makes each launch see the one before it complete.
  for (int phase : {KJIT_ROUTING_PHASE_COUNT, KJIT_ROUTING_PHASE_SCAN, KJIT_ROUTING_PHASE_PLACE}) {
    p.phase = phase;
    g.grid_x = phase == KJIT_ROUTING_PHASE_SCAN ? 1 : blocks;
    KJIT_TRY(launch_on_owning_device(runtime, spec, with_workspace, p.device_error, g, &p, stream));
  }
  return {};
}

uint64_t moe_routing_workspace_bytes(int64_t entries, int64_t experts_local) {
  if (entries <= kIdsPerBlock) return 0;
  const auto blocks = static_cast<uint64_t>((entries + kIdsPerBlock - 1) / kIdsPerBlock);
  return (1 + blocks + blocks * static_cast<uint64_t>(experts_local)) * sizeof(int32_t);
}

Expected<void> prepare_moe_routing(Runtime& runtime, const kjit_moe_routing_desc& d, int device) {
  const auto spec = KJIT_TRY(plan_moe_routing_shapes(d));
  return prepare_on_device(runtime, spec, device);
}

Expected<void> moe_combine(Runtime& runtime, const kjit_moe_combine_desc& d, CUstream stream) {
  const auto spec = KJIT_TRY(plan_moe_combine_shapes(d));
  if (d.tokens == 0) return {};
  // The gradient reads grad where the combine reads the weights.
  const std::initializer_list<NamedPointer> pointers = {
      {d.expert_out, "expert_out"},
      spec.gradient ? NamedPointer{d.grad, "grad"} : NamedPointer{d.topk_weights, "topk_weights"},
      {d.flat_to_sorted, "flat_to_sorted"},
      {d.out, "out"}};
  KJIT_TRY(require_non_null(pointers));
  if (reinterpret_cast<uintptr_t>(d.expert_out) % 16 != 0 || reinterpret_cast<uintptr_t>(d.out) % 16 != 0)
    return invalid("'expert_out' and 'out' must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(d.grad) % 16 != 0) return invalid("'grad' is not 16-byte aligned");
  kjit_moe_combine_params p{};
  p.expert_out = d.expert_out;
  p.topk_weights = d.topk_weights;
  p.flat_to_sorted = d.flat_to_sorted;
  p.out = d.out;
  p.tokens = d.tokens;
  p.rows = d.rows;
  p.grad = d.grad;
  const auto g = codegen::moe_combine_geometry(spec, d.tokens);
  return launch_on_owning_device(runtime, spec, pointers, p.device_error, g, &p, stream);
}

Expected<void> prepare_moe_combine(Runtime& runtime, const kjit_moe_combine_desc& d, int device) {
  const auto spec = KJIT_TRY(plan_moe_combine_shapes(d));
  return prepare_on_device(runtime, spec, device);
}

Expected<void> moe_dispatch(Runtime& runtime, const kjit_moe_dispatch_desc& d, CUstream stream) {
  const auto spec = KJIT_TRY(plan_moe_dispatch_shapes(d));
  if (d.tokens == 0) return {};
  KJIT_TRY(require_non_null({{d.x, "x"}, {d.flat_to_sorted, "flat_to_sorted"}, {d.out, "out"}}));
  // valid_rows is optional: the owning-device check skips a NULL one.
  const std::initializer_list<NamedPointer> pointers = {
      {d.x, "x"}, {d.flat_to_sorted, "flat_to_sorted"}, {d.out, "out"}, {d.valid_rows, "valid_rows"}};
  if (reinterpret_cast<uintptr_t>(d.x) % 16 != 0 || reinterpret_cast<uintptr_t>(d.out) % 16 != 0)
    return invalid("'x' and 'out' must be 16-byte aligned");
  kjit_moe_dispatch_params p{};
  p.x = d.x;
  p.flat_to_sorted = d.flat_to_sorted;
  p.valid_rows = d.valid_rows;
  p.out = d.out;
  p.tokens = d.tokens;
  p.rows = d.tokens * d.top_k;
  const auto g = codegen::moe_combine_geometry(spec, d.tokens);
  return launch_on_owning_device(runtime, spec, pointers, p.device_error, g, &p, stream);
}

Expected<void> prepare_moe_dispatch(Runtime& runtime, const kjit_moe_dispatch_desc& d, int device) {
  const auto spec = KJIT_TRY(plan_moe_dispatch_shapes(d));
  return prepare_on_device(runtime, spec, device);
}

}  // namespace kjit::ops
