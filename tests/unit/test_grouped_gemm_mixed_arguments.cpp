// The W8A16 grouped GEMM's argument errors against the fake driver, through
// the C descriptor (kjit_grouped_gemm_desc with bf16 A and FP8 weights, as
// kjit.h's W8A16 comment states the contract): each bad argument fails with
// its status and a message naming it, and launches and zeroes nothing. A
// valid W8A16 call launches once (each orientation, granularity and
// convention), so the refusals below are the arguments' doing.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "fake_driver.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

struct MixedGemmFixture : FakeRuntimeFixture {
  static constexpr int64_t kRows = 64, kN = 256, kK = 256, kExperts = 4;
  FakeBuffer a{kRows * kK * 2, 0}, w{kExperts * kN * kK, 0}, y{kRows * kN * 2, 0}, offsets{kExperts * 4, 0},
      b_scales{kExperts * kN * 4, 0};  // room for any weight scaling
  kjit_grouped_gemm_desc g{};

  MixedGemmFixture() {
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = KJIT_DTYPE_BF16;
    g.b_dtype = KJIT_DTYPE_F8_E4M3FN;
    g.out_dtype = KJIT_DTYPE_BF16;
    g.rows = kRows;
    g.n = kN;
    g.k = kK;
    g.experts = kExperts;
    g.weights = KJIT_WEIGHTS_E_N_K;
    g.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
    g.a = a.data();
    g.b = w.data();
    g.out = y.data();
    g.offsets = reinterpret_cast<const int32_t*>(offsets.data());
    g.b_scales = reinterpret_cast<const float*>(b_scales.data());
    g.b_scale_granularity = KJIT_SCALE_PER_BLOCK;
    g.b_block_rows = g.b_block_cols = 128;
    g.b_scale_convention = KJIT_SCALE_MULTIPLY;
  }
  kjit::Expected<void> run() { return kjit::ops::grouped_gemm(runtime, g, fake_stream(0)); }
  void expect_rejected(const std::string& needle, kjit_status code = KJIT_ERROR_INVALID_ARGUMENT) {
    check_rejected(run(), code, needle);
    CHECK(machine.launches == 0);
    CHECK(machine.async_memsets.empty());
  }
};

}  // namespace

TEST_CASE_FIXTURE(MixedGemmFixture, "a valid W8A16 grouped GEMM launches once per call, in every supported form") {
  int launches = 0;
  for (auto b_dtype : {KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E5M2})
    for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
      for (auto granularity : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW, KJIT_SCALE_PER_TENSOR})
        for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
          CAPTURE(b_dtype);
          CAPTURE(weights);
          CAPTURE(granularity);
          CAPTURE(convention);
          g.b_dtype = b_dtype;
          g.weights = weights;
          g.b_scale_granularity = granularity;
          g.b_block_rows = g.b_block_cols = granularity == KJIT_SCALE_PER_BLOCK ? 128 : 0;
          g.b_scale_convention = convention;
          auto r = run();
          REQUIRE_MESSAGE(r.has_value(), why(r));
          CHECK(machine.launches == ++launches);
        }
}

TEST_CASE_FIXTURE(MixedGemmFixture, "the scale convention has no default: W8A16 without one is refused, naming it") {
  g.b_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  expect_rejected("b_scale_convention");
  g.b_scale_convention = static_cast<kjit_scale_convention>(3);
  expect_rejected("b_scale_convention");
}

TEST_CASE_FIXTURE(MixedGemmFixture, "the W8A16 weight scale granularity has no default") {
  g.b_scale_granularity = KJIT_SCALE_INVALID;
  expect_rejected("b_scale_granularity");
}

TEST_CASE_FIXTURE(MixedGemmFixture, "block weight scales must state 128 x 128 blocks, and the other granularities none") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{0, 0}, {64, 128}, {128, 64}, {128, 256}, {1, 1}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    g.b_block_rows = rows;
    g.b_block_cols = cols;
    expect_rejected("b_block");
  }
  for (auto granularity : {KJIT_SCALE_PER_ROW, KJIT_SCALE_PER_TENSOR}) {  // a block stated is a mistake, not ignored
    CAPTURE(granularity);
    g.b_scale_granularity = granularity;
    g.b_block_rows = g.b_block_cols = 128;
    expect_rejected("b_block");
  }
}

TEST_CASE_FIXTURE(MixedGemmFixture, "W8A16 takes no activation scales: a_scales given is refused, naming it") {
  FakeBuffer a_scales(kRows * 2 * 4, 0);
  g.a_scales = reinterpret_cast<const float*>(a_scales.data());
  expect_rejected("a_scales");
}

TEST_CASE_FIXTURE(MixedGemmFixture, "W8A16 N and K must be multiples of 16, in both orientations") {
  for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N}) {
    CAPTURE(weights);
    g.weights = weights;
    g.k = 248;  // a multiple of 8, which the bf16 kernels would take
    expect_rejected("16");
    g.k = kK;
    g.n = 200;
    expect_rejected("16");
    g.n = kN;
  }
}

TEST_CASE_FIXTURE(MixedGemmFixture, "FP8 weights without b_scales are refused, naming them") {
  for (auto granularity : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW, KJIT_SCALE_PER_TENSOR}) {
    CAPTURE(granularity);
    g.b_scale_granularity = granularity;
    g.b_block_rows = g.b_block_cols = granularity == KJIT_SCALE_PER_BLOCK ? 128 : 0;
    g.b_scales = nullptr;
    expect_rejected("b_scales");
  }
}

TEST_CASE_FIXTURE(MixedGemmFixture, "misaligned W8A16 b_scales (4 bytes) and operands (16 bytes) are refused, naming the pointer") {
  g.b_scales = reinterpret_cast<const float*>(b_scales.data() + 2);
  expect_rejected("b_scales");
  g.b_scales = reinterpret_cast<const float*>(b_scales.data());
  g.a = a.data() + 8;
  expect_rejected("'a'");
  g.a = a.data();
  g.b = w.data() + 4;
  expect_rejected("'b'");
  g.b = w.data();
  g.out = y.data() + 2;
  expect_rejected("'out'");
}

TEST_CASE_FIXTURE(MixedGemmFixture, "b_scales on another device than the operands are refused, naming them") {
  FakeBuffer b_scales_on_1(kExperts * kN * 4, 1);
  g.b_scales = reinterpret_cast<const float*>(b_scales_on_1.data());
  expect_rejected("b_scales");
}

TEST_CASE_FIXTURE(MixedGemmFixture, "e5m2 or f16 activations with FP8 weights are refused, naming a_dtype") {
  g.a_dtype = KJIT_DTYPE_F8_E5M2;  // bf16 A only; e5m2 is a weight type here
  expect_rejected("a_dtype", KJIT_ERROR_UNSUPPORTED);
  g.b_dtype = KJIT_DTYPE_F8_E5M2;
  expect_rejected("a_dtype", KJIT_ERROR_UNSUPPORTED);
  g.a_dtype = KJIT_DTYPE_F16;
  g.b_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected("a_dtype", KJIT_ERROR_UNSUPPORTED);
}

TEST_CASE_FIXTURE(MixedGemmFixture, "a fused activation over 128 x 128 block scales launches with the checkpoint's "
                                    "gate/up layout, either one, and N in whole gate/up groups of any size") {
  g.activation = KJIT_ACTIVATION_SILU_MUL;
  int launches = 0;
  for (auto layout : {KJIT_GATE_UP_HALVES, KJIT_GATE_UP_ALTERNATING})
    for (int64_t n : {kN, int64_t{144}, int64_t{16}}) {  // 2I = 144: up rows straddle a 128-row scale block
      for (auto kernel : {KJIT_GEMM_KERNEL_AUTO, KJIT_GEMM_KERNEL_PORTABLE}) {
        CAPTURE(layout);
        CAPTURE(n);
        CAPTURE(kernel);
        g.activation_gate_up_layout = layout;
        g.n = n;
        g.kernel = kernel;
        auto r = run();
        REQUIRE_MESSAGE(r.has_value(), why(r));
        CHECK(machine.launches == ++launches);
      }
    }
}

TEST_CASE_FIXTURE(MixedGemmFixture, "a fused activation over 128 x 128 block scales without their gate/up layout is "
                                    "refused, naming activation_gate_up_layout, and writes nothing") {
  g.activation = KJIT_ACTIVATION_SWIGLU_OAI;
  expect_rejected("needs activation_gate_up_layout (KJIT_GATE_UP_HALVES or _ALTERNATING)");
  g.activation_gate_up_layout = static_cast<kjit_gate_up_layout>(3);
  expect_rejected("activation_gate_up_layout must be KJIT_GATE_UP_UNSET, _HALVES or _ALTERNATING, got 3");
  g.activation_gate_up_layout = KJIT_GATE_UP_HALVES;  // and N still in whole gate/up groups
  g.n = kN + 8;
  expect_rejected("multiple of 16");
}

TEST_CASE_FIXTURE(MixedGemmFixture, "activation_gate_up_layout anywhere but a fused activation over W8A16 block scales "
                                    "is refused, and writes nothing") {
  g.activation_gate_up_layout = KJIT_GATE_UP_ALTERNATING;
  expect_rejected("activation_gate_up_layout is for a fused activation");  // no activation
  g.activation = KJIT_ACTIVATION_SILU_MUL;
  for (auto granularity : {KJIT_SCALE_PER_ROW, KJIT_SCALE_PER_TENSOR}) {  // their scales follow the rows
    CAPTURE(granularity);
    g.b_scale_granularity = granularity;
    g.b_block_rows = g.b_block_cols = 0;
    expect_rejected("activation_gate_up_layout is for a fused activation");
  }
  g.b_scale_granularity = KJIT_SCALE_PER_BLOCK;
  g.b_block_rows = g.b_block_cols = 128;
  g.weights = KJIT_WEIGHTS_E_K_N;  // the backward reading has no gate/up rows
  expect_rejected("[E, N, K] weights");
  g.weights = KJIT_WEIGHTS_E_N_K;
  g.b_dtype = KJIT_DTYPE_BF16;  // the bf16 GEMM
  g.b_scales = nullptr;
  g.b_scale_granularity = KJIT_SCALE_INVALID;
  g.b_block_rows = g.b_block_cols = 0;
  g.b_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  expect_rejected("activation_gate_up_layout is for a fused activation");
}
