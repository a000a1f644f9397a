// The grouped GEMM op.
#include "kjit/internal/ops/grouped_gemm.hpp"

#include "launch.hpp"

#include <cmath>
#include <cstdint>

#include <fmt/format.h>

namespace kjit::ops {

namespace {
auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }
}  // namespace

Expected<GemmCommonPlan> plan_gemm_common_shapes(const kjit_grouped_gemm_desc& d) {
  if (d.struct_size < sizeof(kjit_grouped_gemm_desc))
    return invalid(fmt::format("desc.struct_size is {}, expected {}: call kjit_grouped_gemm_desc_init first",
                               d.struct_size, sizeof(kjit_grouped_gemm_desc)));
  if (d.out_dtype != KJIT_DTYPE_BF16 && d.out_dtype != KJIT_DTYPE_F32)
    return invalid("grouped GEMM out_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F32");
  if (d.rows < 0) return invalid(fmt::format("rows must be >= 0, got {}", d.rows));
  if (d.weights != KJIT_WEIGHTS_E_N_K && d.weights != KJIT_WEIGHTS_E_K_N)
    return invalid("weights must be KJIT_WEIGHTS_E_N_K or KJIT_WEIGHTS_E_K_N (no default)");
  if (d.offsets_convention != KJIT_OFFSETS_CUMULATIVE_END && d.offsets_convention != KJIT_OFFSETS_WITH_LEADING_ZERO)
    return invalid("offsets_convention must be KJIT_OFFSETS_CUMULATIVE_END (E ends, as torch._grouped_mm) or "
                   "KJIT_OFFSETS_WITH_LEADING_ZERO (E + 1 entries); there is no default");

  if (d.kernel != KJIT_GEMM_KERNEL_AUTO && d.kernel != KJIT_GEMM_KERNEL_PORTABLE && d.kernel != KJIT_GEMM_KERNEL_SM90 &&
      d.kernel != KJIT_GEMM_KERNEL_SM90_SWAP_AB && d.kernel != KJIT_GEMM_KERNEL_SM90_CONVERTER &&
      d.kernel != KJIT_GEMM_KERNEL_DECODE && d.kernel != KJIT_GEMM_KERNEL_SHORT_K)
    return invalid(fmt::format("kernel must be KJIT_GEMM_KERNEL_AUTO, _PORTABLE, _SM90, _SM90_SWAP_AB, "
                               "_SM90_CONVERTER, _DECODE or _SHORT_K, got {}",
                               static_cast<int>(d.kernel)));
  if (d.kernel == KJIT_GEMM_KERNEL_SM90_CONVERTER && !is_mixed_gemm(d))
    return invalid("KJIT_GEMM_KERNEL_SM90_CONVERTER is the W8A16 / W4A16 kernel (fp8 or FP4 weights, bf16 "
                   "activations): its converter warps turn the weights into bf16; bf16 and W8A8 GEMMs have none");
  if (d.kernel == KJIT_GEMM_KERNEL_SHORT_K && (is_fp8_gemm(d) || is_mixed_gemm(d)))
    return invalid("KJIT_GEMM_KERNEL_SHORT_K is the bf16 kernel for K <= 32 (LoRA ranks): FP8 and FP4 GEMMs have "
                   "none");
  if (d.tile_m < 0 || d.tile_n < 0 || d.cluster < 0)
    return invalid(fmt::format("tile_m, tile_n and cluster must be 0 (the heuristic's) or supported values, got "
                               "{}x{} cluster {}",
                               d.tile_m, d.tile_n, d.cluster));
  if (d.cluster_axis != KJIT_GEMM_CLUSTER_ALONG_M && d.cluster_axis != KJIT_GEMM_CLUSTER_ALONG_N)
    return invalid(fmt::format("cluster_axis must be KJIT_GEMM_CLUSTER_ALONG_M or _ALONG_N, got {}",
                               static_cast<int>(d.cluster_axis)));
  if (d.cluster_axis == KJIT_GEMM_CLUSTER_ALONG_N && d.cluster < 2)
    return invalid(fmt::format("cluster_axis ALONG_N needs cluster 2, got cluster {}", d.cluster));
  if (d.b_dtype != KJIT_DTYPE_F4_E2M1 &&
      (d.b_format != KJIT_BLOCK_FORMAT_UNSET || d.b_block_scales != nullptr || d.b_global_scales != nullptr))
    return invalid("b_format, b_block_scales and b_global_scales are for FP4 weights (b_dtype KJIT_DTYPE_F4_E2M1, "
                   "W4A16); leave them unset for other weights");

  if (d.activation != KJIT_ACTIVATION_NONE && d.activation != KJIT_ACTIVATION_SILU_MUL &&
      d.activation != KJIT_ACTIVATION_SWIGLU_OAI)
    return invalid(fmt::format("activation must be KJIT_ACTIVATION_NONE, _SILU_MUL or _SWIGLU_OAI, got {}",
                               static_cast<int>(d.activation)));
  if (d.activation != KJIT_ACTIVATION_NONE && is_fp8_gemm(d) && !is_mixed_gemm(d))
    return invalid("a fused activation is implemented in the bf16, W8A16 and W4A16 grouped GEMMs, not W8A8 (FP8 "
                   "activations): apply kjit's activation to its output");
  if (d.activation_gate_up_layout != KJIT_GATE_UP_UNSET && d.activation_gate_up_layout != KJIT_GATE_UP_HALVES &&
      d.activation_gate_up_layout != KJIT_GATE_UP_ALTERNATING)
    return invalid(fmt::format("activation_gate_up_layout must be KJIT_GATE_UP_UNSET, _HALVES or _ALTERNATING, got {}",
                               static_cast<int>(d.activation_gate_up_layout)));
  const bool block_scaled_w8a16 = is_mixed_gemm(d) && d.b_dtype != KJIT_DTYPE_F4_E2M1 &&
                                  d.b_scale_granularity == KJIT_SCALE_PER_BLOCK;
  if (d.activation_gate_up_layout != KJIT_GATE_UP_UNSET && !(d.activation != KJIT_ACTIVATION_NONE && block_scaled_w8a16))
    return invalid("activation_gate_up_layout is for a fused activation in the W8A16 grouped GEMM with 128 x 128 "
                   "block scales (KJIT_SCALE_PER_BLOCK), which stay in the checkpoint's row order; leave it "
                   "KJIT_GATE_UP_UNSET otherwise (scales that follow their rows are reordered with them)");
  if (d.activation != KJIT_ACTIVATION_NONE && block_scaled_w8a16 && d.activation_gate_up_layout == KJIT_GATE_UP_UNSET)
    return invalid("a fused activation with W8A16 128 x 128 block scales needs activation_gate_up_layout "
                   "(KJIT_GATE_UP_HALVES or _ALTERNATING): the checkpoint's gate/up row order, over which b_scales "
                   "stay as stored while the weights' rows are in gate/up groups of 8");
  if (d.activation == KJIT_ACTIVATION_SWIGLU_OAI &&
      !(std::isfinite(d.activation_alpha) && std::isfinite(d.activation_limit) && d.activation_limit > 0.0f))
    return invalid(fmt::format("SWIGLU_OAI needs a finite alpha and a finite positive limit, got alpha {} limit {}",
                               d.activation_alpha, d.activation_limit));

  const bool has_addend = d.addend != nullptr;
  if (!has_addend && d.addend_dtype != KJIT_DTYPE_INVALID)
    return invalid("addend_dtype is set without an addend: give both, or leave addend_dtype KJIT_DTYPE_INVALID");
  if (has_addend) {
    if (d.addend_dtype != KJIT_DTYPE_BF16 && d.addend_dtype != KJIT_DTYPE_F32)
      return invalid(fmt::format("addend_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F32 with an addend, got {}",
                                 static_cast<int>(d.addend_dtype)));
    if (is_fp8_gemm(d))
      return invalid("an addend is implemented in the bf16 grouped GEMM (bf16 a and b), not in the W8A8, W8A16 or "
                     "W4A16 ones: add it to their output, or run the bf16 GEMM with the addend after them");
    if (d.activation != KJIT_ACTIVATION_NONE)
      return invalid("an addend and a fused activation do not go together (the addend has the product's N columns)");
  }

  if (d.top_k < 0) return invalid(fmt::format("top_k must be 0 (no gather) or >= 1, got {}", d.top_k));
  const bool gather = d.top_k >= 1;
  if (!gather && (d.sorted_to_flat != nullptr || d.tokens != 0))
    return invalid("sorted_to_flat and tokens are for a gather: set top_k >= 1 with them, or leave all three unset");
  if (gather) {
    if (is_fp8_gemm(d) && !is_mixed_gemm(d))
      return invalid("the W8A8 GEMM reads FP8 rows as they lie: gather them in kjit_fp8_quantize (its "
                     "sorted_to_flat and top_k) and leave the GEMM's unset");
    // Flat indices are int32: every one of them must be representable.
    if (d.tokens < 0 || d.tokens > INT32_MAX / d.top_k)
      return invalid(fmt::format("gather: tokens must be >= 0 with tokens * top_k within int32, got tokens {} top_k {}",
                                 d.tokens, d.top_k));
  }

  GemmCommonPlan plan;
  plan.gather = gather;
  plan.addend = !has_addend                         ? codegen::Addend::none
                : d.addend_dtype == KJIT_DTYPE_BF16 ? codegen::Addend::bf16
                                                    : codegen::Addend::f32;
  using Kernel = codegen::GemmRequest::Kernel;
  plan.request = {.kernel = d.kernel == KJIT_GEMM_KERNEL_PORTABLE       ? Kernel::portable
                            : d.kernel == KJIT_GEMM_KERNEL_SM90         ? Kernel::sm90
                            : d.kernel == KJIT_GEMM_KERNEL_SM90_SWAP_AB ? Kernel::sm90_swap_ab
                            : d.kernel == KJIT_GEMM_KERNEL_SM90_CONVERTER ? Kernel::sm90_converter
                            : d.kernel == KJIT_GEMM_KERNEL_DECODE         ? Kernel::decode
                            : d.kernel == KJIT_GEMM_KERNEL_SHORT_K        ? Kernel::short_k
                                                                          : Kernel::arch_default,
                  .tile_m = d.tile_m,
                  .tile_n = d.tile_n,
                  .cluster = d.cluster,
                  .cluster_axis = d.cluster_axis == KJIT_GEMM_CLUSTER_ALONG_N ? codegen::ClusterAxis::n
                                                                              : codegen::ClusterAxis::m};
  plan.out = d.out_dtype == KJIT_DTYPE_F32 ? codegen::DType::f32 : codegen::DType::bf16;
  plan.offsets = d.offsets_convention == KJIT_OFFSETS_WITH_LEADING_ZERO ? codegen::OffsetsConvention::with_leading_zero
                                                                        : codegen::OffsetsConvention::cumulative_end;
  plan.empty = d.rows == 0;
  auto& p = plan.params;
  p.total_rows = d.rows;
  p.activation_alpha = d.activation_alpha;
  p.activation_limit = d.activation_limit;
  p.gather_tokens = gather ? d.tokens : 0;
  p.gather_top_k = gather ? d.top_k : 0;
  return plan;
}

Expected<void> bind_gemm_common(const kjit_grouped_gemm_desc& d, bool empty, kjit_grouped_gemm_params& p) {
  const bool gather = d.top_k >= 1;
  if (!empty) {
    KJIT_TRY(require_non_null({{d.b, "b"}, {d.out, "out"}, {d.offsets, "offsets"}}));
    // A gather from no tokens reads no row of `a` (every entry is -1, or reported).
    if (!gather || d.tokens > 0) KJIT_TRY(require_non_null({{d.a, "a"}}));
    if (gather) {
      KJIT_TRY(require_non_null({{d.sorted_to_flat, "sorted_to_flat"}}));
      if (reinterpret_cast<uintptr_t>(d.sorted_to_flat) % 4 != 0) return invalid("'sorted_to_flat' must be 4-byte aligned");
    }
    // 16-byte accesses need 16-byte aligned rows; N and K divisible by 8 keep them so.
    for (const auto& [pointer, name] : {std::pair{d.a, "a"}, std::pair{d.b, "b"}, std::pair<const void*, const char*>{d.out, "out"},
                                        std::pair{d.addend, "addend"}})
      if (reinterpret_cast<uintptr_t>(pointer) % 16 != 0) return invalid(fmt::format("'{}' is not 16-byte aligned", name));
    if (reinterpret_cast<uintptr_t>(d.offsets) % 4 != 0 || reinterpret_cast<uintptr_t>(d.row_scale) % 4 != 0)
      return invalid("'offsets' and 'row_scale' must be 4-byte aligned");
  }
  if (d.workspace != nullptr) {
    if (d.workspace_bytes < kGroupedGemmWorkspaceBytes)
      return invalid(fmt::format("workspace_bytes is {}, the grouped GEMM needs {} (kjit_grouped_gemm_workspace_bytes)",
                                 d.workspace_bytes, kGroupedGemmWorkspaceBytes));
    if (reinterpret_cast<uintptr_t>(d.workspace) % 16 != 0) return invalid("'workspace' must be 16-byte aligned");
  }
  p.a = d.a;
  p.b = d.b;
  p.out = d.out;
  p.offsets = d.offsets;
  p.row_scale = d.row_scale;
  p.tile_counter = static_cast<unsigned int*>(d.workspace);
  p.gather = d.sorted_to_flat;
  p.addend = d.addend;
  p.experts = static_cast<int>(d.experts);  // validated: 1 to kMaxExperts
  return {};
}

bool is_fp8_gemm(const kjit_grouped_gemm_desc& d) {
  return d.a_dtype == KJIT_DTYPE_F8_E4M3FN || d.a_dtype == KJIT_DTYPE_F8_E5M2 || d.b_dtype == KJIT_DTYPE_F8_E4M3FN ||
         d.b_dtype == KJIT_DTYPE_F8_E5M2;
}

bool is_mixed_gemm(const kjit_grouped_gemm_desc& d) {
  return d.a_dtype == KJIT_DTYPE_BF16 &&
         (d.b_dtype == KJIT_DTYPE_F8_E4M3FN || d.b_dtype == KJIT_DTYPE_F8_E5M2 || d.b_dtype == KJIT_DTYPE_F4_E2M1);
}

Expected<GroupedGemmPlan> plan_grouped_gemm_shapes(const kjit_grouped_gemm_desc& d) {
  auto common = KJIT_TRY(plan_gemm_common_shapes(d));
  if (d.a_dtype != KJIT_DTYPE_BF16 || d.b_dtype != KJIT_DTYPE_BF16)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                "grouped GEMM operands must both be KJIT_DTYPE_BF16, or both KJIT_DTYPE_F8_E4M3FN with their scales");
  GroupedGemmPlan plan;
  plan.request = common.request;
  plan.params = common.params;
  plan.empty = common.empty;
  auto& s = plan.problem;
  s.out = common.out;
  s.n = d.n;
  s.k = d.k;
  s.experts = d.experts;
  s.weights = d.weights == KJIT_WEIGHTS_E_K_N ? codegen::WeightLayout::e_k_n : codegen::WeightLayout::e_n_k;
  s.offsets = common.offsets;
  s.row_scale = d.row_scale != nullptr;
  s.activation = static_cast<codegen::Activation>(d.activation);  // checked by the common plan; same order
  s.gather = common.gather;
  s.addend = common.addend;
  KJIT_TRY(codegen::validate(codegen::KernelSpec{s}));
  return plan;
}

Expected<void> check_grouped_gemm_shapes(const kjit_grouped_gemm_desc& desc) {
  const auto checked = [](const auto& plan) -> Expected<void> {
    if (plan) return {};
    return std::unexpected(plan.error());
  };
  if (is_mixed_gemm(desc)) return checked(plan_grouped_gemm_mixed_shapes(desc));
  if (is_fp8_gemm(desc)) return checked(plan_grouped_gemm_fp8_shapes(desc));
  return checked(plan_grouped_gemm_shapes(desc));
}

namespace {
constexpr CUtensorMapDataType kBf16 = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}  // namespace

Expected<void> encode_swap_ab_row_maps(const DriverApi& api, int64_t k, kjit_grouped_gemm_sm90_params& p) {
  const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(p.gemm.total_rows)};
  const cuuint64_t a_strides[1] = {static_cast<cuuint64_t>(k) * 2};
  const cuuint32_t a_box[2] = {KJIT_SM90_K_BLOCK, KJIT_SWAP_AB_ROW_BOX};
  const cuuint32_t wide_box[2] = {KJIT_SM90_K_BLOCK, KJIT_SWAP_AB_WIDE_ROW_BOX};
  KJIT_TRY(encode_tensor_map(api, p.a_map, kBf16, p.gemm.a, 2, a_dims, a_strides, a_box, "A"));
  return encode_tensor_map(api, p.a_wide_map, kBf16, p.gemm.a, 2, a_dims, a_strides, wide_box, "A");
}

namespace {

Expected<void> encode_sm90_maps(const DriverApi& api, const codegen::GroupedGemmSpec& s,
                                kjit_grouped_gemm_sm90_params& p) {
  const auto k = static_cast<cuuint64_t>(s.k), n = static_cast<cuuint64_t>(s.n);
  const auto e = static_cast<cuuint64_t>(s.experts);
  const cuuint64_t a_dims[2] = {k, static_cast<cuuint64_t>(p.gemm.total_rows)};
  const cuuint64_t a_strides[1] = {k * 2};
  // With a cluster each block loads its share of the operand the pair shares.
  // Swap AB loads rows in boxes of 32 (its tile heights' step) and every
  // block its own weight tile.
  const bool swap_ab = s.kernel == codegen::GemmKernel::wgmma_sm90_swap_ab;
  const bool along_n = s.cluster_axis == codegen::ClusterAxis::n;
  if (s.gather) {
    // The kernel's loader warp copies A's rows itself (no map).
  } else if (swap_ab) {
    KJIT_TRY(encode_swap_ab_row_maps(api, s.k, p));
  } else {
    const cuuint32_t a_box[2] = {KJIT_SM90_K_BLOCK, static_cast<cuuint32_t>(along_n ? s.tile_m / s.cluster : s.tile_m)};
    KJIT_TRY(encode_tensor_map(api, p.a_map, kBf16, p.gemm.a, 2, a_dims, a_strides, a_box, "A"));
  }
  if (s.weights == codegen::WeightLayout::e_n_k) {
    const cuuint64_t dims[3] = {k, n, e};
    const cuuint64_t strides[2] = {k * 2, n * k * 2};
    const cuuint32_t box[3] = {KJIT_SM90_K_BLOCK,
                               static_cast<cuuint32_t>(along_n || swap_ab ? s.tile_n : s.tile_n / s.cluster), 1};
    return encode_tensor_map(api, p.b_map, kBf16, p.gemm.b, 3, dims, strides, box, "B [E, N, K]");
  }
  const cuuint64_t dims[3] = {n, k, e};
  const cuuint64_t strides[2] = {n * 2, k * n * 2};
  const cuuint32_t box[3] = {KJIT_SM90_KN_CHUNK, KJIT_SM90_K_BLOCK, 1};
  return encode_tensor_map(api, p.b_map, kBf16, p.gemm.b, 3, dims, strides, box, "B [E, K, N]");
}

}  // namespace

Expected<void> grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream) {
  if (is_mixed_gemm(desc)) return grouped_gemm_mixed(runtime, desc, stream);
  if (is_fp8_gemm(desc)) return grouped_gemm_fp8(runtime, desc, stream);
  auto plan = KJIT_TRY(plan_grouped_gemm_shapes(desc));
  KJIT_TRY(bind_gemm_common(desc, plan.empty, plan.params));
  if (plan.empty) return {};
  auto& p = plan.params;
  DeviceState* device = KJIT_TRY(owning_device_for(runtime, {{p.a, "a"},
                                                              {p.b, "b"},
                                                              {p.out, "out"},
                                                              {p.offsets, "offsets"},
                                                              {p.row_scale, "row_scale"},
                                                              {p.gather, "sorted_to_flat"},
                                                              {p.addend, "addend"},
                                                              {p.tile_counter, "workspace"}}));
  const auto spec = KJIT_TRY(codegen::choose_grouped_gemm_config(plan.problem, *device->arch, p.total_rows, plan.request));
  const LoadedKernel* kernel = KJIT_TRY(launchable_kernel(runtime, *device, spec, stream));
  // The SM90 kernels are persistent: their grid is what fits on the device at once.
  const auto geometry = codegen::grouped_gemm_geometry(spec, p.total_rows, kernel->resident_blocks);
  if (!codegen::is_sm90(spec.kernel)) return launch_kernel(runtime, *device, *kernel, p.device_error, geometry, &p, stream);

  kjit_grouped_gemm_sm90_params sm90{};
  sm90.gemm = p;
  // Only swap AB hands tiles out on demand; the others' tiles cost the same.
  if (spec.kernel != codegen::GemmKernel::wgmma_sm90_swap_ab) sm90.gemm.tile_counter = nullptr;
  {
    // Encoding needs a current context (a bare thread, as in jitctl, has none).
    const DriverApi& api = **runtime.driver();
    ScopedContext scope(api, device->context);
    KJIT_TRY(scope.status());
    KJIT_TRY(encode_sm90_maps(api, spec, sm90));
    if (sm90.gemm.tile_counter != nullptr) KJIT_TRY(zero_tile_counter(api, sm90.gemm.tile_counter, stream));
  }
  return launch_kernel(runtime, *device, *kernel, sm90.gemm.device_error, geometry, &sm90, stream);
}

Expected<void> prepare_grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int ordinal) {
  if (is_mixed_gemm(desc)) return prepare_grouped_gemm_mixed(runtime, desc, ordinal);
  if (is_fp8_gemm(desc)) return prepare_grouped_gemm_fp8(runtime, desc, ordinal);
  // Its kernels do not depend on the pointers (they must be 16-byte aligned).
  const auto plan = KJIT_TRY(plan_grouped_gemm_shapes(desc));
  DeviceState* device = KJIT_TRY(runtime.device(ordinal));
  const auto configs = KJIT_TRY(codegen::grouped_gemm_candidates(plan.problem, *device->arch, plan.request));
  for (const auto& config : configs) KJIT_TRY(prepare_on_device(runtime, config, ordinal));
  return {};
}

}  // namespace kjit::ops
