// The grouped weight-gradient GEMM op.
#include "kjit/internal/ops/grouped_gemm_wgrad.hpp"

#include "launch.hpp"

#include <climits>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

Expected<GroupedGemmWgradPlan> plan_grouped_gemm_wgrad_shapes(const kjit_grouped_gemm_wgrad_desc& d) {
  if (d.struct_size < sizeof(kjit_grouped_gemm_wgrad_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_grouped_gemm_wgrad_desc_init first",
                               d.struct_size, sizeof(kjit_grouped_gemm_wgrad_desc)));
  if (d.dy_dtype != KJIT_DTYPE_BF16)
    return invalid(fmt::format("grouped_gemm_wgrad dy_dtype must be KJIT_DTYPE_BF16 (got {})",
                               static_cast<int>(d.dy_dtype)));
  if (d.x_dtype != KJIT_DTYPE_BF16)
    return invalid(
        fmt::format("grouped_gemm_wgrad x_dtype must be KJIT_DTYPE_BF16 (got {})", static_cast<int>(d.x_dtype)));
  GroupedGemmWgradPlan plan;
  codegen::GroupedGemmWgradSpec problem;
  if (d.out_dtype == KJIT_DTYPE_F32) problem.out = codegen::DType::f32;
  else if (d.out_dtype == KJIT_DTYPE_BF16) problem.out = codegen::DType::bf16;
  else
    return invalid(fmt::format("grouped_gemm_wgrad out_dtype must be KJIT_DTYPE_F32 or KJIT_DTYPE_BF16 (got {})",
                               static_cast<int>(d.out_dtype)));
  if (d.offsets_convention == KJIT_OFFSETS_CUMULATIVE_END) problem.offsets = codegen::OffsetsConvention::cumulative_end;
  else if (d.offsets_convention == KJIT_OFFSETS_WITH_LEADING_ZERO)
    problem.offsets = codegen::OffsetsConvention::with_leading_zero;
  else
    return invalid(fmt::format("offsets_convention must be KJIT_OFFSETS_CUMULATIVE_END (E ends) or "
                               "KJIT_OFFSETS_WITH_LEADING_ZERO (E + 1 entries), got {}; there is no default",
                               static_cast<int>(d.offsets_convention)));
  using Kernel = codegen::GemmRequest::Kernel;
  if (d.kernel == KJIT_GEMM_KERNEL_AUTO) plan.request = Kernel::arch_default;
  else if (d.kernel == KJIT_GEMM_KERNEL_PORTABLE) plan.request = Kernel::portable;
  else if (d.kernel == KJIT_GEMM_KERNEL_SM90) plan.request = Kernel::sm90;
  else
    return invalid(fmt::format("grouped_gemm_wgrad kernel must be KJIT_GEMM_KERNEL_AUTO, _PORTABLE (the mma.sync "
                               "kernel) or _SM90 (the wgmma kernel), got {}",
                               static_cast<int>(d.kernel)));
  problem.n = d.n;
  problem.k = d.k;
  problem.experts = d.experts;
  // The spec's invariants (N, K multiples of 8, the expert count) are codegen's to check.
  KJIT_TRY(codegen::validate(codegen::KernelSpec{problem}));
  plan.problem = problem;

  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  // The wgmma kernel's TMA coordinates are int32 rows.
  if (d.rows > INT32_MAX) return invalid(fmt::format("rows must be at most {}, got {}", INT32_MAX, d.rows));
  plan.params.total_rows = d.rows;
  return plan;
}

Expected<GroupedGemmWgradPlan> bind_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc& d,
                                                       GroupedGemmWgradPlan plan) {
  KJIT_TRY(require_non_null({{d.out, "out"}, {d.offsets, "offsets"}}));
  // With no rows dy and x are never read.
  if (d.rows > 0) KJIT_TRY(require_non_null({{d.dy, "dy"}, {d.x, "x"}}));
  // 16-byte copies and paired stores; N and K divisible by 8 keep every row aligned.
  for (const auto& [pointer, name] :
       {std::pair{d.dy, "dy"}, std::pair{d.x, "x"}, std::pair<const void*, const char*>{d.out, "out"}})
    if (!aligned(pointer, 16)) return invalid(fmt::format("'{}' is not 16-byte aligned", name));
  if (!aligned(d.offsets, alignof(int32_t))) return invalid("'offsets' must be 4-byte aligned");
  auto& p = plan.params;
  p.dy = d.dy;
  p.x = d.x;
  p.out = d.out;
  p.offsets = d.offsets;
  p.experts = static_cast<int>(d.experts);  // validated: 1 to kMaxExperts
  return plan;
}

Expected<GroupedGemmWgradPlan> plan_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc& d) {
  return bind_grouped_gemm_wgrad(d, KJIT_TRY(plan_grouped_gemm_wgrad_shapes(d)));
}

namespace {

// dy and x as 2-D row-major views of all rows, boxes of 64 columns x 64 rows.
// With no rows nothing is read (every expert is empty), but a map needs an
// address and a row: out's first row stands in.
Expected<void> encode_wgrad_maps(const DriverApi& api, const codegen::GroupedGemmWgradSpec& s,
                                 kjit_grouped_gemm_wgrad_sm90_params& p) {
  const auto rows = static_cast<cuuint64_t>(p.wgrad.total_rows > 0 ? p.wgrad.total_rows : 1);
  const cuuint32_t box[2] = {KJIT_SM90_K_BLOCK, KJIT_SM90_K_BLOCK};
  const auto encode = [&](kjit_tensor_map& map, const void* base, int64_t columns, const char* what) {
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(columns), rows};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(columns) * 2};
    return encode_tensor_map(api, map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                             p.wgrad.total_rows > 0 ? base : p.wgrad.out, 2, dims, strides, box, what);
  };
  KJIT_TRY(encode(p.dy_map, p.wgrad.dy, s.n, "dy"));
  return encode(p.x_map, p.wgrad.x, s.k, "x");
}

}  // namespace

Expected<void> grouped_gemm_wgrad(Runtime& runtime, const kjit_grouped_gemm_wgrad_desc& d, CUstream stream) {
  auto plan = KJIT_TRY(plan_grouped_gemm_wgrad(d));
  auto& p = plan.params;
  // NULL dy and x (rows = 0) are skipped by the device check.
  DeviceState* device =
      KJIT_TRY(owning_device_for(runtime, {{d.dy, "dy"}, {d.x, "x"}, {d.out, "out"}, {d.offsets, "offsets"}}));
  const auto spec = KJIT_TRY(codegen::grouped_gemm_wgrad_config(plan.problem, *device->arch, plan.request));
  const LoadedKernel* kernel = KJIT_TRY(launchable_kernel(runtime, *device, spec, stream));
  const auto geometry = codegen::grouped_gemm_wgrad_geometry(spec, kernel->resident_blocks);
  if (spec.kernel != codegen::GemmKernel::wgmma_sm90)
    return launch_kernel(runtime, *device, *kernel, p.device_error, geometry, &p, stream);

  kjit_grouped_gemm_wgrad_sm90_params sm90{};
  sm90.wgrad = p;
  {
    // Encoding needs a current context (a bare thread, as in jitctl, has none).
    const DriverApi& api = **runtime.driver();
    ScopedContext scope(api, device->context);
    KJIT_TRY(scope.status());
    KJIT_TRY(encode_wgrad_maps(api, spec, sm90));
  }
  return launch_kernel(runtime, *device, *kernel, sm90.wgrad.device_error, geometry, &sm90, stream);
}

Expected<void> prepare_grouped_gemm_wgrad(Runtime& runtime, const kjit_grouped_gemm_wgrad_desc& d, int ordinal) {
  // Its kernel does not depend on the pointers (they must be 16-byte aligned).
  const auto plan = KJIT_TRY(plan_grouped_gemm_wgrad_shapes(d));
  DeviceState* device = KJIT_TRY(runtime.device(ordinal));
  const auto spec = KJIT_TRY(codegen::grouped_gemm_wgrad_config(plan.problem, *device->arch, plan.request));
  return prepare_on_device(runtime, spec, ordinal);
}

}  // namespace kjit::ops
