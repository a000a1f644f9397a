// The MX dequant op against the fake driver: every bad-argument class fails
// with its clear error and launches nothing; valid calls plan the expected
// spec, strides and grid, and launch once (compiled with the real NVRTC into
// a private cache).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "fake_driver.hpp"
#include "kjit/internal/ops/mx_dequant.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

// NVFP4, two experts of [256, 512], swizzled scales, bf16 out.
struct MxDequantFixture : FakeRuntimeFixture {
  FakeBuffer in{2 * 256 * 256, 0}, scales{2 * 256 * 32, 0}, globals{16, 0}, out{2 * 256 * 512 * 4, 0};
  kjit_mx_dequant_desc desc{};

  MxDequantFixture() {
    kjit_mx_dequant_desc_init(&desc);
    desc.format = KJIT_BLOCK_FORMAT_NVFP4;
    desc.out_dtype = KJIT_DTYPE_BF16;
    desc.experts = 2;
    desc.rows = 256;
    desc.k = 512;
    desc.scale_layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    desc.global_scale_convention = KJIT_SCALE_MULTIPLY;
    desc.in = in.data();
    desc.scales = scales.data();
    desc.global_scales = reinterpret_cast<const float*>(globals.data());
    desc.out = out.data();
  }

  // MXFP4 has no global scale and no convention.
  void as_mxfp4() {
    desc.format = KJIT_BLOCK_FORMAT_MXFP4;
    desc.global_scales = nullptr;
    desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  }

  kjit::Expected<void> run() { return kjit::ops::dequant_mx(runtime, desc, fake_stream(0)); }
  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(MxDequantFixture, "a valid NVFP4 dequant plans 8-element vectors (one 16-byte bf16 store) and launches once") {
  auto plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec.vec == 8);
  CHECK(plan->spec.format == kjit::codegen::MxFormat::nvfp4);
  CHECK(plan->params.in_row_stride == 256);       // bytes: k / 2
  CHECK(plan->params.in_expert_stride == 256 * 256);
  CHECK(plan->params.out_row_stride == 512);
  CHECK(plan->params.scale_expert_stride == 256 * 32);  // round_up(256, 128) x round_up(512 / 16, 4)
  CHECK(plan->params.global_scales == desc.global_scales);
  CHECK(plan->params.output_slots == 2);
  CHECK(plan->geometry.grid_x == 256 * 64 / 1024);  // 64 vectors a row, 4 per thread (16 input bytes)
  CHECK(plan->geometry.grid_y == 2);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 16);
  CHECK(runtime.store().list().size() == 1);
  REQUIRE(run().has_value());  // a registry hit
  CHECK(machine.launches == 2);
  CHECK(runtime.store().list().size() == 1);
}

TEST_CASE_FIXTURE(MxDequantFixture, "swizzled scale blocks of experts follow each other padded to 128 rows x 4 columns") {
  desc.rows = 129;
  desc.k = 48;  // 3 scale columns -> 4
  auto plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->params.scale_expert_stride == 256 * 4);
  CHECK(plan->spec.vec == 8);  // one 16-byte bf16 store (4 input bytes; 24-byte rows allow it)
  desc.scale_layout = KJIT_SCALE_LAYOUT_LINEAR;
  plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->params.scale_expert_stride == 129 * 3);
}

TEST_CASE_FIXTURE(MxDequantFixture, "MXFP4 and MXFP8 plan their strides from their element sizes") {
  as_mxfp4();
  desc.scale_layout = KJIT_SCALE_LAYOUT_LINEAR;
  auto plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->params.scale_expert_stride == 256 * 16);
  CHECK(plan->params.global_scales == nullptr);
  CHECK(plan->spec.vec == 8);
  desc.format = KJIT_BLOCK_FORMAT_MXFP8;
  desc.element_dtype = KJIT_DTYPE_F8_E5M2;
  desc.rows = 128;
  desc.out_dtype = KJIT_DTYPE_F32;
  plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->params.in_row_stride == 512);  // one byte an element
  CHECK(plan->spec.vec == 4);                 // one 16-byte f32 store
  CHECK(plan->spec.element == kjit::codegen::DType::f8_e5m2);
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
}

TEST_CASE_FIXTURE(MxDequantFixture, "format, scale layout and NVFP4's convention have no default") {
  desc.format = KJIT_BLOCK_FORMAT_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "format must be KJIT_BLOCK_FORMAT_NVFP4");
  desc.format = KJIT_BLOCK_FORMAT_NVFP4;
  desc.scale_layout = KJIT_SCALE_LAYOUT_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scale_layout must be KJIT_SCALE_LAYOUT_LINEAR");
  desc.scale_layout = KJIT_SCALE_LAYOUT_LINEAR;
  desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "there is no default");
  desc.global_scale_convention = KJIT_SCALE_MULTIPLY;
  desc.out_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_dtype must be");
}

TEST_CASE_FIXTURE(MxDequantFixture, "the element dtype must fit the format") {
  desc.element_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "element_dtype must be KJIT_DTYPE_INVALID for NVFP4");
  as_mxfp4();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "element_dtype must be KJIT_DTYPE_INVALID for MXFP4");
  desc.format = KJIT_BLOCK_FORMAT_MXFP8;
  desc.element_dtype = KJIT_DTYPE_INVALID;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "element_dtype must be KJIT_DTYPE_F8_E4M3FN or KJIT_DTYPE_F8_E5M2");
  desc.element_dtype = KJIT_DTYPE_BF16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "for MXFP8");
}

TEST_CASE_FIXTURE(MxDequantFixture, "k must be whole blocks of the format") {
  desc.k = 40;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "k must be a positive multiple of 16 (NVFP4's block), got 40");
  desc.k = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "got 0");
  as_mxfp4();
  desc.k = 48;  // whole bytes, but not whole 32-element blocks
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "k must be a positive multiple of 32 (MXFP4's block), got 48");
  desc.format = KJIT_BLOCK_FORMAT_MXFP8;
  desc.element_dtype = KJIT_DTYPE_F8_E4M3FN;
  desc.k = 33;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "(MXFP8's block), got 33");
}

TEST_CASE_FIXTURE(MxDequantFixture, "row strides smaller than a row are rejected, larger ones are used") {
  desc.in_row_stride = 255;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 255 bytes is smaller than a row (256 bytes for k 512)");
  desc.in_row_stride = 0;
  desc.out_row_stride = 500;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_row_stride 500 is smaller than k 512");
  desc.out_row_stride = 513;  // odd: pairs of bf16 cannot be stored at every row start
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "must be aligned to two elements");
  desc.rows = 128;
  desc.out_row_stride = 520;
  desc.in_row_stride = 258;  // 2-byte multiple: the access narrows to 4 elements
  auto plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->params.out_row_stride == 520);
  CHECK(plan->params.in_row_stride == 258);
  CHECK(plan->params.in_expert_stride == 128 * 258);
  CHECK(plan->spec.vec == 4);
}

TEST_CASE_FIXTURE(MxDequantFixture, "misaligned pointers are rejected, a misaligned input narrows the access") {
  desc.out = out.data() + 1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is not aligned to its element size (2 bytes)");
  desc.out = out.data() + 2;  // one bf16 element: FP4 pairs cannot be stored
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "NVFP4 writes its elements in pairs");
  desc.out = out.data();
  desc.global_scales = reinterpret_cast<const float*>(globals.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'global_scales' is not 4-byte aligned");
  desc.global_scales = reinterpret_cast<const float*>(globals.data());
  desc.in = in.data() + 1;
  desc.rows = 255;  // the shifted input still fits its buffer
  auto plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec.vec == 2);  // one byte at a time
}

TEST_CASE_FIXTURE(MxDequantFixture, "NVFP4 needs its global scales, the MX formats take none and no convention") {
  desc.global_scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'global_scales' is NULL: NVFP4 needs one fp32 global scale per expert");
  as_mxfp4();
  desc.global_scales = reinterpret_cast<const float*>(globals.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "global_scales must be NULL for MXFP4");
  desc.global_scales = nullptr;
  desc.global_scale_convention = KJIT_SCALE_DIVIDE;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "global_scale_convention must be UNSET for MXFP4");
  desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  desc.format = KJIT_BLOCK_FORMAT_MXFP8;
  desc.element_dtype = KJIT_DTYPE_F8_E4M3FN;
  desc.global_scale_convention = KJIT_SCALE_MULTIPLY;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "global_scale_convention must be UNSET for MXFP8");
}

TEST_CASE_FIXTURE(MxDequantFixture, "null pointers are rejected by name") {
  desc.in = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' is NULL");
  desc.in = in.data();
  desc.scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is NULL");
  desc.scales = scales.data();
  desc.out = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is NULL");
}

TEST_CASE_FIXTURE(MxDequantFixture, "host pointers and pointers on different devices are rejected") {
  std::vector<unsigned char> host(2 * 256 * 512 * 2);
  desc.out = host.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "not CUDA memory");
  desc.out = out.data();
  FakeBuffer globals_on_1(16, 1);
  desc.global_scales = reinterpret_cast<const float*>(globals_on_1.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'global_scales' is on device 1");
}

TEST_CASE_FIXTURE(MxDequantFixture, "shapes and expert ids: bad counts are rejected, no rows launch nothing") {
  desc.experts = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "experts must be >= 1");
  desc.experts = 2;
  desc.rows = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "rows must be >= 0");
  desc.rows = 256;
  desc.num_expert_ids = 2;  // ids pointer missing
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "expert_ids and num_expert_ids go together");
  desc.num_expert_ids = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "num_expert_ids must be >= 0");
  FakeBuffer ids(12, 0);
  desc.expert_ids = reinterpret_cast<const int32_t*>(ids.data());
  desc.num_expert_ids = 3;
  auto plan = kjit::ops::plan_mx_dequant(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec.selected_experts);
  CHECK(plan->params.output_slots == 3);
  CHECK(plan->params.experts == 2);  // the id range, checked on the device
  desc.expert_ids = nullptr;
  desc.num_expert_ids = 0;
  desc.rows = 0;
  REQUIRE(run().has_value());
  CHECK(machine.launches == 0);
}

TEST_CASE_FIXTURE(MxDequantFixture, "a launch that would compile while the stream captures fails, after prepare it runs") {
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  CHECK(runtime.store().list().empty());
  machine.capturing = false;
  REQUIRE(kjit::ops::prepare_dequant_mx(runtime, desc, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(MxDequantFixture, "prepare lists every vector width a launch with the same shapes can pick, whatever the pointers' alignment") {
  auto plan = kjit::ops::plan_mx_dequant_shapes(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec.vec == 8);  // 16-byte-aligned pointers: one 16-byte bf16 store
  // FP4 pairs: 2 elements at least (an output aligned to one element is refused).
  CHECK(kjit::ops::mx_dequant_vectors(*plan) == std::vector<int>{8, 4, 2});
  desc.format = KJIT_BLOCK_FORMAT_MXFP8;
  desc.element_dtype = KJIT_DTYPE_F8_E4M3FN;
  desc.global_scales = nullptr;
  desc.global_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  desc.out_dtype = KJIT_DTYPE_F32;
  plan = kjit::ops::plan_mx_dequant_shapes(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(kjit::ops::mx_dequant_vectors(*plan) == std::vector<int>{4, 2, 1});
}

TEST_CASE_FIXTURE(MxDequantFixture, "after prepare, a captured launch on views off alignment runs without compiling") {
  REQUIRE(kjit::ops::prepare_dequant_mx(runtime, desc, 0).has_value());
  const int modules = machine.modules_loaded;
  machine.capturing = true;
  desc.experts = 1;          // the views stay inside the buffers
  desc.in = in.data() + 1;   // one byte (a pair of codes) in: 1-byte aligned
  desc.out = out.data() + 4;  // a pair of bf16 in: 4-byte aligned
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.modules_loaded == modules);  // loaded by prepare
}

TEST_CASE_FIXTURE(MxDequantFixture, "an Ampere GPU is told MX dequant needs 8.9") {
  machine.compute_major = 8;
  machine.compute_minor = 0;
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "needs compute capability 8.9 or newer; sm_80 is 8.0");
}

TEST_CASE("the MX dequant C ABI rejects a NULL descriptor and one without struct_size, init sets one expert") {
  CHECK(kjit_dequant_mx(nullptr, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  kjit_mx_dequant_desc desc{};
  CHECK(kjit_dequant_mx(&desc, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("kjit_mx_dequant_desc_init") != std::string::npos);
  CHECK(kjit_dequant_mx_prepare(nullptr, 0) == KJIT_ERROR_INVALID_ARGUMENT);
  kjit_mx_dequant_desc_init(&desc);
  CHECK(desc.struct_size == sizeof(kjit_mx_dequant_desc));
  CHECK(desc.experts == 1);
  CHECK(desc.format == KJIT_BLOCK_FORMAT_UNSET);
}
