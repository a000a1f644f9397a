// The MX dequant op (NVFP4, MXFP4, MXFP8).
#include "kjit/internal/ops/mx_dequant.hpp"

#include <cstdint>
#include <functional>

#include <fmt/format.h>

#include "launch.hpp"

namespace kjit::ops {
namespace {

using codegen::DType;
using codegen::MxFormat;
using codegen::MxScaleLayout;

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

Expected<MxFormat> block_format(kjit_block_format f) {
  switch (f) {
    case KJIT_BLOCK_FORMAT_NVFP4: return MxFormat::nvfp4;
    case KJIT_BLOCK_FORMAT_MXFP4: return MxFormat::mxfp4;
    case KJIT_BLOCK_FORMAT_MXFP8: return MxFormat::mxfp8;
    default:
      return invalid(fmt::format(
          "format must be KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4 or KJIT_BLOCK_FORMAT_MXFP8 (got {})",
          static_cast<int>(f)));
  }
}

Expected<MxScaleLayout> scale_layout(kjit_scale_layout l) {
  if (l == KJIT_SCALE_LAYOUT_LINEAR) return MxScaleLayout::linear;
  if (l == KJIT_SCALE_LAYOUT_SWIZZLED_128X4) return MxScaleLayout::swizzled_128x4;
  return invalid(fmt::format(
      "scale_layout must be KJIT_SCALE_LAYOUT_LINEAR or KJIT_SCALE_LAYOUT_SWIZZLED_128X4 (got {}; no default)",
      static_cast<int>(l)));
}

Expected<DType> float_output(kjit_dtype t) {
  if (t == KJIT_DTYPE_BF16) return DType::bf16;
  if (t == KJIT_DTYPE_F16) return DType::f16;
  if (t == KJIT_DTYPE_F32) return DType::f32;
  return invalid(fmt::format("out_dtype must be KJIT_DTYPE_BF16, KJIT_DTYPE_F16 or KJIT_DTYPE_F32 (got {})",
                             static_cast<int>(t)));
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

const char* format_name(MxFormat format) {
  return format == MxFormat::nvfp4 ? "NVFP4" : format == MxFormat::mxfp4 ? "MXFP4" : "MXFP8";
}

// The widest access every row start allows: k, both strides, both addresses
// (bytes); 0 when none does.
int vector_for(const MxDequantPlan& plan, int64_t in_alignment, int64_t out_alignment) {
  const auto& s = plan.spec;
  const int out_bytes = codegen::size_bytes(s.out);
  return codegen::mx_dequant_vector(s.format, s.out, s.k, {plan.params.in_row_stride, in_alignment},
                                    {plan.params.out_row_stride, out_alignment / out_bytes});
}

Expected<int> vector_or_error(const MxDequantPlan& plan, int64_t in_alignment, int64_t out_alignment) {
  const int vec = vector_for(plan, in_alignment, out_alignment);
  if (vec == 0)
    return invalid(fmt::format("{} writes its elements in pairs: 'out' and out_row_stride ({}) must be aligned to two "
                               "elements",
                               format_name(plan.spec.format), plan.params.out_row_stride));
  return vec;
}

}  // namespace

Expected<MxDequantPlan> plan_mx_dequant_shapes(const kjit_mx_dequant_desc& d) {
  if (d.struct_size < sizeof(kjit_mx_dequant_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_mx_dequant_desc_init first",
                               d.struct_size, sizeof(kjit_mx_dequant_desc)));
  codegen::MxDequantSpec spec;
  spec.format = KJIT_TRY(block_format(d.format));
  const bool nvfp4 = spec.format == MxFormat::nvfp4;
  const char* format = format_name(spec.format);
  if (spec.format == MxFormat::mxfp8) {
    if (d.element_dtype == KJIT_DTYPE_F8_E4M3FN) spec.element = DType::f8_e4m3fn;
    else if (d.element_dtype == KJIT_DTYPE_F8_E5M2) spec.element = DType::f8_e5m2;
    else
      return invalid(fmt::format("element_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2 for MXFP8 (got {})",
                                 static_cast<int>(d.element_dtype)));
  } else if (d.element_dtype != KJIT_DTYPE_INVALID) {
    return invalid(fmt::format("element_dtype must be KJIT_DTYPE_INVALID for {}: its elements are e2m1 (got {})",
                               format, static_cast<int>(d.element_dtype)));
  }
  spec.out = KJIT_TRY(float_output(d.out_dtype));
  spec.k = d.k;
  spec.scale_layout = KJIT_TRY(scale_layout(d.scale_layout));
  if (nvfp4) {
    if (d.global_scale_convention == KJIT_SCALE_MULTIPLY) spec.convention = codegen::ScaleConvention::multiply;
    else if (d.global_scale_convention == KJIT_SCALE_DIVIDE) spec.convention = codegen::ScaleConvention::divide;
    else
      return invalid("global_scale_convention must be KJIT_SCALE_MULTIPLY or KJIT_SCALE_DIVIDE for NVFP4 (there is "
                     "no default: ModelOpt's weight_scale_2 is MULTIPLY, compressed-tensors' weight_global_scale is "
                     "DIVIDE)");
  } else {
    if (d.global_scale_convention != KJIT_SCALE_CONVENTION_UNSET)
      return invalid(fmt::format("global_scale_convention must be UNSET for {}: it has no global scale", format));
    if (d.global_scales != nullptr)
      return invalid(fmt::format("global_scales must be NULL for {}: it has no global scale", format));
  }
  if (d.num_expert_ids < 0) return invalid(fmt::format("num_expert_ids must be >= 0, got {}", d.num_expert_ids));
  spec.selected_experts = d.num_expert_ids > 0;

  // Run-time shapes and strides (not part of the spec).
  const int64_t block = codegen::mx_block(spec.format);
  if (d.k <= 0 || d.k % block != 0)
    return invalid(fmt::format("k must be a positive multiple of {} ({}'s block), got {}", block, format, d.k));
  if (d.experts < 1) return invalid(fmt::format("experts must be >= 1 (1 for a 2-D tensor), got {}", d.experts));
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  const int64_t row_bytes = codegen::is_fp4(spec.format) ? d.k / 2 : d.k;
  const int64_t in_stride = d.in_row_stride == 0 ? row_bytes : d.in_row_stride;
  const int64_t out_stride = d.out_row_stride == 0 ? d.k : d.out_row_stride;
  if (in_stride < row_bytes)
    return invalid(fmt::format("in_row_stride {} bytes is smaller than a row ({} bytes for k {})", d.in_row_stride,
                               row_bytes, d.k));
  if (out_stride < d.k)
    return invalid(fmt::format("out_row_stride {} is smaller than k {}", d.out_row_stride, d.k));

  MxDequantPlan plan;
  const int64_t slots = spec.selected_experts ? d.num_expert_ids : d.experts;
  plan.empty = d.rows == 0 || slots == 0;
  auto& p = plan.params;
  p.rows = d.rows;
  p.in_row_stride = in_stride;
  p.out_row_stride = out_stride;
  p.in_expert_stride = d.rows * in_stride;
  p.out_expert_stride = d.rows * out_stride;
  const int64_t scale_cols = d.k / block;
  p.scale_expert_stride = spec.scale_layout == MxScaleLayout::linear ? d.rows * scale_cols
                                                                     : round_up(d.rows, 128) * round_up(scale_cols, 4);
  p.experts = d.experts;
  p.output_slots = slots;
  // Validated at the widest width: a narrower one, which bind may pick, divides k too.
  plan.spec = spec;
  plan.spec.vec = KJIT_TRY(vector_or_error(plan, 16, 16));
  KJIT_TRY(codegen::validate(codegen::KernelSpec{plan.spec}));
  return plan;
}

Expected<MxDequantPlan> bind_mx_dequant(const kjit_mx_dequant_desc& d, MxDequantPlan plan) {
  if (plan.spec.format == MxFormat::nvfp4 && d.global_scales == nullptr)
    return invalid("'global_scales' is NULL: NVFP4 needs one fp32 global scale per expert");
  if ((d.expert_ids == nullptr) != (d.num_expert_ids == 0))
    return invalid(fmt::format("expert_ids and num_expert_ids go together (expert_ids {}, num_expert_ids {})",
                               d.expert_ids ? "set" : "NULL", d.num_expert_ids));
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.in, "in"}, {d.scales, "scales"}, {d.out, "out"}}));
    const int out_bytes = codegen::size_bytes(plan.spec.out);
    if (reinterpret_cast<uintptr_t>(d.out) % static_cast<uintptr_t>(out_bytes) != 0)
      return invalid(fmt::format("'out' is not aligned to its element size ({} bytes)", out_bytes));
    if (reinterpret_cast<uintptr_t>(d.global_scales) % alignof(float) != 0)
      return invalid("'global_scales' is not 4-byte aligned");
  }
  plan.spec.vec = KJIT_TRY(vector_or_error(plan, pointer_alignment(d.in), pointer_alignment(d.out)));
  auto& p = plan.params;
  p.in = static_cast<const unsigned char*>(d.in);
  p.scales = d.scales;
  p.global_scales = d.global_scales;
  p.out = d.out;
  p.expert_ids = d.expert_ids;
  plan.geometry = codegen::mx_dequant_geometry(plan.spec, p.rows, p.output_slots);
  return plan;
}

Expected<MxDequantPlan> plan_mx_dequant(const kjit_mx_dequant_desc& d) {
  return bind_mx_dequant(d, KJIT_TRY(plan_mx_dequant_shapes(d)));
}

std::vector<int> mx_dequant_vectors(const MxDequantPlan& plan) {
  return vector_widths(codegen::size_bytes(plan.spec.out), std::bind_front(vector_for, std::cref(plan)));
}

Expected<void> launch_mx_dequant(Runtime& runtime, MxDequantPlan& plan, CUstream stream) {
  if (plan.empty) return {};
  auto& p = plan.params;
  return launch_on_owning_device(runtime, plan.spec,
                                 {{p.in, "in"},
                                  {p.scales, "scales"},
                                  {p.global_scales, "global_scales"},
                                  {p.out, "out"},
                                  {p.expert_ids, "expert_ids"}},
                                 p.device_error, plan.geometry, &p, stream);
}

Expected<void> dequant_mx(Runtime& runtime, const kjit_mx_dequant_desc& desc, CUstream stream) {
  auto plan = KJIT_TRY(plan_mx_dequant(desc));
  return launch_mx_dequant(runtime, plan, stream);
}

Expected<void> prepare_dequant_mx(Runtime& runtime, const kjit_mx_dequant_desc& desc, int ordinal) {
  const auto plan = KJIT_TRY(plan_mx_dequant_shapes(desc));
  return prepare_each_width(runtime, plan.spec, mx_dequant_vectors(plan), ordinal);
}

}  // namespace kjit::ops
