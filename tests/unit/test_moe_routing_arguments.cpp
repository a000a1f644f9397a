// The MoE routing and combine ops against the fake driver: argument errors
// named, one block or three launches over a workspace.
#include <doctest/doctest.h>

#include <string>

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
