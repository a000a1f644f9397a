// The mixed-input (W8A16, W4A16) grouped GEMM op: kjit_grouped_gemm with fp8
// or FP4 weights and bf16 activations.
#include "kjit/internal/ops/grouped_gemm.hpp"

#include "launch.hpp"

#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {
namespace {

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

Expected<codegen::ScaleGranularity> weight_scale_of(const kjit_grouped_gemm_desc& d) {
  const bool block_given = d.b_block_rows != 0 || d.b_block_cols != 0;
  switch (d.b_scale_granularity) {
    case KJIT_SCALE_PER_BLOCK:
      if (d.b_block_rows != KJIT_MIXED_SCALE_BLOCK || d.b_block_cols != KJIT_MIXED_SCALE_BLOCK)
        return invalid(fmt::format("W8A16 b_scales per block must be of 128 x 128 stored weights (b_block_rows, "
                                   "b_block_cols), got {} x {}: the kernels have no other block",
                                   d.b_block_rows, d.b_block_cols));
      return codegen::ScaleGranularity::per_block;
    case KJIT_SCALE_PER_ROW:
    case KJIT_SCALE_PER_TENSOR:
      if (block_given)
        return invalid(fmt::format("b_block_rows and b_block_cols are for KJIT_SCALE_PER_BLOCK; per-row and "
                                   "per-tensor scales need 0 x 0, got {} x {}",
                                   d.b_block_rows, d.b_block_cols));
      return d.b_scale_granularity == KJIT_SCALE_PER_ROW ? codegen::ScaleGranularity::per_row
                                                         : codegen::ScaleGranularity::per_tensor;
    default:
      return invalid(fmt::format("b_scale_granularity must be KJIT_SCALE_PER_BLOCK (128 x 128), _PER_ROW or "
                                 "_PER_TENSOR for FP8 weights; there is no default, got {}",
                                 static_cast<int>(d.b_scale_granularity)));
  }
}

// The FP4 fields of the descriptor: the weights' scale bytes, NVFP4's global
// scales and their convention.
Expected<codegen::MixedWeight> fp4_weight_of(const kjit_grouped_gemm_desc& d) {
  if (d.b_format != KJIT_BLOCK_FORMAT_NVFP4 && d.b_format != KJIT_BLOCK_FORMAT_MXFP4)
    return invalid(fmt::format("W4A16 (b_dtype KJIT_DTYPE_F4_E2M1) needs b_format KJIT_BLOCK_FORMAT_NVFP4 or "
                               "_MXFP4; there is no default, got {}",
                               static_cast<int>(d.b_format)));
  const bool nvfp4 = d.b_format == KJIT_BLOCK_FORMAT_NVFP4;
  if (d.b_scales != nullptr || d.b_scale_granularity != KJIT_SCALE_INVALID || d.b_block_rows != 0 ||
      d.b_block_cols != 0)
    return invalid("W4A16 weights carry their format's scale bytes in b_block_scales (and NVFP4's b_global_scales): "
                   "leave b_scales, b_scale_granularity and b_block_rows/cols unset");
  if (nvfp4 && d.b_scale_convention != KJIT_SCALE_MULTIPLY && d.b_scale_convention != KJIT_SCALE_DIVIDE)
    return invalid("NVFP4 weights need b_scale_convention for their global scale: KJIT_SCALE_MULTIPLY (ModelOpt "
                   "weight_scale_2) or KJIT_SCALE_DIVIDE (compressed-tensors weight_global_scale); there is no "
                   "default");
  if (!nvfp4 && d.b_scale_convention != KJIT_SCALE_CONVENTION_UNSET && d.b_scale_convention != KJIT_SCALE_MULTIPLY)
    return invalid("MXFP4 scales are UE8M0 multipliers: b_scale_convention must be unset or KJIT_SCALE_MULTIPLY");
  if (!nvfp4 && d.b_global_scales != nullptr)
    return invalid("b_global_scales is NVFP4's; MXFP4 weights have none: pass NULL");
  return nvfp4 ? codegen::MixedWeight::nvfp4 : codegen::MixedWeight::mxfp4;
}

// The weight tile's TMA map over the stored bytes. wgmma_sm90: fp8 [E, N, K]
// in boxes of 128 codes x tile_n rows, [E, K, N] in boxes of tile_n codes x
// 128 k-rows, both 128-byte swizzled; FP4 [E, N, K / 2] in boxes of 64 bytes
// (128 elements) x tile_n rows, 64-byte swizzled. wgmma_sm90_converter:
// [E, N, K] in boxes of 64 k (64 codes, or 32 bytes of FP4 pairs) x tile_n
// rows, unswizzled (its converter warps read whole 16-byte units of a row);
// FP4 [E, K, N] (the stored [E, N, K / 2] read for dX) in boxes of tile_n / 2
// bytes (tile_n output columns) x 64 stored rows (k), 64-byte swizzled.
// grouped_gemm_mixed_sm90.cuh reads them so.
Expected<void> encode_weight_map(const DriverApi& api, const codegen::GroupedGemmMixedSpec& s,
                                 kjit_grouped_gemm_sm90_params& p) {
  constexpr CUtensorMapDataType kBytes = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  constexpr cuuint32_t kKBlock = KJIT_MIXED_K_BLOCK;
  const auto n = static_cast<cuuint64_t>(s.n), k = static_cast<cuuint64_t>(s.k);
  const auto e = static_cast<cuuint64_t>(s.experts);
  if (s.kernel == codegen::MixedGemmKernel::wgmma_sm90_converter && s.weights == codegen::WeightLayout::e_k_n) {
    // 64 k-rows of the tile's n as stored: FP4 pairs 64-byte swizzled (the consumers' halves), fp8 codes as they
    // are (the converter warps read contiguous units).
    const bool fp4 = codegen::is_fp4(s.weight);
    const cuuint64_t row_bytes = fp4 ? n / 2 : n;
    const cuuint64_t dims[3] = {row_bytes, k, e};
    const cuuint64_t strides[2] = {row_bytes, k * row_bytes};
    const cuuint32_t box[3] = {static_cast<cuuint32_t>(fp4 ? s.tile_n / 2 : s.tile_n), KJIT_SM90_K_BLOCK, 1};
    return encode_tensor_map(api, p.b_map, kBytes, p.gemm.b, 3, dims, strides, box,
                             fp4 ? "B [E, K, N] (FP4 pairs of the stored [E, N, K / 2], converter)"
                                 : "B [E, K, N] (fp8 codes of the stored [E, N, K], converter)",
                             fp4 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  if (s.kernel == codegen::MixedGemmKernel::wgmma_sm90_converter) {
    const bool fp4 = codegen::is_fp4(s.weight);
    const cuuint64_t row_bytes = fp4 ? k / 2 : k;
    const cuuint64_t dims[3] = {row_bytes, n, e};
    const cuuint64_t strides[2] = {row_bytes, n * row_bytes};
    const cuuint32_t box[3] = {fp4 ? KJIT_SM90_K_BLOCK / 2u : KJIT_SM90_K_BLOCK * 1u, static_cast<cuuint32_t>(s.tile_n), 1};
    return encode_tensor_map(api, p.b_map, kBytes, p.gemm.b, 3, dims, strides, box, "B [E, N, K] (converter)",
                             CU_TENSOR_MAP_SWIZZLE_NONE);
  }
  if (codegen::is_fp4(s.weight)) {
    const cuuint64_t dims[3] = {k / 2, n, e};
    const cuuint64_t strides[2] = {k / 2, n * (k / 2)};
    const cuuint32_t box[3] = {kKBlock / 2, static_cast<cuuint32_t>(s.tile_n), 1};
    return encode_tensor_map(api, p.b_map, kBytes, p.gemm.b, 3, dims, strides, box, "B [E, N, K / 2] (FP4 pairs)",
                             CU_TENSOR_MAP_SWIZZLE_64B);
  }
  if (s.weights == codegen::WeightLayout::e_n_k) {
    const cuuint64_t dims[3] = {k, n, e};
    const cuuint64_t strides[2] = {k, n * k};
    const cuuint32_t box[3] = {kKBlock, static_cast<cuuint32_t>(s.tile_n), 1};
    return encode_tensor_map(api, p.b_map, kBytes, p.gemm.b, 3, dims, strides, box, "B [E, N, K]");
  }
  const cuuint64_t dims[3] = {n, k, e};
  const cuuint64_t strides[2] = {n, k * n};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(s.tile_n), kKBlock, 1};
  return encode_tensor_map(api, p.b_map, kBytes, p.gemm.b, 3, dims, strides, box, "B [E, K, N]");
}

}  // namespace

Expected<GroupedGemmMixedPlan> plan_grouped_gemm_mixed_shapes(const kjit_grouped_gemm_desc& d) {
  auto common = KJIT_TRY(plan_gemm_common_shapes(d));
  if (d.a_scales != nullptr)
    return invalid("a_scales is for FP8 activations (W8A8); bf16 activations (W8A16, W4A16) take none: pass NULL");
  const bool fp4 = d.b_dtype == KJIT_DTYPE_F4_E2M1;
  if (!fp4 && d.b_scale_convention != KJIT_SCALE_MULTIPLY && d.b_scale_convention != KJIT_SCALE_DIVIDE)
    return invalid("W8A16 needs b_scale_convention: KJIT_SCALE_MULTIPLY (w = code * scale: DeepSeek's "
                   "weight_scale_inv, compressed-tensors' weight_scale) or KJIT_SCALE_DIVIDE (w = code / scale); "
                   "there is no default");
  GroupedGemmMixedPlan plan;
  plan.request = common.request;
  plan.empty = common.empty;
  auto& s = plan.problem;
  s.out = common.out;
  s.n = d.n;
  s.k = d.k;
  s.experts = d.experts;
  s.weights = d.weights == KJIT_WEIGHTS_E_K_N ? codegen::WeightLayout::e_k_n : codegen::WeightLayout::e_n_k;
  if (fp4) {
    s.weight = KJIT_TRY(fp4_weight_of(d));
    s.weight_scale = codegen::ScaleGranularity::per_block;  // the format's
  } else {
    s.weight = d.b_dtype == KJIT_DTYPE_F8_E5M2 ? codegen::MixedWeight::f8_e5m2 : codegen::MixedWeight::f8_e4m3fn;
    s.weight_scale = KJIT_TRY(weight_scale_of(d));
  }
  s.scale_convention =
      d.b_scale_convention == KJIT_SCALE_DIVIDE ? codegen::ScaleConvention::divide : codegen::ScaleConvention::multiply;
  s.offsets = common.offsets;
  s.row_scale = d.row_scale != nullptr;
  s.activation = static_cast<codegen::Activation>(d.activation);  // checked by the common plan; same order
  if (d.activation_gate_up_layout == KJIT_GATE_UP_HALVES) s.gate_up_layout = codegen::GateUpLayout::halves;
  else if (d.activation_gate_up_layout == KJIT_GATE_UP_ALTERNATING) s.gate_up_layout = codegen::GateUpLayout::alternating;
  s.gather = common.gather;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{s}));
  plan.params.gemm = common.params;
  return plan;
}

Expected<void> bind_grouped_gemm_mixed(const kjit_grouped_gemm_desc& d, GroupedGemmMixedPlan& plan) {
  KJIT_TRY(bind_gemm_common(d, plan.empty, plan.params.gemm));
  if (!plan.empty) {
    if (d.b_dtype == KJIT_DTYPE_F4_E2M1) {
      KJIT_TRY(require_non_null({{d.b_block_scales, "b_block_scales"}}));
      if (plan.problem.weight == codegen::MixedWeight::nvfp4) {
        KJIT_TRY(require_non_null({{d.b_global_scales, "b_global_scales"}}));
        if (reinterpret_cast<uintptr_t>(d.b_global_scales) % 4 != 0)
          return invalid("'b_global_scales' must be 4-byte aligned (fp32)");
      }
    } else {
      KJIT_TRY(require_non_null({{d.b_scales, "b_scales"}}));
      if (reinterpret_cast<uintptr_t>(d.b_scales) % 4 != 0) return invalid("'b_scales' must be 4-byte aligned (fp32)");
    }
  }
  plan.params.b_scales = d.b_scales;
  plan.params.b_block_scales = d.b_block_scales;
  plan.params.b_global_scales = d.b_global_scales;
  return {};
}

Expected<void> grouped_gemm_mixed(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream) {
  auto plan = KJIT_TRY(plan_grouped_gemm_mixed_shapes(desc));
  KJIT_TRY(bind_grouped_gemm_mixed(desc, plan));
  if (plan.empty) return {};
  auto& p = plan.params;
  DeviceState* device = KJIT_TRY(owning_device_for(runtime, {{p.gemm.a, "a"},
                                                              {p.gemm.b, "b"},
                                                              {p.gemm.out, "out"},
                                                              {p.gemm.offsets, "offsets"},
                                                              {p.gemm.row_scale, "row_scale"},
                                                              {p.b_scales, "b_scales"},
                                                              {p.b_block_scales, "b_block_scales"},
                                                              {p.b_global_scales, "b_global_scales"},
                                                              {p.gemm.gather, "sorted_to_flat"},
                                                              {p.gemm.tile_counter, "workspace"}}));
  const auto spec = KJIT_TRY(
      codegen::choose_grouped_gemm_mixed_config(plan.problem, *device->arch, p.gemm.total_rows, plan.request));
  const LoadedKernel* kernel = KJIT_TRY(launchable_kernel(runtime, *device, spec, stream));
  const auto geometry = codegen::grouped_gemm_mixed_geometry(spec, p.gemm.total_rows, kernel->resident_blocks);
  if (!codegen::is_sm90(spec.kernel))
    return launch_kernel(runtime, *device, *kernel, p.gemm.device_error, geometry, &p, stream);

  kjit_grouped_gemm_mixed_sm90_params sm90{};
  sm90.sm90.gemm = p.gemm;
  sm90.b_scales = p.b_scales;
  sm90.b_block_scales = p.b_block_scales;
  sm90.b_global_scales = p.b_global_scales;
  {
    // Encoding needs a current context (a bare thread, as in jitctl, has none).
    const DriverApi& api = **runtime.driver();
    ScopedContext scope(api, device->context);
    KJIT_TRY(scope.status());
    if (!spec.gather) KJIT_TRY(encode_swap_ab_row_maps(api, spec.k, sm90.sm90));  // gather: the loader warp's
    KJIT_TRY(encode_weight_map(api, spec, sm90.sm90));
    if (sm90.sm90.gemm.tile_counter != nullptr) KJIT_TRY(zero_tile_counter(api, sm90.sm90.gemm.tile_counter, stream));
  }
  return launch_kernel(runtime, *device, *kernel, sm90.sm90.gemm.device_error, geometry, &sm90, stream);
}

Expected<void> prepare_grouped_gemm_mixed(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int ordinal) {
  // Its kernels do not depend on the pointers (they must be 16-byte aligned).
  const auto plan = KJIT_TRY(plan_grouped_gemm_mixed_shapes(desc));
  DeviceState* device = KJIT_TRY(runtime.device(ordinal));
  const auto configs = KJIT_TRY(codegen::grouped_gemm_mixed_candidates(plan.problem, *device->arch, plan.request));
  for (const auto& config : configs) KJIT_TRY(prepare_on_device(runtime, config, ordinal));
  return {};
}

}  // namespace kjit::ops
