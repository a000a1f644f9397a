// The MoE activation op against the fake driver: every bad-argument class
// fails with its clear error and launches nothing; a valid call launches once
// with the expected grid and parameters, compiling with the real NVRTC into a
// private cache.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "fake_driver.hpp"
#include "kjit/internal/ops/moe_activation.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;
using kjit::codegen::DType;
using kjit::codegen::GateUpLayout;
using kjit::codegen::Activation;
using kjit::codegen::MoeActivationSpec;
using kjit::codegen::QuantScaleFormat;

namespace {

// 37 rows, I = 256: h [37, 512] bf16 -> out [37, 256] bf16 (or e4m3fn with scales [37, 2]).
struct ActivationFixture : FakeRuntimeFixture {
  static constexpr int64_t kRows = 37, kI = 256;
  FakeBuffer in{kRows * 2 * kI * 2, 0}, out{kRows * kI * 2, 0}, scales{kRows * 2 * 4, 0}, valid{16, 0};
  kjit_moe_activation_desc desc{};

  ActivationFixture() {
    kjit_moe_activation_desc_init(&desc);
    desc.out_dtype = KJIT_DTYPE_BF16;
    desc.activation = KJIT_ACTIVATION_SILU_MUL;
    desc.layout = KJIT_GATE_UP_HALVES;
    desc.rows = kRows;
    desc.intermediate = kI;
    desc.in = in.data();
    desc.out = out.data();
  }

  void fp8(kjit_quant_scale_format format = KJIT_QUANT_SCALE_FP32) {
    desc.out_dtype = KJIT_DTYPE_F8_E4M3FN;
    desc.scale_format = format;
    desc.scales = reinterpret_cast<float*>(scales.data());
  }

  kjit::Expected<void> run() { return kjit::ops::moe_activation(runtime, desc, fake_stream(0)); }
  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(ActivationFixture, "a valid bf16 activation launches once, one thread per 8 output columns") {
  auto plan = kjit::ops::plan_moe_activation(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec == MoeActivationSpec{.intermediate = 256});
  CHECK(plan->geometry.block_x == 256);
  CHECK(plan->geometry.grid_x == (37 * 256 / 8 + 255) / 256);
  CHECK(plan->params.rows == 37);
  CHECK(plan->params.in_row_stride == 512);  // 0 means 2I
  CHECK(plan->params.valid_rows == nullptr);
  CHECK(plan->params.scales == nullptr);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  CHECK(runtime.store().list().size() == 1);
  REQUIRE(run().has_value());  // a registry hit
  CHECK(machine.launches == 2);
  CHECK(runtime.store().list().size() == 1);
}

TEST_CASE_FIXTURE(ActivationFixture, "FP8 output: 8 threads per 128-column group, the scale format keyed, valid_rows passed") {
  fp8(KJIT_QUANT_SCALE_UE8M0);
  desc.activation = KJIT_ACTIVATION_SWIGLU_OAI;
  desc.layout = KJIT_GATE_UP_ALTERNATING;
  desc.valid_rows = reinterpret_cast<const int32_t*>(valid.data());
  auto plan = kjit::ops::plan_moe_activation(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec == MoeActivationSpec{.intermediate = 256, .activation = Activation::swiglu_oai,
                                        .layout = GateUpLayout::alternating, .out = DType::f8_e4m3fn,
                                        .scale_format = QuantScaleFormat::ue8m0});
  CHECK(plan->geometry.grid_x == (37 * 256 / 16 + 255) / 256);
  CHECK(plan->params.valid_rows == desc.valid_rows);
  CHECK(plan->params.alpha == 1.702f);  // _desc_init's gpt-oss defaults
  CHECK(plan->params.limit == 7.0f);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(ActivationFixture, "activation, layout and (FP8) scale format have no default, dtypes are checked") {
  desc.activation = KJIT_ACTIVATION_NONE;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "activation must be KJIT_ACTIVATION_SILU_MUL or");
  desc.activation = KJIT_ACTIVATION_SILU_MUL;
  desc.layout = KJIT_GATE_UP_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "layout must be KJIT_GATE_UP_HALVES, _ALTERNATING or _GROUPS_OF_8");
  desc.layout = KJIT_GATE_UP_HALVES;
  desc.out_dtype = KJIT_DTYPE_F32;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F8_E4M3FN");
  desc.out_dtype = KJIT_DTYPE_BF16;
  desc.in_dtype = KJIT_DTYPE_F16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_dtype must be KJIT_DTYPE_BF16");
  desc.in_dtype = KJIT_DTYPE_BF16;
  fp8(KJIT_QUANT_SCALE_UNSET);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "FP8 output needs scale_format KJIT_QUANT_SCALE_FP32 or");
}

TEST_CASE_FIXTURE(ActivationFixture, "bf16 output takes no scales or scale format") {
  desc.scale_format = KJIT_QUANT_SCALE_FP32;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scale_format and scales are for FP8 output");
  desc.scale_format = KJIT_QUANT_SCALE_UNSET;
  desc.scales = reinterpret_cast<float*>(scales.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scale_format and scales are for FP8 output");
}

TEST_CASE_FIXTURE(ActivationFixture, "I must be a multiple of 8 (bf16 out) or 128 (FP8 out)") {
  desc.intermediate = 12;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "the intermediate size I must be a positive multiple of 8");
  desc.intermediate = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "the intermediate size I must be a positive multiple of 8");
  desc.intermediate = 200;  // fine for bf16
  desc.rows = 20;
  REQUIRE(kjit::ops::plan_moe_activation(desc).has_value());
  fp8();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "a positive multiple of 128 up to 1048576 with f8_e4m3fn output");
}

TEST_CASE_FIXTURE(ActivationFixture, "swiglu_oai needs a finite alpha and a positive limit, silu_mul ignores them") {
  desc.alpha = std::numeric_limits<float>::quiet_NaN();
  desc.limit = -1.0f;
  REQUIRE(kjit::ops::plan_moe_activation(desc).has_value());  // silu_mul
  desc.activation = KJIT_ACTIVATION_SWIGLU_OAI;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "alpha must be finite");
  desc.alpha = 1.702f;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "limit must be > 0 (+inf: no clamp), got -1");
  desc.limit = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "limit must be > 0");
  desc.limit = std::numeric_limits<float>::infinity();
  auto plan = kjit::ops::plan_moe_activation(desc);
  REQUIRE(plan.has_value());
  CHECK(std::isinf(plan->params.limit));
}

TEST_CASE_FIXTURE(ActivationFixture, "an input row stride below 2I or not a multiple of 8 is rejected, a padded one used") {
  desc.in_row_stride = 256;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 256 must be 0 (= 2I) or a multiple of 8 that is >= 2I = 512");
  desc.in_row_stride = 516;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_row_stride 516");
  desc.in_row_stride = 520;
  desc.rows = 30;
  auto plan = kjit::ops::plan_moe_activation(desc);
  REQUIRE(plan.has_value());
  CHECK(plan->params.in_row_stride == 520);
}

TEST_CASE_FIXTURE(ActivationFixture, "null, misaligned, host and foreign-device pointers are rejected by name") {
  fp8();
  desc.scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is NULL");
  desc.scales = reinterpret_cast<float*>(scales.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is not 4-byte aligned");
  desc.scales = reinterpret_cast<float*>(scales.data());
  desc.out = out.data() + 8;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' and 'out' must be 16-byte aligned");
  desc.out = out.data();
  desc.valid_rows = reinterpret_cast<const int32_t*>(valid.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'valid_rows' is not 4-byte aligned");
  FakeBuffer valid_on_1(16, 1);
  desc.valid_rows = reinterpret_cast<const int32_t*>(valid_on_1.data());
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'valid_rows' is on device 1");
  alignas(16) static unsigned char host[kRows * kI];
  desc.valid_rows = nullptr;
  desc.out = host;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "not CUDA memory");
}

TEST_CASE_FIXTURE(ActivationFixture, "zero rows launch nothing, and negative rows are rejected") {
  desc.rows = 0;
  desc.in = nullptr;
  REQUIRE(run().has_value());
  CHECK(machine.launches == 0);
  desc.rows = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "rows must be >= 0, got -1");
}

TEST_CASE_FIXTURE(ActivationFixture, "a launch that would compile while the stream captures fails, after prepare it runs") {
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  CHECK(runtime.store().list().empty());
  machine.capturing = false;
  kjit_moe_activation_desc shape_only = desc;  // prepare needs no pointers
  shape_only.in = nullptr;
  shape_only.out = nullptr;
  REQUIRE(kjit::ops::prepare_moe_activation(runtime, shape_only, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE_FIXTURE(ActivationFixture, "an Ampere GPU runs bf16 output and is told FP8 output needs 8.9") {
  machine.compute_major = 8;
  machine.compute_minor = 0;
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  machine.launches = 0;  // the FP8 call below must launch nothing
  fp8();
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "moe_activation with fp8 output needs compute capability 8.9 or newer; sm_80");
}

TEST_CASE_FIXTURE(ActivationFixture, "the gradient (grad given): its own kernel, bf16 only, grad checked by name") {
  FakeBuffer grad(kRows * kI * 2, 0), grad_out(kRows * 2 * kI * 2, 0);
  fp8();
  desc.grad = grad.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "the gradient (grad given) is bf16");
  desc.out_dtype = KJIT_DTYPE_BF16;
  desc.scale_format = KJIT_QUANT_SCALE_UNSET;
  desc.scales = nullptr;
  desc.out = grad_out.data();
  desc.grad = grad.data() + 8;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'grad' is not 16-byte aligned");
  FakeBuffer grad_on_1(kRows * kI * 2, 1);
  desc.grad = grad_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'grad' is on device 1");
  desc.grad = grad.data();
  auto plan = kjit::ops::plan_moe_activation(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->spec == MoeActivationSpec{.intermediate = 256, .gradient = true});
  CHECK(plan->geometry.grid_x == (37 * 256 / 8 + 255) / 256);  // one thread per 8 columns of the activation
  CHECK(plan->params.grad == grad.data());
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE("the moe activation C ABI rejects a NULL descriptor and one without struct_size, _desc_init's defaults") {
  CHECK(kjit_moe_activation(nullptr, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()) == "desc is NULL");
  CHECK(kjit_moe_activation_prepare(nullptr, 0) == KJIT_ERROR_INVALID_ARGUMENT);
  kjit_moe_activation_desc desc{};
  CHECK(kjit_moe_activation(&desc, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("kjit_moe_activation_desc_init") != std::string::npos);
  kjit_moe_activation_desc_init(&desc);
  CHECK(desc.struct_size == sizeof(kjit_moe_activation_desc));
  CHECK(desc.in_dtype == KJIT_DTYPE_BF16);
  CHECK(desc.out_dtype == KJIT_DTYPE_INVALID);
  CHECK(desc.activation == KJIT_ACTIVATION_NONE);
  CHECK(desc.layout == KJIT_GATE_UP_UNSET);
  CHECK(desc.scale_format == KJIT_QUANT_SCALE_UNSET);
  CHECK(desc.alpha == 1.702f);
  CHECK(desc.limit == 7.0f);
}
