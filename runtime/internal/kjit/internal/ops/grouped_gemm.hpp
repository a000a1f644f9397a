// The grouped GEMM op: argument checks, the problem they describe, the
// configuration chosen for the device, and the launch.
#pragma once

#include "kjit/internal/runtime.hpp"
#include "grouped_gemm_fp8_params.h"
#include "grouped_gemm_mixed_params.h"
#include "grouped_gemm_params.h"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/kjit.h"

namespace kjit::ops {

// The workspace: one 32-bit tile counter (16 bytes leave room to grow).
inline constexpr uint64_t kGroupedGemmWorkspaceBytes = 16;

// What every grouped GEMM's descriptor holds beyond its operands' types.
struct GemmCommonPlan {
  codegen::GemmRequest request;
  codegen::DType out = codegen::DType::bf16;
  codegen::OffsetsConvention offsets = codegen::OffsetsConvention::cumulative_end;
  kjit_grouped_gemm_params params{};
  bool empty = false;   // no rows: nothing to do
  bool gather = false;  // A's rows are read through sorted_to_flat (the spec's `gather`)
  codegen::Addend addend = codegen::Addend::none;  // the spec's `addend` (the bf16 family only)
};
// Checks what every grouped GEMM's descriptor holds that does not depend on
// pointers; the params hold no pointers.
Expected<GemmCommonPlan> plan_gemm_common_shapes(const kjit_grouped_gemm_desc& desc);
// Checks the pointers every grouped GEMM takes (presence, 16-byte alignment,
// the workspace) and puts them in `params`. Every GEMM kernel needs 16-byte
// aligned operands, so its variants never depend on the pointers.
Expected<void> bind_gemm_common(const kjit_grouped_gemm_desc& desc, bool empty, kjit_grouped_gemm_params& params);

// Whether `desc` names FP8 operands (the grouped_gemm_fp8 family's op).
bool is_fp8_gemm(const kjit_grouped_gemm_desc& desc);

struct GroupedGemmFp8Plan {
  codegen::GroupedGemmFp8Spec problem;  // no configuration yet
  codegen::GemmRequest request;
  kjit_grouped_gemm_fp8_params params{};
  bool empty = false;
};
// The FP8 GEMM's checks without pointers, then its pointers' (the scales').
Expected<GroupedGemmFp8Plan> plan_grouped_gemm_fp8_shapes(const kjit_grouped_gemm_desc& desc);
Expected<void> bind_grouped_gemm_fp8(const kjit_grouped_gemm_desc& desc, GroupedGemmFp8Plan& plan);
Expected<void> grouped_gemm_fp8(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream);
Expected<void> prepare_grouped_gemm_fp8(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int device);

// Whether `desc` names fp8 weights with bf16 activations (W8A16: the grouped_gemm_mixed family's op).
bool is_mixed_gemm(const kjit_grouped_gemm_desc& desc);

struct GroupedGemmMixedPlan {
  codegen::GroupedGemmMixedSpec problem;  // no configuration yet
  codegen::GemmRequest request;
  kjit_grouped_gemm_mixed_params params{};
  bool empty = false;
};
// The W8A16 / W4A16 GEMM's checks without pointers, then its pointers' (the scales').
Expected<GroupedGemmMixedPlan> plan_grouped_gemm_mixed_shapes(const kjit_grouped_gemm_desc& desc);
Expected<void> bind_grouped_gemm_mixed(const kjit_grouped_gemm_desc& desc, GroupedGemmMixedPlan& plan);
Expected<void> grouped_gemm_mixed(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream);
Expected<void> prepare_grouped_gemm_mixed(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int device);

// The swap-AB kernels' maps of bf16 rows A [total_rows, K] (boxes of 64 k x 32 rows, and x 128: a_wide_map).
Expected<void> encode_swap_ab_row_maps(const DriverApi& api, int64_t k, kjit_grouped_gemm_sm90_params& params);

struct GroupedGemmPlan {
  codegen::GroupedGemmSpec problem;  // no configuration yet: that depends on the device
  codegen::GemmRequest request;
  kjit_grouped_gemm_params params{};
  bool empty = false;   // no rows: nothing to do
  bool gather = false;  // A's rows are read through sorted_to_flat (the spec's `gather`)
};

// Checks everything that does not depend on pointers (bind_gemm_common checks
// those).
Expected<GroupedGemmPlan> plan_grouped_gemm_shapes(const kjit_grouped_gemm_desc& desc);

// The checks without pointers of whichever grouped GEMM `desc` names (bf16, W8A8, W8A16 / W4A16), as its
// launch and prepare run them first.
Expected<void> check_grouped_gemm_shapes(const kjit_grouped_gemm_desc& desc);

Expected<void> grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, CUstream stream);
// Loads every configuration a launch of `desc` may pick on `device`, whatever
// its row count, so that capturing any batch size needs no compile.
Expected<void> prepare_grouped_gemm(Runtime& runtime, const kjit_grouped_gemm_desc& desc, int device);

}  // namespace kjit::ops
