// The MX quantize op against the fake driver: every bad-argument class fails
// with its clear error and launches nothing; valid calls launch with the
// expected grid (and, for a computed global scale, a memset in the caller's
// stream before three launches), compiling with the real NVRTC into a
// private cache.
#include <doctest/doctest.h>

#include <string>

#include "fake_driver.hpp"
#include "kjit/internal/ops/mx_quantize.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

struct MxQuantizeFixture : FakeRuntimeFixture {
  static constexpr int64_t kExperts = 2, kRows = 37, kK = 96;
  FakeBuffer in{kExperts * kRows * kK * 2, 0}, out{kExperts * kRows * kK, 0}, scales{kExperts * 128 * 8, 0},
      global{kExperts * 4, 0};
  kjit_mx_quantize_desc desc{};

  // NVFP4, swizzled, the global scale given as a multiplier.
  MxQuantizeFixture() {
    kjit_mx_quantize_desc_init(&desc);
    desc.format = KJIT_BLOCK_FORMAT_NVFP4;
    desc.experts = kExperts;
    desc.rows = kRows;
    desc.k = kK;
    desc.scale_layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    desc.in = in.data();
    desc.out = out.data();
    desc.scales = scales.data();
    desc.global_scales = reinterpret_cast<float*>(global.data());
    desc.global_scale_mode = KJIT_GLOBAL_SCALE_GIVEN;
    desc.global_scale_convention = KJIT_SCALE_MULTIPLY;
  }

  void mxfp8() {
    desc.format = KJIT_BLOCK_FORMAT_MXFP8;
    desc.element_dtype = KJIT_DTYPE_F8_E4M3FN;
    desc.global_scales = nullptr;
    desc.global_scale_mode = KJIT_GLOBAL_SCALE_UNSET;
    desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  }

  kjit::Expected<void> run() { return kjit::ops::mx_quantize(runtime, desc, fake_stream(0)); }

  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(MxQuantizeFixture, "a valid NVFP4 quantize launches once, grid x over an expert's scale tiles (swizzled) or chunks (linear), y over experts") {
  auto plan = kjit::ops::plan_mx_quantize(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec == kjit::codegen::MxQuantizeSpec{.format = kjit::codegen::MxFormat::nvfp4,
                                                    .element = kjit::codegen::MxElement::e2m1,
                                                    .k = kK,
                                                    .scale_layout = kjit::codegen::MxScaleLayout::swizzled_128x4,
                                                    .global_scale = kjit::codegen::GlobalScaleMode::given,
                                                    .convention = kjit::codegen::ScaleConvention::multiply});
  CHECK(plan->params.rows == kRows);
  CHECK(plan->params.experts == kExperts);
  CHECK(plan->params.in_row_stride == kK);
  CHECK(plan->params.phase == KJIT_MX_QUANTIZE_PHASE_QUANTIZE);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 2);  // one 128-row band of 6 scale columns: 2 tiles of 4
  CHECK(machine.grid[1] == kExperts);
  CHECK(machine.async_memsets.empty());
  CHECK(runtime.store().list().size() == 1);

  desc.scale_layout = KJIT_SCALE_LAYOUT_LINEAR;
  auto linear = run();
  REQUIRE_MESSAGE(linear.has_value(), kjit::testing::why(linear));
  CHECK(machine.launches == 2);
  CHECK(machine.grid[0] == (kRows * kK / 8 + 1023) / 1024);  // 1024 chunks of 8 elements per block
  CHECK(machine.grid[1] == kExperts);
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "a computed global scale zeroes global_scales in the caller's stream, then launches three passes") {
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_COMPUTE;
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  REQUIRE(machine.async_memsets.size() == 1);
  CHECK(machine.async_memsets[0].first == reinterpret_cast<CUdeviceptr>(global.data()));
  CHECK(machine.async_memsets[0].second == fake_stream(0));
  CHECK(machine.launches == 3);  // amax, finalize, quantize: one kernel
  CHECK(runtime.store().list().size() == 1);
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "format, layout, global-scale mode and convention have no default") {
  desc.format = KJIT_BLOCK_FORMAT_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "format must be KJIT_BLOCK_FORMAT_NVFP4, _MXFP4 or _MXFP8");
  desc.format = KJIT_BLOCK_FORMAT_NVFP4;
  desc.scale_layout = KJIT_SCALE_LAYOUT_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scale_layout must be KJIT_SCALE_LAYOUT_LINEAR or");
  desc.scale_layout = KJIT_SCALE_LAYOUT_LINEAR;
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "NVFP4 global_scale_mode must be KJIT_GLOBAL_SCALE_GIVEN or");
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_GIVEN;
  desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "NVFP4 global_scale_convention must be KJIT_SCALE_MULTIPLY");
  desc.global_scale_convention = KJIT_SCALE_DIVIDE;
  auto plan = kjit::ops::plan_mx_quantize(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->spec.convention == kjit::codegen::ScaleConvention::divide);
  CHECK(plan->spec.scale_layout == kjit::codegen::MxScaleLayout::linear);
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "the element dtype must fit the format, and only bf16 comes in") {
  desc.element_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "NVFP4 elements are e2m1: leave element_dtype KJIT_DTYPE_INVALID");
  mxfp8();
  desc.element_dtype = KJIT_DTYPE_INVALID;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "MXFP8 element_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2");
  desc.element_dtype = KJIT_DTYPE_BF16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "MXFP8 element_dtype must be");
  desc.element_dtype = KJIT_DTYPE_F8_E5M2;
  desc.in_dtype = KJIT_DTYPE_F16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_dtype must be KJIT_DTYPE_BF16");
  desc.in_dtype = KJIT_DTYPE_BF16;
  auto plan = kjit::ops::plan_mx_quantize(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->spec.element == kjit::codegen::MxElement::f8_e5m2);
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "the MX formats refuse a global scale, NVFP4 needs one") {
  mxfp8();
  desc.global_scales = reinterpret_cast<float*>(global.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "MXFP4 and MXFP8 have no global scale");
  desc.global_scales = nullptr;
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_GIVEN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "MXFP4 and MXFP8 have no global scale");
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_UNSET;
  desc.global_scale_convention = KJIT_SCALE_MULTIPLY;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "MXFP4 and MXFP8 have no global scale");
  desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  REQUIRE(run().has_value());
  CHECK(machine.launches == 1);

  desc = MxQuantizeFixture().desc;
  desc.global_scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'global_scales' is NULL");
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "K must be a positive multiple of the format's block") {
  desc.k = 40;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 16 (nvfp4's block)");
  desc.k = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 16");
  mxfp8();
  desc.k = 48;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 32 (mxfp8's block)");
  desc.format = KJIT_BLOCK_FORMAT_MXFP4;
  desc.element_dtype = KJIT_DTYPE_INVALID;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 32 (mxfp4's block)");
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "rows, experts and the input row stride are checked") {
  desc.rows = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "rows must be >= 0, got -1");
  desc.rows = kRows;
  desc.experts = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "experts must be 1 to 65535");
  desc.experts = 70000;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "experts must be 1 to 65535");
  desc.experts = kExperts;
  desc.in_row_stride = 64;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 64 must be 0 (= k) or a multiple of 8 that is >= k = 96");
  desc.in_row_stride = 100;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 100");
  desc.in_row_stride = int64_t{1} << 60;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "is too large");
  desc.in_row_stride = 104;
  desc.rows = 30;  // 2 x 30 rows of 104 fit the buffer
  auto plan = kjit::ops::plan_mx_quantize(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->params.in_row_stride == 104);
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "null and misaligned pointers are rejected by name") {
  desc.scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is NULL");
  desc.scales = scales.data();
  desc.in = in.data() + 8;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' must be 16-byte aligned");
  desc.in = in.data();
  desc.out = out.data() + 2;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' must be 4-byte aligned");
  mxfp8();
  desc.out = out.data() + 4;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' must be 8-byte aligned");
  desc = MxQuantizeFixture().desc;
  desc.global_scales = reinterpret_cast<float*>(global.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'global_scales' is not 4-byte aligned");
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "pointers on different devices and host pointers are rejected") {
  FakeBuffer scales_on_1(kExperts * 128 * 8, 1);
  desc.scales = scales_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is on device 1");
  desc.scales = scales.data();
  alignas(16) static float host[kExperts];
  desc.global_scales = host;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "not CUDA memory");
  CHECK(machine.async_memsets.empty());
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "zero rows launch nothing, not even the global scale's memset") {
  desc.rows = 0;
  desc.in = nullptr;
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_COMPUTE;
  REQUIRE(run().has_value());
  CHECK(machine.launches == 0);
  CHECK(machine.async_memsets.empty());
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "capturing an unprepared quantize fails, after prepare all three passes are captured") {
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_COMPUTE;
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  CHECK(runtime.store().list().empty());
  CHECK(machine.async_memsets.empty());
  machine.capturing = false;
  kjit_mx_quantize_desc shape_only = desc;  // prepare needs no pointers
  shape_only.in = nullptr;
  shape_only.out = nullptr;
  shape_only.scales = nullptr;
  shape_only.global_scales = nullptr;
  REQUIRE(kjit::ops::prepare_mx_quantize(runtime, shape_only, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 3);
  CHECK(machine.async_memsets.size() == 1);
}

TEST_CASE_FIXTURE(MxQuantizeFixture, "an Ampere GPU is told NVFP4 needs 8.9, MXFP4 runs there") {
  machine.compute_major = 8;
  machine.compute_minor = 0;
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "nvfp4 quantize needs compute capability 8.9 or newer");
  desc.format = KJIT_BLOCK_FORMAT_MXFP4;
  desc.global_scales = nullptr;
  desc.global_scale_mode = KJIT_GLOBAL_SCALE_UNSET;
  desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
}

TEST_CASE("the MX quantize C ABI rejects a NULL descriptor and one without struct_size, init sets bf16 and 1 expert") {
  CHECK(kjit_quantize_mx(nullptr, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  CHECK(kjit_quantize_mx_prepare(nullptr, 0) == KJIT_ERROR_INVALID_ARGUMENT);
  kjit_mx_quantize_desc desc{};
  CHECK(kjit_quantize_mx(&desc, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("kjit_mx_quantize_desc_init") != std::string::npos);
  kjit_mx_quantize_desc_init(&desc);
  CHECK(desc.struct_size == sizeof(kjit_mx_quantize_desc));
  CHECK(desc.in_dtype == KJIT_DTYPE_BF16);
  CHECK(desc.experts == 1);
  CHECK(desc.format == KJIT_BLOCK_FORMAT_UNSET);
  CHECK(desc.scale_layout == KJIT_SCALE_LAYOUT_UNSET);
  CHECK(desc.global_scale_mode == KJIT_GLOBAL_SCALE_UNSET);
  CHECK(desc.global_scale_convention == KJIT_SCALE_CONVENTION_UNSET);
}
