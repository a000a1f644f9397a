// The grouped GEMM op.
#include "grouped_gemm.hpp"

#include "launch.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {

Expected<GroupedGemmPlan> plan_grouped_gemm(const kjit_grouped_gemm_desc& d, bool for_prepare) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  if (d.struct_size < sizeof(kjit_grouped_gemm_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_grouped_gemm_desc_init first",
                               d.struct_size, sizeof(kjit_grouped_gemm_desc)));
  if (d.a_dtype != KJIT_DTYPE_BF16 || d.b_dtype != KJIT_DTYPE_BF16)
    return invalid("grouped GEMM operands must be KJIT_DTYPE_BF16 (FP8 and FP4 grouped GEMMs are not there yet)");
  if (d.out_dtype != KJIT_DTYPE_BF16 && d.out_dtype != KJIT_DTYPE_F32)
    return invalid("grouped GEMM out_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F32");
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (d.n < 8 || d.n % 8 != 0) return invalid(fmt::format("N must be a positive multiple of 8, got {}", d.n));
  if (d.k < 8 || d.k % 8 != 0) return invalid(fmt::format("K must be a positive multiple of 8, got {}", d.k));
  if (d.experts < 1 || d.experts > 4096) return invalid(fmt::format("experts must be 1 to 4096, got {}", d.experts));
  if (d.weights != KJIT_WEIGHTS_E_N_K && d.weights != KJIT_WEIGHTS_E_K_N)
    return invalid("weights must be KJIT_WEIGHTS_E_N_K or KJIT_WEIGHTS_E_K_N (no default)");
  if (d.offsets_convention != KJIT_OFFSETS_CUMULATIVE_END && d.offsets_convention != KJIT_OFFSETS_WITH_LEADING_ZERO)
    return invalid("offsets_convention must be KJIT_OFFSETS_CUMULATIVE_END (E ends, as torch._grouped_mm) or "
                   "KJIT_OFFSETS_WITH_LEADING_ZERO (E + 1 entries); there is no default");

  GroupedGemmPlan plan;
  auto& s = plan.spec;
  s.out = d.out_dtype == KJIT_DTYPE_F32 ? codegen::DType::f32 : codegen::DType::bf16;
  s.n = d.n;
  s.k = d.k;
  s.experts = d.experts;
  s.weights = d.weights == KJIT_WEIGHTS_E_K_N ? codegen::WeightLayout::e_k_n : codegen::WeightLayout::e_n_k;
  s.offsets = d.offsets_convention == KJIT_OFFSETS_WITH_LEADING_ZERO ? codegen::OffsetsConvention::with_leading_zero
                                                                     : codegen::OffsetsConvention::cumulative_end;
  s.row_scale = d.row_scale != nullptr;
  codegen::set_grouped_gemm_tile(s);
  plan.empty = d.rows == 0;

  if (!for_prepare && !plan.empty) {
    if (auto ok = require_non_null({{d.a, "a"}, {d.b, "b"}, {d.out, "out"}, {d.offsets, "offsets"}}); !ok)
      return std::unexpected(ok.error());
    // 16-byte accesses need 16-byte aligned rows; N and K divisible by 8 keep them so.
    for (const auto& [pointer, name] : {std::pair{d.a, "a"}, std::pair{d.b, "b"}, std::pair<const void*, const char*>{d.out, "out"}})
      if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) return invalid(fmt::format("'{}' is not 16-byte aligned", name));
    if (reinterpret_cast<uintptr_t>(d.offsets) % 4 != 0 || reinterpret_cast<uintptr_t>(d.row_scale) % 4 != 0)
      return invalid("'offsets' and 'row_scale' must be 4-byte aligned");
  }
  auto& p = plan.params;
  p.a = d.a;
  p.b = d.b;
  p.out = d.out;
  p.offsets = d.offsets;
  p.row_scale = d.row_scale;
  p.total_rows = d.rows;
  plan.geometry = codegen::grouped_gemm_geometry(s, d.rows);
  return plan;
}

Expected<void> launch_grouped_gemm(Runtime& runtime, GroupedGemmPlan& plan, CUstream stream) {
  if (plan.empty) return {};
  auto& p = plan.params;
  return launch_on_owning_device(
      runtime, plan.spec, {{p.a, "a"}, {p.b, "b"}, {p.out, "out"}, {p.offsets, "offsets"}, {p.row_scale, "row_scale"}},
      p.device_error, plan.geometry, &p, stream);
}

Expected<void> grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream) {
  auto plan = plan_grouped_gemm(desc, false);
  if (!plan) return std::unexpected(plan.error());
  return launch_grouped_gemm(runtime, *plan, stream);
}

Expected<void> prepare_grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int ordinal) {
  auto plan = plan_grouped_gemm(desc, true);
  if (!plan) return std::unexpected(plan.error());
  return prepare_on_device(runtime, plan->spec, ordinal);
}

}  // namespace kjit::ops
