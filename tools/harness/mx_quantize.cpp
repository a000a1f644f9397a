// The MX quantize family's check (harness.hpp).
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/internal/ops/mx_quantize.hpp"
#include "kjit/reference/fp4_mx.hpp"

namespace kjit::harness {

// 3 experts of 37 rows (not a multiple of 128: the swizzled padding is
// checked) over input rows padded past K. Blocks span 2^-40 to 2^40 in
// magnitude; the first blocks of expert 0 are the edge cases: all zero, +inf,
// NaN, -inf, a huge value (bf16's largest finite), and bf16 subnormals only.
// NVFP4's given global scales are random; computed ones are compared too.
// Codes, every scale byte (padding included) and the global scales start
// poisoned and must match kjit/reference/fp4_mx.hpp bit for bit.
Expected<int64_t> check_mx_quantize(Runtime& runtime, DeviceState& device, const codegen::MxQuantizeSpec& spec,
                                    std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t experts = 3, rows = 37, k = spec.k, stride = k + 8, block = codegen::mx_block(spec.format);
  const bool nvfp4 = spec.format == codegen::MxFormat::nvfp4;

  std::vector<uint16_t> in(static_cast<size_t>(experts * rows * stride), reference::bf16_bits_rne(-7.0f));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  for (int64_t r = 0; r < experts * rows; ++r)
    for (int64_t b = 0; b < k / block; ++b) {
      const float magnitude = std::ldexp(1.0f, exponent(rng));
      for (int64_t c = 0; c < block; ++c)
        in[static_cast<size_t>(r * stride + b * block + c)] = reference::bf16_bits_rne(normal(rng) * magnitude);
    }
  // Edge blocks along expert 0's first rows (K may hold a single block).
  auto edge_block = [&](int64_t i) { return in.begin() + i * stride; };
  const float inf = std::numeric_limits<float>::infinity();
  std::fill_n(edge_block(0), block, reference::bf16_bits_rne(0.0f));
  edge_block(1)[3] = reference::bf16_bits_rne(inf);
  edge_block(2)[block - 1] = reference::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN());
  edge_block(3)[0] = reference::bf16_bits_rne(-inf);
  edge_block(4)[1] = 0x7F7Fu;  // bf16's largest finite value, 3.39e38
  for (int64_t c = 0; c < block; ++c) edge_block(5)[c] = static_cast<uint16_t>((c * 5 + 1) & 0x7F);  // subnormals

  std::vector<float> given(static_cast<size_t>(experts));
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  for (auto& g : given) g = std::ldexp(unit(rng), exponent(rng) / 4);

  const auto element = spec.element == codegen::MxElement::f8_e5m2   ? KJIT_DTYPE_F8_E5M2
                       : spec.element == codegen::MxElement::f8_e4m3fn ? KJIT_DTYPE_F8_E4M3FN
                                                                       : KJIT_DTYPE_INVALID;
  const auto format = nvfp4 ? KJIT_BLOCK_FORMAT_NVFP4
                            : spec.format == codegen::MxFormat::mxfp4 ? KJIT_BLOCK_FORMAT_MXFP4
                                                                           : KJIT_BLOCK_FORMAT_MXFP8;
  const auto layout =
      spec.scale_layout == codegen::MxScaleLayout::linear ? KJIT_SCALE_LAYOUT_LINEAR : KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  const auto mode = !nvfp4 ? KJIT_GLOBAL_SCALE_UNSET
                    : spec.global_scale == codegen::GlobalScaleMode::compute ? KJIT_GLOBAL_SCALE_COMPUTE
                                                                             : KJIT_GLOBAL_SCALE_GIVEN;
  const auto convention = !nvfp4 ? KJIT_SCALE_CONVENTION_UNSET
                          : spec.convention == codegen::ScaleConvention::divide ? KJIT_SCALE_DIVIDE
                                                                                : KJIT_SCALE_MULTIPLY;
  const auto want = reference::quantize_mx_stack(format, element, in, experts, rows, k, stride, layout, mode,
                                                 convention, given);

  Buffers buffers(api, device.context);
  auto din = buffers.upload(in.data(), in.size() * 2);
  auto dout = buffers.upload(nullptr, want.out.size());  // 0xA5 poison: unwritten bytes fail
  auto dscales = buffers.upload(nullptr, want.scales.size());
  auto dglobal = buffers.upload(mode == KJIT_GLOBAL_SCALE_GIVEN ? given.data() : nullptr, given.size() * 4);
  for (auto* r : {&din, &dout, &dscales, &dglobal})
    if (!*r) return std::unexpected(r->error());
  kjit_mx_quantize_desc d;
  kjit_mx_quantize_desc_init(&d);
  d.format = format;
  d.element_dtype = element;
  d.experts = experts;
  d.rows = rows;
  d.k = k;
  d.in_row_stride = stride;
  d.scale_layout = layout;
  d.in = reinterpret_cast<const void*>(*din);
  d.out = reinterpret_cast<void*>(*dout);
  d.scales = reinterpret_cast<uint8_t*>(*dscales);
  if (nvfp4) d.global_scales = reinterpret_cast<float*>(*dglobal);
  d.global_scale_mode = mode;
  d.global_scale_convention = convention;
  const auto plan = KJIT_TRY(ops::plan_mx_quantize(d));
  if (!(plan.spec == spec)) return fail(KJIT_ERROR_INTERNAL, "the descriptor does not select the spec under check");
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::mx_quantize(runtime, d, nullptr); }));

  std::vector<uint8_t> out(want.out.size()), scales(want.scales.size());
  std::vector<float> global(given.size());
  KJIT_TRY(buffers.download(out.data(), *dout, out.size()));
  KJIT_TRY(buffers.download(scales.data(), *dscales, scales.size()));
  KJIT_TRY(buffers.download(global.data(), *dglobal, global.size() * 4));
  int64_t wrong = 0;
  for (size_t i = 0; i < out.size(); ++i) wrong += out[i] == want.out[i] ? 0 : 1;
  for (size_t i = 0; i < scales.size(); ++i) wrong += scales[i] == want.scales[i] ? 0 : 1;
  for (size_t i = 0; nvfp4 && i < global.size(); ++i)
    wrong += reference::float_bits(global[i]) == reference::float_bits(want.global_scales[i]) ? 0 : 1;
  return wrong;
}

}  // namespace kjit::harness
