// MoE routing helpers on a real GPU against a CPU reference on fresh random
// ids: counts, offsets in both conventions, the stable permutation and its
// inverse, expert-parallel ranks (other ranks' rows skipped, never indexed),
// bad global ids rejected, and the weighted combine.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"
#include "kjit/reference/moe_routing.hpp"

using namespace kjit::testing;

namespace {

struct RoutingCase {
  int64_t tokens = 1000, top_k = 8, experts_total = 64, expert_base = 0, experts_local = 64;
  kjit_expert_offsets convention = KJIT_OFFSETS_CUMULATIVE_END;
  bool workspace = false;  // pass the workspace kjit_moe_routing_workspace_bytes asks for (many blocks)
};

using RoutingResult = kjit::reference::MoeRouting;

RoutingResult reference_routing(const RoutingCase& c, const std::vector<int32_t>& ids) {
  return kjit::reference::moe_routing(ids, c.expert_base, c.experts_local, c.convention);
}

std::vector<int32_t> random_ids(const RoutingCase& c) {
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.experts_total - 1));
  std::vector<int32_t> ids(static_cast<size_t>(c.tokens * c.top_k));
  for (auto& id : ids) id = pick(rng());
  return ids;
}

struct RoutingBuffers {
  uint64_t workspace_bytes;
  DeviceBuffer ids, counts, offsets, sorted, inverse, workspace;
  RoutingBuffers(const RoutingCase& c, size_t n)
      : workspace_bytes(c.workspace ? kjit_moe_routing_workspace_bytes(c.tokens, c.top_k, c.experts_local) : 0),
        ids(0, std::max<size_t>(4, n * 4)), counts(0, static_cast<size_t>(c.experts_local) * 4),
        offsets(0, static_cast<size_t>(c.experts_local + 1) * 4), sorted(0, std::max<size_t>(4, n * 4)),
        inverse(0, std::max<size_t>(4, n * 4)), workspace(0, std::max<uint64_t>(4, workspace_bytes)) {
    for (auto* b : {&counts, &offsets, &sorted, &inverse, &workspace}) b->poison();
  }
  kjit_moe_routing_desc desc(const RoutingCase& c) const {
    kjit_moe_routing_desc d;
    kjit_moe_routing_desc_init(&d);
    d.tokens = c.tokens;
    d.top_k = c.top_k;
    d.experts_total = c.experts_total;
    d.expert_base = c.expert_base;
    d.experts_local = c.experts_local;
    d.offsets_convention = c.convention;
    d.topk_ids = static_cast<const int32_t*>(ids.get());
    d.counts = static_cast<int32_t*>(counts.get());
    d.offsets = static_cast<int32_t*>(offsets.get());
    d.sorted_to_flat = static_cast<int32_t*>(sorted.get());
    d.flat_to_sorted = static_cast<int32_t*>(inverse.get());
    if (workspace_bytes) {
      d.workspace = workspace.get();
      d.workspace_bytes = workspace_bytes;
    }
    return d;
  }
};

RoutingResult run_routing(const RoutingCase& c, const std::vector<int32_t>& ids) {
  const size_t n = ids.size();
  RoutingBuffers b(c, n);
  if (n) b.ids.upload(ids);
  const auto d = b.desc(c);
  REQUIRE_MESSAGE(kjit_moe_routing(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  RoutingResult r;
  r.counts = b.counts.download<int32_t>(0, static_cast<size_t>(c.experts_local));
  r.offsets = b.offsets.download<int32_t>(
      0, static_cast<size_t>(c.experts_local + (c.convention == KJIT_OFFSETS_WITH_LEADING_ZERO ? 1 : 0)));
  r.sorted_to_flat = b.sorted.download<int32_t>(0, n);
  r.flat_to_sorted = b.inverse.download<int32_t>(0, n);
  return r;
}

void check_routing(const RoutingCase& c) {
  const auto ids = random_ids(c);
  const auto got = run_routing(c, ids);
  const auto want = reference_routing(c, ids);
  CHECK(got.counts == want.counts);
  CHECK(got.offsets == want.offsets);
  CHECK(got.sorted_to_flat == want.sorted_to_flat);
  CHECK(got.flat_to_sorted == want.flat_to_sorted);
}

}  // namespace

TEST_SUITE_BEGIN("moe_routing");

TEST_CASE("routing equals the CPU reference: prefill, decode, both offset conventions, many experts") {
  for (auto convention : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO}) {
    RoutingCase prefill;
    prefill.convention = convention;
    check_routing(prefill);
    RoutingCase decode;
    decode.tokens = 3;
    decode.top_k = 2;
    decode.convention = convention;
    check_routing(decode);
    RoutingCase many;
    many.tokens = 4096;
    many.top_k = 8;
    many.experts_total = many.experts_local = 256;
    many.convention = convention;
    check_routing(many);
    // Past 256 local experts the kernel places rows by another method (warps take turns).
    RoutingCase more;
    more.tokens = 2000;
    more.top_k = 4;
    more.experts_total = more.experts_local = 1000;
    more.convention = convention;
    check_routing(more);
  }
}

TEST_CASE("expert parallelism: a rank counts and places only its experts, other rows map to -1") {
  RoutingCase rank;
  rank.experts_total = 256;
  rank.expert_base = 64;
  rank.experts_local = 32;
  rank.tokens = 777;
  check_routing(rank);
}

TEST_CASE("with a workspace, large batches route over many blocks to the same result") {
  for (auto convention : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO}) {
    RoutingCase prefill;  // 20 blocks of 8192 ids, per-warp counts (256 experts)
    prefill.tokens = 20000;
    prefill.experts_total = prefill.experts_local = 256;
    prefill.convention = convention;
    prefill.workspace = true;
    REQUIRE(kjit_moe_routing_workspace_bytes(prefill.tokens, prefill.top_k, prefill.experts_local) > 0);
    check_routing(prefill);
    RoutingCase rank = prefill;  // expert parallelism: most rows go elsewhere
    rank.expert_base = 64;
    rank.experts_local = 32;
    check_routing(rank);
    RoutingCase many = prefill;  // more than 256 local experts: warps take turns; a partial last block
    many.tokens = 5001;
    many.top_k = 4;
    many.experts_total = many.experts_local = 1000;
    check_routing(many);
  }
  // One block's worth needs no workspace.
  CHECK(kjit_moe_routing_workspace_bytes(1024, 8, 256) == 0);
}

TEST_CASE("no tokens gives zero counts and offsets") {
  RoutingCase empty;
  empty.tokens = 0;
  check_routing(empty);
}

TEST_CASE("a rank without tokens passes null id arrays (an empty tensor's pointer) and gets zero counts and offsets") {
  DeviceBuffer counts(0, 16 * 4), offsets(0, 17 * 4);
  counts.poison();
  offsets.poison();
  kjit_moe_routing_desc d;
  kjit_moe_routing_desc_init(&d);
  d.tokens = 0;
  d.top_k = 8;
  d.experts_total = 64;
  d.expert_base = 16;
  d.experts_local = 16;
  d.offsets_convention = KJIT_OFFSETS_WITH_LEADING_ZERO;
  d.counts = static_cast<int32_t*>(counts.get());
  d.offsets = static_cast<int32_t*>(offsets.get());
  REQUIRE_MESSAGE(kjit_moe_routing(&d, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
  REQUIRE(kjit_device_errors(0) == KJIT_OK);
  for (int32_t v : counts.download<int32_t>(0, 16)) CHECK(v == 0);
  for (int32_t v : offsets.download<int32_t>(0, 17)) CHECK(v == 0);
  d.tokens = 1;  // with ids to read, null is an error
  CHECK(kjit_moe_routing(&d, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("a global expert id out of range writes nothing and is reported") {
  for (bool many_blocks : {false, true}) {
    CAPTURE(many_blocks);
    RoutingCase c;
    c.workspace = many_blocks;
    if (many_blocks) c.tokens = 20000;  // the bad id in the last of 20 blocks: the others must not write either
    auto ids = random_ids(c);
    ids[many_blocks ? ids.size() - 5 : 123] = static_cast<int32_t>(c.experts_total);  // one past the end
    RoutingBuffers b(c, ids.size());
    b.ids.upload(ids);
    const auto d = b.desc(c);
    REQUIRE(kjit_moe_routing(&d, nullptr) == KJIT_OK);
    CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
    CHECK(std::string(kjit_last_error_message()).find("expert id 64") != std::string::npos);
    for (auto* buffer : {&b.counts, &b.offsets, &b.sorted, &b.inverse}) CHECK(buffer->written_words() == 0);
  }
}

TEST_SUITE_END();
TEST_SUITE_BEGIN("moe_combine");

TEST_CASE("combine sums weighted expert rows back in token order, skipping other ranks' rows") {
  for (auto out_dtype : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
    RoutingCase c;
    c.tokens = 300;
    c.top_k = 4;
    c.experts_total = 64;
    c.expert_base = 16;
    c.experts_local = 32;  // about half the rows belong to other ranks
    const auto ids = random_ids(c);
    const auto routing = reference_routing(c, ids);
    const int64_t hidden = 264, rows = c.tokens * c.top_k;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(rows * hidden));
    for (auto& v : x) v = kjit::reference::bf16_bits_rne(normal(rng()));
    std::vector<float> weights(static_cast<size_t>(rows));
    for (auto& w : weights) w = std::abs(normal(rng()));
    DeviceBuffer dx(0, x.size() * 2), dw(0, weights.size() * 4), dinv(0, routing.flat_to_sorted.size() * 4),
        dout(0, static_cast<size_t>(c.tokens * hidden * 4));
    dx.upload(x);
    dw.upload(weights);
    dinv.upload(routing.flat_to_sorted);
    dout.poison();
    kjit_moe_combine_desc d;
    kjit_moe_combine_desc_init(&d);
    d.tokens = c.tokens;
    d.top_k = c.top_k;
    d.hidden = hidden;
    d.rows = rows;
    d.in_dtype = KJIT_DTYPE_BF16;
    d.out_dtype = out_dtype;
    d.expert_out = dx.get();
    d.topk_weights = static_cast<const float*>(dw.get());
    d.flat_to_sorted = static_cast<const int32_t*>(dinv.get());
    d.out = dout.get();
    REQUIRE_MESSAGE(kjit_moe_combine(&d, nullptr) == KJIT_OK, kjit_last_error_message());
    REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
    const auto out = dout.download<uint8_t>(0, dout.bytes);
    int64_t bad = 0;
    for (int64_t t = 0; t < c.tokens; ++t)
      for (int64_t h = 0; h < hidden; ++h) {
        const float ref =
            kjit::reference::moe_combine_value(x, weights, routing.flat_to_sorted, c.top_k, hidden, t, h, out_dtype);
        float got;
        if (out_dtype == KJIT_DTYPE_F32) {
          std::memcpy(&got, &out[static_cast<size_t>((t * hidden + h) * 4)], 4);
        } else {
          uint16_t b;
          std::memcpy(&b, &out[static_cast<size_t>((t * hidden + h) * 2)], 2);
          got = kjit::reference::bf16_to_float(b);
        }
        if (!kjit::reference::combine_close(got, ref) && ++bad <= 5)
          MESSAGE("token " << t << " h " << h << ": got " << got << ", want " << ref);
      }
    CAPTURE(out_dtype);
    CHECK(bad == 0);
  }
}

TEST_CASE("the weights' gradient is bit-exact: a dot product per pair in kjit.h's order, +0 for other ranks' pairs") {
  for (const auto& [tokens, top_k, hidden] :
       {std::tuple<int64_t, int64_t, int64_t>{300, 4, 264}, {1, 8, 7168}, {37, 32, 2048}}) {
    RoutingCase c;
    c.tokens = tokens;
    c.top_k = top_k;
    c.experts_total = 64;
    c.expert_base = 16;
    c.experts_local = 32;  // about half the pairs belong to other ranks
    const auto ids = random_ids(c);
    const auto routing = reference_routing(c, ids);
    const int64_t rows = tokens * top_k;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> x(static_cast<size_t>(rows * hidden)), grad(static_cast<size_t>(tokens * hidden));
    for (auto& v : x) v = kjit::reference::bf16_bits_rne(normal(rng()));
    for (auto& v : grad) v = kjit::reference::bf16_bits_rne(normal(rng()));
    DeviceBuffer dx(0, x.size() * 2), dgrad(0, grad.size() * 2), dinv(0, routing.flat_to_sorted.size() * 4),
        dout(0, static_cast<size_t>(rows * 4));
    dx.upload(x);
    dgrad.upload(grad);
    dinv.upload(routing.flat_to_sorted);
    dout.poison();
    kjit_moe_combine_desc d;
    kjit_moe_combine_desc_init(&d);
    d.tokens = tokens;
    d.top_k = top_k;
    d.hidden = hidden;
    d.rows = rows;
    d.in_dtype = KJIT_DTYPE_BF16;
    d.out_dtype = KJIT_DTYPE_F32;
    d.expert_out = dx.get();
    d.flat_to_sorted = static_cast<const int32_t*>(dinv.get());
    d.out = dout.get();
    d.grad = dgrad.get();
    REQUIRE_MESSAGE(kjit_moe_combine(&d, nullptr) == KJIT_OK, kjit_last_error_message());
    REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
    const auto out = dout.download<uint32_t>(0, static_cast<size_t>(rows));
    int64_t bad = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < top_k; ++j) {
        const float want =
            kjit::reference::moe_combine_weight_gradient(x, grad, routing.flat_to_sorted, top_k, hidden, t, j);
        bad += out[static_cast<size_t>(t * top_k + j)] == kjit::reference::float_bits(want) ? 0 : 1;
      }
    CAPTURE(hidden);
    CHECK(bad == 0);
  }
}

TEST_SUITE_END();
