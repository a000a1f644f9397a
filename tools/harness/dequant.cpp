// The dequant family's check (harness.hpp).
#include <cstring>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/reference/fp8.hpp"
#include "kjit/internal/ops/dequant.hpp"

namespace kjit::harness {
namespace {

kjit_dtype abi_dtype(codegen::DType t) {
  switch (t) {
    case codegen::DType::f8_e4m3fn: return KJIT_DTYPE_F8_E4M3FN;
    case codegen::DType::f8_e5m2: return KJIT_DTYPE_F8_E5M2;
    case codegen::DType::bf16: return KJIT_DTYPE_BF16;
    case codegen::DType::f16: return KJIT_DTYPE_F16;
    case codegen::DType::f32: return KJIT_DTYPE_F32;
  }
  return KJIT_DTYPE_INVALID;
}

}  // namespace

// Runs `spec` once on `device` and returns the number of wrong elements.
Expected<int64_t> check_dequant(Runtime& runtime, DeviceState& device, const codegen::DequantSpec& spec,
                                std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  kjit_dequant_desc d;
  kjit_dequant_desc_init(&d);
  d.in_dtype = abi_dtype(spec.in);
  d.out_dtype = abi_dtype(spec.out);
  d.experts = 3;
  d.rows = spec.granularity == codegen::ScaleGranularity::per_block ? 2 * spec.block_rows + 1 : 67;
  d.cols = spec.cols;
  d.scale_convention = spec.convention == codegen::ScaleConvention::multiply ? KJIT_SCALE_MULTIPLY : KJIT_SCALE_DIVIDE;
  d.scale_granularity = spec.granularity == codegen::ScaleGranularity::per_tensor ? KJIT_SCALE_PER_TENSOR
                        : spec.granularity == codegen::ScaleGranularity::per_row  ? KJIT_SCALE_PER_ROW
                                                                                  : KJIT_SCALE_PER_BLOCK;
  d.block_rows = spec.block_rows;
  d.block_cols = spec.block_cols;
  d.scale_rows = d.scale_granularity == KJIT_SCALE_PER_TENSOR ? 1
                 : d.scale_granularity == KJIT_SCALE_PER_ROW  ? d.rows
                                                              : (d.rows + d.block_rows - 1) / d.block_rows;
  d.scale_cols = d.scale_granularity == KJIT_SCALE_PER_BLOCK ? (d.cols + d.block_cols - 1) / d.block_cols : 1;
  const std::vector<int32_t> ids = {2, 0};
  const int64_t slots = spec.selected_experts ? 2 : d.experts;

  std::vector<uint8_t> codes(static_cast<size_t>(d.experts * d.rows * d.cols));
  fill_random(codes, rng, [](std::mt19937_64& r) { return static_cast<uint8_t>(r()); });
  std::vector<float> scales(static_cast<size_t>(d.experts * d.scale_rows * d.scale_cols));
  std::uniform_real_distribution<float> dist(0.01f, 8.0f);
  for (auto& s : scales) s = dist(rng);
  const int out_bytes = codegen::size_bytes(spec.out);
  const size_t out_size = static_cast<size_t>(slots * d.rows * d.cols * out_bytes);

  Buffers buffers(api, device.context);
  auto in = buffers.upload(codes.data(), codes.size());
  auto sc = buffers.upload(scales.data(), scales.size() * 4);
  auto out = buffers.upload(nullptr, out_size);  // poisoned: unwritten elements fail
  auto dids = buffers.upload(ids.data(), ids.size() * 4);
  for (auto* r : {&in, &sc, &out, &dids})
    if (!*r) return std::unexpected(r->error());
  d.in = reinterpret_cast<void*>(*in);
  d.scales = reinterpret_cast<const float*>(*sc);
  d.out = reinterpret_cast<void*>(*out);
  if (spec.selected_experts) {
    d.expert_ids = reinterpret_cast<const int32_t*>(*dids);
    d.num_expert_ids = 2;
  }
  auto plan = ops::plan_dequant(d);
  if (!plan) return std::unexpected(plan.error());
  // Run exactly the cached kind: a narrower access than the buffers allow is valid.
  plan->spec.vec = spec.vec;
  plan->geometry = codegen::dequant_geometry(plan->spec, d.rows, slots);
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::launch_dequant(runtime, *plan, nullptr); }));

  std::vector<uint8_t> result(out_size);
  KJIT_TRY(buffers.download(result.data(), *out, out_size));
  int64_t wrong = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = spec.selected_experts ? ids[static_cast<size_t>(s)] : s;
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t c = 0; c < d.cols; ++c) {
        int64_t si = 0;
        if (d.scale_granularity == KJIT_SCALE_PER_ROW) si = r;
        if (d.scale_granularity == KJIT_SCALE_PER_BLOCK) si = (r / d.block_rows) * d.scale_cols + c / d.block_cols;
        const auto want = reference::dequant_value(
            d.in_dtype, d.out_dtype, codes[static_cast<size_t>((e * d.rows + r) * d.cols + c)],
            scales[static_cast<size_t>(e * d.scale_rows * d.scale_cols + si)], d.scale_convention);
        uint32_t got = 0;
        std::memcpy(&got, &result[static_cast<size_t>(((s * d.rows + r) * d.cols + c) * out_bytes)],
                    static_cast<size_t>(out_bytes));
        wrong += reference::matches(d.out_dtype, want, got) ? 0 : 1;
      }
  }
  return wrong;
}

}  // namespace kjit::harness
