// The fp8 dequant op.
#include "kjit/internal/ops/dequant.hpp"

#include "launch.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

using codegen::DType;
using codegen::ScaleConvention;
using codegen::ScaleGranularity;

Expected<DType> fp8_input(kjit_dtype t) {
  if (t == KJIT_DTYPE_F8_E4M3FN) return DType::f8_e4m3fn;
  if (t == KJIT_DTYPE_F8_E5M2) return DType::f8_e5m2;
  return fail(KJIT_ERROR_INVALID_ARGUMENT,
              fmt::format("in_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2 (got {})", static_cast<int>(t)));
}

Expected<DType> float_output(kjit_dtype t) {
  if (t == KJIT_DTYPE_BF16) return DType::bf16;
  if (t == KJIT_DTYPE_F16) return DType::f16;
  if (t == KJIT_DTYPE_F32) return DType::f32;
  return fail(KJIT_ERROR_INVALID_ARGUMENT,
              fmt::format("out_dtype must be KJIT_DTYPE_BF16, KJIT_DTYPE_F16 or KJIT_DTYPE_F32 (got {})",
                          static_cast<int>(t)));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

// The access width every row start allows: cols, both strides and the input
// address; the output address needs vec * out_bytes alignment.
int vector_for(const DequantPlan& plan, int64_t in_alignment, int64_t out_alignment) {
  const auto& p = plan.params;
  int vec = codegen::dequant_vector(plan.spec.out, plan.spec.cols, {p.in_row_stride, p.out_row_stride, in_alignment});
  const int out_bytes = codegen::size_bytes(plan.spec.out);
  while (vec > 1 && out_alignment % std::min(16, vec * out_bytes) != 0) vec /= 2;
  return vec;
}

}  // namespace

Expected<DequantPlan> plan_dequant_shapes(const kjit_dequant_desc& d) {
  if (d.struct_size < sizeof(kjit_dequant_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_dequant_desc_init first",
                               d.struct_size, sizeof(kjit_dequant_desc)));
  // The descriptor -> the spec; the spec's invariants are codegen's to check.
  codegen::DequantSpec spec;
  spec.in = KJIT_TRY(fp8_input(d.in_dtype));
  spec.out = KJIT_TRY(float_output(d.out_dtype));
  spec.cols = d.cols;
  switch (d.scale_granularity) {
    case KJIT_SCALE_PER_TENSOR: spec.granularity = ScaleGranularity::per_tensor; break;
    case KJIT_SCALE_PER_ROW: spec.granularity = ScaleGranularity::per_row; break;
    case KJIT_SCALE_PER_BLOCK: spec.granularity = ScaleGranularity::per_block; break;
    default:
      return invalid(fmt::format("scale_granularity must be PER_TENSOR, PER_ROW or PER_BLOCK (got {})",
                                 static_cast<int>(d.scale_granularity)));
  }
  if (d.scale_granularity != KJIT_SCALE_PER_BLOCK && (d.block_rows != 0 || d.block_cols != 0))
    return invalid("block_rows/block_cols are only used with KJIT_SCALE_PER_BLOCK; leave them 0");
  spec.block_rows = d.block_rows;
  spec.block_cols = d.block_cols;
  if (d.scale_convention == KJIT_SCALE_MULTIPLY) spec.convention = ScaleConvention::multiply;
  else if (d.scale_convention == KJIT_SCALE_DIVIDE) spec.convention = ScaleConvention::divide;
  else
    return invalid("scale_convention must be KJIT_SCALE_MULTIPLY or KJIT_SCALE_DIVIDE (there is no default: "
                   "DeepSeek's weight_scale_inv and compressed-tensors' weight_scale are both MULTIPLY)");
  if (d.num_expert_ids < 0) return invalid(fmt::format("num_expert_ids must be >= 0, got {}", d.num_expert_ids));
  spec.selected_experts = d.num_expert_ids > 0;

  // Run-time shapes and strides (not part of the spec).
  if (d.experts < 1) return invalid(fmt::format("experts must be >= 1 (1 for a 2-D tensor), got {}", d.experts));
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  const int64_t in_stride = d.in_row_stride == 0 ? d.cols : d.in_row_stride;
  const int64_t out_stride = d.out_row_stride == 0 ? d.cols : d.out_row_stride;
  if (in_stride < d.cols)
    return invalid(fmt::format("in_row_stride {} is smaller than cols {}", d.in_row_stride, d.cols));
  if (out_stride < d.cols)
    return invalid(fmt::format("out_row_stride {} is smaller than cols {}", d.out_row_stride, d.cols));

  DequantPlan plan;
  const int64_t slots = spec.selected_experts ? d.num_expert_ids : d.experts;
  plan.empty = d.rows == 0 || slots == 0;
  auto& p = plan.params;
  p.rows = d.rows;
  p.in_row_stride = in_stride;
  p.out_row_stride = out_stride;
  p.in_expert_stride = d.rows * in_stride;
  p.out_expert_stride = d.rows * out_stride;
  p.scale_expert_stride = d.scale_rows * d.scale_cols;
  p.experts = d.experts;
  p.output_slots = slots;
  // Validated at the widest width: a narrower one, which bind may pick, divides cols too.
  plan.spec = spec;
  plan.spec.vec = vector_for(plan, 16, 16);
  KJIT_TRY(codegen::validate(codegen::KernelSpec{plan.spec}));

  // The scales the caller holds must be the ones the granularity implies (checked once the block is known valid).
  const bool blocked = spec.granularity == ScaleGranularity::per_block;
  const int64_t expected_scale_rows = blocked ? ceil_div(d.rows, d.block_rows)
                                      : spec.granularity == ScaleGranularity::per_row ? d.rows
                                                                                       : 1;
  const int64_t expected_scale_cols = blocked ? ceil_div(d.cols, d.block_cols) : 1;
  if (d.scale_rows != expected_scale_rows || d.scale_cols != expected_scale_cols)
    return invalid(fmt::format("scales are [{}, {}] per expert but a {}x{} tensor with these scales needs [{}, {}]",
                               d.scale_rows, d.scale_cols, d.rows, d.cols, expected_scale_rows, expected_scale_cols));
  return plan;
}

Expected<DequantPlan> bind_dequant(const kjit_dequant_desc& d, DequantPlan plan) {
  if ((d.expert_ids == nullptr) != (d.num_expert_ids == 0))
    return invalid(fmt::format("expert_ids and num_expert_ids go together (expert_ids {}, num_expert_ids {})",
                               d.expert_ids ? "set" : "NULL", d.num_expert_ids));
  const int out_bytes = codegen::size_bytes(plan.spec.out);
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.in, "in"}, {d.scales, "scales"}, {d.out, "out"}}));
    if (reinterpret_cast<uintptr_t>(d.scales) % alignof(float) != 0) return invalid("'scales' is not 4-byte aligned");
    if (reinterpret_cast<uintptr_t>(d.out) % static_cast<uintptr_t>(out_bytes) != 0)
      return invalid(fmt::format("'out' is not aligned to its element size ({} bytes)", out_bytes));
  }
  plan.spec.vec = vector_for(plan, pointer_alignment(d.in), pointer_alignment(d.out));
  auto& p = plan.params;
  p.in = static_cast<const unsigned char*>(d.in);
  p.scales = d.scales;
  p.out = d.out;
  p.expert_ids = d.expert_ids;
  plan.geometry = codegen::dequant_geometry(plan.spec, p.rows, p.output_slots);
  return plan;
}

Expected<DequantPlan> plan_dequant(const kjit_dequant_desc& d) {
  return bind_dequant(d, KJIT_TRY(plan_dequant_shapes(d)));
}

std::vector<int> dequant_vectors(const DequantPlan& plan) {
  return vector_widths(codegen::size_bytes(plan.spec.out), std::bind_front(vector_for, std::cref(plan)));
}

Expected<void> launch_dequant(Runtime& runtime, DequantPlan& plan, CUstream stream) {
  if (plan.empty) return {};
  auto& p = plan.params;
  return launch_on_owning_device(runtime, plan.spec,
                                 {{p.in, "in"}, {p.scales, "scales"}, {p.out, "out"}, {p.expert_ids, "expert_ids"}},
                                 p.device_error, plan.geometry, &p, stream);
}

Expected<void> dequant_fp8(Runtime& runtime, const kjit_dequant_desc& desc, CUstream stream) {
  auto plan = KJIT_TRY(plan_dequant(desc));
  return launch_dequant(runtime, plan, stream);
}

Expected<void> prepare_dequant_fp8(Runtime& runtime, const kjit_dequant_desc& desc, int ordinal) {
  const auto plan = KJIT_TRY(plan_dequant_shapes(desc));
  return prepare_each_width(runtime, plan.spec, dequant_vectors(plan), ordinal);
}

}  // namespace kjit::ops
