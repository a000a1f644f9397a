// The MoE routing, combine and dispatch ops against the fake driver: argument
// errors named, one block or three launches over a workspace; the dispatch's
// host-only check.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>

#include "fake_driver.hpp"
#include "kjit/internal/ops/moe_routing.hpp"
#include "kjit/internal/runtime.hpp"

using namespace kjit::testing;

TEST_CASE_FIXTURE(FakeRuntimeFixture, "routing and combine argument errors are named and launch nothing") {
  FakeBuffer ids(64 * 4, 0), counts(16 * 4, 0), offsets(17 * 4, 0), sorted(64 * 4, 0), inverse(64 * 4, 0);
  kjit_moe_routing_desc r;
  kjit_moe_routing_desc_init(&r);
  r.tokens = 8;
  r.top_k = 8;
  r.experts_total = 64;
  r.expert_base = 56;
  r.experts_local = 16;  // [56, 72) leaves [0, 64)
  r.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
  r.topk_ids = reinterpret_cast<const int32_t*>(ids.data());
  r.counts = reinterpret_cast<int32_t*>(counts.data());
  r.offsets = reinterpret_cast<int32_t*>(offsets.data());
  r.sorted_to_flat = reinterpret_cast<int32_t*>(sorted.data());
  r.flat_to_sorted = reinterpret_cast<int32_t*>(inverse.data());
  auto bad_range = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_FALSE(bad_range.has_value());
  CHECK(bad_range.error().message.find("this rank's experts [56, 72) must lie in [0, experts_total = 64)") !=
        std::string::npos);
  // tokens * top_k past int32 is refused, also where the product would overflow int64
  for (const auto& [tokens, top_k] : {std::pair<int64_t, int64_t>{INT32_MAX / 2 + 1, 2},
                                      std::pair<int64_t, int64_t>{INT64_C(1) << 40, INT64_C(1) << 40}}) {
    kjit_moe_routing_desc big = r;
    big.tokens = tokens;
    big.top_k = top_k;
    const auto refused = kjit::ops::plan_moe_routing_shapes(big);
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().message.find("tokens * top_k must fit in int32") != std::string::npos);
  }
  r.expert_base = 48;
  r.counts = nullptr;
  auto no_counts = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_FALSE(no_counts.has_value());
  CHECK(no_counts.error().message == "'counts' is NULL");
  r.counts = reinterpret_cast<int32_t*>(counts.data());
  auto ok = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_MESSAGE(ok.has_value(), ok.error().message);
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 1);
  // 64 ids fit one block: a workspace changes nothing.
  FakeBuffer workspace(1 << 20, 0);
  r.workspace = workspace.data();
  r.workspace_bytes = 4;
  REQUIRE(kjit::ops::moe_routing(runtime, r, fake_stream(0)).has_value());
  CHECK(machine.launches == 2);
  // 100000 x 8 ids: 98 blocks of 8192 in three launches (count, scan, place) over
  // (1 + 98 + 98 x 16) ints of workspace, which must all be there.
  CHECK(kjit_moe_routing_workspace_bytes(100000, 8, 16) == (1 + 98 + 98 * 16) * 4);
  CHECK(kjit_moe_routing_workspace_bytes(1024, 8, 16) == 0);
  r.tokens = 100000;
  auto small = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_FALSE(small.has_value());
  CHECK(small.error().message.find("need 6668 (kjit_moe_routing_workspace_bytes)") != std::string::npos);
  CHECK(machine.launches == 2);
  r.workspace_bytes = 6668;
  REQUIRE(kjit::ops::moe_routing(runtime, r, fake_stream(0)).has_value());
  CHECK(machine.launches == 5);
  CHECK(machine.grid[0] == 98);  // the last launch: placement

  kjit_moe_combine_desc c;
  kjit_moe_combine_desc_init(&c);
  c.tokens = 8;
  c.top_k = 8;
  c.hidden = 12;
  c.rows = 64;
  c.in_dtype = KJIT_DTYPE_BF16;
  c.out_dtype = KJIT_DTYPE_BF16;
  auto bad_hidden = kjit::ops::moe_combine(runtime, c, fake_stream(0));
  REQUIRE_FALSE(bad_hidden.has_value());
  CHECK(bad_hidden.error().message == "moe_combine: hidden must be a positive multiple of 8 up to 1048576, got 12");
  CHECK(machine.launches == 5);  // none for the bad combine

  // The weights' gradient: fp32 out [tokens, top_k], grad instead of the weights, a warp per pair.
  FakeBuffer expert_out(64 * 256 * 2, 0), grad(8 * 256 * 2, 0), map(64 * 4, 0), weights(64 * 4, 0), out(64 * 4, 0);
  c.hidden = 256;
  c.expert_out = expert_out.data();
  c.flat_to_sorted = reinterpret_cast<const int32_t*>(map.data());
  c.out = out.data();
  c.grad = grad.data();
  auto expect_combine_rejected = [&](const std::string& needle) {
    const auto refused = kjit::ops::moe_combine(runtime, c, fake_stream(0));
    REQUIRE_FALSE(refused.has_value());
    CHECK_MESSAGE(refused.error().message.find(needle) != std::string::npos, refused.error().message);
  };
  expect_combine_rejected("the weights' gradient (grad given) is fp32: out_dtype must be KJIT_DTYPE_F32");
  c.out_dtype = KJIT_DTYPE_F32;
  c.topk_weights = reinterpret_cast<const float*>(weights.data());
  expect_combine_rejected("the weights' gradient does not read topk_weights: leave it NULL");
  c.topk_weights = nullptr;
  c.grad = grad.data() + 8;
  expect_combine_rejected("'grad' is not 16-byte aligned");
  CHECK(machine.launches == 5);
  c.grad = grad.data();
  const auto launched = kjit::ops::moe_combine(runtime, c, fake_stream(0));
  REQUIRE_MESSAGE(launched.has_value(), launched.error().message);
  CHECK(machine.launches == 6);
  CHECK(machine.grid[0] == 8);  // 64 pairs, 8 warps a block
  CHECK(machine.grid[1] == 1);
}

namespace {

// A dispatch of 37 tokens at top 8 over 2048 columns, no pointers: shapes kjit_moe_dispatch_check accepts.
kjit_moe_dispatch_desc dispatch_shapes() {
  kjit_moe_dispatch_desc d;
  kjit_moe_dispatch_desc_init(&d);
  d.tokens = 37;
  d.top_k = 8;
  d.hidden = 2048;
  return d;
}

// `d` is refused by the check with a message containing `needle`.
void check_dispatch_refused(const kjit_moe_dispatch_desc& d, const std::string& needle) {
  CHECK(kjit_moe_dispatch_check(&d) == KJIT_ERROR_INVALID_ARGUMENT);
  const std::string message = kjit_last_error_message();
  CHECK_MESSAGE(message.find(needle) != std::string::npos, message);
}

}  // namespace

TEST_CASE("the dispatch's check refuses each bad shape by name, host only, and accepts shapes without pointers") {
  const kjit_moe_dispatch_desc good = dispatch_shapes();
  CHECK(good.dtype == KJIT_DTYPE_BF16);  // _init's: the only dtype
  CHECK(kjit_moe_dispatch_check(&good) == KJIT_OK);
  CHECK(kjit_moe_dispatch_check(nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  auto d = good;
  d.struct_size = sizeof(kjit_moe_dispatch_desc) - 1;
  check_dispatch_refused(d, "desc.struct_size is too small: call kjit_moe_dispatch_desc_init first");
  d = good;
  d.dtype = KJIT_DTYPE_F32;
  check_dispatch_refused(d, "moe_dispatch dtype must be KJIT_DTYPE_BF16");
  for (const int64_t hidden : {0, 12, 2044}) {
    d = good;
    d.hidden = hidden;
    check_dispatch_refused(d, "hidden must be a positive multiple of 8 up to 1048576, got " + std::to_string(hidden));
  }
  for (const int64_t top_k : {0, 33}) {
    d = good;
    d.top_k = top_k;
    check_dispatch_refused(d, "top_k from 1 to 32, got " + std::to_string(top_k));
  }
  d = good;
  d.tokens = -1;
  check_dispatch_refused(d, "tokens must be >= 0");
  d.tokens = INT64_C(0x80000000);  // one past a grid dimension, at top 1
  d.top_k = 1;
  check_dispatch_refused(d, "tokens must fit in a grid dimension");
  d.tokens = INT32_MAX / 8 + 1;  // 2^31 + 0 pairs: one past int32 at top 8
  d.top_k = 8;
  check_dispatch_refused(d, "tokens * top_k must fit in int32");
  d.tokens = INT32_MAX / 8;  // the last that fits
  CHECK(kjit_moe_dispatch_check(&d) == KJIT_OK);
  d.tokens = 0;  // a rank without tokens
  CHECK(kjit_moe_dispatch_check(&d) == KJIT_OK);
  // The launch refuses what its check refuses, with the same message, before it needs a driver ...
  d = good;
  d.top_k = 33;
  CHECK(kjit_moe_dispatch(&d, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "moe_combine needs top_k from 1 to 32, got 33");
  // ... and NULL pointers, which the check does not read.
  CHECK(kjit_moe_dispatch(&good, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "'x' is NULL");
}

TEST_CASE_FIXTURE(FakeRuntimeFixture, "the dispatch names a NULL, misaligned or foreign pointer and launches nothing") {
  constexpr size_t tokens = 8, top_k = 8, hidden = 2304;  // two 2048-column slices, the second partial
  FakeBuffer x(tokens * hidden * 2, 0), map(tokens * top_k * 4, 0), out(tokens * top_k * hidden * 2, 0),
      valid(16, 0), valid_elsewhere(16, 1);
  kjit_moe_dispatch_desc d = dispatch_shapes();
  d.tokens = tokens;
  d.top_k = top_k;
  d.hidden = hidden;
  d.x = x.data();
  d.flat_to_sorted = reinterpret_cast<const int32_t*>(map.data());
  d.out = out.data();
  auto with = [&](auto change) {
    kjit_moe_dispatch_desc changed = d;
    change(changed);
    return kjit::ops::moe_dispatch(runtime, changed, fake_stream(0));
  };
  check_rejected(with([](auto& c) { c.x = nullptr; }), KJIT_ERROR_INVALID_ARGUMENT, "'x' is NULL");
  check_rejected(with([](auto& c) { c.flat_to_sorted = nullptr; }), KJIT_ERROR_INVALID_ARGUMENT,
                 "'flat_to_sorted' is NULL");
  check_rejected(with([](auto& c) { c.out = nullptr; }), KJIT_ERROR_INVALID_ARGUMENT, "'out' is NULL");
  check_rejected(with([&](auto& c) { c.x = x.data() + 8; }), KJIT_ERROR_INVALID_ARGUMENT,
                 "'x' and 'out' must be 16-byte aligned");
  check_rejected(with([&](auto& c) { c.out = out.data() + 2; }), KJIT_ERROR_INVALID_ARGUMENT,
                 "'x' and 'out' must be 16-byte aligned");
  // valid_rows is optional, but when given it is a device int of the call's device.
  int32_t on_host = 0;
  check_rejected(with([&](auto& c) { c.valid_rows = &on_host; }), KJIT_ERROR_INVALID_ARGUMENT,
                 "kjit needs device memory");
  check_rejected(with([&](auto& c) { c.valid_rows = reinterpret_cast<const int32_t*>(valid_elsewhere.data()); }),
                 KJIT_ERROR_INVALID_ARGUMENT, "'valid_rows' is on device 1");
  // A rank without tokens launches nothing and reads no pointer.
  const auto empty = with([](auto& c) {
    c.tokens = 0;
    c.x = nullptr;
    c.flat_to_sorted = nullptr;
    c.out = nullptr;
  });
  REQUIRE_MESSAGE(empty.has_value(), empty.error().message);
  CHECK(machine.launches == 0);

  // A block per token and 2048-column slice, with or without valid_rows: one kernel.
  const int modules = machine.modules_loaded;
  const auto launched = kjit::ops::moe_dispatch(runtime, d, fake_stream(0));
  REQUIRE_MESSAGE(launched.has_value(), launched.error().message);
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 8);
  CHECK(machine.grid[1] == 2);
  CHECK(machine.block_x == 256);
  d.valid_rows = reinterpret_cast<const int32_t*>(valid.data());
  const auto zeroing = kjit::ops::moe_dispatch(runtime, d, fake_stream(0));
  REQUIRE_MESSAGE(zeroing.has_value(), zeroing.error().message);
  CHECK(machine.launches == 2);
  CHECK(machine.modules_loaded == modules + 1);
  // The spec is the shapes', not the pointers': prepare finds the kernel both launches ran.
  const auto spec = kjit::ops::plan_moe_dispatch_shapes(d);
  REQUIRE(spec.has_value());
  CHECK(*spec == kjit::codegen::MoeCombineSpec{.top_k = 8, .hidden = 2304, .dispatch = true});
  REQUIRE(kjit::ops::prepare_moe_dispatch(runtime, d, 0).has_value());
  CHECK(machine.modules_loaded == modules + 1);
}
