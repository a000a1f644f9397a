// The MoE activation family: invariants, recipe and grid.
#include "kjit/codegen/families/moe_activation.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "fp8_spec_fields.hpp"

namespace kjit::codegen {

namespace {

constexpr int kActivationThreads = 256;
constexpr int64_t kMaxGridX = 0x7fffffff;

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

bool fp8_out(const MoeActivationSpec& s) { return s.out == DType::f8_e4m3fn; }

// Output columns one thread owns (one 16-byte store).
int64_t columns_per_thread(const MoeActivationSpec& s) { return fp8_out(s) ? 16 : 8; }

}  // namespace

template struct SpecForms<MoeActivationSpec>;

Expected<void> Family<MoeActivationSpec>::validate(const MoeActivationSpec& s) {
  if (s.activation == Activation::none) return invalid("moe_activation: activation must be silu_mul or swiglu_oai");
  if (s.out != DType::bf16 && s.out != DType::f8_e4m3fn)
    return invalid(fmt::format("moe_activation: out must be bf16 or f8_e4m3fn, not {}", name(s.out)));
  const int64_t multiple = fp8_out(s) ? 128 : 8;
  if (s.intermediate < multiple || s.intermediate % multiple != 0 || s.intermediate > kMaxDimension)
    return invalid(fmt::format("moe_activation: the intermediate size I must be a positive multiple of {} up to {} "
                               "with {} output{}, got {}",
                               multiple, kMaxDimension, name(s.out),
                               fp8_out(s) ? " (one scale per 128 columns)" : " (16-byte stores)", s.intermediate));
  if (!fp8_out(s) && s.scale_format != QuantScaleFormat::fp32)
    return invalid("moe_activation: scale_format is for f8_e4m3fn output; bf16 output has no scales (leave it fp32)");
  if (s.gradient && fp8_out(s)) return invalid("moe_activation: the gradient is bf16 (out=bf16)");
  return {};
}

Expected<void> Family<MoeActivationSpec>::supported_on(const MoeActivationSpec& s, const ArchInfo& arch) {
  if (!fp8_out(s) || arch.fp8_conversion) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("moe_activation with fp8 output needs compute capability 8.9 or newer; {} is {}.{} ({})",
                          arch.target, arch.major, arch.minor, arch.note));
}

RenderedKernel Family<MoeActivationSpec>::render(const MoeActivationSpec& s) {
  return assemble(canonical(s),
                  {.entry_point = "kjit_moe_activation",
                   .threads = kActivationThreads,
                   .templates = {"activation/moe_activation.cuh"},
                   .config = fmt::format("kjit::MoeActivationConfig<{}LL, kjit::GateUpLayout::{}, "
                                         "kjit::Activation::{}, {}, {}, {}, {}>",
                                         s.intermediate, name(s.layout), name(s.activation), fp8_out(s),
                                         s.scale_format == QuantScaleFormat::ue8m0, kActivationThreads, s.gradient),
                   .params_type = "kjit_moe_activation_params",
                   .body = "kjit::moe_activation",
                   .signals_dependents_early = true});
}

LaunchGeometry moe_activation_geometry(const MoeActivationSpec& spec, int64_t rows) {
  const int64_t threads = rows * (spec.intermediate / columns_per_thread(spec));
  LaunchGeometry g;
  g.block_x = kActivationThreads;
  g.grid_x = static_cast<uint32_t>(
      std::clamp<int64_t>((threads + kActivationThreads - 1) / kActivationThreads, 1, kMaxGridX));
  return g;
}

int64_t moe_activation_max_rows(const MoeActivationSpec& spec) {
  return kMaxGridX * kActivationThreads / (spec.intermediate / columns_per_thread(spec));
}

}  // namespace kjit::codegen
