// The fp8 quantize op against the fake driver: every bad-argument class fails
// with its clear error and launches nothing; a valid call launches once with
// the expected grid and parameters, compiling with the real NVRTC into a
// private cache.
#include <doctest/doctest.h>

#include <string>

#include "fake_driver.hpp"
#include "kjit/internal/ops/fp8_quantize.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

struct QuantizeFixture : FakeRuntimeFixture {
  static constexpr int64_t kRows = 37, kK = 384;
  FakeBuffer in{kRows * kK * 2, 0}, out{kRows * kK, 0}, scales{kRows * 3 * 4, 0}, sorted{kRows * 4, 0};
  kjit_fp8_quantize_desc desc{};

  QuantizeFixture() {
    kjit_fp8_quantize_desc_init(&desc);
    desc.in_dtype = KJIT_DTYPE_BF16;
    desc.out_dtype = KJIT_DTYPE_F8_E4M3FN;
    desc.rows = kRows;
    desc.k = kK;
    desc.scale_format = KJIT_QUANT_SCALE_FP32;
    desc.in = in.data();
    desc.out = out.data();
    desc.scales = reinterpret_cast<float*>(scales.data());
  }

  void gather() {
    desc.sorted_to_flat = reinterpret_cast<const int32_t*>(sorted.data());
    desc.tokens = 10;
    desc.top_k = 4;
  }

  kjit::Expected<void> run() { return kjit::ops::fp8_quantize(runtime, desc, fake_stream(0)); }

  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(QuantizeFixture, "a valid quantize launches once with one 8-thread team per 128-column group") {
  auto plan = kjit::ops::plan_fp8_quantize(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->geometry.block_x == 256);
  CHECK(plan->geometry.grid_x == (37 * 3 + 31) / 32);
  CHECK(plan->params.rows == 37);
  CHECK(plan->params.in_row_stride == 384);
  CHECK(plan->params.in == in.data());
  CHECK(plan->params.sorted_to_flat == nullptr);
  CHECK(plan->spec == kjit::codegen::Fp8QuantizeSpec{.k = 384, .group = 128});
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 4);
  CHECK(runtime.store().list().size() == 1);
  REQUIRE(run().has_value());  // a registry hit
  CHECK(machine.launches == 2);
  CHECK(runtime.store().list().size() == 1);
}

TEST_CASE_FIXTURE(QuantizeFixture, "K must be a multiple of 128 and the group 128") {
  desc.k = 320;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 128");
  desc.k = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 128");
  desc.k = kK;
  desc.group = 64;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "group must be 128");
}

TEST_CASE_FIXTURE(QuantizeFixture, "dtypes other than bf16 in and e4m3fn out are rejected") {
  desc.in_dtype = KJIT_DTYPE_F16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_dtype must be KJIT_DTYPE_BF16");
  desc.in_dtype = KJIT_DTYPE_BF16;
  desc.out_dtype = KJIT_DTYPE_F8_E5M2;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_dtype must be KJIT_DTYPE_F8_E4M3FN");
}

TEST_CASE_FIXTURE(QuantizeFixture, "the scale format has no default") {
  desc.scale_format = KJIT_QUANT_SCALE_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scale_format must be KJIT_QUANT_SCALE_FP32 or KJIT_QUANT_SCALE_UE8M0");
  desc.scale_format = KJIT_QUANT_SCALE_UE8M0;
  auto plan = kjit::ops::plan_fp8_quantize(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->spec.scale_format == kjit::codegen::QuantScaleFormat::ue8m0);
}

TEST_CASE_FIXTURE(QuantizeFixture, "null and misaligned pointers are rejected by name") {
  desc.scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is NULL");
  desc.scales = reinterpret_cast<float*>(scales.data());
  desc.in = in.data() + 8;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' and 'out' must be 16-byte aligned");
  desc.in = in.data();
  desc.scales = reinterpret_cast<float*>(scales.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is not 4-byte aligned");
}

TEST_CASE_FIXTURE(QuantizeFixture, "pointers on different devices and host pointers are rejected") {
  FakeBuffer out_on_1(kRows * kK, 1);
  desc.out = out_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is on device 1");
  alignas(16) static unsigned char host[kRows * kK];
  desc.out = host;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "not CUDA memory");
}

TEST_CASE_FIXTURE(QuantizeFixture, "an input row stride below K or not a multiple of 8 is rejected, a padded one is used") {
  desc.in_row_stride = 256;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 256 must be 0 (= k) or a multiple of 8 that is >= k = 384");
  desc.in_row_stride = 388;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 388");
  desc.in_row_stride = 392;
  desc.rows = 30;  // 30 rows of 392 fit the buffer
  auto plan = kjit::ops::plan_fp8_quantize(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->params.in_row_stride == 392);
}

TEST_CASE_FIXTURE(QuantizeFixture, "the gather needs sorted_to_flat exactly when top_k >= 1, and tokens * top_k in int32") {
  desc.top_k = 2;
  desc.tokens = 20;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'sorted_to_flat' is NULL");
  desc.top_k = 0;
  desc.sorted_to_flat = reinterpret_cast<const int32_t*>(sorted.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "sorted_to_flat and tokens are for a gather");
  desc.top_k = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "top_k must be 0 (no gather) or >= 1, got -1");
  gather();
  desc.tokens = int64_t{1} << 30;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "tokens * top_k must fit in int32");
  desc.tokens = desc.top_k = int64_t{1} << 40;  // a product past int64, refused all the same
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "tokens * top_k must fit in int32");
  gather();
  auto plan = kjit::ops::plan_fp8_quantize(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->spec.gather);
  CHECK(plan->params.top_k == 4);
  CHECK(plan->params.entries == 40);
  CHECK(plan->params.sorted_to_flat == desc.sorted_to_flat);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(QuantizeFixture, "zero rows launch nothing, and negative rows are rejected") {
  desc.rows = 0;
  desc.in = nullptr;
  REQUIRE(run().has_value());
  CHECK(machine.launches == 0);
  desc.rows = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "rows must be >= 0, got -1");
}

TEST_CASE_FIXTURE(QuantizeFixture, "a launch that would compile while the stream captures a graph fails, after prepare it runs") {
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  CHECK(runtime.store().list().empty());
  machine.capturing = false;
  kjit_fp8_quantize_desc shape_only = desc;  // prepare needs no pointers
  shape_only.in = nullptr;
  shape_only.out = nullptr;
  shape_only.scales = nullptr;
  REQUIRE(kjit::ops::prepare_fp8_quantize(runtime, shape_only, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(QuantizeFixture, "an Ampere GPU is told fp8 quantize needs 8.9") {
  machine.compute_major = 8;
  machine.compute_minor = 0;
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "fp8 quantize needs compute capability 8.9 or newer; sm_80 is 8.0");
}

TEST_CASE("the fp8 quantize C ABI rejects a NULL descriptor and one without struct_size") {
  CHECK(kjit_fp8_quantize(nullptr, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  CHECK(kjit_fp8_quantize_prepare(nullptr, 0) == KJIT_ERROR_INVALID_ARGUMENT);
  kjit_fp8_quantize_desc desc{};
  CHECK(kjit_fp8_quantize(&desc, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("kjit_fp8_quantize_desc_init") != std::string::npos);
  kjit_fp8_quantize_desc_init(&desc);
  CHECK(desc.struct_size == sizeof(kjit_fp8_quantize_desc));
  CHECK(desc.group == 128);
  CHECK(desc.top_k == 0);
  CHECK(desc.scale_format == KJIT_QUANT_SCALE_UNSET);
}
