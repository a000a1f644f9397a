// The MoE activation family: the gate_up grouped GEMM's bf16 output
// h [rows, 2I] -> act(gate, up) [rows, I] in one pass, bf16 out or e4m3fn
// codes with one scale per row per 128 columns (exactly kjit_fp8_quantize's,
// the A operand of the W8A8 down GEMM). Activations: SiLU-and-mul and
// gpt-oss's clamped SwiGLU; gate and up as halves (Hugging Face) or
// alternating columns (gpt-oss). Its gradient (`gradient`): the gradient of
// h [rows, 2I] from the activation's [rows, I], bf16, for the backward pass.
// Home: this header and codegen/src/families/moe_activation.cpp; device code in
// templates/activation/moe_activation.cuh (math: templates/common/activation.cuh);
// ABI block templates/abi/moe_activation_params.h. kjit.h
// (kjit_moe_activation_desc) states the arithmetic.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/families/fp8_quantize.hpp"
#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The key: I (compiled in), activation, layout, output type and, for FP8
// output, the scale format. Rows, the input row stride, valid_rows and
// swiglu_oai's alpha and limit are run-time arguments.
struct MoeActivationSpec {
  int64_t intermediate = 0;  // I: output columns; h has 2I
  Activation activation = Activation::silu_mul;  // not none: an activation to apply
  GateUpLayout layout = GateUpLayout::halves;
  DType out = DType::bf16;                                 // bf16 or f8_e4m3fn
  QuantScaleFormat scale_format = QuantScaleFormat::fp32;  // f8_e4m3fn only
  bool gradient = false;  // the backward: out is the gradient of h (bf16), from the activation's (`grad`)
  bool operator==(const MoeActivationSpec&) const = default;
};

template <>
struct Family<MoeActivationSpec> : SpecForms<MoeActivationSpec> {
  static constexpr std::string_view op = "moe_activation";
  static constexpr auto fields = std::tuple{
      fixed_text(" in=bf16"),
      field("activation", &MoeActivationSpec::activation).only(Activation::silu_mul, Activation::swiglu_oai),
      field("layout", &MoeActivationSpec::layout),
      field("intermediate", &MoeActivationSpec::intermediate).range(8, kMaxDimension),
      field("out", &MoeActivationSpec::out).only(DType::bf16, DType::f8_e4m3fn),
      // FP8 output only (validate refuses ue8m0 beside bf16); its group is always 128 columns.
      field("scale_format", &MoeActivationSpec::scale_format)
          .written_when([](const MoeActivationSpec& s) { return s.out == DType::f8_e4m3fn; })
          .prefix(" group=128 scale="),
      field("gradient", &MoeActivationSpec::gradient).omit_default()};
  static Expected<void> validate(const MoeActivationSpec& s);
  static Expected<void> supported_on(const MoeActivationSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const MoeActivationSpec& s);
  static std::vector<MoeActivationSpec> kernels_for_target(const MoeActivationSpec& s, const ArchInfo&) { return {s}; }
};

// One thread per 8 output columns (bf16) or 16 (FP8: 8 threads per scale group), 256 per block.
LaunchGeometry moe_activation_geometry(const MoeActivationSpec& spec, int64_t rows);
// The most rows one launch takes for `spec` (the grid's x limit).
int64_t moe_activation_max_rows(const MoeActivationSpec& spec);

}  // namespace kjit::codegen
