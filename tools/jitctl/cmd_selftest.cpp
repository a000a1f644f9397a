// jitctl selftest: on a GPU machine, launches every cached kernel kind built
// for a present device's arch once, on fresh random data, and checks it
// against a CPU reference: dequant bit for bit (partial blocks included),
// grouped GEMM to 1e-2 relative error on sampled rows (uneven routing, an
// empty expert, rows past the last offset that must stay untouched), MoE
// routing exactly in every output (expert parallelism: ids of other ranks'
// experts, a hot expert, several block-wide chunks), MoE combine to the GPU
// tests' tolerance (rows of other ranks skipped, a token with none on this
// rank exactly zero). Outputs start poisoned, so unwritten elements fail.
// Exit 0 when all match (or when there is no GPU: nothing to run, said so).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "kjit/reference/fp8.hpp"
#include "kjit/reference/moe_routing.hpp"
#include "ops/dequant.hpp"
#include "ops/grouped_gemm.hpp"
#include "ops/moe_routing.hpp"
#include "runtime.hpp"

namespace kjit::tools {
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

// Device memory of one selftest, freed on every path.
class Buffers {
 public:
  Buffers(const DriverApi& api, CUcontext ctx) : api_(api), ctx_(ctx) {}
  ~Buffers() {
    ScopedContext scope(api_, ctx_);
    for (CUdeviceptr p : owned_) api_.cuMemFree(p);
  }
  Expected<CUdeviceptr> upload(const void* data, size_t bytes) {
    ScopedContext scope(api_, ctx_);
    CUdeviceptr p = 0;
    if (auto ok = check(api_, api_.cuMemAlloc(&p, bytes), "cuMemAlloc"); !ok) return std::unexpected(ok.error());
    owned_.push_back(p);
    if (data) {
      if (auto ok = check(api_, api_.cuMemcpyHtoD(p, data, bytes), "cuMemcpyHtoD"); !ok) return std::unexpected(ok.error());
    } else if (auto ok = check(api_, api_.cuMemsetD8(p, 0xA5, bytes), "cuMemsetD8"); !ok) {
      return std::unexpected(ok.error());
    }
    return p;
  }
  Expected<void> download(void* data, CUdeviceptr p, size_t bytes) {
    ScopedContext scope(api_, ctx_);
    return check(api_, api_.cuMemcpyDtoH(data, p, bytes), "cuMemcpyDtoH");
  }

 private:
  const DriverApi& api_;
  CUcontext ctx_;
  std::vector<CUdeviceptr> owned_;
};

// Runs `spec` once on `device` and returns the number of wrong elements.
Expected<int64_t> selftest_dequant(Runtime& runtime, DeviceState& device, const codegen::DequantSpec& spec,
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
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
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
  auto plan = ops::plan_dequant(d, false);
  if (!plan) return std::unexpected(plan.error());
  // Run exactly the cached kind: a narrower access than the buffers allow is valid.
  plan->spec.vec = spec.vec;
  plan->geometry = codegen::dequant_geometry(plan->spec, d.rows, slots);
  if (auto ok = ops::launch_dequant(runtime, *plan, nullptr); !ok) return std::unexpected(ok.error());
  if (auto ok = runtime.take_device_errors(device.ordinal); !ok) return std::unexpected(ok.error());

  std::vector<uint8_t> result(out_size);
  if (auto ok = buffers.download(result.data(), *out, out_size); !ok) return std::unexpected(ok.error());
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

uint16_t bf16_bits(float f) { return reference::bf16_bits_rne(f); }

// Runs a grouped GEMM kind once on random routing (empty experts included,
// rows past the last offset) and returns the relative error of 6 sampled
// rows against a float64 reference. Output starts as 0xA5 bytes (-2.9e-16 in
// bf16 and f32), so an unwritten row shows as a ~100% error; the rows past
// the last offset must keep those bytes.
Expected<double> selftest_gemm(Runtime& runtime, DeviceState& device, const codegen::GroupedGemmSpec& spec,
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
      if (auto ok = check(api,
                          api.cuMemcpyHtoD(*dw + static_cast<size_t>(e) * expert_elements * 2,
                                           w[static_cast<size_t>(e)].data(), expert_elements * 2),
                          "cuMemcpyHtoD");
          !ok)
        return std::unexpected(ok.error());
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
  if (auto ok = ops::grouped_gemm(runtime, g, nullptr); !ok) return std::unexpected(ok.error());
  if (auto ok = runtime.take_device_errors(device.ordinal); !ok) return std::unexpected(ok.error());
  std::vector<uint8_t> out(out_size);
  if (auto ok = buffers.download(out.data(), *dout, out_size); !ok) return std::unexpected(ok.error());
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

// Runs a routing kind once as one rank of an expert-parallel layout (its
// spec.experts experts start past 0, among about twice as many) and returns
// the number of elements of counts, offsets and both permutations that differ
// from the reference. A quarter of the ids go to one hot local expert, so
// lanes of a warp share an expert; the first six sit on the edges of the
// valid and the local ranges. With `many_blocks`, a (poisoned) workspace
// lets the ids run over several blocks.
Expected<int64_t> selftest_routing_once(Runtime& runtime, DeviceState& device, const codegen::MoeRoutingSpec& spec,
                                        std::mt19937_64& rng, int64_t tokens, bool many_blocks) {
  const DriverApi& api = **runtime.driver();
  kjit_moe_routing_desc d;
  kjit_moe_routing_desc_init(&d);
  d.tokens = tokens;
  d.top_k = 8;
  d.experts_local = spec.experts;
  d.expert_base = spec.experts / 2 + 1;
  d.experts_total = 2 * spec.experts + 3;  // > expert_base + experts_local: other ranks on both sides
  d.offsets_convention = spec.offsets == codegen::OffsetsConvention::with_leading_zero ? KJIT_OFFSETS_WITH_LEADING_ZERO
                                                                                       : KJIT_OFFSETS_CUMULATIVE_END;
  const auto base = static_cast<int32_t>(d.expert_base), end = static_cast<int32_t>(d.expert_base + d.experts_local);
  std::vector<int32_t> ids(static_cast<size_t>(d.tokens * d.top_k));
  std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(d.experts_total - 1));
  std::bernoulli_distribution hot(0.25);
  for (auto& id : ids) id = hot(rng) ? base + static_cast<int32_t>(d.experts_local / 2) : any(rng);
  const int32_t edges[] = {0, base - 1, base, end - 1, end, static_cast<int32_t>(d.experts_total - 1)};
  std::copy(std::begin(edges), std::end(edges), ids.begin());
  const auto want = reference::moe_routing(ids, d.expert_base, d.experts_local, d.offsets_convention);

  Buffers buffers(api, device.context);
  auto dids = buffers.upload(ids.data(), ids.size() * 4);
  auto dcounts = buffers.upload(nullptr, want.counts.size() * 4);  // outputs poisoned: unwritten elements fail
  auto doffsets = buffers.upload(nullptr, want.offsets.size() * 4);
  auto dsorted = buffers.upload(nullptr, ids.size() * 4);
  auto dinverse = buffers.upload(nullptr, ids.size() * 4);
  for (auto* r : {&dids, &dcounts, &doffsets, &dsorted, &dinverse})
    if (!*r) return std::unexpected(r->error());
  if (many_blocks) {
    d.workspace_bytes = kjit_moe_routing_workspace_bytes(d.tokens, d.top_k, d.experts_local);
    if (d.workspace_bytes == 0)
      return fail(KJIT_ERROR_INTERNAL, fmt::format("{} x {} ids fit one block: the many-block path would not run",
                                                   d.tokens, d.top_k));
    auto dworkspace = buffers.upload(nullptr, d.workspace_bytes);
    if (!dworkspace) return std::unexpected(dworkspace.error());
    d.workspace = reinterpret_cast<void*>(*dworkspace);
  }
  d.topk_ids = reinterpret_cast<const int32_t*>(*dids);
  d.counts = reinterpret_cast<int32_t*>(*dcounts);
  d.offsets = reinterpret_cast<int32_t*>(*doffsets);
  d.sorted_to_flat = reinterpret_cast<int32_t*>(*dsorted);
  d.flat_to_sorted = reinterpret_cast<int32_t*>(*dinverse);
  if (auto ok = ops::moe_routing(runtime, d, nullptr); !ok) return std::unexpected(ok.error());
  if (auto ok = runtime.take_device_errors(device.ordinal); !ok) return std::unexpected(ok.error());

  int64_t wrong = 0;
  const std::pair<CUdeviceptr, const std::vector<int32_t>*> outputs[] = {
      {*dcounts, &want.counts}, {*doffsets, &want.offsets}, {*dsorted, &want.sorted_to_flat},
      {*dinverse, &want.flat_to_sorted}};
  for (const auto& [p, expected] : outputs) {
    std::vector<int32_t> got(expected->size());
    if (auto ok = buffers.download(got.data(), p, got.size() * 4); !ok) return std::unexpected(ok.error());
    for (size_t i = 0; i < got.size(); ++i) wrong += got[i] == (*expected)[i] ? 0 : 1;
  }
  return wrong;
}

// Both of routing's paths: 333 x 8 ids in one block (three of its block-wide
// chunks, ending mid-warp), and 3333 x 8 over several blocks (the last one
// partly filled).
Expected<int64_t> selftest_routing(Runtime& runtime, DeviceState& device, const codegen::MoeRoutingSpec& spec,
                                   std::mt19937_64& rng) {
  auto one_block = selftest_routing_once(runtime, device, spec, rng, 333, false);
  if (!one_block) return one_block;
  auto many_blocks = selftest_routing_once(runtime, device, spec, rng, 3333, true);
  if (!many_blocks) return many_blocks;
  return *one_block + *many_blocks;
}

// Runs a combine kind once on the mapping a routing of random ids leaves on
// one rank (local experts [2, 6) of 8: about half the (t, j) are -1) and
// returns the number of output elements off the reference, to the GPU tests'
// tolerance (reference::combine_close). Token 0 has all its rows on this
// rank, token 1 none: a token with none must come out +0 exactly, since the
// 0xA5 poison (-2.9e-16) would pass the tolerance's absolute term.
Expected<int64_t> selftest_combine(Runtime& runtime, DeviceState& device, const codegen::MoeCombineSpec& spec,
                                   std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t tokens = 37, top_k = spec.top_k, hidden = spec.hidden;
  std::vector<int32_t> ids(static_cast<size_t>(tokens * top_k));
  std::uniform_int_distribution<int32_t> any(0, 7);
  for (auto& id : ids) id = any(rng);
  for (int64_t j = 0; j < top_k; ++j) {
    ids[static_cast<size_t>(j)] = static_cast<int32_t>(2 + j % 4);            // token 0: all local
    ids[static_cast<size_t>(top_k + j)] = static_cast<int32_t>(j % 2 ? 7 : 0);  // token 1: all on other ranks
  }
  const auto routing = reference::moe_routing(ids, 2, 4, KJIT_OFFSETS_CUMULATIVE_END);
  const int64_t rows = routing.offsets.back();  // >= top_k: token 0's rows

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(rows * hidden));
  for (auto& v : x) v = bf16_bits(normal(rng));
  std::vector<float> weights(ids.size());
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (auto& w : weights) w = weight(rng);
  const kjit_dtype out_dtype = spec.out == codegen::DType::f32 ? KJIT_DTYPE_F32 : KJIT_DTYPE_BF16;
  const int out_bytes = codegen::size_bytes(spec.out);
  const size_t out_size = static_cast<size_t>(tokens * hidden * out_bytes);

  Buffers buffers(api, device.context);
  auto dx = buffers.upload(x.data(), x.size() * 2);
  auto dw = buffers.upload(weights.data(), weights.size() * 4);
  auto dmap = buffers.upload(routing.flat_to_sorted.data(), routing.flat_to_sorted.size() * 4);
  auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
  for (auto* r : {&dx, &dw, &dmap, &dout})
    if (!*r) return std::unexpected(r->error());
  kjit_moe_combine_desc d;
  kjit_moe_combine_desc_init(&d);
  d.tokens = tokens;
  d.top_k = top_k;
  d.hidden = hidden;
  d.rows = rows;
  d.in_dtype = KJIT_DTYPE_BF16;
  d.out_dtype = out_dtype;
  d.expert_out = reinterpret_cast<const void*>(*dx);
  d.topk_weights = reinterpret_cast<const float*>(*dw);
  d.flat_to_sorted = reinterpret_cast<const int32_t*>(*dmap);
  d.out = reinterpret_cast<void*>(*dout);
  if (auto ok = ops::moe_combine(runtime, d, nullptr); !ok) return std::unexpected(ok.error());
  if (auto ok = runtime.take_device_errors(device.ordinal); !ok) return std::unexpected(ok.error());
  std::vector<uint8_t> out(out_size);
  if (auto ok = buffers.download(out.data(), *dout, out_size); !ok) return std::unexpected(ok.error());

  int64_t wrong = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    bool none_here = true;
    for (int64_t j = 0; j < top_k; ++j)
      none_here = none_here && routing.flat_to_sorted[static_cast<size_t>(t * top_k + j)] < 0;
    for (int64_t h = 0; h < hidden; ++h) {
      uint32_t bits = 0;
      std::memcpy(&bits, &out[static_cast<size_t>((t * hidden + h) * out_bytes)], static_cast<size_t>(out_bytes));
      float got;
      if (out_bytes == 4) std::memcpy(&got, &bits, 4);
      else got = reference::bf16_to_float(static_cast<uint16_t>(bits));
      const float want =
          reference::moe_combine_value(x, weights, routing.flat_to_sorted, top_k, hidden, t, h, out_dtype);
      wrong += (none_here ? bits == 0 : reference::combine_close(got, want)) ? 0 : 1;
    }
  }
  return wrong;
}

// One entry's result: whether it passed, and the text of its line.
struct Outcome {
  bool ok;
  std::string text;
};

Outcome counted(const Expected<int64_t>& wrong, std::string_view match) {
  if (!wrong) return {false, "error: " + wrong.error().message};
  if (*wrong == 0) return {true, std::string(match)};
  return {false, fmt::format("{} wrong elements", *wrong)};
}

template <class>
constexpr bool kNoSelftest = false;

Outcome selftest(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec, std::mt19937_64& rng) {
  return std::visit(
      [&](const auto& s) -> Outcome {
        using S = std::decay_t<decltype(s)>;
        if constexpr (std::is_same_v<S, codegen::DequantSpec>) {
          return counted(selftest_dequant(runtime, device, s, rng), "bit-exact");
        } else if constexpr (std::is_same_v<S, codegen::GroupedGemmSpec>) {
          auto error = selftest_gemm(runtime, device, s, rng);
          if (!error) return {false, "error: " + error.error().message};
          return {*error <= 1e-2, fmt::format("relative error {:.1e}", *error)};  // NaN fails too
        } else if constexpr (std::is_same_v<S, codegen::MoeRoutingSpec>) {
          return counted(selftest_routing(runtime, device, s, rng), "exact");
        } else if constexpr (std::is_same_v<S, codegen::MoeCombineSpec>) {
          return counted(selftest_combine(runtime, device, s, rng), "within 1e-5 relative");
        } else {
          static_assert(kNoSelftest<S>, "every kernel kind needs a selftest here");
        }
      },
      spec);
}

}  // namespace

int cmd_selftest() {
  Runtime& runtime = Runtime::global();
  auto count = runtime.device_count();
  if (!count || *count == 0) {
    // Nothing checked is not a pass: 77 says "skipped" to ctest and main-job.
    fmt::print("selftest: skipped: no GPU ({})\n", count ? "the driver reports no device" : count.error().message);
    return kExitSkipped;
  }
  std::mt19937_64 rng(std::random_device{}());
  int passed = 0, failed = 0;
  std::vector<std::string> tested_targets;  // each kind once: on the first device of its arch
  for (int ordinal = 0; ordinal < *count; ++ordinal) {
    auto device = runtime.device(ordinal);
    if (!device) {
      fmt::print("device {}: skipped: {}\n", ordinal, device.error().message);
      continue;
    }
    const std::string target = (*device)->arch->target;
    if (std::find(tested_targets.begin(), tested_targets.end(), target) != tested_targets.end()) continue;
    tested_targets.push_back(target);
    for (const auto& entry : runtime.store().list()) {
      if (entry.state != cache::EntryState::ok || !entry.meta.is_object() || entry.meta.value("arch", "") != target)
        continue;
      auto spec = codegen::spec_from_json(entry.meta.value("spec", nlohmann::json()));
      if (!spec) {  // a kind (or form) this jitctl does not know: nothing to launch it with
        const auto canonical = entry.meta.find("canonical");
        fmt::print("device {} {} {}: not checked by selftest: {}\n", ordinal, target,
                   canonical != entry.meta.end() && canonical->is_string() ? canonical->get<std::string>() : entry.key,
                   spec.error().message);
        continue;
      }
      const Outcome outcome = selftest(runtime, **device, *spec, rng);
      (outcome.ok ? passed : failed)++;
      fmt::print("device {} {} {}: {}\n", ordinal, target, codegen::canonical(*spec), outcome.text);
    }
  }
  if (tested_targets.empty()) {
    fmt::print("selftest: skipped: no usable GPU (see the device lines above)\n");
    return kExitSkipped;
  }
  if (passed + failed == 0) {
    fmt::print("selftest: skipped: no cached kernel for the present devices ({}); run jitctl precompile --arch {}\n",
               fmt::join(tested_targets, ", "), fmt::join(tested_targets, ","));
    return kExitSkipped;
  }
  fmt::print("selftest: {} passed, {} failed\n", passed, failed);
  return failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
