// MoE routing helpers on a real GPU against a CPU reference on fresh random
// ids: counts, offsets in both conventions, the stable permutation and its
// inverse, expert-parallel ranks (other ranks' rows skipped, never indexed),
// bad global ids rejected, the weighted combine, its weights' gradient, and
// its transpose, the dispatch.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
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
namespace {

// bf16 rows drawn fresh, none of them 0 (+0 or -0): a row the dispatch zeroes never equals one it copies.
std::vector<uint16_t> nonzero_bf16(size_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> out(count);
  for (auto& v : out) {
    do {
      v = kjit::reference::bf16_bits_rne(normal(rng()));
    } while ((v & 0x7fff) == 0);
  }
  return out;
}

// The bf16 element `i` of a buffer left as DeviceBuffer::poison() made it (little-endian 32-bit words).
uint16_t poison_bf16(size_t i) { return static_cast<uint16_t>(DeviceBuffer::kPoison >> (i % 2 ? 16 : 0)); }

// What kjit_moe_dispatch leaves in a poisoned out of `out_rows` rows (>= tokens * top_k), from kjit.h's contract:
// out[flat_to_sorted[t * top_k + j]] = x[t] for each pair of this rank (an index at or past tokens * top_k
// writes nothing); with `zero_tail` the rows from `routed` to tokens * top_k - 1 are +0, without it they keep
// the poison, as do rows past tokens * top_k.
std::vector<uint16_t> reference_dispatch(const std::vector<uint16_t>& x, const std::vector<int32_t>& flat_to_sorted,
                                         int64_t top_k, int64_t hidden, int64_t routed, bool zero_tail,
                                         int64_t out_rows) {
  const auto rows = static_cast<int64_t>(flat_to_sorted.size());
  std::vector<uint16_t> out(static_cast<size_t>(out_rows * hidden));
  for (size_t i = 0; i < out.size(); ++i) out[i] = poison_bf16(i);
  if (zero_tail) std::fill(out.begin() + routed * hidden, out.begin() + rows * hidden, uint16_t{0});
  for (int64_t pair = 0; pair < rows; ++pair) {
    const int32_t row = flat_to_sorted[static_cast<size_t>(pair)];
    if (row < 0 || row >= rows) continue;  // another rank's pair, or a bad index
    std::copy_n(x.begin() + pair / top_k * hidden, hidden, out.begin() + row * hidden);
  }
  return out;
}

// The elements of `got` that differ from `want`, bit for bit; the first few are printed.
int64_t differing(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int64_t hidden) {
  REQUIRE(got.size() == want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5) {
      char text[96];
      std::snprintf(text, sizeof text, "row %zu column %zu: got 0x%04x, want 0x%04x", i / static_cast<size_t>(hidden),
                    i % static_cast<size_t>(hidden), unsigned{got[i]}, unsigned{want[i]});
      MESSAGE(text);
    }
  return bad;
}

// A dispatch desc of `tokens` x `top_k` pairs over `hidden` columns on these device buffers.
kjit_moe_dispatch_desc dispatch_desc(int64_t tokens, int64_t top_k, int64_t hidden, const DeviceBuffer& x,
                                     const DeviceBuffer& map, const DeviceBuffer* valid_rows, DeviceBuffer& out) {
  kjit_moe_dispatch_desc d;
  kjit_moe_dispatch_desc_init(&d);
  d.tokens = tokens;
  d.top_k = top_k;
  d.hidden = hidden;
  d.x = x.get();
  d.flat_to_sorted = static_cast<const int32_t*>(map.get());
  d.valid_rows = valid_rows ? static_cast<const int32_t*>(valid_rows->get()) : nullptr;
  d.out = out.get();
  return d;
}

}  // namespace

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

TEST_CASE("the dispatch copies each token's row to its rows in expert order, zeroes the rows past the routed ones, "
          "and skips other ranks' pairs") {
  // Decode (1 token), a small batch (37) and prefill (4096); hidden from one 16-byte chunk to 7168 (four slices,
  // the last partial); top 1 and top 8.
  for (const auto& [tokens, top_k, hidden] :
       {std::tuple<int64_t, int64_t, int64_t>{1, 8, 7168}, {1, 1, 8}, {37, 8, 2048}, {37, 1, 7168}, {37, 8, 8},
        {4096, 8, 2048}, {4096, 1, 8}})
    for (const bool expert_parallel : {false, true})
      for (const bool zero_tail : {true, false}) {
        CAPTURE(tokens);
        CAPTURE(top_k);
        CAPTURE(hidden);
        CAPTURE(expert_parallel);
        CAPTURE(zero_tail);
        RoutingCase c;
        c.tokens = tokens;
        c.top_k = top_k;
        c.experts_total = 64;
        c.expert_base = expert_parallel ? 16 : 0;
        c.experts_local = expert_parallel ? 32 : 64;  // about half the pairs on other ranks, or none
        const auto routing = reference_routing(c, random_ids(c));
        const int64_t rows = tokens * top_k, routed = routing.offsets.back();
        if (!expert_parallel) REQUIRE(routed == rows);
        const auto x = nonzero_bf16(static_cast<size_t>(tokens * hidden));
        DeviceBuffer dx(0, x.size() * 2), dmap(0, routing.flat_to_sorted.size() * 4), dvalid(0, 4),
            dout(0, static_cast<size_t>(rows * hidden * 2));
        dx.upload(x);
        dmap.upload(routing.flat_to_sorted);
        dvalid.upload(std::vector<int32_t>{static_cast<int32_t>(routed)});
        const auto d = dispatch_desc(tokens, top_k, hidden, dx, dmap, zero_tail ? &dvalid : nullptr, dout);
        const auto want =
            reference_dispatch(x, routing.flat_to_sorted, top_k, hidden, routed, zero_tail, rows);
        std::vector<uint16_t> first;
        for (int run = 0; run < 2; ++run) {  // into fresh poison each time: the same bits
          CAPTURE(run);
          dout.poison();
          REQUIRE_MESSAGE(kjit_moe_dispatch(&d, nullptr) == KJIT_OK, kjit_last_error_message());
          REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
          const auto got = dout.download<uint16_t>(0, static_cast<size_t>(rows * hidden));
          CHECK(differing(got, want, hidden) == 0);
          if (run == 0) first = got;
          else CHECK(got == first);
        }
      }
}

TEST_CASE("a dispatch index past tokens * top_k writes nothing for its pair and is reported") {
  const int64_t tokens = 37, top_k = 8, hidden = 2048, rows = tokens * top_k;
  RoutingCase c;
  c.tokens = tokens;
  c.top_k = top_k;
  const auto routing = reference_routing(c, random_ids(c));  // every pair on this rank: rows routed
  const auto x = nonzero_bf16(static_cast<size_t>(tokens * hidden));
  // One row past out: the guard row that index would land on, and must keep its poison.
  DeviceBuffer dx(0, x.size() * 2), dmap(0, routing.flat_to_sorted.size() * 4), dvalid(0, 4),
      dout(0, static_cast<size_t>((rows + 1) * hidden * 2));
  dx.upload(x);
  dvalid.upload(std::vector<int32_t>{static_cast<int32_t>(rows)});
  const size_t pair = 123;
  auto bad = routing.flat_to_sorted;
  bad[pair] = static_cast<int32_t>(rows);
  dmap.upload(bad);
  for (const bool zero_tail : {true, false}) {
    CAPTURE(zero_tail);
    const auto d = dispatch_desc(tokens, top_k, hidden, dx, dmap, zero_tail ? &dvalid : nullptr, dout);
    dout.poison();
    REQUIRE_MESSAGE(kjit_moe_dispatch(&d, nullptr) == KJIT_OK, kjit_last_error_message());
    CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
    CHECK_MESSAGE(std::string(kjit_last_error_message()).find("sorted row 296") != std::string::npos,
                  kjit_last_error_message());
    // The pair's own row keeps its poison (no other pair maps to it, and it lies below valid_rows), as does the
    // guard row; every other row is its token's.
    const auto want = reference_dispatch(x, bad, top_k, hidden, rows, zero_tail, rows + 1);
    const auto got = dout.download<uint16_t>(0, static_cast<size_t>((rows + 1) * hidden));
    CHECK(differing(got, want, hidden) == 0);
  }
  CHECK(kjit_device_errors(0) == KJIT_OK);  // taken: the next call starts clean
}

TEST_SUITE_END();
