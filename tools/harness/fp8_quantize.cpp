// The fp8 quantize family's check (harness.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/internal/ops/fp8_quantize.hpp"
#include "kjit/reference/fp8_quantize.hpp"

namespace kjit::harness {

// 37 output rows (not a multiple of any block's 32 groups) over input rows
// padded past K. Groups span 2^-30 to 2^30 in magnitude; the first groups of
// the first input rows are the edge cases: all zero, amax exactly 448, all
// ones, +inf, NaN, -inf, and an amax below the 1e-10 clamp. With gather, 13
// tokens x top_k 3: 31 rows take a shuffled sample of the flat indices and
// the last 6 are -1. Codes and scales start poisoned and must match the
// reference bit for bit.
Expected<int64_t> check_fp8_quantize(Runtime& runtime, DeviceState& device, const codegen::Fp8QuantizeSpec& spec,
                                     std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t rows = 37, k = spec.k, groups = k / 128, stride = k + 8;
  const int64_t tokens = spec.gather ? 13 : rows, top_k = spec.gather ? 3 : 0;

  std::vector<uint16_t> in(static_cast<size_t>(tokens * stride), reference::bf16_bits_rne(-7.0f));  // padding: never read
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t g = 0; g < groups; ++g) {
      const float magnitude = std::ldexp(1.0f, exponent(rng));
      for (int64_t c = 0; c < 128; ++c)
        in[static_cast<size_t>(t * stride + g * 128 + c)] = reference::bf16_bits_rne(normal(rng) * magnitude);
    }
  auto first_group = [&](int64_t t) { return in.begin() + t * stride; };
  std::fill_n(first_group(0), 128, reference::bf16_bits_rne(0.0f));
  std::fill_n(first_group(1), 128, reference::bf16_bits_rne(0.0f));
  first_group(1)[5] = reference::bf16_bits_rne(448.0f);
  for (int c = 0; c < 128; c += 2) first_group(1)[c] = reference::bf16_bits_rne(c % 4 ? -1.5f : 0.125f);
  std::fill_n(first_group(2), 128, reference::bf16_bits_rne(1.0f));
  first_group(3)[17] = reference::bf16_bits_rne(std::numeric_limits<float>::infinity());
  first_group(4)[127] = reference::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN());
  first_group(5)[0] = reference::bf16_bits_rne(-std::numeric_limits<float>::infinity());
  for (int c = 0; c < 128; ++c) first_group(6)[c] = reference::bf16_bits_rne(static_cast<float>(c) * 1e-13f);

  std::vector<int32_t> sorted_to_flat;
  if (spec.gather) {
    std::vector<int32_t> flat(static_cast<size_t>(tokens * top_k));
    std::iota(flat.begin(), flat.end(), 0);
    std::shuffle(flat.begin(), flat.end(), rng);
    sorted_to_flat.assign(flat.begin(), flat.begin() + 31);
    sorted_to_flat.resize(static_cast<size_t>(rows), -1);
    sorted_to_flat[0] = 0;  // tokens 0 and 1 (zeros, amax 448) are read for sure
    sorted_to_flat[1] = static_cast<int32_t>(top_k);
  }
  std::vector<uint8_t> want_codes(static_cast<size_t>(rows * k));
  std::vector<float> want_scales(static_cast<size_t>(rows * groups));
  reference::fp8_quantize(in, stride, rows, k, spec.scale_format == codegen::QuantScaleFormat::ue8m0, sorted_to_flat,
                          tokens, top_k, want_codes, want_scales);

  Buffers buffers(api, device.context);
  auto din = buffers.upload(in.data(), in.size() * 2);
  auto dmap = buffers.upload(sorted_to_flat.empty() ? nullptr : sorted_to_flat.data(),
                             std::max<size_t>(4, sorted_to_flat.size() * 4));
  auto dcodes = buffers.upload(nullptr, want_codes.size());  // 0xA5 poison: unwritten elements fail
  auto dscales = buffers.upload(nullptr, want_scales.size() * 4);
  for (auto* r : {&din, &dmap, &dcodes, &dscales})
    if (!*r) return std::unexpected(r->error());
  kjit_fp8_quantize_desc d;
  kjit_fp8_quantize_desc_init(&d);
  d.in_dtype = KJIT_DTYPE_BF16;
  d.out_dtype = KJIT_DTYPE_F8_E4M3FN;
  d.rows = rows;
  d.k = k;
  d.group = spec.group;
  d.scale_format = spec.scale_format == codegen::QuantScaleFormat::ue8m0 ? KJIT_QUANT_SCALE_UE8M0 : KJIT_QUANT_SCALE_FP32;
  d.in_row_stride = stride;
  d.in = reinterpret_cast<const void*>(*din);
  d.out = reinterpret_cast<void*>(*dcodes);
  d.scales = reinterpret_cast<float*>(*dscales);
  if (spec.gather) {
    d.sorted_to_flat = reinterpret_cast<const int32_t*>(*dmap);
    d.tokens = tokens;
    d.top_k = top_k;
  }
  const auto plan = KJIT_TRY(ops::plan_fp8_quantize(d));
  if (!(plan.spec == spec)) return fail(KJIT_ERROR_INTERNAL, "the descriptor does not select the spec under check");
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::fp8_quantize(runtime, d, nullptr); }));

  std::vector<uint8_t> codes(want_codes.size());
  std::vector<uint32_t> scales(want_scales.size());
  KJIT_TRY(buffers.download(codes.data(), *dcodes, codes.size()));
  KJIT_TRY(buffers.download(scales.data(), *dscales, scales.size() * 4));
  int64_t wrong = 0;
  for (size_t i = 0; i < codes.size(); ++i) wrong += codes[i] == want_codes[i] ? 0 : 1;
  for (size_t i = 0; i < scales.size(); ++i) wrong += scales[i] == reference::float_bits(want_scales[i]) ? 0 : 1;
  return wrong;
}

}  // namespace kjit::harness
