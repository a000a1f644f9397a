// The dequant op against the fake driver: every bad-argument class fails with
// its clear error and launches nothing; a valid call launches once with the
// right geometry and parameters, compiling with the real NVRTC into a private
// cache.
#include <doctest/doctest.h>

#include <cstdlib>

#include <string>
#include <vector>

#include "fake_driver.hpp"
#include "kjit/internal/ops/dequant.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

struct DequantFixture : FakeRuntimeFixture {
  FakeBuffer in{256 * 384, 0}, scales{2 * 3 * 4, 0}, out{256 * 384 * 2, 0};
  kjit_dequant_desc desc{};

  DequantFixture() {
    kjit_dequant_desc_init(&desc);
    desc.in_dtype = KJIT_DTYPE_F8_E4M3FN;
    desc.out_dtype = KJIT_DTYPE_BF16;
    desc.rows = 256;
    desc.cols = 384;
    desc.scale_granularity = KJIT_SCALE_PER_BLOCK;
    desc.block_rows = 128;
    desc.block_cols = 128;
    desc.scale_rows = 2;
    desc.scale_cols = 3;
    desc.scale_convention = KJIT_SCALE_MULTIPLY;
    desc.in = in.data();
    desc.scales = reinterpret_cast<const float*>(scales.data());
    desc.out = out.data();
  }

  kjit::Expected<void> run() { return kjit::ops::dequant_fp8(runtime, desc, fake_stream(0)); }

  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(DequantFixture, "a valid dequant compiles once, launches once with the expected grid and parameters") {
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == (256 * 384 / 8 + 1023) / 1024);
  CHECK(machine.grid[1] == 1);
  CHECK(machine.last_params.rows == 256);
  CHECK(machine.last_params.in_row_stride == 384);
  CHECK(machine.last_params.scale_expert_stride == 6);
  CHECK(machine.last_params.in == in.data());
  CHECK(machine.last_params.out == out.data());
  CHECK(runtime.store().list().size() == 1);  // published to the private cache

  // A second call is a registry hit: no new module.
  const int modules = machine.modules_loaded;
  REQUIRE(run().has_value());
  CHECK(machine.modules_loaded == modules);
  CHECK(machine.launches == 2);
}

TEST_CASE_FIXTURE(DequantFixture, "a kernel may overlap the one before it in the stream unless KJIT_PROGRAMMATIC_LAUNCH=0") {
  REQUIRE(run().has_value());
  CHECK(machine.programmatic);
  CHECK(machine.cluster_x == 0);

  ::setenv("KJIT_PROGRAMMATIC_LAUNCH", "0", 1);
  kjit::Runtime serialized{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  ::unsetenv("KJIT_PROGRAMMATIC_LAUNCH");
  REQUIRE(kjit::ops::dequant_fp8(serialized, desc, fake_stream(0)).has_value());
  CHECK_FALSE(machine.programmatic);
  CHECK(machine.launches == 2);
}

TEST_CASE_FIXTURE(DequantFixture, "a device before Hopper launches without the programmatic attribute") {
  machine.compute_major = 8, machine.compute_minor = 9;  // Ada: read when the runtime first meets the device
  const auto r = run();
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  CHECK_FALSE(machine.programmatic);
}

TEST_CASE_FIXTURE(DequantFixture, "a second runtime over the same cache loads from disk without compiling") {
  REQUIRE(run().has_value());
  kjit::Runtime second{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  auto device = second.device(0);
  REQUIRE(device.has_value());
  auto plan = kjit::ops::plan_dequant(desc);
  REQUIRE(plan.has_value());
  auto built = second.builder().build(plan->spec, *(*device)->arch);
  REQUIRE(built.has_value());
  CHECK(built->origin == kjit::CubinOrigin::disk_cache);
}

TEST_CASE_FIXTURE(DequantFixture, "null pointers are rejected by name") {
  desc.in = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' is NULL");
  desc.in = in.data();
  desc.scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is NULL");
  desc.scales = reinterpret_cast<const float*>(scales.data());
  desc.out = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is NULL");
}

TEST_CASE_FIXTURE(DequantFixture, "unsupported dtype pairs are rejected") {
  desc.in_dtype = KJIT_DTYPE_BF16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_dtype must be");
  desc.in_dtype = KJIT_DTYPE_F8_E5M2;
  desc.out_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_dtype must be");
}

TEST_CASE_FIXTURE(DequantFixture, "a scale shape that does not match the tensor and block is rejected with both shapes") {
  desc.scale_cols = 2;  // ceil(384 / 128) is 3
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scales are [2, 2] per expert but a 256x384 tensor");
  desc.scale_cols = 3;
  desc.scale_granularity = KJIT_SCALE_PER_ROW;
  desc.block_rows = desc.block_cols = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "needs [256, 1]");
}

TEST_CASE_FIXTURE(DequantFixture, "a zero block size is rejected") {
  desc.block_rows = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "per_block scales need block sizes >= 1, got 0x128");
}

TEST_CASE_FIXTURE(DequantFixture, "the scale convention has no default") {
  desc.scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "there is no default");
}

TEST_CASE_FIXTURE(DequantFixture, "host pointers are rejected") {
  std::vector<unsigned char> host(256 * 384 * 2);
  desc.out = host.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out'");
  CHECK(run().error().message.find("not CUDA memory") != std::string::npos);
}

TEST_CASE_FIXTURE(DequantFixture, "pointers on different devices are rejected") {
  FakeBuffer out_on_1(256 * 384 * 2, 1);
  desc.out = out_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is on device 1 but 'scales' is on device 0");
}

TEST_CASE_FIXTURE(DequantFixture, "a stream of another device is rejected") {
  auto r = kjit::ops::dequant_fp8(runtime, desc, fake_stream(1));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("stream belongs to device 1 but the data is on device 0") != std::string::npos);
  CHECK(machine.launches == 0);
}

TEST_CASE_FIXTURE(DequantFixture, "row strides smaller than the row are rejected, larger ones are used") {
  desc.in_row_stride = 383;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 383 is smaller than cols 384");
  desc.in_row_stride = 0;
  desc.out_row_stride = 100;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_row_stride 100 is smaller than cols 384");
  desc.out_row_stride = 392;  // padded rows are allowed
  desc.rows = 128;
  desc.scale_rows = 1;
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.last_params.out_row_stride == 392);
}

TEST_CASE_FIXTURE(DequantFixture, "expert id arguments must agree, and their range is checked on the device") {
  desc.num_expert_ids = 2;  // ids pointer missing
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "expert_ids and num_expert_ids go together");
  desc.num_expert_ids = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "num_expert_ids must be >= 0");
}

TEST_CASE_FIXTURE(DequantFixture, "a launch that would compile while the stream captures a graph fails instead") {
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  CHECK(runtime.store().list().empty());  // nothing was compiled
  // After prepare the same launch is fine during capture.
  machine.capturing = false;
  REQUIRE(kjit::ops::prepare_dequant_fp8(runtime, desc, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(DequantFixture, "prepare lists every vector width a launch with the same shapes can pick, whatever the pointers' alignment") {
  auto plan = kjit::ops::plan_dequant_shapes(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec.vec == 8);  // 16-byte-aligned pointers: one 16-byte bf16 store
  CHECK(kjit::ops::dequant_vectors(*plan) == std::vector<int>{8, 4, 2, 1});
  desc.out_dtype = KJIT_DTYPE_F32;
  plan = kjit::ops::plan_dequant_shapes(desc);
  REQUIRE(plan.has_value());
  CHECK(kjit::ops::dequant_vectors(*plan) == std::vector<int>{4, 2, 1});
  desc.out_dtype = KJIT_DTYPE_BF16;
  desc.in_row_stride = 388;  // rows 4-byte aligned at most, whatever the pointer
  plan = kjit::ops::plan_dequant_shapes(desc);
  REQUIRE(plan.has_value());
  CHECK(kjit::ops::dequant_vectors(*plan) == std::vector<int>{4, 2, 1});
  desc.in_row_stride = 385;
  plan = kjit::ops::plan_dequant_shapes(desc);
  REQUIRE(plan.has_value());
  CHECK(kjit::ops::dequant_vectors(*plan) == std::vector<int>{1});
}

TEST_CASE_FIXTURE(DequantFixture, "after prepare, a captured launch on views one element off alignment runs without compiling") {
  REQUIRE(kjit::ops::prepare_dequant_fp8(runtime, desc, 0).has_value());
  const int modules = machine.modules_loaded;
  machine.capturing = true;
  desc.rows = 128;  // the views stay inside the buffers
  desc.scale_rows = 1;
  desc.in = in.data() + 1;   // one fp8 code in: 1-byte aligned
  desc.out = out.data() + 2;  // one bf16 element in: 2-byte aligned
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.modules_loaded == modules);  // loaded by prepare
  CHECK(machine.grid[0] == (128 * 384 + 1023) / 1024);  // one element a vector
  CHECK(machine.last_params.in == in.data() + 1);
  CHECK(machine.last_params.out == out.data() + 2);
}

TEST_CASE_FIXTURE(DequantFixture, "GPUs outside the capability table, or without fp8 conversion, get errors naming their capability") {
  machine.compute_major = 7;
  machine.compute_minor = 5;
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "compute capability 7.5");
}

TEST_CASE_FIXTURE(DequantFixture, "an Ampere GPU is told fp8 dequant needs 8.9") {
  machine.compute_major = 8;
  machine.compute_minor = 0;
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "needs compute capability 8.9 or newer; sm_80 is 8.0");
}

TEST_CASE("the C ABI rejects a NULL descriptor and a descriptor without struct_size") {
  CHECK(kjit_dequant_fp8(nullptr, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  kjit_dequant_desc desc{};
  CHECK(kjit_dequant_fp8(&desc, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("kjit_dequant_desc_init") != std::string::npos);
  CHECK(std::string(kjit_status_name(KJIT_ERROR_CAPTURING)) == "KJIT_ERROR_CAPTURING");
}
