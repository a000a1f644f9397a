// The FP8 (W8A8) grouped GEMM family's check (harness.hpp).
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "device_buffers.hpp"
#include "grouped_gemm_check.hpp"
#include "harness.hpp"
#include "kjit/codegen/families/grouped_gemm_fp8.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/reference/fp8_gemm.hpp"
#include "kjit/reference/fp8_quantize.hpp"

namespace kjit::harness {
namespace {

// The kernel request that, with `spec`'s tile, names `spec`'s kernel (a tile
// with sm90 names the rows-on-M kernel; swap AB is asked for by name).
kjit_gemm_kernel kernel_request(const codegen::GroupedGemmFp8Spec& spec) {
  switch (spec.kernel) {
    case codegen::Fp8GemmKernel::wgmma_sm90: return KJIT_GEMM_KERNEL_SM90_SWAP_AB;
    case codegen::Fp8GemmKernel::wgmma_sm90_rows_on_m: return KJIT_GEMM_KERNEL_SM90;
    case codegen::Fp8GemmKernel::mma_decode:
    case codegen::Fp8GemmKernel::wgmma_decode: return KJIT_GEMM_KERNEL_DECODE;
    case codegen::Fp8GemmKernel::mma_sync: break;
  }
  return KJIT_GEMM_KERNEL_PORTABLE;
}

// The request that makes the op pick `spec` itself, whatever the row count.
codegen::GemmRequest pinning_request(const codegen::GroupedGemmFp8Spec& spec) {
  using Kernel = codegen::GemmRequest::Kernel;
  const kjit_gemm_kernel kernel = kernel_request(spec);
  return {.kernel = kernel == KJIT_GEMM_KERNEL_SM90_SWAP_AB ? Kernel::sm90_swap_ab
                    : kernel == KJIT_GEMM_KERNEL_SM90       ? Kernel::sm90
                    : kernel == KJIT_GEMM_KERNEL_DECODE     ? Kernel::decode
                                                            : Kernel::portable,
          .tile_m = spec.tile_m,
          .tile_n = spec.tile_n,
          .cluster = spec.cluster,
          .cluster_axis = codegen::ClusterAxis::n};
}

}  // namespace

// Runs an FP8 grouped GEMM kind once and returns the relative error of
// sampled rows (the first and last of each routed expert, two more at
// random; quick: their sampled columns, ColumnPlan) against the fp64
// reference. Rows go to three experts, the middle one up to 300 rows (several
// row tiles; quick: two experts, the last one the busy one); the others stay empty, and only
// the routed experts' weights are filled (a DeepSeek spec's 256 experts hold
// 7.5 GB). A is every finite e4m3fn code at random (subnormals, -0 and 448
// included), the weights quantized normals, every scale random and positive.
// Output starts as 0xA5 bytes, so an unwritten row shows as a ~100% error;
// the three rows past the last offset must keep those bytes.
Expected<double> check_grouped_gemm_fp8(Runtime& runtime, DeviceState& device, const codegen::GroupedGemmFp8Spec& spec,
                                        std::mt19937_64& rng, Depth depth) {
  const DriverApi& api = **runtime.driver();
  const int64_t experts = spec.experts, n = spec.n, k = spec.k, k_blocks = k / 128;
  const bool block_scaled = spec.weight_scale == codegen::Fp8WeightScale::block_128;

  std::vector<int32_t> counts(static_cast<size_t>(experts));
  const std::vector<int64_t> active = routed_experts(experts, depth);
  std::uniform_int_distribution<int> few(1, 6), many(1, 300);
  for (int64_t e : active) counts[static_cast<size_t>(e)] = e == busy_expert(experts, depth) ? many(rng) : few(rng);
  const Routing routing(counts, spec.offsets);
  const int64_t routed = routing.routed(), rows = routed + 3;  // three rows belong to no expert

  // A configuration is launched as itself: the request that names its kernel and tile must pick it.
  if (spec.configured()) {
    codegen::GroupedGemmFp8Spec problem = spec;
    problem.kernel = codegen::Fp8GemmKernel::mma_sync;
    problem.tile_m = problem.tile_n = problem.stages = 0;
    problem.cluster = 1;
    const auto chosen = KJIT_TRY(codegen::choose_grouped_gemm_fp8_config(problem, *device.arch, rows, pinning_request(spec)));
    if (chosen != spec)
      return fail(KJIT_ERROR_INTERNAL,
                  fmt::format("{} cannot be launched as itself: its kernel and tile pick {}",
                              codegen::Family<codegen::GroupedGemmFp8Spec>::canonical(spec),
                              codegen::Family<codegen::GroupedGemmFp8Spec>::canonical(chosen)));
  }

  std::uniform_int_distribution<int> finite_code(0, 253);  // 254 codes: all but the NaNs 0x7F and 0xFF
  std::vector<uint8_t> a(static_cast<size_t>(rows * k));
  fill_random(a, rng, [&](std::mt19937_64& r) {
    const int code = finite_code(r);
    return static_cast<uint8_t>(code >= 0x7F ? code + 1 : code);
  });
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t expert_codes = static_cast<size_t>(n * k);
  std::vector<std::vector<uint8_t>> w(static_cast<size_t>(experts));  // filled for routed experts only
  for (int64_t e : active) {
    w[static_cast<size_t>(e)].resize(expert_codes);
    fill_random(w[static_cast<size_t>(e)], rng,
                [&](std::mt19937_64& r) { return reference::encode_e4m3fn_satfinite(normal(r) * 64.0f); });
  }
  // Scales from 1/4 to 4: a wrong scale index shows, and no block drowns the others in the error.
  std::uniform_real_distribution<float> log2_scale(-2.0f, 2.0f);
  std::vector<float> a_scales(static_cast<size_t>(rows * k_blocks));
  for (auto& s : a_scales) s = std::exp2(log2_scale(rng));
  const int64_t b_scales_per_expert = block_scaled ? (n + 127) / 128 * k_blocks : n;
  std::vector<float> b_scales(static_cast<size_t>(experts * b_scales_per_expert));
  for (auto& s : b_scales) s = std::exp2(log2_scale(rng));
  std::vector<float> row_scale(static_cast<size_t>(rows));
  for (auto& v : row_scale) v = 0.5f + 0.5f * std::abs(normal(rng));
  const int out_bytes = codegen::size_bytes(spec.out);
  const size_t out_size = static_cast<size_t>(rows * n * out_bytes);

  Buffers buffers(api, device.context);
  auto da = buffers.upload(a.data(), a.size());
  auto dw = buffers.upload(nullptr, static_cast<size_t>(experts) * expert_codes);
  auto da_scales = buffers.upload(a_scales.data(), a_scales.size() * 4);
  auto db_scales = buffers.upload(b_scales.data(), b_scales.size() * 4);
  auto doff = buffers.upload(routing.offsets.data(), routing.offsets.size() * 4);
  auto drow_scale = buffers.upload(row_scale.data(), row_scale.size() * 4);
  auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
  for (auto* r : {&da, &dw, &da_scales, &db_scales, &doff, &drow_scale, &dout})
    if (!*r) return std::unexpected(r->error());
  KJIT_TRY(upload_routed_weights(buffers, *dw, w, active));
  kjit_grouped_gemm_desc g = launch_desc(spec, KJIT_DTYPE_F8_E4M3FN, rows, *da, *dw, *dout, *doff, *drow_scale);
  g.weights = KJIT_WEIGHTS_E_N_K;
  g.a_scales = reinterpret_cast<const float*>(*da_scales);
  g.b_scales = reinterpret_cast<const float*>(*db_scales);
  g.b_scale_granularity = block_scaled ? KJIT_SCALE_PER_BLOCK : KJIT_SCALE_PER_ROW;
  g.b_block_rows = g.b_block_cols = block_scaled ? 128 : 0;
  if (spec.configured()) {
    g.kernel = kernel_request(spec);
    g.tile_m = spec.tile_m;
    g.tile_n = spec.tile_n;
    g.cluster = spec.cluster;
    // The FP8 kernel's pairs lie along N (sharing the row tile); a lone block has no axis.
    g.cluster_axis = spec.cluster > 1 ? KJIT_GEMM_CLUSTER_ALONG_N : KJIT_GEMM_CLUSTER_ALONG_M;
  }
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::grouped_gemm(runtime, g, nullptr); }));
  std::vector<uint8_t> out(out_size);
  KJIT_TRY(buffers.download(out.data(), *dout, out_size));
  KJIT_TRY(rows_past_routed_untouched(out, static_cast<size_t>(routed * n * out_bytes)));

  std::vector<int64_t> sampled;
  for (int64_t e = 0, row = 0; e < experts; row += counts[static_cast<size_t>(e)], ++e)
    if (counts[static_cast<size_t>(e)] > 0) sampled.insert(sampled.end(), {row, row + counts[static_cast<size_t>(e)] - 1});
  std::uniform_int_distribution<int64_t> pick(0, routed - 1);
  sampled.insert(sampled.end(), {pick(rng), pick(rng)});
  RelativeError error;
  const ColumnPlan columns(n, codegen::Activation::none, spec.tile_n, depth);
  std::vector<double> product(static_cast<size_t>(n));
  for (int64_t row : sampled) {
    const int64_t e = routing.expert_of[static_cast<size_t>(row)];
    const std::span<const float> scales_of_e(b_scales.data() + e * b_scales_per_expert,
                                             static_cast<size_t>(b_scales_per_expert));
    const reference::Fp8ExpertWeights weights{w[static_cast<size_t>(e)], scales_of_e, g.b_scale_granularity};
    const auto a_row = std::span(a).subspan(static_cast<size_t>(row * k), static_cast<size_t>(k));
    const auto a_row_scales =
        std::span(a_scales).subspan(static_cast<size_t>(row * k_blocks), static_cast<size_t>(k_blocks));
    for (int64_t col : columns.product)
      product[static_cast<size_t>(col)] = reference::fp8_gemm_value(a_row, a_row_scales, weights, k, col);
    error.add_row(out, out_bytes, n, row, columns, product, codegen::Activation::none,
                  spec.row_scale ? double(row_scale[static_cast<size_t>(row)]) : 1.0, g);
  }
  return error.value();
}

}  // namespace kjit::harness
