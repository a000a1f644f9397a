// The grouped GEMM family's check (harness.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/reference/fp8.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"

namespace kjit::harness {
namespace {

uint16_t bf16_bits(float f) { return reference::bf16_bits_rne(f); }

}  // namespace

// Runs a grouped GEMM kind once on random routing (empty experts included,
// rows past the last offset) and returns the relative error of 6 sampled
// rows against a float64 reference. Output starts as 0xA5 bytes (-2.9e-16 in
// bf16 and f32), so an unwritten row shows as a ~100% error; the rows past
// the last offset must keep those bytes.
Expected<double> check_grouped_gemm(Runtime& runtime, DeviceState& device, const codegen::GroupedGemmSpec& spec,
                                    std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t experts = spec.experts, n = spec.n, k = spec.k;
  // Rows go to at most three experts (the second, the middle and the last);
  // the others stay empty, so only their weights need filling: a DeepSeek
  // spec holds 256 x 4096 x 7168 weights, too many to generate on the host.
  std::vector<int32_t> counts(static_cast<size_t>(experts));
  std::uniform_int_distribution<int> count(1, 6);
  std::vector<int64_t> active;
  for (int64_t e : {std::min<int64_t>(1, experts - 1), experts / 2, experts - 1})
    if (std::find(active.begin(), active.end(), e) == active.end()) active.push_back(e);
  for (int64_t e : active) counts[static_cast<size_t>(e)] = count(rng);
  std::vector<int32_t> offsets;
  if (spec.offsets == codegen::OffsetsConvention::with_leading_zero) offsets.push_back(0);
  int64_t routed = 0;
  for (int32_t c : counts) offsets.push_back(static_cast<int32_t>(routed += c));
  const int64_t rows = routed + 3;  // three rows belong to no expert

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> a(static_cast<size_t>(rows * k));
  for (auto& v : a) v = bf16_bits(normal(rng));
  const size_t expert_elements = static_cast<size_t>(n * k);
  std::vector<std::vector<uint16_t>> w(static_cast<size_t>(experts));  // filled for active experts only
  for (int64_t e : active) {
    w[static_cast<size_t>(e)].resize(expert_elements);
    for (auto& v : w[static_cast<size_t>(e)]) v = bf16_bits(normal(rng) / std::sqrt(static_cast<float>(k)));
  }
  std::vector<float> scale(static_cast<size_t>(rows));
  for (auto& v : scale) v = 0.5f + 0.5f * std::abs(normal(rng));
  const int out_bytes = codegen::size_bytes(spec.out);
  const size_t out_size = static_cast<size_t>(rows * n * out_bytes);

  Buffers buffers(api, device.context);
  auto da = buffers.upload(a.data(), a.size() * 2);
  auto dw = buffers.upload(nullptr, static_cast<size_t>(experts) * expert_elements * 2);
  auto doff = buffers.upload(offsets.data(), offsets.size() * 4);
  auto dscale = buffers.upload(scale.data(), scale.size() * 4);
  auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
  // Swap AB's tile counter (kjit zeroes it before the launch; the poison checks that).
  auto dworkspace = buffers.upload(nullptr, kjit_grouped_gemm_workspace_bytes());
  for (auto* r : {&da, &dw, &doff, &dscale, &dout, &dworkspace})
    if (!*r) return std::unexpected(r->error());
  {
    ScopedContext scope(api, device.context);
    for (int64_t e : active)
      KJIT_TRY(check(api, api.cuMemcpyHtoD(*dw + static_cast<size_t>(e) * expert_elements * 2, w[static_cast<size_t>(e)].data(), expert_elements * 2), "cuMemcpyHtoD"));
  }
  kjit_grouped_gemm_desc g;
  kjit_grouped_gemm_desc_init(&g);
  g.a_dtype = g.b_dtype = KJIT_DTYPE_BF16;
  g.out_dtype = spec.out == codegen::DType::f32 ? KJIT_DTYPE_F32 : KJIT_DTYPE_BF16;
  g.rows = rows;
  g.n = n;
  g.k = k;
  g.experts = experts;
  g.weights = spec.weights == codegen::WeightLayout::e_k_n ? KJIT_WEIGHTS_E_K_N : KJIT_WEIGHTS_E_N_K;
  g.offsets_convention = spec.offsets == codegen::OffsetsConvention::with_leading_zero ? KJIT_OFFSETS_WITH_LEADING_ZERO
                                                                                       : KJIT_OFFSETS_CUMULATIVE_END;
  g.a = reinterpret_cast<const void*>(*da);
  g.b = reinterpret_cast<const void*>(*dw);
  g.out = reinterpret_cast<void*>(*dout);
  g.offsets = reinterpret_cast<const int32_t*>(*doff);
  g.row_scale = spec.row_scale ? reinterpret_cast<const float*>(*dscale) : nullptr;
  // Run this cached configuration, whatever the heuristic would pick for these rows.
  g.kernel = spec.kernel == codegen::GemmKernel::wgmma_sm90           ? KJIT_GEMM_KERNEL_SM90
             : spec.kernel == codegen::GemmKernel::wgmma_sm90_swap_ab ? KJIT_GEMM_KERNEL_SM90_SWAP_AB
                                                                      : KJIT_GEMM_KERNEL_PORTABLE;
  g.workspace = reinterpret_cast<void*>(*dworkspace);
  g.workspace_bytes = kjit_grouped_gemm_workspace_bytes();
  g.tile_m = spec.tile_m;
  g.tile_n = spec.tile_n;
  g.cluster = spec.cluster;
  g.cluster_axis = spec.cluster_axis == codegen::ClusterAxis::n ? KJIT_GEMM_CLUSTER_ALONG_N : KJIT_GEMM_CLUSTER_ALONG_M;
  KJIT_TRY(ops::grouped_gemm(runtime, g, nullptr));
  KJIT_TRY(runtime.take_device_errors(device.ordinal));
  std::vector<uint8_t> out(out_size);
  KJIT_TRY(buffers.download(out.data(), *dout, out_size));
  for (size_t i = static_cast<size_t>(routed * n * out_bytes); i < out_size; ++i)
    if (out[i] != 0xA5) return fail(KJIT_ERROR_INTERNAL, "a row past the last offset was written");
  std::vector<int64_t> expert_of(static_cast<size_t>(routed));
  for (int64_t e = 0, row = 0; e < experts; ++e)
    for (int32_t i = 0; i < counts[static_cast<size_t>(e)]; ++i) expert_of[static_cast<size_t>(row++)] = e;
  double diff = 0, norm = 0;
  std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(routed - 1, 0));
  for (int sample = 0; sample < 6 && routed > 0; ++sample) {
    const int64_t row = pick(rng), e = expert_of[static_cast<size_t>(row)];
    for (int64_t col = 0; col < n; ++col) {
      double ref = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const size_t wi = spec.weights == codegen::WeightLayout::e_n_k ? static_cast<size_t>(col * k + kk)
                                                                       : static_cast<size_t>(kk * n + col);
        ref += double(reference::bf16_to_float(a[static_cast<size_t>(row * k + kk)])) *
               double(reference::bf16_to_float(w[static_cast<size_t>(e)][wi]));
      }
      if (spec.row_scale) ref *= scale[static_cast<size_t>(row)];
      const size_t at = static_cast<size_t>((row * n + col) * out_bytes);
      double got;
      if (out_bytes == 4) {
        float f;
        std::memcpy(&f, &out[at], 4);
        got = f;
      } else {
        uint16_t b;
        std::memcpy(&b, &out[at], 2);
        got = reference::bf16_to_float(b);
      }
      diff += (got - ref) * (got - ref);
      norm += ref * ref;
    }
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

}  // namespace kjit::harness
