// The MX scale-layout op against the fake driver: every bad-argument class
// fails with its clear error and launches nothing; valid calls plan the
// expected spec, sizes and grid, and launch once.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fake_driver.hpp"
#include "kjit/internal/ops/mx_scale_layout.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

// Two experts of 200 rows x 90 scale columns, linear -> swizzled: 2 x 256 x 92 bytes out.
struct ScaleLayoutFixture : FakeRuntimeFixture {
  FakeBuffer in{2 * 200 * 90, 0}, out{2 * 256 * 92 + 4096, 0}, offsets{16, 0};
  kjit_scale_layout_desc desc{};

  ScaleLayoutFixture() {
    kjit_scale_layout_desc_init(&desc);
    desc.from = KJIT_SCALE_LAYOUT_LINEAR;
    desc.to = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    desc.experts = 2;
    desc.rows = 200;
    desc.scale_cols = 90;
    desc.in = in.data();
    desc.out = out.data();
    desc.out_bytes = 2 * 256 * 92;
  }

  // The same 400 rows given as device offsets.
  void with_offsets(kjit_expert_offsets convention) {
    desc.rows = 400;
    desc.offsets = reinterpret_cast<const int32_t*>(offsets.data());
    desc.offsets_convention = convention;
    desc.out_bytes = kjit_swizzled_scale_bytes(400, 90, 2);
  }

  kjit::Expected<void> run() { return kjit::ops::convert_scale_layout(runtime, desc, fake_stream(0)); }
  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(ScaleLayoutFixture, "a valid uniform conversion walks every swizzled word and launches once") {
  auto plan = kjit::ops::plan_mx_scale_layout(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->params.swizzled_words == 2 * 256 * 92 / 4);
  CHECK(plan->params.rows == 200);
  CHECK(plan->params.offsets == nullptr);
  CHECK_FALSE(plan->spec.with_offsets);
  CHECK(plan->spec.scale_cols == 90);
  CHECK(plan->geometry.grid_x == (2 * 256 * 92 / 4 + 255) / 256);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  CHECK(runtime.store().list().size() == 1);
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "out_bytes is checked against the exact size (uniform) or the worst case (offsets)") {
  desc.out_bytes -= 1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT,
                  "out_bytes 47103 is too small: the swizzled scales can need 47104 bytes");
  desc.from = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  desc.to = KJIT_SCALE_LAYOUT_LINEAR;
  desc.in = out.data();
  desc.out = in.data();
  desc.out_bytes = 2 * 200 * 90 - 1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "the linear scales can need 36000 bytes");
  desc.from = KJIT_SCALE_LAYOUT_LINEAR;
  desc.to = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  desc.in = in.data();
  desc.out = out.data();
  with_offsets(KJIT_OFFSETS_CUMULATIVE_END);
  CHECK(desc.out_bytes == 640 * 92);  // (400 + 2 * 127) rounded down to 128, times 92
  desc.out_bytes -= 1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "(kjit_swizzled_scale_bytes)");
  desc.out_bytes += 1;
  auto plan = kjit::ops::plan_mx_scale_layout(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec.with_offsets);
  CHECK(plan->params.swizzled_words == 640 * 92 / 4);
  CHECK(plan->params.offsets == desc.offsets);
}

TEST_CASE("kjit_swizzled_scale_bytes bounds every split of the rows among the experts") {
  CHECK(kjit_swizzled_scale_bytes(0, 90, 1) == 0);
  CHECK(kjit_swizzled_scale_bytes(1, 4, 1) == 128 * 4);
  CHECK(kjit_swizzled_scale_bytes(129, 90, 2) == 256 * 92);  // 128 + 1 or 129 + 0: two tiles either way
  CHECK(kjit_swizzled_scale_bytes(256, 3, 3) == 512 * 4);    // 129 + 126 + 1: four tiles
  CHECK(kjit_swizzled_scale_bytes(0, 90, 8) == 0);           // no rows: no expert is padded
  CHECK(kjit_swizzled_scale_bytes(-1, 4, 1) == 0);
  // Brute force over every split of up to 300 rows between 2 experts.
  for (int64_t total = 0; total <= 300; ++total) {
    int64_t worst = 0;
    for (int64_t first = 0; first <= total; ++first)
      worst = std::max(worst, ((first + 127) / 128 + (total - first + 127) / 128) * 128 * 8);
    CHECK(kjit_swizzled_scale_bytes(total, 7, 2) == static_cast<uint64_t>(worst));
  }
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "offsets and their convention go together, there is no default convention") {
  desc.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "offsets_convention is set but 'offsets' is NULL");
  desc.offsets_convention = KJIT_OFFSETS_UNSET;
  desc.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "offsets are given without offsets_convention");
  with_offsets(KJIT_OFFSETS_WITH_LEADING_ZERO);
  desc.offsets = reinterpret_cast<const int32_t*>(offsets.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'offsets' is not 4-byte aligned");
  desc.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "layouts must be set and differ") {
  desc.from = KJIT_SCALE_LAYOUT_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "from must be KJIT_SCALE_LAYOUT_LINEAR or");
  desc.from = KJIT_SCALE_LAYOUT_LINEAR;
  desc.to = KJIT_SCALE_LAYOUT_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "to must be KJIT_SCALE_LAYOUT_LINEAR or");
  desc.to = KJIT_SCALE_LAYOUT_LINEAR;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "from and to are the same layout");
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "counts out of range are rejected") {
  desc.experts = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "experts must be >= 1");
  desc.experts = 2;
  desc.rows = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "rows must be >= 0");
  desc.rows = 200;
  desc.scale_cols = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scale_cols must be 1 to");
  desc.scale_cols = 90;
  with_offsets(KJIT_OFFSETS_CUMULATIVE_END);
  desc.experts = 1025;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "experts must be at most 1024 with offsets");
  desc.experts = 2;
  desc.rows = int64_t{1} << 31;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "do not fit the int32 offsets");
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "pointers: null, misaligned on the swizzled side, overlapping, host, mixed devices") {
  desc.in = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' is NULL");
  desc.in = in.data();
  desc.out = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is NULL");
  desc.out = out.data() + 2;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' (the swizzled side) must be 4-byte aligned");
  desc.out = in.data() + 16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' and 'out' overlap");
  std::vector<unsigned char> host(2 * 256 * 92);
  desc.out = host.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "not CUDA memory");
  FakeBuffer out_on_1(2 * 256 * 92, 1);
  desc.out = out_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is on device 1");
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "uniform rows of none launch nothing, offsets launch even for no rows (they are checked)") {
  desc.rows = 0;
  desc.out_bytes = 0;
  REQUIRE(run().has_value());
  CHECK(machine.launches == 0);
  with_offsets(KJIT_OFFSETS_CUMULATIVE_END);
  desc.rows = 0;
  desc.out_bytes = kjit_swizzled_scale_bytes(0, 90, 2);
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(ScaleLayoutFixture, "a conversion that would compile while the stream captures fails, after prepare it runs") {
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  machine.capturing = false;
  REQUIRE(kjit::ops::prepare_convert_scale_layout(runtime, desc, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE("the scale-layout C ABI rejects a NULL descriptor and one without struct_size") {
  CHECK(kjit_convert_scale_layout(nullptr, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  kjit_scale_layout_desc desc{};
  CHECK(kjit_convert_scale_layout(&desc, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("kjit_scale_layout_desc_init") != std::string::npos);
  CHECK(kjit_convert_scale_layout_prepare(nullptr, 0) == KJIT_ERROR_INVALID_ARGUMENT);
  kjit_scale_layout_desc_init(&desc);
  CHECK(desc.struct_size == sizeof(kjit_scale_layout_desc));
  CHECK(desc.experts == 1);
}
