// The grouped weight-gradient GEMM op.
#include "kjit/internal/ops/grouped_gemm_wgrad.hpp"

#include "launch.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

Expected<GroupedGemmWgradPlan> plan_grouped_gemm_wgrad(const kjit_grouped_gemm_wgrad_desc& d, bool for_prepare) {
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
  if (d.kernel != KJIT_GEMM_KERNEL_AUTO && d.kernel != KJIT_GEMM_KERNEL_PORTABLE)
    return invalid(fmt::format("grouped_gemm_wgrad kernel must be KJIT_GEMM_KERNEL_AUTO or _PORTABLE (the mma.sync "
                               "kernel; there is no other yet), got {}",
                               static_cast<int>(d.kernel)));
  problem.n = d.n;
  problem.k = d.k;
  problem.experts = d.experts;
  // The spec's invariants (N, K multiples of 8, the expert count) are codegen's to check.
  KJIT_TRY(codegen::validate(codegen::KernelSpec{problem}));
  plan.spec = codegen::grouped_gemm_wgrad_config(problem);

  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (!for_prepare) {
    KJIT_TRY(require_non_null({{d.out, "out"}, {d.offsets, "offsets"}}));
    // With no rows dy and x are never read.
    if (d.rows > 0) KJIT_TRY(require_non_null({{d.dy, "dy"}, {d.x, "x"}}));
    // 16-byte copies and paired stores; N and K divisible by 8 keep every row aligned.
    for (const auto& [pointer, name] : {std::pair{d.dy, "dy"}, std::pair{d.x, "x"},
                                        std::pair<const void*, const char*>{d.out, "out"}})
      if (!aligned(pointer, 16)) return invalid(fmt::format("'{}' is not 16-byte aligned", name));
    if (!aligned(d.offsets, alignof(int32_t))) return invalid("'offsets' must be 4-byte aligned");
  }

  auto& p = plan.params;
  p.dy = d.dy;
  p.x = d.x;
  p.out = d.out;
  p.offsets = d.offsets;
  p.total_rows = d.rows;
  plan.geometry = codegen::grouped_gemm_wgrad_geometry(plan.spec);
  return plan;
}

Expected<void> grouped_gemm_wgrad(Runtime& runtime, const kjit_grouped_gemm_wgrad_desc& d, CUstream stream) {
  auto plan = KJIT_TRY(plan_grouped_gemm_wgrad(d, false));
  // NULL dy and x (rows = 0) are skipped by the device check.
  return launch_on_owning_device(runtime, plan.spec,
                                 {{d.dy, "dy"}, {d.x, "x"}, {d.out, "out"}, {d.offsets, "offsets"}},
                                 plan.params.device_error, plan.geometry, &plan.params, stream);
}

Expected<void> prepare_grouped_gemm_wgrad(Runtime& runtime, const kjit_grouped_gemm_wgrad_desc& d, int device) {
  const auto plan = KJIT_TRY(plan_grouped_gemm_wgrad(d, true));
  return prepare_on_device(runtime, plan.spec, device);
}

}  // namespace kjit::ops
