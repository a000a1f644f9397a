// The FP8 (W8A8) grouped GEMM's argument errors against the fake driver,
// through the C descriptor (kjit_grouped_gemm_desc with FP8 dtypes): each bad
// argument fails with its status and a message naming it, and launches
// nothing. A valid FP8 call launches once, so the refusals below are the
// arguments' doing.
#include <doctest/doctest.h>

#include <string>
#include <utility>

#include "fake_driver.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;

namespace {

struct Fp8GemmFixture : FakeRuntimeFixture {
  static constexpr int64_t kRows = 64, kN = 256, kK = 256, kExperts = 4, kKBlocks = kK / 128;
  FakeBuffer a{kRows * kK, 0}, w{kExperts * kN * kK, 0}, y{kRows * kN * 2, 0}, offsets{kExperts * 4, 0},
      a_scales{kRows * kKBlocks * 4, 0}, b_scales{kExperts * kN * 4, 0};  // room for either weight scaling
  kjit_grouped_gemm_desc g{};

  Fp8GemmFixture() {
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = g.b_dtype = KJIT_DTYPE_F8_E4M3FN;
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
    g.a_scales = reinterpret_cast<const float*>(a_scales.data());
    g.b_scales = reinterpret_cast<const float*>(b_scales.data());
    g.b_scale_granularity = KJIT_SCALE_PER_BLOCK;
    g.b_block_rows = g.b_block_cols = 128;
  }
  kjit::Expected<void> run() { return kjit::ops::grouped_gemm(runtime, g, fake_stream(0)); }
  void expect_rejected(const std::string& needle, kjit_status code = KJIT_ERROR_INVALID_ARGUMENT) {
    check_rejected(run(), code, needle);
    CHECK(machine.async_memsets.empty());
  }
};

}  // namespace

TEST_CASE_FIXTURE(Fp8GemmFixture, "a valid FP8 grouped GEMM launches once, with block or per-channel weight scales") {
  g.kernel = KJIT_GEMM_KERNEL_SM90;
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.tensor_map_dims.size() == 3);  // Hopper's SM90 kernel: A in two boxes, B
  CHECK(machine.async_memsets.empty());        // no workspace given: no tile counter to zero
  // 64 routed rows are the decode bucket: Hopper's decode kernel (wgmma) reads A in boxes of its 8-row chunks
  // and B in boxes of 64 weight rows (a warpgroup's; K 256 runs two side by side), no wide A box.
  g.kernel = KJIT_GEMM_KERNEL_AUTO;
  REQUIRE(run().has_value());
  REQUIRE(machine.tensor_map_boxes.size() == 5);
  CHECK(machine.tensor_map_boxes[3] == std::vector<cuuint64_t>{128, 8});
  CHECK(machine.tensor_map_boxes[4] == std::vector<cuuint64_t>{128, 64, 1});
  g.kernel = KJIT_GEMM_KERNEL_AUTO;
  g.b_scale_granularity = KJIT_SCALE_PER_ROW;
  g.b_block_rows = g.b_block_cols = 0;
  r = run();
  REQUIRE_MESSAGE(r.has_value(), why(r));
  CHECK(machine.launches == 3);
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "the portable FP8 kernel can be forced on sm_90, and is the default on sm_89") {
  g.kernel = KJIT_GEMM_KERNEL_PORTABLE;
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.tensor_map_dims.empty());
  machine.compute_major = 8;
  machine.compute_minor = 9;
  kjit::Runtime ada{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  g.kernel = KJIT_GEMM_KERNEL_AUTO;
  r = kjit::ops::grouped_gemm(ada, g, fake_stream(0));
  REQUIRE_MESSAGE(r.has_value(), why(r));
  CHECK(machine.launches == 2);
  CHECK(machine.tensor_map_dims.empty());
  machine.launches = 0;
  g.kernel = KJIT_GEMM_KERNEL_SM90;
  check_rejected(kjit::ops::grouped_gemm(ada, g, fake_stream(0)), KJIT_ERROR_UNSUPPORTED, "sm_90a");
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "FP8 operands without a_scales or b_scales are refused, naming the missing one") {
  g.a_scales = nullptr;
  expect_rejected("a_scales");
  g.a_scales = reinterpret_cast<const float*>(a_scales.data());
  g.b_scales = nullptr;
  expect_rejected("b_scales");
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "the weight scale granularity has no default and is per block or per channel only") {
  g.b_scale_granularity = KJIT_SCALE_INVALID;
  expect_rejected("b_scale_granularity");
  g.b_scale_granularity = KJIT_SCALE_PER_TENSOR;
  expect_rejected("per-tensor", KJIT_ERROR_UNSUPPORTED);
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "block weight scales must state 128 x 128 blocks, so that another checkpoint block is an error") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{0, 0}, {64, 128}, {128, 64}, {128, 256}}) {
    CAPTURE(rows);
    CAPTURE(cols);
    g.b_block_rows = rows;
    g.b_block_cols = cols;
    expect_rejected("b_block");
  }
  g.b_scale_granularity = KJIT_SCALE_PER_ROW;  // per channel: a block stated is a mistake, not ignored
  g.b_block_rows = g.b_block_cols = 128;
  expect_rejected("b_block");
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "K must be a multiple of 128, one scale block") {
  g.k = 192;  // a multiple of 8, which the bf16 kernels would take
  expect_rejected("128");
  g.k = 64;
  expect_rejected("128");
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "FP8 activations need e4m3fn weights, and e5m2 is not a W8A8 operand") {
  g.b_dtype = KJIT_DTYPE_BF16;
  expect_rejected("b_dtype", KJIT_ERROR_UNSUPPORTED);
  g.a_dtype = g.b_dtype = KJIT_DTYPE_F8_E5M2;  // the FP8 kernels take e4m3fn only
  expect_rejected("E4M3FN", KJIT_ERROR_UNSUPPORTED);
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "the short-K kernel is bf16's: an FP8 or FP4 GEMM asking for it is refused") {
  g.kernel = KJIT_GEMM_KERNEL_SHORT_K;
  expect_rejected("KJIT_GEMM_KERNEL_SHORT_K is the bf16 kernel for K <= 32");
  g.a_dtype = KJIT_DTYPE_BF16;  // W8A16
  expect_rejected("KJIT_GEMM_KERNEL_SHORT_K is the bf16 kernel for K <= 32");
  CHECK(machine.launches == 0);
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "FP8 weights must be [E, N, K]") {
  g.weights = KJIT_WEIGHTS_E_K_N;
  expect_rejected("E_N_K", KJIT_ERROR_UNSUPPORTED);
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "misaligned scales (4 bytes) and operands (16 bytes) are refused, naming the pointer") {
  g.a_scales = reinterpret_cast<const float*>(a_scales.data() + 2);
  expect_rejected("a_scales");
  g.a_scales = reinterpret_cast<const float*>(a_scales.data());
  g.b_scales = reinterpret_cast<const float*>(b_scales.data() + 1);
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

TEST_CASE_FIXTURE(Fp8GemmFixture, "scales on another device than the operands are refused, naming the pointer") {
  FakeBuffer a_scales_on_1(kRows * kKBlocks * 4, 1), b_scales_on_1(kExperts * kN * 4, 1);
  g.a_scales = reinterpret_cast<const float*>(a_scales_on_1.data());
  expect_rejected("a_scales");
  g.a_scales = reinterpret_cast<const float*>(a_scales.data());
  g.b_scales = reinterpret_cast<const float*>(b_scales_on_1.data());
  expect_rejected("b_scales");
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "a negative row count is refused") {
  g.rows = -1;
  expect_rejected("rows");
}

TEST_CASE_FIXTURE(Fp8GemmFixture, "GPUs without FP8 tensor cores (before sm_89) refuse the FP8 grouped GEMM") {
  machine.compute_major = 8;
  machine.compute_minor = 0;
  kjit::Runtime ampere{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  check_rejected(kjit::ops::grouped_gemm(ampere, g, fake_stream(0)), KJIT_ERROR_UNSUPPORTED, "sm_80");
}
