// The MoE activation op.
#include "kjit/internal/ops/moe_activation.hpp"

#include "launch.hpp"

#include <cmath>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

Expected<MoeActivationPlan> plan_moe_activation_shapes(const kjit_moe_activation_desc& d) {
  if (d.struct_size < sizeof(kjit_moe_activation_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_moe_activation_desc_init first",
                               d.struct_size, sizeof(kjit_moe_activation_desc)));
  if (d.in_dtype != KJIT_DTYPE_BF16)
    return invalid(
        fmt::format("moe_activation in_dtype must be KJIT_DTYPE_BF16 (got {})", static_cast<int>(d.in_dtype)));
  // The descriptor -> the spec; the spec's invariants are codegen's to check.
  MoeActivationPlan plan;
  auto& spec = plan.spec;
  spec.intermediate = d.intermediate;
  if (d.out_dtype == KJIT_DTYPE_BF16) spec.out = codegen::DType::bf16;
  else if (d.out_dtype == KJIT_DTYPE_F8_E4M3FN) spec.out = codegen::DType::f8_e4m3fn;
  else
    return invalid(fmt::format("moe_activation out_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F8_E4M3FN (got {})",
                               static_cast<int>(d.out_dtype)));
  if (d.activation == KJIT_ACTIVATION_SILU_MUL) spec.activation = codegen::Activation::silu_mul;
  else if (d.activation == KJIT_ACTIVATION_SWIGLU_OAI) spec.activation = codegen::Activation::swiglu_oai;
  else
    return invalid(fmt::format("activation must be KJIT_ACTIVATION_SILU_MUL or KJIT_ACTIVATION_SWIGLU_OAI "
                               "(got {}; there is no default)",
                               static_cast<int>(d.activation)));
  if (d.layout == KJIT_GATE_UP_HALVES) spec.layout = codegen::GateUpLayout::halves;
  else if (d.layout == KJIT_GATE_UP_ALTERNATING) spec.layout = codegen::GateUpLayout::alternating;
  else if (d.layout == KJIT_GATE_UP_GROUPS_OF_8) spec.layout = codegen::GateUpLayout::groups_of_8;
  else
    return invalid(fmt::format("layout must be KJIT_GATE_UP_HALVES, _ALTERNATING or _GROUPS_OF_8 (got {}; there is no "
                               "default)",
                               static_cast<int>(d.layout)));
  const bool fp8_out = spec.out == codegen::DType::f8_e4m3fn;
  if (fp8_out) {
    if (d.scale_format == KJIT_QUANT_SCALE_FP32) spec.scale_format = codegen::QuantScaleFormat::fp32;
    else if (d.scale_format == KJIT_QUANT_SCALE_UE8M0) spec.scale_format = codegen::QuantScaleFormat::ue8m0;
    else
      return invalid(fmt::format("FP8 output needs scale_format KJIT_QUANT_SCALE_FP32 or KJIT_QUANT_SCALE_UE8M0 (got "
                                 "{}; there is no default)",
                                 static_cast<int>(d.scale_format)));
  } else if (d.scale_format != KJIT_QUANT_SCALE_UNSET || d.scales != nullptr) {
    return invalid("scale_format and scales are for FP8 output; with bf16 output leave them UNSET and NULL");
  }
  spec.gradient = d.grad != nullptr;
  if (spec.gradient && fp8_out)
    return invalid("the gradient (grad given) is bf16: out_dtype must be KJIT_DTYPE_BF16, out the gradient of h "
                   "[rows, 2I]");
  KJIT_TRY(codegen::validate(codegen::KernelSpec{spec}));
  if (spec.activation == codegen::Activation::swiglu_oai) {
    if (!std::isfinite(d.alpha)) return invalid(fmt::format("alpha must be finite, got {}", d.alpha));
    if (!(d.limit > 0.0f)) return invalid(fmt::format("limit must be > 0 (+inf: no clamp), got {}", d.limit));
  }

  // Run-time shapes (not part of the spec).
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (d.rows > codegen::moe_activation_max_rows(spec))
    return invalid(fmt::format("rows {} exceed the {} one launch takes at I {}", d.rows,
                               codegen::moe_activation_max_rows(spec), d.intermediate));
  const int64_t in_stride = d.in_row_stride == 0 ? 2 * d.intermediate : d.in_row_stride;
  if (in_stride < 2 * d.intermediate || in_stride % 8 != 0)
    return invalid(fmt::format("in_row_stride {} must be 0 (= 2I) or a multiple of 8 that is >= 2I = {}",
                               d.in_row_stride, 2 * d.intermediate));
  plan.empty = d.rows == 0;
  auto& p = plan.params;
  p.rows = d.rows;
  p.in_row_stride = in_stride;
  p.alpha = d.alpha;
  p.limit = d.limit;
  plan.geometry = codegen::moe_activation_geometry(spec, d.rows);
  return plan;
}

Expected<MoeActivationPlan> bind_moe_activation(const kjit_moe_activation_desc& d, MoeActivationPlan plan) {
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.in, "in"}, {d.out, "out"}}));
    if (plan.spec.out == codegen::DType::f8_e4m3fn) KJIT_TRY(require_non_null({{d.scales, "scales"}}));
    if (!aligned(d.in, 16) || !aligned(d.out, 16)) return invalid("'in' and 'out' must be 16-byte aligned");
    if (!aligned(d.grad, 16)) return invalid("'grad' is not 16-byte aligned");
    if (!aligned(d.scales, alignof(float))) return invalid("'scales' is not 4-byte aligned");
    if (!aligned(d.valid_rows, alignof(int32_t))) return invalid("'valid_rows' is not 4-byte aligned");
  }
  auto& p = plan.params;
  p.in = d.in;
  p.out = d.out;
  p.scales = d.scales;
  p.valid_rows = d.valid_rows;
  p.grad = d.grad;
  return plan;
}

Expected<MoeActivationPlan> plan_moe_activation(const kjit_moe_activation_desc& d) {
  return bind_moe_activation(d, KJIT_TRY(plan_moe_activation_shapes(d)));
}

Expected<void> moe_activation(Runtime& runtime, const kjit_moe_activation_desc& d, CUstream stream) {
  auto plan = KJIT_TRY(plan_moe_activation(d));
  if (plan.empty) return {};
  // NULL optional pointers (scales with bf16 out, valid_rows) are skipped by the device check.
  return launch_on_owning_device(runtime, plan.spec,
                                 {{d.in, "in"},
                                  {d.out, "out"},
                                  {d.scales, "scales"},
                                  {d.valid_rows, "valid_rows"},
                                  {d.grad, "grad"}},
                                 plan.params.device_error, plan.geometry, &plan.params, stream);
}

Expected<void> prepare_moe_activation(Runtime& runtime, const kjit_moe_activation_desc& d, int device) {
  // Its kernel does not depend on the pointers (they must be 16-byte aligned).
  const auto plan = KJIT_TRY(plan_moe_activation_shapes(d));
  return prepare_on_device(runtime, plan.spec, device);
}

}  // namespace kjit::ops
