// The MoE routing and combine families' checks, the combine's dispatch among them (harness.hpp).
#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "device_buffers.hpp"
#include "harness.hpp"
#include "kjit/reference/fp8.hpp"
#include "kjit/reference/moe_routing.hpp"
#include "kjit/internal/ops/moe_routing.hpp"

namespace kjit::harness {
namespace {

uint16_t bf16_bits(float f) { return reference::bf16_bits_rne(f); }

// Runs a routing kind once as one rank of an expert-parallel layout (its
// spec.experts experts start past 0, among about twice as many) and returns
// the number of elements of counts, offsets and both permutations that differ
// from the reference. A quarter of the ids go to one hot local expert, so
// lanes of a warp share an expert; the first six sit on the edges of the
// valid and the local ranges. With `many_blocks`, a (poisoned) workspace
// lets the ids run over several blocks.
Expected<int64_t> check_moe_routing_once(Runtime& runtime, DeviceState& device,
                                         const codegen::MoeRoutingSpec& spec, std::mt19937_64& rng, int64_t tokens,
                                         bool many_blocks) {
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
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::moe_routing(runtime, d, nullptr); }));

  int64_t wrong = 0;
  const std::pair<CUdeviceptr, const std::vector<int32_t>*> outputs[] = {
      {*dcounts, &want.counts}, {*doffsets, &want.offsets}, {*dsorted, &want.sorted_to_flat},
      {*dinverse, &want.flat_to_sorted}};
  for (const auto& [p, expected] : outputs) {
    std::vector<int32_t> got(expected->size());
    KJIT_TRY(buffers.download(got.data(), p, got.size() * 4));
    for (size_t i = 0; i < got.size(); ++i) wrong += got[i] == (*expected)[i] ? 0 : 1;
  }
  return wrong;
}

}  // namespace

// Both of routing's paths: 333 x 8 ids in one block (three of its block-wide
// chunks, ending mid-warp), and 3333 x 8 over several blocks (the last one
// partly filled).
Expected<int64_t> check_moe_routing(Runtime& runtime, DeviceState& device, const codegen::MoeRoutingSpec& spec,
                                    std::mt19937_64& rng) {
  auto one_block = check_moe_routing_once(runtime, device, spec, rng, 333, false);
  if (!one_block) return one_block;
  auto many_blocks = check_moe_routing_once(runtime, device, spec, rng, 3333, true);
  if (!many_blocks) return many_blocks;
  return *one_block + *many_blocks;
}

// The routing of random ids over 8 experts that one rank, local experts [2, 6), keeps: about half the (t, j)
// are -1; token 0 has all its pairs on this rank, token 1 none.
static reference::MoeRouting one_rank_routing(int64_t tokens, int64_t top_k, std::mt19937_64& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens * top_k));
  std::uniform_int_distribution<int32_t> any(0, 7);
  for (auto& id : ids) id = any(rng);
  for (int64_t j = 0; j < top_k; ++j) {
    ids[static_cast<size_t>(j)] = static_cast<int32_t>(2 + j % 4);            // token 0: all local
    ids[static_cast<size_t>(top_k + j)] = static_cast<int32_t>(j % 2 ? 7 : 0);  // token 1: all on other ranks
  }
  return reference::moe_routing(ids, 2, 4, KJIT_OFFSETS_CUMULATIVE_END);
}

// Runs a combine kind once on the mapping a routing of random ids leaves on
// one rank (local experts [2, 6) of 8: about half the (t, j) are -1) and
// returns the number of output elements off the reference, to the GPU tests'
// tolerance (reference::combine_close). Token 0 has all its rows on this
// rank, token 1 none: a token with none must come out +0 exactly, since the
// 0xA5 poison (-2.9e-16) would pass the tolerance's absolute term.
Expected<int64_t> check_moe_combine(Runtime& runtime, DeviceState& device, const codegen::MoeCombineSpec& spec,
                                    std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t tokens = 37, top_k = spec.top_k, hidden = spec.hidden;
  const auto routing = one_rank_routing(tokens, top_k, rng);
  const int64_t rows = routing.offsets.back();  // >= top_k: token 0's rows

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(rows * hidden));
  fill_random(x, rng, [&](std::mt19937_64& r) { return bf16_bits(normal(r)); });
  std::vector<float> weights(routing.flat_to_sorted.size());
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (auto& w : weights) w = weight(rng);
  const kjit_dtype out_dtype = spec.out == codegen::DType::f32 ? KJIT_DTYPE_F32 : KJIT_DTYPE_BF16;
  const int out_bytes = codegen::size_bytes(spec.out);
  const size_t out_size = static_cast<size_t>((spec.gradient ? tokens * top_k : tokens * hidden) * out_bytes);
  std::vector<uint16_t> grad(static_cast<size_t>(spec.gradient ? tokens * hidden : 0));
  fill_random(grad, rng, [&](std::mt19937_64& r) { return bf16_bits(normal(r)); });

  Buffers buffers(api, device.context);
  auto dx = buffers.upload(x.data(), x.size() * 2);
  auto dw = buffers.upload(weights.data(), weights.size() * 4);
  auto dmap = buffers.upload(routing.flat_to_sorted.data(), routing.flat_to_sorted.size() * 4);
  auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
  auto dgrad = buffers.upload(grad.empty() ? nullptr : grad.data(), std::max<size_t>(grad.size() * 2, 16));
  for (auto* r : {&dx, &dw, &dmap, &dout, &dgrad})
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
  d.topk_weights = spec.gradient ? nullptr : reinterpret_cast<const float*>(*dw);
  d.flat_to_sorted = reinterpret_cast<const int32_t*>(*dmap);
  d.out = reinterpret_cast<void*>(*dout);
  if (spec.gradient) d.grad = reinterpret_cast<const void*>(*dgrad);
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::moe_combine(runtime, d, nullptr); }));
  std::vector<uint8_t> out(out_size);
  KJIT_TRY(buffers.download(out.data(), *dout, out_size));

  int64_t wrong = 0;
  if (spec.gradient) {  // bit for bit, +0 exactly for the pairs of other ranks
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < top_k; ++j) {
        uint32_t got = 0;
        std::memcpy(&got, &out[static_cast<size_t>((t * top_k + j) * 4)], 4);
        const float want =
            reference::moe_combine_weight_gradient(x, grad, routing.flat_to_sorted, top_k, hidden, t, j);
        wrong += got == reference::float_bits(want) ? 0 : 1;
      }
    return wrong;
  }
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

// Runs the dispatch (spec.dispatch) on the mapping of the combine's check above (local experts [2, 6) of 8;
// token 0 all local, token 1 none) and returns the number of output elements that are not what they must be,
// bit for bit: each routed row r (below the routed count, the offsets' last entry) is its token's row of x,
// the token sorted_to_flat[r] / top_k. Twice, into fresh 0xA5 poison: with valid_rows (a device int holding
// the routed count) every row past the routed ones must be +0 exactly, without it they must keep the poison.
Expected<int64_t> check_moe_dispatch(Runtime& runtime, DeviceState& device, const codegen::MoeCombineSpec& spec,
                                     std::mt19937_64& rng) {
  const DriverApi& api = **runtime.driver();
  const int64_t tokens = 37, top_k = spec.top_k, hidden = spec.hidden, rows = tokens * top_k;
  const auto routing = one_rank_routing(tokens, top_k, rng);
  const int32_t routed = routing.offsets.back();  // < rows: token 1's pairs went elsewhere

  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(tokens * hidden));
  fill_random(x, rng, [&](std::mt19937_64& r) { return bf16_bits(normal(r)); });
  const size_t out_size = static_cast<size_t>(rows * hidden * 2);

  Buffers buffers(api, device.context);
  auto dx = buffers.upload(x.data(), x.size() * 2);
  auto dmap = buffers.upload(routing.flat_to_sorted.data(), routing.flat_to_sorted.size() * 4);
  auto dvalid = buffers.upload(&routed, 4);
  for (auto* r : {&dx, &dmap, &dvalid})
    if (!*r) return std::unexpected(r->error());
  int64_t wrong = 0;
  for (const bool zero_tail : {true, false}) {
    auto dout = buffers.upload(nullptr, out_size);  // 0xA5 poison
    if (!dout) return std::unexpected(dout.error());
    kjit_moe_dispatch_desc d;
    kjit_moe_dispatch_desc_init(&d);
    d.tokens = tokens;
    d.top_k = top_k;
    d.hidden = hidden;
    d.x = reinterpret_cast<const void*>(*dx);
    d.flat_to_sorted = reinterpret_cast<const int32_t*>(*dmap);
    d.valid_rows = zero_tail ? reinterpret_cast<const int32_t*>(*dvalid) : nullptr;
    d.out = reinterpret_cast<void*>(*dout);
    KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::moe_dispatch(runtime, d, nullptr); }));
    std::vector<uint16_t> out(static_cast<size_t>(rows * hidden));
    KJIT_TRY(buffers.download(out.data(), *dout, out_size));
    constexpr uint16_t kPoisoned = Buffers::kPoison * 0x0101;
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t flat = routing.sorted_to_flat[static_cast<size_t>(r)];
      const uint16_t* want = r < routed ? &x[static_cast<size_t>(flat / top_k * hidden)] : nullptr;
      for (int64_t h = 0; h < hidden; ++h) {
        const uint16_t expected = want ? want[h] : zero_tail ? uint16_t{0} : kPoisoned;
        wrong += out[static_cast<size_t>(r * hidden + h)] == expected ? 0 : 1;
      }
    }
  }
  return wrong;
}

}  // namespace kjit::harness
