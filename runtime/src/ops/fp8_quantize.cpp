// The fp8 quantize op.
#include "kjit/internal/ops/fp8_quantize.hpp"

#include "launch.hpp"

#include <climits>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

Expected<Fp8QuantizePlan> plan_fp8_quantize_shapes(const kjit_fp8_quantize_desc& d) {
  if (d.struct_size < sizeof(kjit_fp8_quantize_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_fp8_quantize_desc_init first",
                               d.struct_size, sizeof(kjit_fp8_quantize_desc)));
  if (d.in_dtype != KJIT_DTYPE_BF16)
    return invalid(fmt::format("fp8_quantize in_dtype must be KJIT_DTYPE_BF16 (got {})", static_cast<int>(d.in_dtype)));
  if (d.out_dtype != KJIT_DTYPE_F8_E4M3FN)
    return invalid(
        fmt::format("fp8_quantize out_dtype must be KJIT_DTYPE_F8_E4M3FN (got {})", static_cast<int>(d.out_dtype)));
  // The descriptor -> the spec; the spec's invariants are codegen's to check.
  Fp8QuantizePlan plan;
  auto& spec = plan.spec;
  spec.k = d.k;
  spec.group = d.group;
  if (d.scale_format == KJIT_QUANT_SCALE_FP32) spec.scale_format = codegen::QuantScaleFormat::fp32;
  else if (d.scale_format == KJIT_QUANT_SCALE_UE8M0) spec.scale_format = codegen::QuantScaleFormat::ue8m0;
  else
    return invalid(fmt::format("scale_format must be KJIT_QUANT_SCALE_FP32 or KJIT_QUANT_SCALE_UE8M0 (got {}; there "
                               "is no default)",
                               static_cast<int>(d.scale_format)));
  if (d.top_k < 0) return invalid(fmt::format("top_k must be 0 (no gather) or >= 1, got {}", d.top_k));
  spec.gather = d.top_k >= 1;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{spec}));

  // Run-time shapes (not part of the spec).
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (d.rows > codegen::fp8_quantize_max_rows(spec))
    return invalid(fmt::format("rows {} exceed the {} one launch takes at K {}", d.rows,
                               codegen::fp8_quantize_max_rows(spec), d.k));
  const int64_t in_stride = d.in_row_stride == 0 ? d.k : d.in_row_stride;
  if (in_stride < d.k || in_stride % 8 != 0)
    return invalid(fmt::format("in_row_stride {} must be 0 (= k) or a multiple of 8 that is >= k = {}",
                               d.in_row_stride, d.k));
  if (spec.gather) {
    if (d.tokens < 0) return invalid(fmt::format("tokens must be >= 0, got {}", d.tokens));
    if (d.tokens > 0 && d.top_k > INT32_MAX / d.tokens)  // divided: the product could overflow int64
      return invalid("tokens * top_k must fit in int32 (the type of sorted_to_flat)");
    if (d.rows > INT32_MAX) return invalid("rows must fit in int32 (the rows of sorted_to_flat)");
  } else if (d.sorted_to_flat != nullptr || d.tokens != 0) {
    return invalid("sorted_to_flat and tokens are for a gather, which top_k >= 1 asks for; with top_k 0 leave them "
                   "NULL and 0");
  }
  plan.empty = d.rows == 0;
  auto& p = plan.params;
  p.rows = d.rows;
  p.in_row_stride = in_stride;
  p.top_k = spec.gather ? d.top_k : 1;
  p.entries = spec.gather ? d.tokens * d.top_k : d.rows;
  plan.geometry = codegen::fp8_quantize_geometry(spec, d.rows);
  return plan;
}

Expected<Fp8QuantizePlan> bind_fp8_quantize(const kjit_fp8_quantize_desc& d, Fp8QuantizePlan plan) {
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.in, "in"}, {d.out, "out"}, {d.scales, "scales"}}));
    if (plan.spec.gather) KJIT_TRY(require_non_null({{d.sorted_to_flat, "sorted_to_flat"}}));
    if (!aligned(d.in, 16) || !aligned(d.out, 16)) return invalid("'in' and 'out' must be 16-byte aligned");
    if (!aligned(d.scales, alignof(float))) return invalid("'scales' is not 4-byte aligned");
    if (!aligned(d.sorted_to_flat, alignof(int32_t))) return invalid("'sorted_to_flat' is not 4-byte aligned");
  }
  auto& p = plan.params;
  p.in = d.in;
  p.out = static_cast<unsigned char*>(d.out);
  p.scales = d.scales;
  p.sorted_to_flat = d.sorted_to_flat;
  return plan;
}

Expected<Fp8QuantizePlan> plan_fp8_quantize(const kjit_fp8_quantize_desc& d) {
  return bind_fp8_quantize(d, KJIT_TRY(plan_fp8_quantize_shapes(d)));
}

Expected<void> fp8_quantize(Runtime& runtime, const kjit_fp8_quantize_desc& d, CUstream stream) {
  auto plan = KJIT_TRY(plan_fp8_quantize(d));
  if (plan.empty) return {};
  if (plan.spec.gather) {
    return launch_on_owning_device(
        runtime, plan.spec, {{d.in, "in"}, {d.out, "out"}, {d.scales, "scales"}, {d.sorted_to_flat, "sorted_to_flat"}},
        plan.params.device_error, plan.geometry, &plan.params, stream);
  }
  return launch_on_owning_device(runtime, plan.spec, {{d.in, "in"}, {d.out, "out"}, {d.scales, "scales"}},
                                 plan.params.device_error, plan.geometry, &plan.params, stream);
}

Expected<void> prepare_fp8_quantize(Runtime& runtime, const kjit_fp8_quantize_desc& d, int device) {
  // Its kernel does not depend on the pointers (they must be 16-byte aligned).
  const auto plan = KJIT_TRY(plan_fp8_quantize_shapes(d));
  return prepare_on_device(runtime, plan.spec, device);
}

}  // namespace kjit::ops
