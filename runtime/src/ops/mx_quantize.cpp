// The MX quantize op (NVFP4, MXFP4, MXFP8).
#include "kjit/internal/ops/mx_quantize.hpp"

#include "launch.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// grid y carries the expert.
constexpr int64_t kMaxExpertsPerLaunch = 65535;

Expected<codegen::MxFormat> format_of(kjit_block_format f) {
  switch (f) {
    case KJIT_BLOCK_FORMAT_NVFP4: return codegen::MxFormat::nvfp4;
    case KJIT_BLOCK_FORMAT_MXFP4: return codegen::MxFormat::mxfp4;
    case KJIT_BLOCK_FORMAT_MXFP8: return codegen::MxFormat::mxfp8;
    default:
      return invalid(fmt::format("format must be KJIT_BLOCK_FORMAT_NVFP4, _MXFP4 or _MXFP8 (got {}; there is no "
                                 "default)",
                                 static_cast<int>(f)));
  }
}

}  // namespace

Expected<MxQuantizePlan> plan_mx_quantize_shapes(const kjit_mx_quantize_desc& d) {
  if (d.struct_size < sizeof(kjit_mx_quantize_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_mx_quantize_desc_init first",
                               d.struct_size, sizeof(kjit_mx_quantize_desc)));
  if (d.in_dtype != KJIT_DTYPE_BF16)
    return invalid(fmt::format("mx_quantize in_dtype must be KJIT_DTYPE_BF16 (got {})", static_cast<int>(d.in_dtype)));
  // The descriptor -> the spec; the spec's invariants are codegen's to check.
  MxQuantizePlan plan;
  auto& spec = plan.spec;
  spec.format = KJIT_TRY(format_of(d.format));
  const bool nvfp4 = spec.format == codegen::MxFormat::nvfp4;
  if (spec.format == codegen::MxFormat::mxfp8) {
    if (d.element_dtype == KJIT_DTYPE_F8_E4M3FN) spec.element = codegen::MxElement::f8_e4m3fn;
    else if (d.element_dtype == KJIT_DTYPE_F8_E5M2) spec.element = codegen::MxElement::f8_e5m2;
    else
      return invalid(fmt::format("MXFP8 element_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2 (got {})",
                                 static_cast<int>(d.element_dtype)));
  } else if (d.element_dtype != KJIT_DTYPE_INVALID) {
    return invalid(fmt::format("{} elements are e2m1: leave element_dtype KJIT_DTYPE_INVALID (got {})",
                               nvfp4 ? "NVFP4" : "MXFP4", static_cast<int>(d.element_dtype)));
  }
  if (d.scale_layout == KJIT_SCALE_LAYOUT_LINEAR) spec.scale_layout = codegen::MxScaleLayout::linear;
  else if (d.scale_layout == KJIT_SCALE_LAYOUT_SWIZZLED_128X4)
    spec.scale_layout = codegen::MxScaleLayout::swizzled_128x4;
  else
    return invalid(fmt::format("scale_layout must be KJIT_SCALE_LAYOUT_LINEAR or KJIT_SCALE_LAYOUT_SWIZZLED_128X4 "
                               "(got {}; there is no default)",
                               static_cast<int>(d.scale_layout)));
  if (nvfp4) {
    if (d.global_scale_mode == KJIT_GLOBAL_SCALE_GIVEN) spec.global_scale = codegen::GlobalScaleMode::given;
    else if (d.global_scale_mode == KJIT_GLOBAL_SCALE_COMPUTE) spec.global_scale = codegen::GlobalScaleMode::compute;
    else
      return invalid(fmt::format("NVFP4 global_scale_mode must be KJIT_GLOBAL_SCALE_GIVEN or KJIT_GLOBAL_SCALE_COMPUTE "
                                 "(got {}; there is no default)",
                                 static_cast<int>(d.global_scale_mode)));
    if (d.global_scale_convention == KJIT_SCALE_MULTIPLY) spec.convention = codegen::ScaleConvention::multiply;
    else if (d.global_scale_convention == KJIT_SCALE_DIVIDE) spec.convention = codegen::ScaleConvention::divide;
    else
      return invalid(fmt::format("NVFP4 global_scale_convention must be KJIT_SCALE_MULTIPLY (ModelOpt weight_scale_2) "
                                 "or KJIT_SCALE_DIVIDE (compressed-tensors global_scale) (got {}; there is no default)",
                                 static_cast<int>(d.global_scale_convention)));
  } else {
    spec.global_scale = codegen::GlobalScaleMode::none;
    if (d.global_scale_mode != KJIT_GLOBAL_SCALE_UNSET || d.global_scale_convention != KJIT_SCALE_CONVENTION_UNSET ||
        d.global_scales != nullptr)
      return invalid("MXFP4 and MXFP8 have no global scale: leave global_scales NULL, global_scale_mode "
                     "KJIT_GLOBAL_SCALE_UNSET and global_scale_convention KJIT_SCALE_CONVENTION_UNSET");
  }
  spec.k = d.k;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{spec}));

  // Run-time shapes (not part of the spec).
  if (d.experts < 1 || d.experts > kMaxExpertsPerLaunch)
    return invalid(
        fmt::format("experts must be 1 to {} (1 for a 2-D tensor), got {}", kMaxExpertsPerLaunch, d.experts));
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (d.rows > codegen::mx_quantize_max_rows(spec))
    return invalid(fmt::format("rows {} exceed the {} one launch takes at K {}", d.rows,
                               codegen::mx_quantize_max_rows(spec), d.k));
  const int64_t in_stride = d.in_row_stride == 0 ? d.k : d.in_row_stride;
  if (in_stride < d.k || in_stride % 8 != 0)
    return invalid(fmt::format("in_row_stride {} must be 0 (= k) or a multiple of 8 that is >= k = {} (16-byte rows)",
                               d.in_row_stride, d.k));
  // Every byte offset the kernel forms stays below 2^62.
  if (d.rows > 0 && in_stride > (int64_t{1} << 61) / (d.experts * d.rows))
    return invalid(fmt::format("experts * rows * in_row_stride ({} * {} * {}) is too large", d.experts, d.rows,
                               in_stride));
  plan.empty = d.rows == 0;
  auto& p = plan.params;
  p.experts = d.experts;
  p.rows = d.rows;
  p.in_row_stride = in_stride;
  p.phase = KJIT_MX_QUANTIZE_PHASE_QUANTIZE;
  return plan;
}

Expected<MxQuantizePlan> bind_mx_quantize(const kjit_mx_quantize_desc& d, MxQuantizePlan plan) {
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.in, "in"}, {d.out, "out"}, {d.scales, "scales"}}));
    if (plan.spec.format == codegen::MxFormat::nvfp4) KJIT_TRY(require_non_null({{d.global_scales, "global_scales"}}));
    if (!aligned(d.in, 16)) return invalid("'in' must be 16-byte aligned");
    const uintptr_t out_alignment = plan.spec.format == codegen::MxFormat::mxfp8 ? 8 : 4;
    if (!aligned(d.out, out_alignment)) return invalid(fmt::format("'out' must be {}-byte aligned", out_alignment));
    if (!aligned(d.global_scales, alignof(float))) return invalid("'global_scales' is not 4-byte aligned");
  }
  auto& p = plan.params;
  p.in = d.in;
  p.out = static_cast<unsigned char*>(d.out);
  p.scales = d.scales;
  p.global_scales = d.global_scales;
  return plan;
}

Expected<MxQuantizePlan> plan_mx_quantize(const kjit_mx_quantize_desc& d) {
  return bind_mx_quantize(d, KJIT_TRY(plan_mx_quantize_shapes(d)));
}

Expected<void> mx_quantize(Runtime& runtime, const kjit_mx_quantize_desc& d, CUstream stream) {
  auto plan = KJIT_TRY(plan_mx_quantize(d));
  if (plan.empty) return {};
  auto& p = plan.params;
  DeviceState* device = KJIT_TRY(owning_device_for(runtime, {{d.in, "in"},
                                                              {d.out, "out"},
                                                              {d.scales, "scales"},
                                                              {d.global_scales, "global_scales"}}));
  const LoadedKernel* kernel = KJIT_TRY(launchable_kernel(runtime, *device, plan.spec, stream));
  const auto grid = codegen::mx_quantize_geometry(plan.spec, p.experts, p.rows, false);
  if (plan.spec.global_scale == codegen::GlobalScaleMode::compute) {
    // The amax pass atomically maxes into global_scales, so it starts from 0
    // (a memset node when the stream captures); finalize turns amax into the
    // global scale in place before the quantize pass reads it.
    {
      const DriverApi& api = **runtime.driver();
      ScopedContext scope(api, device->context);
      KJIT_TRY(scope.status());
      KJIT_TRY(check(api,
                     api.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(p.global_scales), 0,
                                          static_cast<size_t>(p.experts), stream),
                     "cuMemsetD32Async"));
    }
    p.phase = KJIT_MX_QUANTIZE_PHASE_AMAX;
    KJIT_TRY(launch_kernel(runtime, *device, *kernel, p.device_error, grid, &p, stream));
    p.phase = KJIT_MX_QUANTIZE_PHASE_FINALIZE;
    KJIT_TRY(launch_kernel(runtime, *device, *kernel, p.device_error,
                           codegen::mx_quantize_geometry(plan.spec, p.experts, p.rows, true), &p, stream));
    p.phase = KJIT_MX_QUANTIZE_PHASE_QUANTIZE;
  }
  return launch_kernel(runtime, *device, *kernel, p.device_error, grid, &p, stream);
}

Expected<void> prepare_mx_quantize(Runtime& runtime, const kjit_mx_quantize_desc& d, int device) {
  // Its kernel does not depend on the pointers' alignment (each has one that is required).
  const auto plan = KJIT_TRY(plan_mx_quantize_shapes(d));
  return prepare_on_device(runtime, plan.spec, device);
}

}  // namespace kjit::ops
