// The grouped GEMM op against the fake driver: the kernel, tiles, clusters,
// grid and TMA maps it launches with per arch and token count, and its
// argument errors, each named and launching nothing.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fake_driver.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/internal/runtime.hpp"

using namespace kjit::testing;

namespace {

struct GemmFixture : FakeRuntimeFixture {
  FakeBuffer a{128 * 256 * 2, 0}, w{4 * 128 * 256 * 2, 0}, y{128 * 128 * 2, 0}, offsets{4 * 4, 0};
  kjit_grouped_gemm_desc g{};

  GemmFixture() {
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = g.b_dtype = g.out_dtype = KJIT_DTYPE_BF16;
    g.rows = 128;  // past the decode bucket (kDecodeMaxRowsBf16), so the SM90 kernels run
    g.n = 128;
    g.k = 256;
    g.experts = 4;
    g.weights = KJIT_WEIGHTS_E_N_K;
    g.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
    g.a = a.data();
    g.b = w.data();
    g.out = y.data();
    g.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  }
  void expect_gemm_rejected(const std::string& needle) {
    check_rejected(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)), KJIT_ERROR_INVALID_ARGUMENT, needle);
  }
};

}  // namespace

TEST_CASE_FIXTURE(GemmFixture, "on sm_90 a grouped GEMM launches the persistent wgmma kernel with its TMA maps") {
  auto r = kjit::ops::grouped_gemm(runtime, g, fake_stream(0));
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  // 128 rows over 4 experts: 32 per expert, the first SM90 bucket (one consumer warpgroup, 64 x 256 tiles).
  CHECK(machine.block_x == 256);
  CHECK(machine.grid[0] == 1 * 6);  // (ceil(128 / 64) + 4 partial tiles) x 1 n-tile, under 132 SMs
  CHECK(machine.shared_bytes > 48 * 1024);
  CHECK(machine.shared_opt_in == static_cast<int>(machine.shared_bytes));
  REQUIRE(machine.tensor_map_dims.size() == 2);
  CHECK(machine.tensor_map_dims[0] == std::vector<cuuint64_t>{256, 128});     // A: K, rows
  CHECK(machine.tensor_map_boxes[0] == std::vector<cuuint64_t>{64, 64});      // 64 k x tile_m rows
  CHECK(machine.tensor_map_dims[1] == std::vector<cuuint64_t>{256, 128, 4});  // B [E, N, K]: K, N, E
  CHECK(machine.tensor_map_boxes[1] == std::vector<cuuint64_t>{64, 256, 1});

  // 256 rows per expert: swap AB, rows in tiles of up to 256 x 128 columns.
  FakeBuffer many_a(8192 * 256 * 2, 0), many_out(8192 * 128 * 2, 0);
  g.rows = 1024;
  g.a = many_a.data();
  g.out = many_out.data();
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.block_x == 384);
  CHECK(machine.cluster_x == 0);
  CHECK(machine.grid[0] == 8);  // (1024 / 256 + 4) row tiles x 1 n-tile, under 132 SMs
  CHECK(machine.tensor_map_boxes[2] == std::vector<cuuint64_t>{64, 32});
  CHECK(machine.tensor_map_boxes[3] == std::vector<cuuint64_t>{64, 128});  // and in wide boxes of 128
  CHECK(machine.tensor_map_boxes[4] == std::vector<cuuint64_t>{64, 128, 1});

  // 2048 rows per expert: 128 x 256 tiles in clusters of two blocks, each
  // loading half of the B tile (128 of its 256 rows) for both.
  g.rows = 8192;
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.cluster_x == 2);
  CHECK(machine.programmatic);  // a cluster launch may overlap the kernel before it too
  CHECK(machine.grid[0] == 72);  // (8192 / 256 + 4) cluster tiles x 1 n-tile, 2 blocks each, under 66 clusters x 2
  CHECK(machine.tensor_map_boxes[6] == std::vector<cuuint64_t>{64, 128, 1});

  // With 128 x 64 tiles (asked for: no cluster then) there are
  // (64 + 4) x 2 = 136 tiles, and the grid stops at the SM count.
  g.weights = KJIT_WEIGHTS_E_K_N;
  g.tile_m = 128;
  g.tile_n = 64;
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.block_x == 384);
  CHECK(machine.grid[0] == 132);
  CHECK(machine.cluster_x == 0);
  CHECK(machine.tensor_map_dims[8] == std::vector<cuuint64_t>{128, 256, 4});  // B [E, K, N]: N, K, E
  CHECK(machine.tensor_map_boxes[8] == std::vector<cuuint64_t>{64, 64, 1});

  // Pairs along N share A: each block loads 64 of the 128 A rows and the
  // whole B tile. N = 128 is one 64-column n-tile, so each pair's second block
  // lies past N: (64 + 4) m-tiles x 1 pair, 2 blocks each, under 66 clusters x 2.
  g.weights = KJIT_WEIGHTS_E_N_K;
  g.cluster = 2;
  g.cluster_axis = KJIT_GEMM_CLUSTER_ALONG_N;
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.cluster_x == 2);
  CHECK(machine.programmatic);  // a cluster launch may overlap the kernel before it too
  CHECK(machine.grid[0] == 132);
  CHECK(machine.tensor_map_boxes[9] == std::vector<cuuint64_t>{64, 64});
  CHECK(machine.tensor_map_boxes[10] == std::vector<cuuint64_t>{64, 64, 1});
  g.rows = 256;  // (2 + 4) m-tiles: 6 clusters
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.grid[0] == 12);
}

TEST_CASE_FIXTURE(GemmFixture, "swap AB launches with boxes of 32 rows, zeroing its tile counter in the stream first") {
  FakeBuffer workspace(kjit_grouped_gemm_workspace_bytes(), 0);
  g.kernel = KJIT_GEMM_KERNEL_SM90_SWAP_AB;
  g.rows = 1024;
  FakeBuffer many_a(1024 * 256 * 2, 0), many_out(1024 * 128 * 2, 0);
  g.a = many_a.data();
  g.out = many_out.data();
  // Without a workspace: a static round robin, nothing zeroed.
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.block_x == 384);  // 128 columns: two consumer warpgroups and the producer
  CHECK(machine.cluster_x == 0);
  CHECK(machine.grid[0] == 8);  // (1024 / 256 + 4) row tiles x 1 n-tile, under 132 SMs
  CHECK(machine.tensor_map_boxes[0] == std::vector<cuuint64_t>{64, 32});      // rows in boxes of 32
  CHECK(machine.tensor_map_boxes[1] == std::vector<cuuint64_t>{64, 128});     // and in boxes of 128
  CHECK(machine.tensor_map_boxes[2] == std::vector<cuuint64_t>{64, 128, 1});  // the block's whole weight tile
  CHECK(machine.async_memsets.empty());
  // With one: zeroed in the launch's stream, before the launch.
  g.workspace = workspace.data();
  g.workspace_bytes = kjit_grouped_gemm_workspace_bytes();
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  REQUIRE(machine.async_memsets.size() == 1);
  CHECK(machine.async_memsets[0].first == reinterpret_cast<CUdeviceptr>(workspace.data()));
  CHECK(machine.async_memsets[0].second == fake_stream(0));
  CHECK(machine.launches == 2);
  // The other kernels ignore the workspace.
  g.kernel = KJIT_GEMM_KERNEL_SM90;
  g.tile_m = 128;
  g.tile_n = 192;
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.async_memsets.size() == 1);
  // A workspace too small, misaligned, or on another device: nothing zeroed, nothing launched.
  machine.launches = 0;
  g.kernel = KJIT_GEMM_KERNEL_SM90_SWAP_AB;
  g.tile_m = g.tile_n = 0;
  g.workspace_bytes = 4;
  expect_gemm_rejected("workspace_bytes is 4, the grouped GEMM needs 16");
  g.workspace_bytes = 16;
  g.workspace = workspace.data() + 4;
  expect_gemm_rejected("'workspace' must be 16-byte aligned");
  FakeBuffer elsewhere(16, 1);
  g.workspace = elsewhere.data();
  check_rejected(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)), KJIT_ERROR_INVALID_ARGUMENT, "workspace");
  CHECK(machine.async_memsets.size() == 1);
  // Pairs of blocks lie along N only, and only where N holds whole pairs.
  g.workspace = workspace.data();
  g.cluster = 2;
  g.cluster_axis = KJIT_GEMM_CLUSTER_ALONG_N;
  expect_gemm_rejected("swap AB");  // N = 128 is one 128-column tile
  g.tile_m = 256;
  g.tile_n = 64;
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.cluster_x == 2);
  CHECK(machine.programmatic);  // a cluster launch may overlap the kernel before it too
  CHECK(machine.block_x == 256);
}

TEST_CASE_FIXTURE(GemmFixture, "a cluster axis is checked: along N needs a cluster, and only M or N exist") {
  g.cluster_axis = KJIT_GEMM_CLUSTER_ALONG_N;
  expect_gemm_rejected("cluster_axis ALONG_N needs cluster 2");
  g.cluster = 2;
  const int unknown_axis = 7;  // what a C caller may pass; C++ cannot name it as the enum
  std::memcpy(&g.cluster_axis, &unknown_axis, sizeof unknown_axis);
  expect_gemm_rejected("cluster_axis must be");
  CHECK(machine.launches == 0);
}

TEST_CASE_FIXTURE(GemmFixture, "the portable kernel can be forced, and launches over an upper-bound grid of m-tiles") {
  g.kernel = KJIT_GEMM_KERNEL_PORTABLE;
  auto r = kjit::ops::grouped_gemm(runtime, g, fake_stream(0));
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 2 + 4);  // ceil(128 / 64) + one partial tile per expert
  CHECK(machine.grid[1] == 1);      // ceil(128 / 128)
  CHECK(machine.tensor_map_dims.empty());
}

TEST_CASE_FIXTURE(GemmFixture, "problems that differ only in their expert count share one kernel, each launch its own grid") {
  // The expert count is a launch argument (kernel_identity): E 4 and E 2 (the first two experts of the same
  // buffers) load one module; the portable kernel's upper-bound grid counts each launch's own experts.
  g.kernel = KJIT_GEMM_KERNEL_PORTABLE;
  auto four = kjit::ops::grouped_gemm(runtime, g, fake_stream(0));
  REQUIRE_MESSAGE(four.has_value(), four.error().message);
  CHECK(machine.grid[0] == 2 + 4);
  const int loaded = machine.modules_loaded;
  g.experts = 2;
  auto two = kjit::ops::grouped_gemm(runtime, g, fake_stream(0));
  REQUIRE_MESSAGE(two.has_value(), two.error().message);
  CHECK(machine.launches == 2);
  CHECK(machine.modules_loaded == loaded);
  CHECK(machine.grid[0] == 2 + 2);
}

TEST_CASE_FIXTURE(GemmFixture, "kernel and tile requests are checked against the arch") {
  g.tile_m = 96;
  expect_gemm_rejected("tile 96x256x64");
  g.tile_m = 128;
  g.tile_n = 512;
  expect_gemm_rejected("is not supported");
  g.tile_n = 0;
  const int unknown_kernel = 7;  // what a C caller may pass; C++ cannot name it as the enum
  std::memcpy(&g.kernel, &unknown_kernel, sizeof unknown_kernel);
  expect_gemm_rejected("_DECODE or _SHORT_K, got 7");
  g.kernel = KJIT_GEMM_KERNEL_SHORT_K;  // K 256: past the short-K kernel's 32
  check_rejected(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)), KJIT_ERROR_UNSUPPORTED,
                 "serves K up to 32 without a fused activation, not K 256");
  g.kernel = KJIT_GEMM_KERNEL_SM90_CONVERTER;  // the W8A16 / W4A16 kernel: bf16 weights have nothing to convert
  expect_gemm_rejected("KJIT_GEMM_KERNEL_SM90_CONVERTER is the W8A16 / W4A16 kernel");
  g.kernel = KJIT_GEMM_KERNEL_SM90;
  REQUIRE(kjit::ops::grouped_gemm(runtime, g, fake_stream(0)).has_value());
  CHECK(machine.block_x == 384);  // tile_m 128 asked for
  machine.launches = 0;
  machine.reject_tensor_maps = true;
  expect_gemm_rejected("cuTensorMapEncodeTiled rejected the A tensor");
  machine.reject_tensor_maps = false;

  // Off Hopper the SM90 kernel is refused, and AUTO runs the portable one.
  machine.compute_major = 12;
  kjit::Runtime blackwell{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  check_rejected(kjit::ops::grouped_gemm(blackwell, g, fake_stream(0)), KJIT_ERROR_UNSUPPORTED, "run only on sm_90a");
  g.kernel = KJIT_GEMM_KERNEL_SM90_SWAP_AB;
  check_rejected(kjit::ops::grouped_gemm(blackwell, g, fake_stream(0)), KJIT_ERROR_UNSUPPORTED, "run only on sm_90a");
  g.kernel = KJIT_GEMM_KERNEL_AUTO;
  REQUIRE(kjit::ops::grouped_gemm(blackwell, g, fake_stream(0)).has_value());
  CHECK(machine.block_x == 128);
  CHECK(machine.grid[1] == 1);
}

TEST_CASE_FIXTURE(GemmFixture, "grouped GEMM argument errors are named and launch nothing") {
  g.offsets_convention = KJIT_OFFSETS_UNSET;
  expect_gemm_rejected("there is no default");
  g.offsets_convention = KJIT_OFFSETS_WITH_LEADING_ZERO;
  g.weights = KJIT_WEIGHTS_UNSET;
  expect_gemm_rejected("weights must be");
  g.weights = KJIT_WEIGHTS_E_K_N;
  g.k = 100;
  expect_gemm_rejected("K must be a positive multiple of 8 up to 1048576, got 100");
  g.k = 256;
  g.n = 0;
  expect_gemm_rejected("N must be a positive multiple of 8 up to 1048576, got 0");
  g.n = 128;
  g.a_dtype = KJIT_DTYPE_F16;  // (FP8 operands go to the FP8 op: test_grouped_gemm_fp8_arguments.cpp)
  expect_gemm_rejected("operands must both be KJIT_DTYPE_BF16");
  g.a_dtype = KJIT_DTYPE_BF16;
  g.offsets = nullptr;
  expect_gemm_rejected("'offsets' is NULL");
  g.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  g.a = a.data() + 2;
  expect_gemm_rejected("'a' is not 16-byte aligned");
  g.a = a.data();
  FakeBuffer out_on_1(128 * 128 * 2, 1);
  g.out = out_on_1.data();
  expect_gemm_rejected("'out' is on device 1 but 'b' is on device 0");
}

TEST_CASE_FIXTURE(GemmFixture, "a gathered A launches without A's TMA maps") {
  FakeBuffer index(128 * 4, 0);
  g.sorted_to_flat = reinterpret_cast<const int32_t*>(index.data());
  g.tokens = 32;
  g.top_k = 4;
  auto r = kjit::ops::grouped_gemm(runtime, g, fake_stream(0));
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
  // The loader warp gathers the rows: only B's map is encoded.
  REQUIRE(machine.tensor_map_dims.size() == 1);
  CHECK(machine.tensor_map_dims[0] == std::vector<cuuint64_t>{256, 128, 4});
}

TEST_CASE_FIXTURE(GemmFixture, "gather argument errors are named and launch nothing") {
  FakeBuffer index(128 * 4, 0);
  g.sorted_to_flat = reinterpret_cast<const int32_t*>(index.data());
  g.tokens = 32;
  g.top_k = -1;
  expect_gemm_rejected("top_k must be 0 (no gather) or >= 1, got -1");
  g.top_k = 0;
  expect_gemm_rejected("sorted_to_flat and tokens are for a gather");
  g.top_k = 4;
  g.tokens = -1;
  expect_gemm_rejected("tokens must be >= 0 with tokens * top_k within int32");
  g.tokens = int64_t{1} << 30;
  expect_gemm_rejected("tokens must be >= 0 with tokens * top_k within int32");
  g.tokens = 32;
  g.sorted_to_flat = nullptr;
  expect_gemm_rejected("'sorted_to_flat' is NULL");
  g.sorted_to_flat = reinterpret_cast<const int32_t*>(index.data() + 2);
  expect_gemm_rejected("'sorted_to_flat' must be 4-byte aligned");
  FakeBuffer index_on_1(128 * 4, 1);
  g.sorted_to_flat = reinterpret_cast<const int32_t*>(index_on_1.data());
  expect_gemm_rejected("'sorted_to_flat' is on device 1");
  g.sorted_to_flat = reinterpret_cast<const int32_t*>(index.data());
  g.a_dtype = g.b_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_gemm_rejected("gather them in kjit_fp8_quantize");
}

TEST_CASE_FIXTURE(GemmFixture, "an addend's errors are named and launch nothing, and a good one launches") {
  FakeBuffer addend(128 * 128 * 4, 0);
  g.addend = addend.data();
  g.addend_dtype = KJIT_DTYPE_F16;
  expect_gemm_rejected("addend_dtype must be KJIT_DTYPE_BF16 or KJIT_DTYPE_F32 with an addend, got 4");
  g.addend_dtype = KJIT_DTYPE_BF16;
  g.addend = addend.data() + 8;
  expect_gemm_rejected("'addend' is not 16-byte aligned");
  FakeBuffer addend_on_1(128 * 128 * 2, 1);
  g.addend = addend_on_1.data();
  expect_gemm_rejected("'addend' is on device 1");
  g.addend = addend.data();
  g.activation = KJIT_ACTIVATION_SILU_MUL;
  expect_gemm_rejected("an addend and a fused activation do not go together");
  g.activation = KJIT_ACTIVATION_NONE;
  g.b_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_gemm_rejected("an addend is implemented in the bf16 grouped GEMM");
  g.b_dtype = KJIT_DTYPE_BF16;
  g.addend = nullptr;
  expect_gemm_rejected("addend_dtype is set without an addend");
  g.addend = addend.data();
  g.addend_dtype = KJIT_DTYPE_F32;
  auto r = kjit::ops::grouped_gemm(runtime, g, fake_stream(0));
  REQUIRE_MESSAGE(r.has_value(), r.error().message);
  CHECK(machine.launches == 1);
}
