// The MoE activation family's check (harness.hpp).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/internal/ops/moe_activation.hpp"
#include "kjit/reference/moe_activation.hpp"

namespace kjit::harness {

// 37 rows of h over a row stride padded past 2I, valid_rows 31 (the last 6
// rows must come out zero). Values normal(0, 1) times 2^e, e per row from
// [-6, 5], so gates and ups reach past gpt-oss's limit 7 and past where
// e^-g overflows; row 0 holds inf, -inf and NaN in both gate and up. swiglu_oai
// runs with alpha 1.702 and limit 7. The gradient (spec.gradient) takes an
// incoming gradient normal(0, 1) and writes h's [37, 2I]. Outputs start
// poisoned and must match the reference bit for bit (bf16 NaN as NaN).
Expected<int64_t> check_moe_activation(Runtime& runtime, DeviceState& device, const codegen::MoeActivationSpec& spec,
                                       std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const bool fp8 = spec.out == codegen::DType::f8_e4m3fn;
  reference::MoeActivationProblem problem;
  problem.rows = 37;
  problem.intermediate = spec.intermediate;
  problem.in_row_stride = 2 * spec.intermediate + 8;
  problem.layout = spec.layout == codegen::GateUpLayout::halves        ? reference::GateUp::halves
                   : spec.layout == codegen::GateUpLayout::alternating ? reference::GateUp::alternating
                                                                       : reference::GateUp::groups_of_8;
  problem.activation = spec.activation == codegen::Activation::silu_mul ? reference::Activation::silu_mul
                                                                           : reference::Activation::swiglu_oai;
  problem.valid_rows = 31;

  std::vector<uint16_t> in(static_cast<size_t>(problem.rows * problem.in_row_stride), reference::bf16_bits_rne(-5.0f));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 5);
  for (int64_t r = 0; r < problem.rows; ++r) {
    const float magnitude = std::ldexp(1.0f, exponent(rng));
    for (int64_t c = 0; c < 2 * problem.intermediate; ++c)
      in[static_cast<size_t>(r * problem.in_row_stride + c)] = reference::bf16_bits_rne(normal(rng) * magnitude);
  }
  const float specials[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (int i = 0; i < 3; ++i) {
    in[static_cast<size_t>(2 * i)] = reference::activation_bf16_bits(specials[i]);  // a gate or an up, by layout
    in[static_cast<size_t>(problem.intermediate + 2 * i + 1)] = reference::activation_bf16_bits(specials[i]);
  }

  std::vector<uint16_t> grad(static_cast<size_t>(spec.gradient ? problem.rows * problem.intermediate : 0));
  for (auto& g : grad) g = reference::bf16_bits_rne(normal(rng));
  const int64_t outputs = problem.rows * problem.intermediate * (spec.gradient ? 2 : 1), groups = outputs / 128;
  std::vector<uint16_t> want_bf16;
  std::vector<uint8_t> want_codes(static_cast<size_t>(fp8 ? outputs : 0));
  std::vector<float> want_scales(static_cast<size_t>(fp8 ? groups : 0));
  if (fp8)
    reference::moe_activation_fp8(problem, in, spec.scale_format == codegen::QuantScaleFormat::ue8m0, want_codes,
                                  want_scales);
  else if (spec.gradient)
    want_bf16 = reference::moe_activation_gradient(problem, in, grad);
  else
    want_bf16 = reference::moe_activation_bf16(problem, in);

  Buffers buffers(api, device.context);
  const int32_t valid_rows = static_cast<int32_t>(*problem.valid_rows);
  auto din = buffers.upload(in.data(), in.size() * 2);
  auto dvalid = buffers.upload(&valid_rows, 4);
  auto dout = buffers.upload(nullptr, static_cast<size_t>(outputs * (fp8 ? 1 : 2)));  // poisoned
  auto dscales = buffers.upload(nullptr, static_cast<size_t>(std::max<int64_t>(groups, 1) * 4));
  auto dgrad = buffers.upload(grad.empty() ? nullptr : grad.data(), std::max<size_t>(grad.size() * 2, 16));
  for (auto* r : {&din, &dvalid, &dout, &dscales, &dgrad})
    if (!*r) return std::unexpected(r->error());
  kjit_moe_activation_desc d;
  kjit_moe_activation_desc_init(&d);
  d.out_dtype = fp8 ? KJIT_DTYPE_F8_E4M3FN : KJIT_DTYPE_BF16;
  d.activation = spec.activation == codegen::Activation::silu_mul ? KJIT_ACTIVATION_SILU_MUL
                                                                     : KJIT_ACTIVATION_SWIGLU_OAI;
  d.layout = spec.layout == codegen::GateUpLayout::halves        ? KJIT_GATE_UP_HALVES
             : spec.layout == codegen::GateUpLayout::alternating ? KJIT_GATE_UP_ALTERNATING
                                                                 : KJIT_GATE_UP_GROUPS_OF_8;
  d.rows = problem.rows;
  d.intermediate = problem.intermediate;
  d.in_row_stride = problem.in_row_stride;
  d.alpha = problem.alpha;
  d.limit = problem.limit;
  d.in = reinterpret_cast<const void*>(*din);
  d.out = reinterpret_cast<void*>(*dout);
  d.valid_rows = reinterpret_cast<const int32_t*>(*dvalid);
  if (spec.gradient) d.grad = reinterpret_cast<const void*>(*dgrad);
  if (fp8) {
    d.scale_format = spec.scale_format == codegen::QuantScaleFormat::ue8m0 ? KJIT_QUANT_SCALE_UE8M0
                                                                           : KJIT_QUANT_SCALE_FP32;
    d.scales = reinterpret_cast<float*>(*dscales);
  }
  const auto plan = KJIT_TRY(ops::plan_moe_activation(d));
  if (!(plan.spec == spec)) return fail(KJIT_ERROR_INTERNAL, "the descriptor does not select the spec under check");
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::moe_activation(runtime, d, nullptr); }));

  int64_t wrong = 0;
  if (fp8) {
    std::vector<uint8_t> codes(want_codes.size());
    std::vector<uint32_t> scales(want_scales.size());
    KJIT_TRY(buffers.download(codes.data(), *dout, codes.size()));
    KJIT_TRY(buffers.download(scales.data(), *dscales, scales.size() * 4));
    for (size_t i = 0; i < codes.size(); ++i) wrong += codes[i] == want_codes[i] ? 0 : 1;
    for (size_t i = 0; i < scales.size(); ++i) wrong += scales[i] == reference::float_bits(want_scales[i]) ? 0 : 1;
  } else {
    std::vector<uint16_t> got(want_bf16.size());
    KJIT_TRY(buffers.download(got.data(), *dout, got.size() * 2));
    for (size_t i = 0; i < got.size(); ++i) {
      const bool both_nan = std::isnan(reference::bf16_to_float(got[i])) && std::isnan(reference::bf16_to_float(want_bf16[i]));
      wrong += got[i] == want_bf16[i] || both_nan ? 0 : 1;
    }
  }
  return wrong;
}

}  // namespace kjit::harness
