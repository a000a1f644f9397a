// The grouped GEMM family's check (harness.hpp).
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "grouped_gemm_check.hpp"
#include "harness.hpp"
#include "kjit/reference/fp8.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"

namespace kjit::harness {
namespace {

uint16_t bf16_bits(float f) { return reference::bf16_bits_rne(f); }

}  // namespace

// Runs a grouped GEMM kind once on random routing (empty experts included,
// rows past the last offset) and returns the relative error of 6 sampled
// rows (quick: their sampled columns, ColumnPlan) against a float64 reference (with its fused activation, and with its
// rows gathered through sorted_to_flat when the kind has them). Output starts as 0xA5 bytes (-2.9e-16 in
// bf16 and f32), so an unwritten row shows as a ~100% error; the rows past
// the last offset must keep those bytes.
Expected<double> check_grouped_gemm(Runtime& runtime, DeviceState& device, const codegen::GroupedGemmSpec& spec,
                                    std::mt19937_64& rng, Depth depth) {
  const DriverApi& api = **runtime.driver();
  const int64_t experts = spec.experts, n = spec.n, k = spec.k;
  std::vector<int32_t> counts(static_cast<size_t>(experts));
  std::uniform_int_distribution<int> count(1, 6);
  const std::vector<int64_t> active = routed_experts(experts, depth);
  for (int64_t e : active) counts[static_cast<size_t>(e)] = count(rng);
  const Routing routing(counts, spec.offsets);
  const int64_t routed = routing.routed(), rows = routed + 3;  // three rows belong to no expert

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> a(static_cast<size_t>(rows * k));
  fill_random(a, rng, [&](std::mt19937_64& r) { return bf16_bits(normal(r)); });
  const size_t expert_elements = static_cast<size_t>(n * k);
  std::vector<std::vector<uint16_t>> w(static_cast<size_t>(experts));  // filled for active experts only
  for (int64_t e : active) {
    w[static_cast<size_t>(e)].resize(expert_elements);
    fill_random(w[static_cast<size_t>(e)], rng,
                [&](std::mt19937_64& r) { return bf16_bits(normal(r) / std::sqrt(static_cast<float>(k))); });
  }
  std::vector<float> scale(static_cast<size_t>(rows));
  for (auto& v : scale) v = 0.5f + 0.5f * std::abs(normal(rng));
  const int out_bytes = codegen::size_bytes(spec.out);
  const bool fused = spec.activation != codegen::Activation::none;
  const int64_t out_cols = fused ? n / 2 : n;
  const size_t out_size = static_cast<size_t>(rows * out_cols * out_bytes);
  const GatherCheck gathered(a, rows, routed, k, rng);

  Buffers buffers(api, device.context);
  auto da = buffers.upload(spec.gather ? gathered.tokens.data() : a.data(), a.size() * 2);
  auto dindex = buffers.upload(gathered.sorted_to_flat.data(), gathered.sorted_to_flat.size() * 4);
  auto dw = buffers.upload(nullptr, static_cast<size_t>(experts) * expert_elements * 2);
  auto doff = buffers.upload(routing.offsets.data(), routing.offsets.size() * 4);
  auto dscale = buffers.upload(scale.data(), scale.size() * 4);
  auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
  // Swap AB's tile counter (kjit zeroes it before the launch; the poison checks that).
  auto dworkspace = buffers.upload(nullptr, kjit_grouped_gemm_workspace_bytes());
  for (auto* r : {&da, &dindex, &dw, &doff, &dscale, &dout, &dworkspace})
    if (!*r) return std::unexpected(r->error());
  KJIT_TRY(upload_routed_weights(buffers, *dw, w, active));
  kjit_grouped_gemm_desc g = launch_desc(spec, KJIT_DTYPE_BF16, rows, *da, *dw, *dout, *doff, *dscale);
  g.weights = spec.weights == codegen::WeightLayout::e_k_n ? KJIT_WEIGHTS_E_K_N : KJIT_WEIGHTS_E_N_K;
  // Run this cached configuration, whatever the heuristic would pick for these rows.
  g.kernel = spec.kernel == codegen::GemmKernel::wgmma_sm90           ? KJIT_GEMM_KERNEL_SM90
             : spec.kernel == codegen::GemmKernel::wgmma_sm90_swap_ab ? KJIT_GEMM_KERNEL_SM90_SWAP_AB
             : spec.kernel == codegen::GemmKernel::mma_decode         ? KJIT_GEMM_KERNEL_DECODE
             : spec.kernel == codegen::GemmKernel::mma_short_k        ? KJIT_GEMM_KERNEL_SHORT_K
                                                                      : KJIT_GEMM_KERNEL_PORTABLE;
  g.workspace = reinterpret_cast<void*>(*dworkspace);
  g.workspace_bytes = kjit_grouped_gemm_workspace_bytes();
  g.tile_m = spec.tile_m;
  g.tile_n = spec.tile_n;
  g.cluster = spec.cluster;
  g.cluster_axis = spec.cluster_axis == codegen::ClusterAxis::n ? KJIT_GEMM_CLUSTER_ALONG_N : KJIT_GEMM_CLUSTER_ALONG_M;
  set_activation(g, spec);
  if (spec.gather) gathered.apply(g, *da, *dindex);
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::grouped_gemm(runtime, g, nullptr); }));
  std::vector<uint8_t> out(out_size);
  KJIT_TRY(buffers.download(out.data(), *dout, out_size));
  KJIT_TRY(rows_past_routed_untouched(out, static_cast<size_t>(routed * out_cols * out_bytes)));
  RelativeError error;
  const ColumnPlan columns(n, spec.activation, spec.tile_n, depth);
  std::vector<double> product(static_cast<size_t>(n));
  std::uniform_int_distribution<int64_t> pick(0, std::max<int64_t>(routed - 1, 0));
  for (int sample = 0; sample < 6 && routed > 0; ++sample) {
    const int64_t row = pick(rng), e = routing.expert_of[static_cast<size_t>(row)];
    for (int64_t col : columns.product) {
      double ref = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const size_t wi = spec.weights == codegen::WeightLayout::e_n_k ? static_cast<size_t>(col * k + kk)
                                                                       : static_cast<size_t>(kk * n + col);
        ref += double(reference::bf16_to_float(a[static_cast<size_t>(row * k + kk)])) *
               double(reference::bf16_to_float(w[static_cast<size_t>(e)][wi]));
      }
      product[static_cast<size_t>(col)] = ref;
    }
    const double row_scale = spec.row_scale ? double(scale[static_cast<size_t>(row)]) : 1.0;
    error.add_row(out, out_bytes, out_cols, row, columns, product, spec.activation, row_scale, g);
  }
  return error.value();
}

}  // namespace kjit::harness
