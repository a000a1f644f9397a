// The mixed-input (W8A16, W4A16) grouped GEMM family: out[rows of e] = A[rows
// of e] . convert(W_e) (^T for [E, N, K] weights), A bf16, W fp8 codes (e4m3fn
// or e5m2) with fp32 scales per 128 x 128 block, per stored row or per expert,
// or FP4 pairs (NVFP4, MXFP4: [E, N, K] only) with their format's scales;
// each weight is converted to bf16 inside the kernel's mainloop exactly as
// kjit's dequant converts it (code x scale in fp32, rounded to nearest-even
// bf16), so no bf16 copy of the weights is ever written. The same stored
// tensor serves the forward pass ([E, N, K]) and the backward pass's dX = dY .
// W ([E, K, N]: the storage read the other way). Home: this header and
// codegen/src/families/grouped_gemm_mixed.cpp; device code in
// templates/gemm/grouped_gemm_mixed_*.cuh; ABI block
// templates/abi/grouped_gemm_mixed_params.h. The op is the bf16 grouped
// GEMM's (kjit_grouped_gemm with fp8 weights and bf16 activations).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/families/grouped_gemm.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// Which kernel: the portable mma.sync one (sm_89 and newer: fp8 conversion
// instructions), or one of Hopper's, both with rows of A on wgmma's N ("swap
// AB"): wgmma_sm90 takes the weights as wgmma's register operand, converted
// from the TMA-fed tile by the consumer warpgroups themselves (decode: they
// have the time); wgmma_sm90_converter has the producer warpgroup's spare
// warps convert each tile into a bf16 one in shared memory, which the bf16
// swap-AB consumers read (prefill: conversion beside the tensor cores, row
// tiles up to 256; [E, N, K] weights only). mma_decode is the bf16 family's
// decode kernel on fp8 weights converted in registers (GemmKernel::mma_decode;
// fp8 [E, N, K] only; sm_89 and newer).
enum class MixedGemmKernel : uint8_t { mma_sync, wgmma_sm90, wgmma_sm90_converter, mma_decode };
constexpr bool is_sm90(MixedGemmKernel k) {
  return k == MixedGemmKernel::wgmma_sm90 || k == MixedGemmKernel::wgmma_sm90_converter;
}
std::string_view name(MixedGemmKernel k);

// The stored weights: fp8 codes (fp32 scales as weight_scale says), or e2m1
// pairs with their format's scales along the stored row (weight_scale
// per_block): NVFP4 an e4m3fn byte per 16 and an fp32 global per expert
// (scale_convention says which way), MXFP4 a UE8M0 byte per 32.
enum class MixedWeight : uint8_t { f8_e4m3fn, f8_e5m2, nvfp4, mxfp4 };
std::string_view name(MixedWeight w);
constexpr bool is_fp4(MixedWeight w) { return w == MixedWeight::nvfp4 || w == MixedWeight::mxfp4; }

// The shape key is N, K, the weights' layout, code type and scaling; the token
// count and (for a configured kernel, kernel_identity) the experts are run-time
// arguments. A spec with tile 0x0 is a problem (manifests), expanded per arch
// into its configurations.
struct GroupedGemmMixedSpec {
  DType out = DType::bf16;
  int64_t n = 0;
  int64_t k = 0;
  int64_t experts = 0;
  WeightLayout weights = WeightLayout::e_n_k;
  MixedWeight weight = MixedWeight::f8_e4m3fn;
  ScaleGranularity weight_scale = ScaleGranularity::per_block;  // fp8: 128 x 128 of the stored tensor; FP4: the format's
  ScaleConvention scale_convention = ScaleConvention::multiply;
  OffsetsConvention offsets = OffsetsConvention::cumulative_end;
  bool row_scale = false;
  // A fused MoE activation ([E, N, K] weights in gate_up_interleaved order,
  // their per-row or FP4 scales in the same order): the output has N / 2
  // columns. fp8 128 x 128 block scales, which groups of 8 rows would split,
  // stay in the checkpoint's row order: gate_up_layout (set with them, and
  // only then) names that order, and the kernel finds each reordered row's
  // block through it.
  Activation activation = Activation::none;
  std::optional<GateUpLayout> gate_up_layout = std::nullopt;
  bool gather = false;  // A's rows read through sorted_to_flat (as GroupedGemmSpec's)
  MixedGemmKernel kernel = MixedGemmKernel::mma_sync;
  int tile_m = 0, tile_n = 0;
  int stages = 0;  // the SM90 kernels' pipeline depth; 0 for mma_sync

  bool configured() const { return tile_m != 0; }
  bool operator==(const GroupedGemmMixedSpec&) const = default;
};

// The k of `kernel`'s tile: its k per pipeline stage (the decode kernel's per loop step).
int mixed_tile_k(MixedGemmKernel kernel);

template <>
struct Family<GroupedGemmMixedSpec> : SpecForms<GroupedGemmMixedSpec> {
  static constexpr std::string_view op = "grouped_gemm_mixed";
  static constexpr auto fields = std::tuple_cat(
      std::tuple{fixed_text(" a=bf16"), field("weight", &GroupedGemmMixedSpec::weight).prefix(" b="),
                 // The text names the scales the weights have: FP4 its format's, fp8 128 x 128 blocks (or as given).
                 field("weight_scale", &GroupedGemmMixedSpec::weight_scale)
                     .only(ScaleGranularity::per_block, ScaleGranularity::per_row, ScaleGranularity::per_tensor)
                     .text([](const GroupedGemmMixedSpec& s) -> std::string {
                       if (s.weight == MixedWeight::nvfp4) return "/per_block:1x16_e4m3fn+global";
                       if (s.weight == MixedWeight::mxfp4) return "/per_block:1x32_ue8m0";
                       if (s.weight_scale == ScaleGranularity::per_block) return "/per_block:128x128";
                       return std::string("/").append(name(s.weight_scale));
                     }),
                 field("scale_convention", &GroupedGemmMixedSpec::scale_convention).prefix("/")},
      gemm_shape_fields<GroupedGemmMixedSpec>(16, 16),
      std::tuple{
          field("weights", &GroupedGemmMixedSpec::weights), field("offsets", &GroupedGemmMixedSpec::offsets),
          field("row_scale", &GroupedGemmMixedSpec::row_scale).optional(),
          field("activation", &GroupedGemmMixedSpec::activation).omit_default(),
          field("gate_up_layout", &GroupedGemmMixedSpec::gate_up_layout),
          field("gather", &GroupedGemmMixedSpec::gather).omit_default().spelled("false", "sorted_to_flat"),
          // A configuration's fields (cache metadata; rare in manifests); the text's tile has its kernel's k.
          configuration(field("kernel", &GroupedGemmMixedSpec::kernel),
                        field("tile", &GroupedGemmMixedSpec::tile_m, &GroupedGemmMixedSpec::tile_n)
                            .range(1, 256)
                            .shape("[m, n]")
                            .text([](const GroupedGemmMixedSpec& s) {
                              return std::string(" tile=").append(
                                  sides_text({s.tile_m, s.tile_n, mixed_tile_k(s.kernel)}));
                            }),
                        field("stages", &GroupedGemmMixedSpec::stages).optional().range(0, 16))});
  static Expected<void> validate(const GroupedGemmMixedSpec& s);
  // A configuration only; fp8 conversion instructions (sm_89 and newer); wgmma_sm90 only where wgmma and TMA are.
  static Expected<void> supported_on(const GroupedGemmMixedSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const GroupedGemmMixedSpec& s);
  static std::vector<GroupedGemmMixedSpec> kernels_for_target(const GroupedGemmMixedSpec& s, const ArchInfo& arch);
};

int grouped_gemm_mixed_shared_bytes(const GroupedGemmMixedSpec& spec);
// The deepest pipeline of SM90 `kernel` with row tiles of `tile_m` rows that fits a Hopper block's shared memory.
int grouped_gemm_mixed_max_stages(MixedGemmKernel kernel, int tile_m, MixedWeight weight = MixedWeight::f8_e4m3fn);
LaunchGeometry grouped_gemm_mixed_geometry(const GroupedGemmMixedSpec& spec, int64_t total_rows, int resident_blocks);

// The configurations `arch` may pick, one per token-count bucket (what precompile builds).
std::vector<GroupedGemmMixedSpec> grouped_gemm_mixed_configs(const GroupedGemmMixedSpec& problem, const ArchInfo& arch);
// The configuration a launch of `rows` rows on `arch` uses; `request` as for the bf16 family (sm90 and
// sm90_swap_ab both name the wgmma kernel; tile_m / tile_n override; no clusters).
Expected<GroupedGemmMixedSpec> choose_grouped_gemm_mixed_config(const GroupedGemmMixedSpec& problem,
                                                                const ArchInfo& arch, int64_t rows,
                                                                const GemmRequest& request = {});
Expected<std::vector<GroupedGemmMixedSpec>> grouped_gemm_mixed_candidates(const GroupedGemmMixedSpec& problem,
                                                                          const ArchInfo& arch,
                                                                          const GemmRequest& request = {});

}  // namespace kjit::codegen
