// The grouped weight-gradient GEMM op against the fake driver: every
// bad-argument class fails with an error naming the argument and launches
// nothing; a valid call launches once with the expected grid, configuration
// and parameters, compiling with the real NVRTC into a private cache.
#include <doctest/doctest.h>

#include <string>

#include "fake_driver.hpp"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/ops/grouped_gemm_wgrad.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;
using kjit::codegen::DType;
using kjit::codegen::GroupedGemmWgradSpec;
using kjit::codegen::OffsetsConvention;

namespace {

// 4 experts over 100 rows, N 256, K 384: dy [100, 256], x [100, 384] -> out [4, 256, 384] fp32.
struct WgradFixture : FakeRuntimeFixture {
  static constexpr int64_t kRows = 100, kN = 256, kK = 384, kExperts = 4;
  FakeBuffer dy{kRows * kN * 2, 0}, x{kRows * kK * 2, 0}, out{kExperts * kN * kK * 4, 0}, offsets{64, 0};
  kjit_grouped_gemm_wgrad_desc desc{};

  WgradFixture() {
    kjit_grouped_gemm_wgrad_desc_init(&desc);
    desc.rows = kRows;
    desc.n = kN;
    desc.k = kK;
    desc.experts = kExperts;
    desc.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
    desc.dy = dy.data();
    desc.x = x.data();
    desc.out = out.data();
    desc.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  }

  kjit::Expected<void> run() { return kjit::ops::grouped_gemm_wgrad(runtime, desc, fake_stream(0)); }
  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(WgradFixture, "on sm_90 a valid call launches the wgmma kernel once, with its two TMA maps") {
  auto plan = kjit::ops::plan_grouped_gemm_wgrad(desc);
  REQUIRE_MESSAGE(plan.has_value(), kjit::testing::why(plan));
  CHECK(plan->problem == GroupedGemmWgradSpec{.out = DType::f32, .n = 256, .k = 384, .experts = 4});
  CHECK(plan->params.total_rows == 100);
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 2 * 3 * 4);  // persistent: 128 x 128 tiles over N x K for each expert, under 2 an SM
  CHECK(machine.grid[1] == 1);
  CHECK(machine.block_x == 288);    // two consumer warpgroups and the producer warp
  constexpr unsigned kShared = 3 * 64 * (128 + 128) * 2 + 1024 + 16 * 3;
  CHECK(machine.shared_bytes == kShared);
  // dy as [rows, N] and x as [rows, K], boxes of 64 columns x 64 rows.
  REQUIRE(machine.tensor_map_dims.size() == 2);
  CHECK(machine.tensor_map_dims[0] == std::vector<cuuint64_t>{256, 100});
  CHECK(machine.tensor_map_dims[1] == std::vector<cuuint64_t>{384, 100});
  CHECK(machine.tensor_map_boxes[0] == std::vector<cuuint64_t>{64, 64});
  CHECK(runtime.store().list().size() == 1);
  REQUIRE(run().has_value());  // a registry hit
  CHECK(machine.launches == 2);
  CHECK(runtime.store().list().size() == 1);
}

TEST_CASE_FIXTURE(WgradFixture, "the wgmma kernel's persistent grid holds two blocks an SM at most") {
  desc.n = 4096;
  desc.k = 7168;
  desc.experts = 32;  // (the fake launch writes nothing: out stays the fixture's small buffer)
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.grid[0] == 2 * 132);
}

TEST_CASE_FIXTURE(WgradFixture, "the portable kernel: asked for, below 128 columns on sm_90, and on sm_80") {
  const auto portable_launch = [&](unsigned block, unsigned grid_x) {
    const int launches = machine.launches;
    auto r = run();
    REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
    CHECK(machine.launches == launches + 1);
    CHECK(machine.block_x == block);
    CHECK(machine.grid[0] == grid_x);
    CHECK(machine.tensor_map_dims.empty());
  };
  SUBCASE("asked for") {
    desc.kernel = KJIT_GEMM_KERNEL_PORTABLE;
    portable_launch(256, 2 * 3);
    CHECK(machine.shared_bytes == 3 * 32 * (136 + 136) * 2);
    CHECK(machine.shared_opt_in == 3 * 32 * (136 + 136) * 2);  // over 48 KB: opted in
  }
  SUBCASE("N up to 64 (LoRA ranks): 32-row tiles of 4 warps; bf16 out and leading zero") {
    desc.n = 16;
    desc.out_dtype = KJIT_DTYPE_BF16;
    desc.offsets_convention = KJIT_OFFSETS_WITH_LEADING_ZERO;
    portable_launch(128, 3);
  }
  SUBCASE("K below 128 on sm_90") {
    desc.k = 64;
    portable_launch(256, 2);
  }
  SUBCASE("sm_80: the wgmma kernel asked for is refused, naming the arch") {
    machine.compute_major = 8;
    desc.kernel = KJIT_GEMM_KERNEL_SM90;
    check_rejected(run(), KJIT_ERROR_UNSUPPORTED, "sm_90a");  // nothing launched
    desc.kernel = KJIT_GEMM_KERNEL_AUTO;
    portable_launch(256, 2 * 3);
  }
}

TEST_CASE_FIXTURE(WgradFixture, "dtypes: dy and x bf16, out fp32 or bf16, _desc_init sets fp32 out") {
  CHECK(desc.out_dtype == KJIT_DTYPE_F32);
  desc.out_dtype = KJIT_DTYPE_F16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_dtype must be KJIT_DTYPE_F32 or KJIT_DTYPE_BF16");
  desc.out_dtype = KJIT_DTYPE_F32;
  desc.dy_dtype = KJIT_DTYPE_F16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "dy_dtype must be KJIT_DTYPE_BF16");
  desc.dy_dtype = KJIT_DTYPE_BF16;
  desc.x_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "x_dtype must be KJIT_DTYPE_BF16");
}

TEST_CASE_FIXTURE(WgradFixture, "N and K must be positive multiples of 8, experts 1 to 4096") {
  desc.n = 12;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "N must be a positive multiple of 8");
  desc.n = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "N must be a positive multiple of 8");
  desc.n = 256;
  desc.k = 100;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "K must be a positive multiple of 8");
  desc.k = 384;
  desc.experts = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "needs 1 to 4096 experts, got 0");
  desc.experts = 4097;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "needs 1 to 4096 experts, got 4097");
}

TEST_CASE_FIXTURE(WgradFixture, "the offsets convention has no default, and the kernel is auto, portable or SM90") {
  desc.offsets_convention = KJIT_OFFSETS_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "offsets_convention must be KJIT_OFFSETS_CUMULATIVE_END");
  desc.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
  desc.kernel = KJIT_GEMM_KERNEL_SM90_SWAP_AB;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "grouped_gemm_wgrad kernel must be KJIT_GEMM_KERNEL_AUTO, _PORTABLE");
  desc.kernel = KJIT_GEMM_KERNEL_PORTABLE;
  REQUIRE(run().has_value());
}

TEST_CASE_FIXTURE(WgradFixture, "null, misaligned, host and foreign-device pointers are rejected by name") {
  desc.dy = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'dy' is NULL");
  desc.dy = dy.data();
  desc.x = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'x' is NULL");
  desc.x = x.data();
  desc.out = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is NULL");
  desc.out = out.data();
  desc.offsets = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'offsets' is NULL");
  desc.offsets = reinterpret_cast<const int32_t*>(offsets.data() + 2);
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'offsets' must be 4-byte aligned");
  desc.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  desc.dy = dy.data() + 8;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'dy' is not 16-byte aligned");
  desc.dy = dy.data();
  desc.x = x.data() + 4;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'x' is not 16-byte aligned");
  desc.x = x.data();
  desc.out = out.data() + 8;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is not 16-byte aligned");
  desc.out = out.data();
  FakeBuffer x_on_1(kRows * kK * 2, 1);
  desc.x = x_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'x' is on device 1");
  alignas(16) static unsigned char host[64];
  desc.x = x.data();
  desc.out = host;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "not CUDA memory");
}

TEST_CASE_FIXTURE(WgradFixture, "zero rows still launch (out is written with zeros) and need no dy or x, negative rows fail") {
  desc.rows = 0;
  desc.dy = nullptr;
  desc.x = nullptr;
  auto r = run();
  REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
  machine.launches = 0;
  desc.rows = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "rows must be >= 0, got -1");
}

TEST_CASE_FIXTURE(WgradFixture, "a launch that would compile while the stream captures fails, after prepare it runs") {
  machine.capturing = true;
  expect_rejected(KJIT_ERROR_CAPTURING, "prepare");
  CHECK(runtime.store().list().empty());
  machine.capturing = false;
  kjit_grouped_gemm_wgrad_desc shape_only = desc;  // prepare needs no pointers
  shape_only.dy = shape_only.x = nullptr;
  shape_only.out = nullptr;
  shape_only.offsets = nullptr;
  REQUIRE(kjit::ops::prepare_grouped_gemm_wgrad(runtime, shape_only, 0).has_value());
  machine.capturing = true;
  auto r = run();
  CHECK_MESSAGE(r.has_value(), kjit::testing::why(r));
  CHECK(machine.launches == 1);
}

TEST_CASE("the wgrad spec round-trips through JSON, and a problem expands into its configuration") {
  using namespace kjit::codegen;
  const GroupedGemmWgradSpec problem{.out = DType::bf16, .n = 1536, .k = 2048, .experts = 128};
  const auto json = to_json(KernelSpec{problem});
  CHECK(json.dump() ==
        R"({"experts":128,"k":2048,"n":1536,"offsets":"cumulative_end","op":"grouped_gemm_wgrad","out":"bf16"})");
  CHECK(*spec_from_json(json) == KernelSpec{problem});
  const auto arch = **arch_for_target("sm_90a");
  const auto kernels = kernels_for_target(KernelSpec{problem}, arch);
  REQUIRE(kernels.size() == 1);
  CHECK(canonical(kernels[0]) ==
        "grouped_gemm_wgrad dy=bf16 x=bf16 out=bf16 n=1536 k=2048 experts=128 offsets=cumulative_end layout=e_n_k "
        "kernel=wgmma_sm90 tile=128x128x64 stages=3");
  CHECK(*spec_from_json(to_json(kernels[0])) == kernels[0]);
  const auto portable = kernels_for_target(KernelSpec{problem}, **arch_for_target("sm_100a"));
  REQUIRE(portable.size() == 1);
  CHECK(canonical(portable[0]) ==
        "grouped_gemm_wgrad dy=bf16 x=bf16 out=bf16 n=1536 k=2048 experts=128 offsets=cumulative_end layout=e_n_k "
        "kernel=mma_sync tile=128x128x32 stages=3");
  CHECK(*spec_from_json(to_json(portable[0])) == portable[0]);
  // A configuration's fields need 'kernel' beside them.
  auto bare = to_json(portable[0]);
  bare.erase("kernel");
  CHECK_FALSE(spec_from_json(bare).has_value());
  CHECK_FALSE(validate_for_target(KernelSpec{problem}, arch).has_value());  // a problem is no kernel
  auto odd = std::get<GroupedGemmWgradSpec>(kernels[0]);
  odd.tile_m = 64;
  CHECK_FALSE(validate(KernelSpec{odd}).has_value());
}
