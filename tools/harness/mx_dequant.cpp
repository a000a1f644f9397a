// The MX dequant and scale-layout families' checks (harness.hpp).
#include <cstring>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/internal/ops/mx_dequant.hpp"
#include "kjit/internal/ops/mx_scale_layout.hpp"
#include "kjit/reference/fp4_mx.hpp"
#include "kjit/reference/fp8.hpp"

namespace kjit::harness {
namespace {

using codegen::MxFormat;

kjit_dtype out_dtype(codegen::DType t) {
  return t == codegen::DType::bf16 ? KJIT_DTYPE_BF16 : t == codegen::DType::f16 ? KJIT_DTYPE_F16 : KJIT_DTYPE_F32;
}

// A random scale byte: mostly near 1 (so values stay finite and distinct), at
// times one of the format's extremes (NaN, the smallest, the largest).
uint8_t random_scale(MxFormat format, std::mt19937_64& rng) {
  const uint64_t draw = rng();
  if (format == MxFormat::nvfp4) {
    static constexpr uint8_t kEdges[] = {0x7F, 0x01, 0x07, 0x7E, 0x00};  // NaN, subnormals, 448, zero
    if (draw % 64 == 0) return kEdges[(draw >> 8) % 5];
    return static_cast<uint8_t>(0x20 + (draw >> 8) % 0x40);  // 2^-3 .. 2^4-ish
  }
  static constexpr uint8_t kEdges[] = {0x00, 0xFE, 0xFF, 0x01};
  if (draw % 64 == 0) return kEdges[(draw >> 8) % 4];
  return static_cast<uint8_t>(127 - 20 + (draw >> 8) % 41);
}

// The output bits the reference gives for fp32 value `v`.
reference::ExpectedValue rounded(kjit_dtype out, float v) {
  if (out == KJIT_DTYPE_F32) return {reference::float_bits(v), std::isnan(v)};
  if (out == KJIT_DTYPE_BF16) return {reference::bf16_bits_rne(v), std::isnan(v)};
  return {reference::f16_bits_rne(v), std::isnan(v)};
}

}  // namespace

// Runs `spec` once on `device` over three experts of 129 rows (swizzled: a
// partial second 128-row tile) and returns the number of wrong elements.
Expected<int64_t> check_mx_dequant(Runtime& runtime, DeviceState& device, const codegen::MxDequantSpec& spec,
                                   std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const bool fp4 = codegen::is_fp4(spec.format);
  const int64_t experts = 3, rows = 129, k = spec.k, block = codegen::mx_block(spec.format);
  const int64_t row_bytes = fp4 ? k / 2 : k, scale_cols = k / block;
  kjit_mx_dequant_desc d;
  kjit_mx_dequant_desc_init(&d);
  d.format = spec.format == MxFormat::nvfp4   ? KJIT_BLOCK_FORMAT_NVFP4
             : spec.format == MxFormat::mxfp4 ? KJIT_BLOCK_FORMAT_MXFP4
                                              : KJIT_BLOCK_FORMAT_MXFP8;
  if (!fp4) d.element_dtype = spec.element == codegen::DType::f8_e5m2 ? KJIT_DTYPE_F8_E5M2 : KJIT_DTYPE_F8_E4M3FN;
  d.out_dtype = out_dtype(spec.out);
  d.experts = experts;
  d.rows = rows;
  d.k = k;
  const bool swizzled = spec.scale_layout == codegen::MxScaleLayout::swizzled_128x4;
  d.scale_layout = swizzled ? KJIT_SCALE_LAYOUT_SWIZZLED_128X4 : KJIT_SCALE_LAYOUT_LINEAR;
  if (spec.format == MxFormat::nvfp4)
    d.global_scale_convention =
        spec.convention == codegen::ScaleConvention::multiply ? KJIT_SCALE_MULTIPLY : KJIT_SCALE_DIVIDE;
  const std::vector<int32_t> ids = {2, 0};
  const int64_t slots = spec.selected_experts ? 2 : experts;

  std::vector<uint8_t> codes(static_cast<size_t>(experts * rows * row_bytes));
  fill_random(codes, rng, [](std::mt19937_64& r) { return static_cast<uint8_t>(r()); });
  std::vector<uint8_t> linear(static_cast<size_t>(experts * rows * scale_cols));
  for (auto& s : linear) s = random_scale(spec.format, rng);
  std::vector<uint8_t> scales = linear;
  if (swizzled) {
    const std::vector<int64_t> expert_rows(static_cast<size_t>(experts), rows);
    scales.assign(static_cast<size_t>(experts * reference::swizzled_scale_bytes(rows, scale_cols)), 0);
    reference::scales_linear_to_swizzled(linear, expert_rows, scale_cols, 0x00, scales);
  }
  std::vector<float> globals(static_cast<size_t>(experts));
  std::uniform_real_distribution<float> dist(0.01f, 4.0f);
  for (auto& g : globals) g = dist(rng);
  const int out_bytes = codegen::size_bytes(spec.out);
  const size_t out_size = static_cast<size_t>(slots * rows * k * out_bytes);

  Buffers buffers(api, device.context);
  auto in = buffers.upload(codes.data(), codes.size());
  auto sc = buffers.upload(scales.data(), scales.size());
  auto gs = buffers.upload(globals.data(), globals.size() * 4);
  auto out = buffers.upload(nullptr, out_size);  // poisoned: unwritten elements fail
  auto dids = buffers.upload(ids.data(), ids.size() * 4);
  for (auto* r : {&in, &sc, &gs, &out, &dids})
    if (!*r) return std::unexpected(r->error());
  d.in = reinterpret_cast<void*>(*in);
  d.scales = reinterpret_cast<const uint8_t*>(*sc);
  if (spec.format == MxFormat::nvfp4) d.global_scales = reinterpret_cast<const float*>(*gs);
  d.out = reinterpret_cast<void*>(*out);
  if (spec.selected_experts) {
    d.expert_ids = reinterpret_cast<const int32_t*>(*dids);
    d.num_expert_ids = 2;
  }
  auto plan = ops::plan_mx_dequant(d);
  if (!plan) return std::unexpected(plan.error());
  // Run exactly the cached kind: a narrower access than the buffers allow is valid.
  plan->spec.vec = spec.vec;
  plan->geometry = codegen::mx_dequant_geometry(plan->spec, rows, slots);
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::launch_mx_dequant(runtime, *plan, nullptr); }));

  std::vector<uint8_t> result(out_size);
  KJIT_TRY(buffers.download(result.data(), *out, out_size));
  int64_t wrong = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = spec.selected_experts ? ids[static_cast<size_t>(s)] : s;
    for (int64_t r = 0; r < rows; ++r) {
      const std::span<const uint8_t> row(&codes[static_cast<size_t>((e * rows + r) * row_bytes)],
                                         static_cast<size_t>(row_bytes));
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t scale = linear[static_cast<size_t>((e * rows + r) * scale_cols + c / block)];
        float value;
        if (spec.format == MxFormat::nvfp4)
          value = reference::nvfp4_value(reference::e2m1_code_at(row, c), scale, globals[static_cast<size_t>(e)],
                                         d.global_scale_convention);
        else if (fp4)
          value = reference::mx_value(reference::decode_e2m1(reference::e2m1_code_at(row, c)), scale);
        else
          value = reference::mx_value(reference::decode_fp8(d.element_dtype, row[static_cast<size_t>(c)]), scale);
        uint32_t got = 0;
        std::memcpy(&got, &result[static_cast<size_t>(((s * rows + r) * k + c) * out_bytes)],
                    static_cast<size_t>(out_bytes));
        wrong += reference::matches(d.out_dtype, rounded(d.out_dtype, value), got) ? 0 : 1;
      }
    }
  }
  return wrong;
}

// Runs `spec` once on `device` over three experts (uniform: 129 rows each;
// offsets: 129, 0 and 3 rows, then 5 rows past the last offset) and returns
// the number of wrong bytes: the converted ones, the padding (written with the
// pad byte), and the bytes past the converted part of the output (with
// offsets: the worst case's slack, or linear rows past the last offset), which
// must keep their poison.
Expected<int64_t> check_mx_scale_layout(Runtime& runtime, DeviceState& device, const codegen::MxScaleLayoutSpec& spec,
                                        std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t experts = 3, scale_cols = spec.scale_cols;
  const std::vector<int64_t> expert_rows =
      spec.with_offsets ? std::vector<int64_t>{129, 0, 3} : std::vector<int64_t>{129, 129, 129};
  const int64_t used_rows = expert_rows[0] + expert_rows[1] + expert_rows[2];
  const int64_t total_rows = spec.with_offsets ? used_rows + 5 : used_rows;
  const bool to_swizzled = spec.to == codegen::MxScaleLayout::swizzled_128x4;
  constexpr uint8_t kPad = 0x5A;

  const auto swizzled_used = static_cast<size_t>(reference::swizzled_expert_base(expert_rows, experts, scale_cols));
  const uint64_t swizzled_bound = spec.with_offsets ? ops::swizzled_scale_bytes_bound(total_rows, scale_cols, experts)
                                                    : swizzled_used;
  const auto linear_bytes = static_cast<size_t>(total_rows * scale_cols);
  std::vector<uint8_t> linear(linear_bytes), swizzled(swizzled_used);
  for (auto& b : linear) b = static_cast<uint8_t>(rng());
  if (to_swizzled) {
    reference::scales_linear_to_swizzled(linear, expert_rows, scale_cols, kPad, swizzled);
  } else {
    for (auto& b : swizzled) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> used(static_cast<size_t>(used_rows * scale_cols));
    reference::scales_swizzled_to_linear(swizzled, expert_rows, scale_cols, used);
    std::copy(used.begin(), used.end(), linear.begin());
  }
  std::vector<int32_t> offsets;
  int64_t end = 0;
  if (spec.offsets == codegen::OffsetsConvention::with_leading_zero) offsets.push_back(0);
  for (int64_t rows : expert_rows) offsets.push_back(static_cast<int32_t>(end += rows));

  kjit_scale_layout_desc d;
  kjit_scale_layout_desc_init(&d);
  d.from = to_swizzled ? KJIT_SCALE_LAYOUT_LINEAR : KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  d.to = to_swizzled ? KJIT_SCALE_LAYOUT_SWIZZLED_128X4 : KJIT_SCALE_LAYOUT_LINEAR;
  d.experts = experts;
  d.rows = spec.with_offsets ? total_rows : expert_rows[0];
  d.scale_cols = scale_cols;
  d.pad = kPad;
  const size_t out_size = to_swizzled ? static_cast<size_t>(swizzled_bound) : linear_bytes;
  d.out_bytes = out_size;

  Buffers buffers(api, device.context);
  auto in = to_swizzled ? buffers.upload(linear.data(), linear.size())
                        : buffers.upload(swizzled.data(), swizzled.size());
  auto out = buffers.upload(nullptr, out_size);  // poisoned (Buffers::kPoison)
  auto doff = buffers.upload(offsets.data(), offsets.size() * 4);
  for (auto* r : {&in, &out, &doff})
    if (!*r) return std::unexpected(r->error());
  d.in = reinterpret_cast<const uint8_t*>(*in);
  d.out = reinterpret_cast<uint8_t*>(*out);
  if (spec.with_offsets) {
    d.offsets = reinterpret_cast<const int32_t*>(*doff);
    d.offsets_convention = spec.offsets == codegen::OffsetsConvention::cumulative_end ? KJIT_OFFSETS_CUMULATIVE_END
                                                                                       : KJIT_OFFSETS_WITH_LEADING_ZERO;
  }
  auto plan = ops::plan_mx_scale_layout(d);
  if (!plan) return std::unexpected(plan.error());
  if (!(plan->spec == spec)) return fail(KJIT_ERROR_INTERNAL, "the harness's descriptor does not give its spec");
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::convert_scale_layout(runtime, d, nullptr); }));

  std::vector<uint8_t> result(out_size);
  KJIT_TRY(buffers.download(result.data(), *out, out_size));
  int64_t wrong = 0;
  // Linear rows past the last offset are not the conversion's: they keep their poison.
  const std::vector<uint8_t>& want = to_swizzled ? swizzled : linear;
  const size_t converted = to_swizzled ? swizzled_used : static_cast<size_t>(used_rows * scale_cols);
  for (size_t i = 0; i < out_size; ++i)
    wrong += result[i] != (i < converted ? want[i] : Buffers::kPoison) ? 1 : 0;
  return wrong;
}

}  // namespace kjit::harness
