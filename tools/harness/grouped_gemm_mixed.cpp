// The mixed-input grouped GEMM family's check (harness.hpp): bf16
// activations, FP8 (W8A16) or FP4 (W4A16: NVFP4, MXFP4) weights converted in
// the kernel.
#include <algorithm>
#include <cmath>
#include <random>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "device_buffers.hpp"
#include "grouped_gemm_check.hpp"
#include "harness.hpp"
#include "kjit/codegen/families/grouped_gemm_mixed.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/reference/mixed_gemm.hpp"

namespace kjit::harness {
namespace {

// The request that makes the op pick `spec` itself, whatever the row count.
codegen::GemmRequest pinning_request(const codegen::GroupedGemmMixedSpec& spec) {
  using Kernel = codegen::GemmRequest::Kernel;
  return {.kernel = spec.kernel == codegen::MixedGemmKernel::wgmma_sm90             ? Kernel::sm90
                    : spec.kernel == codegen::MixedGemmKernel::wgmma_sm90_converter ? Kernel::sm90_converter
                    : spec.kernel == codegen::MixedGemmKernel::mma_decode           ? Kernel::decode
                                                                                    : Kernel::portable,
          .tile_m = spec.tile_m,
          .tile_n = spec.tile_n};
}

kjit_scale_granularity granularity_of(codegen::ScaleGranularity s) {
  switch (s) {
    case codegen::ScaleGranularity::per_block: return KJIT_SCALE_PER_BLOCK;
    case codegen::ScaleGranularity::per_row: return KJIT_SCALE_PER_ROW;
    case codegen::ScaleGranularity::per_tensor: return KJIT_SCALE_PER_TENSOR;
  }
  return KJIT_SCALE_INVALID;
}

// A random code of magnitude 1/4 to 4 (e4m3fn exponents 5..8, e5m2 13..16),
// either sign, never zero: a scale applied to the wrong block or row shows,
// and no weight drowns the others in the error.
uint8_t random_code(kjit_dtype dtype, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> bits(0, 255), exponent(0, 3);
  const int r = bits(rng), sign = r & 0x80;
  if (dtype == KJIT_DTYPE_F8_E4M3FN) return static_cast<uint8_t>(sign | (5 + exponent(rng)) << 3 | (r & 0x7));
  return static_cast<uint8_t>(sign | (13 + exponent(rng)) << 2 | (r & 0x3));
}

// FP4 weights' scale bytes of moderate size (NVFP4: e4m3fn 2^-2 .. 2^2 with
// random mantissas; MXFP4: UE8M0 2^-3 .. 2^3), and NVFP4's global.
uint8_t random_fp4_scale(bool nvfp4, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> exponent(5, 9), mantissa(0, 7), ue8m0(124, 130);
  if (nvfp4) return static_cast<uint8_t>(exponent(rng) << 3 | mantissa(rng));
  return static_cast<uint8_t>(ue8m0(rng));
}

}  // namespace

// Runs a W8A16 or W4A16 grouped GEMM kind once and returns the relative error of
// sampled rows (the first and last of each routed expert, two more at
// random; quick: their sampled columns, ColumnPlan) against the fp64
// reference of the dequantised weights. Rows go to three experts, the middle
// one up to 300 rows (several row tiles; quick: two, the last the busy one); the
// others stay empty, and only the routed experts' weights are filled (a
// DeepSeek spec's 256 experts hold 7.5 GB). A is bf16 normals (no zeros), the
// fp8 weights random codes of magnitude 1/4 to 4 (FP4: every e2m1 code), every
// scale random, positive, from 1/4 to 4 (FP4: 1/8 to 8). Output starts as 0xA5 bytes, so an unwritten row shows as a
// ~100% error; the three rows past the last offset must keep those bytes.
Expected<double> check_grouped_gemm_mixed(Runtime& runtime, DeviceState& device,
                                          const codegen::GroupedGemmMixedSpec& spec, std::mt19937_64& rng,
                                          Depth depth) {
  const DriverApi& api = **runtime.driver();
  const int64_t experts = spec.experts, n = spec.n, k = spec.k;

  std::vector<int32_t> counts(static_cast<size_t>(experts));
  const std::vector<int64_t> active = routed_experts(experts, depth);
  std::uniform_int_distribution<int> few(1, 6), many(1, 300);
  for (int64_t e : active) counts[static_cast<size_t>(e)] = e == busy_expert(experts, depth) ? many(rng) : few(rng);
  const Routing routing(counts, spec.offsets);
  const int64_t routed = routing.routed(), rows = routed + 3;  // three rows belong to no expert

  // A configuration is launched as itself: the request that names its kernel and tile must pick it.
  if (spec.configured()) {
    codegen::GroupedGemmMixedSpec problem = spec;
    problem.kernel = codegen::MixedGemmKernel::mma_sync;
    problem.tile_m = problem.tile_n = problem.stages = 0;
    const auto chosen =
        KJIT_TRY(codegen::choose_grouped_gemm_mixed_config(problem, *device.arch, rows, pinning_request(spec)));
    if (chosen != spec)
      return fail(KJIT_ERROR_INTERNAL,
                  fmt::format("{} cannot be launched as itself: its kernel and tile pick {}",
                              codegen::Family<codegen::GroupedGemmMixedSpec>::canonical(spec),
                              codegen::Family<codegen::GroupedGemmMixedSpec>::canonical(chosen)));
  }

  const bool fp4 = codegen::is_fp4(spec.weight), nvfp4 = spec.weight == codegen::MixedWeight::nvfp4;
  const kjit_dtype weight = fp4 ? KJIT_DTYPE_F4_E2M1
                            : spec.weight == codegen::MixedWeight::f8_e5m2 ? KJIT_DTYPE_F8_E5M2
                                                                           : KJIT_DTYPE_F8_E4M3FN;
  const kjit_block_format format = nvfp4 ? KJIT_BLOCK_FORMAT_NVFP4 : fp4 ? KJIT_BLOCK_FORMAT_MXFP4 : KJIT_BLOCK_FORMAT_UNSET;
  const kjit_weight_layout layout = spec.weights == codegen::WeightLayout::e_k_n ? KJIT_WEIGHTS_E_K_N : KJIT_WEIGHTS_E_N_K;
  const kjit_scale_granularity granularity = fp4 ? KJIT_SCALE_INVALID : granularity_of(spec.weight_scale);
  const kjit_scale_convention convention =
      spec.scale_convention == codegen::ScaleConvention::divide ? KJIT_SCALE_DIVIDE : KJIT_SCALE_MULTIPLY;
  const int64_t group = nvfp4 ? reference::kNvfp4Block : reference::kMxBlock;
  // One expert's weights as the reference reads them (experts = 1: the host holds the routed experts apart).
  // fp8: `scales` are its fp32 scales; FP4: `block_scales` its scale bytes and `global` its global scale.
  const auto expert_weights = [&](std::span<const uint8_t> codes, std::span<const float> scales,
                                  std::span<const uint8_t> block_scales, std::span<const float> global) {
    reference::MixedWeights w{codes, scales, weight, layout, granularity, convention, 1, n, k};
    w.format = format;
    w.block_scales = block_scales;
    w.global_scales = global;
    return w;
  };
  // FP4: a scale byte per group of the stored rows ([E, N, K / 2] read [E, N, K] or [E, K, N]).
  const auto stored = expert_weights({}, {}, {}, {});
  const int64_t scales_per_expert =
      fp4 ? stored.stored_rows() * (stored.stored_cols() / group) : stored.scales_per_expert();

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> a(static_cast<size_t>(rows * k));
  fill_random(a, rng, [&](std::mt19937_64& r) {
    const float x = normal(r);
    return reference::bf16_bits_rne(x == 0.0f ? 1.0f : x);
  });
  const size_t expert_codes = static_cast<size_t>(fp4 ? n * k / 2 : n * k);  // bytes
  std::vector<std::vector<uint8_t>> w(static_cast<size_t>(experts));  // filled for routed experts only
  std::uniform_int_distribution<int> any_byte(0, 255);
  for (int64_t e : active) {
    w[static_cast<size_t>(e)].resize(expert_codes);
    fill_random(w[static_cast<size_t>(e)], rng, [&](std::mt19937_64& r) {
      return fp4 ? static_cast<uint8_t>(any_byte(r)) : random_code(weight, r);
    });
  }
  std::uniform_real_distribution<float> log2_scale(-2.0f, 2.0f);
  std::vector<float> scales(fp4 ? 0 : static_cast<size_t>(experts * scales_per_expert));
  for (auto& s : scales) s = std::exp2(log2_scale(rng));
  std::vector<uint8_t> block_scales(fp4 ? static_cast<size_t>(experts * scales_per_expert) : 0);
  for (auto& s : block_scales) s = random_fp4_scale(nvfp4, rng);
  std::vector<float> global_scales(nvfp4 ? static_cast<size_t>(experts) : 0);
  for (auto& s : global_scales) s = std::exp2(log2_scale(rng));
  std::vector<float> row_scale(static_cast<size_t>(rows));
  for (auto& v : row_scale) v = 0.5f + 0.5f * std::abs(normal(rng));
  const int out_bytes = codegen::size_bytes(spec.out);
  const bool fused = spec.activation != codegen::Activation::none;
  const int64_t out_cols = fused ? n / 2 : n;
  const size_t out_size = static_cast<size_t>(rows * out_cols * out_bytes);
  const GatherCheck gathered(a, rows, routed, k, rng);

  Buffers buffers(api, device.context);
  auto da = buffers.upload(spec.gather ? gathered.tokens.data() : a.data(), a.size() * 2);
  auto dindex = buffers.upload(gathered.sorted_to_flat.data(), gathered.sorted_to_flat.size() * 4);
  auto dw = buffers.upload(nullptr, static_cast<size_t>(experts) * expert_codes);
  auto dscales = buffers.upload(fp4 ? block_scales.data() : static_cast<const void*>(scales.data()),
                                fp4 ? block_scales.size() : scales.size() * 4);
  auto dglobal = buffers.upload(global_scales.data(), std::max<size_t>(4, global_scales.size() * 4));
  auto doff = buffers.upload(routing.offsets.data(), routing.offsets.size() * 4);
  auto drow_scale = buffers.upload(row_scale.data(), row_scale.size() * 4);
  auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
  // Swap AB's tile counter (kjit zeroes it before the launch; the poison checks that).
  auto dworkspace = buffers.upload(nullptr, kjit_grouped_gemm_workspace_bytes());
  for (auto* r : {&da, &dindex, &dw, &dscales, &dglobal, &doff, &drow_scale, &dout, &dworkspace})
    if (!*r) return std::unexpected(r->error());
  // Block-scaled W8A16 with a fused activation: the kernel reads the rows in
  // gate_up_interleaved order beside the checkpoint's block scales, so the
  // device gets the reordered rows and the reference the checkpoint's.
  const auto& layout_of_rows = spec.gate_up_layout;
  if (layout_of_rows) {
    std::vector<std::vector<uint8_t>> reordered(static_cast<size_t>(experts));
    for (int64_t e : active) {
      auto& from = w[static_cast<size_t>(e)];
      auto& to = reordered[static_cast<size_t>(e)];
      to.resize(from.size());
      for (int64_t row = 0; row < n; ++row)
        std::copy_n(from.begin() + gate_up_source_row(row, n, *layout_of_rows) * k, k, to.begin() + row * k);
    }
    KJIT_TRY(upload_routed_weights(buffers, *dw, reordered, active));
  } else {
    KJIT_TRY(upload_routed_weights(buffers, *dw, w, active));
  }
  kjit_grouped_gemm_desc g = launch_desc(spec, KJIT_DTYPE_BF16, rows, *da, *dw, *dout, *doff, *drow_scale);
  g.b_dtype = weight;
  g.weights = layout;
  if (fp4) {
    g.b_format = format;
    g.b_block_scales = reinterpret_cast<const uint8_t*>(*dscales);
    g.b_global_scales = nvfp4 ? reinterpret_cast<const float*>(*dglobal) : nullptr;
    g.b_scale_convention = nvfp4 ? convention : KJIT_SCALE_CONVENTION_UNSET;
  } else {
    g.b_scales = reinterpret_cast<const float*>(*dscales);
    g.b_scale_granularity = granularity;
    g.b_block_rows = g.b_block_cols = granularity == KJIT_SCALE_PER_BLOCK ? reference::kMixedScaleBlock : 0;
    g.b_scale_convention = convention;
  }
  g.workspace = reinterpret_cast<void*>(*dworkspace);
  g.workspace_bytes = kjit_grouped_gemm_workspace_bytes();
  if (spec.configured()) {
    g.kernel = spec.kernel == codegen::MixedGemmKernel::wgmma_sm90             ? KJIT_GEMM_KERNEL_SM90
               : spec.kernel == codegen::MixedGemmKernel::wgmma_sm90_converter ? KJIT_GEMM_KERNEL_SM90_CONVERTER
               : spec.kernel == codegen::MixedGemmKernel::mma_decode           ? KJIT_GEMM_KERNEL_DECODE
                                                                               : KJIT_GEMM_KERNEL_PORTABLE;
    g.tile_m = spec.tile_m;
    g.tile_n = spec.tile_n;
  }
  set_activation(g, spec);
  if (spec.gather) gathered.apply(g, *da, *dindex);
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::grouped_gemm(runtime, g, nullptr); }));
  std::vector<uint8_t> out(out_size);
  KJIT_TRY(buffers.download(out.data(), *dout, out_size));
  KJIT_TRY(rows_past_routed_untouched(out, static_cast<size_t>(routed * out_cols * out_bytes)));

  std::vector<int64_t> sampled;
  for (int64_t e = 0, row = 0; e < experts; row += counts[static_cast<size_t>(e)], ++e)
    if (counts[static_cast<size_t>(e)] > 0) sampled.insert(sampled.end(), {row, row + counts[static_cast<size_t>(e)] - 1});
  std::uniform_int_distribution<int64_t> pick(0, routed - 1);
  sampled.insert(sampled.end(), {pick(rng), pick(rng)});
  std::ranges::sort(sampled, {}, [&](int64_t row) { return routing.expert_of[static_cast<size_t>(row)]; });
  RelativeError error;
  const ColumnPlan columns(n, spec.activation, spec.tile_n, depth);
  std::vector<double> product(static_cast<size_t>(n));
  // Expert `converted_of`'s weights dequantised at the product columns the
  // check reads, K each, one expert at a time (all of them: 117 MB for
  // DeepSeek). Column c as the kernel reads it: with reordered rows, the
  // checkpoint's row gate_up_source_row(c).
  std::vector<std::vector<float>> converted(columns.product.size());
  int64_t converted_of = -1;
  for (int64_t row : sampled) {
    const int64_t e = routing.expert_of[static_cast<size_t>(row)];
    if (e != converted_of) {
      const auto per_expert = [&](const auto& all, int64_t count) {
        return all.empty() ? std::span<const typename std::decay_t<decltype(all)>::value_type>()
                           : std::span(all).subspan(static_cast<size_t>(e * count), static_cast<size_t>(count));
      };
      const auto weights_of_e =
          expert_weights(w[static_cast<size_t>(e)], per_expert(scales, scales_per_expert),
                         per_expert(block_scales, scales_per_expert), per_expert(global_scales, 1));
      for (size_t i = 0; i < columns.product.size(); ++i) {
        const int64_t c = columns.product[i];
        const int64_t source = fused && layout_of_rows ? gate_up_source_row(c, n, *layout_of_rows) : c;
        converted[i].resize(static_cast<size_t>(k));
        for (int64_t kk = 0; kk < k; ++kk)
          converted[i][static_cast<size_t>(kk)] = layout == KJIT_WEIGHTS_E_N_K
                                                      ? reference::mixed_weight_at(weights_of_e, 0, source, kk)
                                                      : reference::mixed_weight_at(weights_of_e, 0, kk, source);
      }
      converted_of = e;
    }
    for (size_t i = 0; i < columns.product.size(); ++i) {
      double sum = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        sum += double(reference::bf16_to_float(a[static_cast<size_t>(row * k + kk)])) *
               double(converted[i][static_cast<size_t>(kk)]);
      product[static_cast<size_t>(columns.product[i])] = sum;
    }
    error.add_row(out, out_bytes, out_cols, row, columns, product, spec.activation,
                  spec.row_scale ? double(row_scale[static_cast<size_t>(row)]) : 1.0, g);
  }
  return error.value();
}

}  // namespace kjit::harness
