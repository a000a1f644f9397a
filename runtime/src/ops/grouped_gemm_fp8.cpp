// The FP8 (W8A8) grouped GEMM op: kjit_grouped_gemm with e4m3 operands.
#include "kjit/internal/ops/grouped_gemm.hpp"

#include "launch.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

// The operand types: e4m3fn both, or a clear word about what is not there.
Expected<void> check_fp8_operands(const kjit_grouped_gemm_desc& d) {
  const bool a_fp8 = d.a_dtype == KJIT_DTYPE_F8_E4M3FN || d.a_dtype == KJIT_DTYPE_F8_E5M2;
  const bool b_fp8 = d.b_dtype == KJIT_DTYPE_F8_E4M3FN || d.b_dtype == KJIT_DTYPE_F8_E5M2;
  if (a_fp8 != b_fp8)
    return fail(KJIT_ERROR_UNSUPPORTED,
                b_fp8 ? "FP8 weights take bf16 activations (W8A16: a_dtype KJIT_DTYPE_BF16) or e4m3fn ones (W8A8)"
                      : "FP8 activations need FP8 weights (a_dtype and b_dtype both KJIT_DTYPE_F8_E4M3FN)");
  if (d.a_dtype != KJIT_DTYPE_F8_E4M3FN || d.b_dtype != KJIT_DTYPE_F8_E4M3FN)
    return fail(KJIT_ERROR_UNSUPPORTED, "the W8A8 grouped GEMM takes e4m3fn operands only (a_dtype and b_dtype "
                                        "KJIT_DTYPE_F8_E4M3FN), not e5m2");
  if (d.b_scale_convention != KJIT_SCALE_CONVENTION_UNSET && d.b_scale_convention != KJIT_SCALE_MULTIPLY)
    return fail(KJIT_ERROR_UNSUPPORTED, "the W8A8 grouped GEMM's scales are fp32 multipliers: b_scale_convention must "
                                        "be KJIT_SCALE_MULTIPLY (or left UNSET)");
  if (d.weights != KJIT_WEIGHTS_E_N_K)
    return fail(KJIT_ERROR_UNSUPPORTED,
                "FP8 weights must be KJIT_WEIGHTS_E_N_K ([E, N, K], as checkpoints store them): 8-bit tensor-core "
                "operands are read K-major");
  return {};
}

Expected<codegen::Fp8WeightScale> weight_scale_of(const kjit_grouped_gemm_desc& d) {
  switch (d.b_scale_granularity) {
    case KJIT_SCALE_PER_BLOCK:
      if (d.b_block_rows != 128 || d.b_block_cols != 128)
        return invalid(fmt::format("b_scales per block must be of 128 x 128 weights (b_block_rows, b_block_cols), "
                                   "got {} x {}: the FP8 grouped GEMM has no other block",
                                   d.b_block_rows, d.b_block_cols));
      return codegen::Fp8WeightScale::block_128;
    case KJIT_SCALE_PER_ROW:
      if (d.b_block_rows != 0 || d.b_block_cols != 0)
        return invalid(fmt::format("b_block_rows and b_block_cols are for KJIT_SCALE_PER_BLOCK; per-channel (PER_ROW) "
                                   "scales need 0 x 0, got {} x {}",
                                   d.b_block_rows, d.b_block_cols));
      return codegen::Fp8WeightScale::channel;
    case KJIT_SCALE_PER_TENSOR:
      return fail(KJIT_ERROR_UNSUPPORTED,
                  "per-tensor weight scales are not a variant of the FP8 grouped GEMM: pass them per channel "
                  "(KJIT_SCALE_PER_ROW, each expert's scale repeated over its N rows)");
    default:
      return invalid(fmt::format("b_scale_granularity must be KJIT_SCALE_PER_BLOCK (128 x 128) or KJIT_SCALE_PER_ROW "
                                 "(per output channel); there is no default, got {}",
                                 static_cast<int>(d.b_scale_granularity)));
  }
}

// A's and B's TMA descriptors over bytes: A [rows, K] in boxes of 128 codes
// x 32 rows (rows on M: 64, a consumer warpgroup's; the wgmma decode kernel:
// tile_m, its chunk of an expert's rows) and x 128 (the wide box), B [E, N,
// K] in boxes of 128 codes x tile_n rows (the decode kernel: 64, a
// warpgroup's): each box row one 128-byte swizzle row.
Expected<void> encode_fp8_maps(const DriverApi& api, const codegen::GroupedGemmFp8Spec& s,
                               kjit_grouped_gemm_sm90_params& p) {
  constexpr CUtensorMapDataType kBytes = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const auto k = static_cast<cuuint64_t>(s.k), n = static_cast<cuuint64_t>(s.n);
  const cuuint64_t a_dims[2] = {k, static_cast<cuuint64_t>(p.gemm.total_rows)};
  const cuuint64_t a_strides[1] = {k};
  const cuuint32_t a_rows = s.kernel == codegen::Fp8GemmKernel::wgmma_sm90_rows_on_m ? KJIT_FP8_ROWS_ON_M_ROW_BOX
                             : s.kernel == codegen::Fp8GemmKernel::wgmma_decode ? static_cast<cuuint32_t>(s.tile_m)
                                                                                 : KJIT_SWAP_AB_ROW_BOX;
  const cuuint32_t a_box[2] = {KJIT_FP8_SCALE_BLOCK, a_rows};
  const cuuint32_t wide_box[2] = {KJIT_FP8_SCALE_BLOCK, KJIT_SWAP_AB_WIDE_ROW_BOX};
  KJIT_TRY(encode_tensor_map(api, p.a_map, kBytes, p.gemm.a, 2, a_dims, a_strides, a_box, "A"));
  if (codegen::is_sm90(s.kernel))  // (the decode kernel's row boxes are its chunks: no wide box)
    KJIT_TRY(encode_tensor_map(api, p.a_wide_map, kBytes, p.gemm.a, 2, a_dims, a_strides, wide_box, "A"));
  const cuuint64_t b_dims[3] = {k, n, static_cast<cuuint64_t>(s.experts)};
  const cuuint64_t b_strides[2] = {k, n * k};
  // (The decode kernel's warpgroups each copy their own 64 of the block's tile_n weight rows.)
  const cuuint32_t b_rows = s.kernel == codegen::Fp8GemmKernel::wgmma_decode ? 64 : static_cast<cuuint32_t>(s.tile_n);
  const cuuint32_t b_box[3] = {KJIT_FP8_SCALE_BLOCK, b_rows, 1};
  return encode_tensor_map(api, p.b_map, kBytes, p.gemm.b, 3, b_dims, b_strides, b_box, "B [E, N, K]");
}

}  // namespace

Expected<GroupedGemmFp8Plan> plan_grouped_gemm_fp8_shapes(const kjit_grouped_gemm_desc& d) {
  auto common = KJIT_TRY(plan_gemm_common_shapes(d));
  KJIT_TRY(check_fp8_operands(d));
  GroupedGemmFp8Plan plan;
  plan.request = common.request;
  plan.empty = common.empty;
  auto& s = plan.problem;
  s.out = common.out;
  s.n = d.n;
  s.k = d.k;
  s.experts = d.experts;
  s.weight_scale = KJIT_TRY(weight_scale_of(d));
  s.offsets = common.offsets;
  s.row_scale = d.row_scale != nullptr;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{s}));
  plan.params.gemm = common.params;
  return plan;
}

Expected<void> bind_grouped_gemm_fp8(const kjit_grouped_gemm_desc& d, GroupedGemmFp8Plan& plan) {
  KJIT_TRY(bind_gemm_common(d, plan.empty, plan.params.gemm));
  if (!plan.empty) {
    KJIT_TRY(require_non_null({{d.a_scales, "a_scales"}, {d.b_scales, "b_scales"}}));
    if (reinterpret_cast<uintptr_t>(d.a_scales) % 4 != 0 || reinterpret_cast<uintptr_t>(d.b_scales) % 4 != 0)
      return invalid("'a_scales' and 'b_scales' must be 4-byte aligned (fp32)");
  }
  plan.params.scales = {d.a_scales, d.b_scales};
  return {};
}

Expected<void> grouped_gemm_fp8(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream) {
  auto plan = KJIT_TRY(plan_grouped_gemm_fp8_shapes(desc));
  KJIT_TRY(bind_grouped_gemm_fp8(desc, plan));
  if (plan.empty) return {};
  auto& p = plan.params;
  DeviceState* device = KJIT_TRY(owning_device_for(runtime, {{p.gemm.a, "a"},
                                                              {p.gemm.b, "b"},
                                                              {p.gemm.out, "out"},
                                                              {p.gemm.offsets, "offsets"},
                                                              {p.gemm.row_scale, "row_scale"},
                                                              {p.scales.a, "a_scales"},
                                                              {p.scales.b, "b_scales"},
                                                              {p.gemm.tile_counter, "workspace"}}));
  const auto spec =
      KJIT_TRY(codegen::choose_grouped_gemm_fp8_config(plan.problem, *device->arch, p.gemm.total_rows, plan.request));
  const LoadedKernel* kernel = KJIT_TRY(launchable_kernel(runtime, *device, spec, stream));
  const auto geometry = codegen::grouped_gemm_fp8_geometry(spec, p.gemm.total_rows, kernel->resident_blocks);
  if (!codegen::uses_tma_maps(spec.kernel))
    return launch_kernel(runtime, *device, *kernel, p.gemm.device_error, geometry, &p, stream);

  kjit_grouped_gemm_fp8_sm90_params sm90{};
  sm90.sm90.gemm = p.gemm;
  sm90.scales = p.scales;
  {
    // Encoding needs a current context (a bare thread, as in jitctl, has none).
    const DriverApi& api = **runtime.driver();
    ScopedContext scope(api, device->context);
    KJIT_TRY(scope.status());
    KJIT_TRY(encode_fp8_maps(api, spec, sm90.sm90));
    // (The decode kernel's blocks find their pairs from the offsets: no tile queue.)
    if (sm90.sm90.gemm.tile_counter != nullptr && codegen::is_sm90(spec.kernel))
      KJIT_TRY(zero_tile_counter(api, sm90.sm90.gemm.tile_counter, stream));
  }
  return launch_kernel(runtime, *device, *kernel, sm90.sm90.gemm.device_error, geometry, &sm90, stream);
}

Expected<void> prepare_grouped_gemm_fp8(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int ordinal) {
  // Its kernels do not depend on the pointers (they must be 16-byte aligned).
  const auto plan = KJIT_TRY(plan_grouped_gemm_fp8_shapes(desc));
  DeviceState* device = KJIT_TRY(runtime.device(ordinal));
  const auto configs = KJIT_TRY(codegen::grouped_gemm_fp8_candidates(plan.problem, *device->arch, plan.request));
  for (const auto& config : configs) KJIT_TRY(prepare_on_device(runtime, config, ordinal));
  return {};
}

}  // namespace kjit::ops
