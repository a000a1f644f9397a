// The ops against a fake driver: every bad-argument class fails with its
// clear error and launches nothing; a valid call launches once with the right
// geometry and parameters, compiling with the real NVRTC into a private cache.
#include <doctest/doctest.h>

#include "why.hpp"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "kjit/internal/ops/dequant.hpp"
#include "kjit/internal/ops/grouped_gemm.hpp"
#include "kjit/internal/ops/moe_routing.hpp"
#include "kjit/internal/runtime.hpp"

namespace {

// The fake machine: two sm_90 devices; "device memory" is host buffers
// registered with an ordinal; streams are small integers naming a device.
struct FakeMachine {
  std::map<uintptr_t, std::pair<size_t, int>> allocations;  // base -> (bytes, device)
  int compute_major = 9, compute_minor = 0;
  bool capturing = false;
  int launches = 0;
  unsigned grid[3] = {};
  kjit_dequant_params last_params{};
  int modules_loaded = 0;
  unsigned block_x = 0, shared_bytes = 0, cluster_x = 0;
  int shared_opt_in = 0;                 // cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
  std::vector<std::vector<cuuint64_t>> tensor_map_dims, tensor_map_boxes;  // each cuTensorMapEncodeTiled
  bool reject_tensor_maps = false;
  int contexts_pushed = 0;  // the driver needs a current context for some calls
  std::vector<std::pair<CUdeviceptr, CUstream>> async_memsets;  // each cuMemsetD32Async: where, in which stream
};
FakeMachine machine;

CUstream fake_stream(int device) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x1000 + device)); }

CUresult machine_launch(CUfunction, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned, unsigned,
                        unsigned shared, CUstream, void** params, void**) {
  ++machine.launches;
  machine.block_x = bx;
  machine.shared_bytes = shared;
  machine.cluster_x = 0;
  machine.grid[0] = gx;
  machine.grid[1] = gy;
  machine.grid[2] = gz;
  machine.last_params = *static_cast<kjit_dequant_params*>(params[0]);
  return CUDA_SUCCESS;
}

kjit::DriverApi fake_driver() {
  kjit::DriverApi api;
  api.cuGetErrorName = [](CUresult, const char** s) { *s = "CUDA_ERROR_FAKE"; return CUDA_SUCCESS; };
  api.cuGetErrorString = [](CUresult, const char** s) { *s = "fake"; return CUDA_SUCCESS; };
  api.cuDeviceGetCount = [](int* n) { *n = 2; return CUDA_SUCCESS; };
  api.cuDeviceGet = [](CUdevice* d, int ordinal) { *d = ordinal; return CUDA_SUCCESS; };
  api.cuDeviceGetName = [](char* name, int, CUdevice) { std::snprintf(name, 16, "Fake H100"); return CUDA_SUCCESS; };
  api.cuDeviceGetAttribute = [](int* v, CUdevice_attribute a, CUdevice) {
    *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR   ? machine.compute_major
         : a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR ? machine.compute_minor
         : a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT     ? 132
                                                             : 0;
    return CUDA_SUCCESS;
  };
  api.cuDevicePrimaryCtxRetain = [](CUcontext* c, CUdevice d) {
    *c = reinterpret_cast<CUcontext>(static_cast<uintptr_t>(0x100 + d));
    return CUDA_SUCCESS;
  };
  api.cuDevicePrimaryCtxRelease = [](CUdevice) { return CUDA_SUCCESS; };
  api.cuCtxPushCurrent = [](CUcontext) {
    ++machine.contexts_pushed;
    return CUDA_SUCCESS;
  };
  api.cuCtxPopCurrent = [](CUcontext*) {
    --machine.contexts_pushed;
    return CUDA_SUCCESS;
  };
  api.cuMemAlloc = [](CUdeviceptr* p, size_t) { *p = 0xE0000; return CUDA_SUCCESS; };
  api.cuMemFree = [](CUdeviceptr) { return CUDA_SUCCESS; };
  api.cuMemsetD32 = [](CUdeviceptr, unsigned int, size_t) { return CUDA_SUCCESS; };
  api.cuMemsetD32Async = [](CUdeviceptr p, unsigned int, size_t, CUstream s) {
    machine.async_memsets.emplace_back(p, s);
    return CUDA_SUCCESS;
  };
  api.cuPointerGetAttributes = [](unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr ptr) {
    unsigned memory_type = 0;
    int ordinal = -2;
    for (const auto& [base, info] : machine.allocations)
      if (ptr >= base && ptr < base + info.first) {
        memory_type = CU_MEMORYTYPE_DEVICE;
        ordinal = info.second;
      }
    for (unsigned i = 0; i < n; ++i) {
      if (attrs[i] == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) *static_cast<unsigned*>(data[i]) = memory_type;
      if (attrs[i] == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) *static_cast<int*>(data[i]) = ordinal;
    }
    return CUDA_SUCCESS;
  };
  api.cuStreamGetDevice = [](CUstream s, CUdevice* d) {
    *d = static_cast<CUdevice>(reinterpret_cast<uintptr_t>(s) - 0x1000);
    return CUDA_SUCCESS;
  };
  api.cuStreamIsCapturing = [](CUstream, CUstreamCaptureStatus* status) {
    *status = machine.capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  };
  api.cuModuleLoadData = [](CUmodule* m, const void* image) {
    // A real cubin is an ELF file.
    if (std::memcmp(image, "\x7f" "ELF", 4) != 0) return CUDA_ERROR_INVALID_IMAGE;
    ++machine.modules_loaded;
    *m = reinterpret_cast<CUmodule>(0x200);
    return CUDA_SUCCESS;
  };
  api.cuModuleGetFunction = [](CUfunction* f, CUmodule, const char* name) {
    if (!std::string(name).starts_with("kjit_")) return CUDA_ERROR_NOT_FOUND;
    *f = reinterpret_cast<CUfunction>(0x300);
    return CUDA_SUCCESS;
  };
  api.cuFuncSetAttribute = [](CUfunction, CUfunction_attribute attribute, int value) {
    if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) machine.shared_opt_in = value;
    return CUDA_SUCCESS;
  };
  api.cuTensorMapEncodeTiled = [](CUtensorMap*, CUtensorMapDataType, cuuint32_t rank, void*, const cuuint64_t* dims,
                                  const cuuint64_t*, const cuuint32_t* box, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
    if (machine.contexts_pushed == 0) return CUDA_ERROR_INVALID_CONTEXT;  // as the real driver on a bare thread
    if (machine.reject_tensor_maps) return CUDA_ERROR_INVALID_VALUE;
    machine.tensor_map_dims.emplace_back(dims, dims + rank);
    machine.tensor_map_boxes.emplace_back(box, box + rank);
    return CUDA_SUCCESS;
  };
  api.cuOccupancyMaxActiveClusters = [](int* clusters, CUfunction, const CUlaunchConfig*) {
    *clusters = 66;
    return CUDA_SUCCESS;
  };
  api.cuLaunchKernelEx = [](const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
    const CUresult r = machine_launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, 1, 1,
                                      c->sharedMemBytes, c->hStream, params, extra);
    machine.cluster_x = c->numAttrs == 1 && c->attrs[0].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
                            ? c->attrs[0].value.clusterDim.x
                            : 0;
    return r;
  };
  api.cuLaunchKernel = machine_launch;
  return api;
}

kjit::DriverApi fake_api = fake_driver();

std::string fresh_cache_dir() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kjit-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace);
  return dir.string();
}

// Device buffers of the fake machine.
struct FakeBuffer {
  std::vector<unsigned char> bytes;
  FakeBuffer(size_t n, int device) : bytes(n + 16, 0xAB) {
    machine.allocations[reinterpret_cast<uintptr_t>(data())] = {n, device};
  }
  ~FakeBuffer() { machine.allocations.erase(reinterpret_cast<uintptr_t>(data())); }
  unsigned char* data() {  // 16-byte aligned start
    return bytes.data() + (16 - reinterpret_cast<uintptr_t>(bytes.data()) % 16) % 16;
  }
};

// The call failed with `code`, a message containing `needle`, and launched nothing.
void check_rejected(const kjit::Expected<void>& r, kjit_status code, const std::string& needle) {
  REQUIRE_FALSE(r.has_value());
  CHECK_MESSAGE(r.error().code == code, r.error().message);
  CHECK_MESSAGE(r.error().message.find(needle) != std::string::npos, r.error().message);
  CHECK(machine.launches == 0);
}

struct Fixture {
  std::string cache_dir = fresh_cache_dir();
  kjit::Runtime runtime{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  FakeBuffer in{256 * 384, 0}, scales{2 * 3 * 4, 0}, out{256 * 384 * 2, 0};
  kjit_dequant_desc desc{};

  Fixture() {
    machine.launches = 0;
    machine.capturing = false;
    machine.tensor_map_dims.clear();
    machine.tensor_map_boxes.clear();
    machine.async_memsets.clear();
    machine.reject_tensor_maps = false;
    machine.compute_major = 9;
    machine.compute_minor = 0;
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
  ~Fixture() { std::filesystem::remove_all(cache_dir); }

  kjit::Expected<void> run() { return kjit::ops::dequant_fp8(runtime, desc, fake_stream(0)); }

  void expect_rejected(kjit_status code, const std::string& needle) { check_rejected(run(), code, needle); }
};

}  // namespace

TEST_CASE_FIXTURE(Fixture, "a valid dequant compiles once, launches once with the expected grid and parameters") {
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

TEST_CASE_FIXTURE(Fixture, "a second runtime over the same cache loads from disk without compiling") {
  REQUIRE(run().has_value());
  kjit::Runtime second{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};
  auto device = second.device(0);
  REQUIRE(device.has_value());
  auto plan = kjit::ops::plan_dequant(desc, false);
  REQUIRE(plan.has_value());
  auto built = second.builder().build(plan->spec, *(*device)->arch);
  REQUIRE(built.has_value());
  CHECK(built->origin == kjit::CubinOrigin::disk_cache);
}

TEST_CASE_FIXTURE(Fixture, "null pointers are rejected by name") {
  desc.in = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'in' is NULL");
  desc.in = in.data();
  desc.scales = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'scales' is NULL");
  desc.scales = reinterpret_cast<const float*>(scales.data());
  desc.out = nullptr;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is NULL");
}

TEST_CASE_FIXTURE(Fixture, "unsupported dtype pairs are rejected") {
  desc.in_dtype = KJIT_DTYPE_BF16;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "in_dtype must be");
  desc.in_dtype = KJIT_DTYPE_F8_E5M2;
  desc.out_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "out_dtype must be");
}

TEST_CASE_FIXTURE(Fixture, "a scale shape that does not match the tensor and block is rejected with both shapes") {
  desc.scale_cols = 2;  // ceil(384 / 128) is 3
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "scales are [2, 2] per expert but a 256x384 tensor");
  desc.scale_cols = 3;
  desc.scale_granularity = KJIT_SCALE_PER_ROW;
  desc.block_rows = desc.block_cols = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "needs [256, 1]");
}

TEST_CASE_FIXTURE(Fixture, "a zero block size is rejected") {
  desc.block_rows = 0;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "per_block scales need block sizes >= 1, got 0x128");
}

TEST_CASE_FIXTURE(Fixture, "the scale convention has no default") {
  desc.scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "there is no default");
}

TEST_CASE_FIXTURE(Fixture, "host pointers are rejected") {
  std::vector<unsigned char> host(256 * 384 * 2);
  desc.out = host.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out'");
  CHECK(run().error().message.find("not CUDA memory") != std::string::npos);
}

TEST_CASE_FIXTURE(Fixture, "pointers on different devices are rejected") {
  FakeBuffer out_on_1(256 * 384 * 2, 1);
  desc.out = out_on_1.data();
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "'out' is on device 1 but 'scales' is on device 0");
}

TEST_CASE_FIXTURE(Fixture, "a stream of another device is rejected") {
  auto r = kjit::ops::dequant_fp8(runtime, desc, fake_stream(1));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("stream belongs to device 1 but the data is on device 0") != std::string::npos);
  CHECK(machine.launches == 0);
}

TEST_CASE_FIXTURE(Fixture, "row strides smaller than the row are rejected; larger ones are used") {
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

TEST_CASE_FIXTURE(Fixture, "expert id arguments must agree; their range is checked on the device") {
  desc.num_expert_ids = 2;  // ids pointer missing
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "expert_ids and num_expert_ids go together");
  desc.num_expert_ids = -1;
  expect_rejected(KJIT_ERROR_INVALID_ARGUMENT, "num_expert_ids must be >= 0");
}

TEST_CASE_FIXTURE(Fixture, "a launch that would compile while the stream captures a graph fails instead") {
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

TEST_CASE_FIXTURE(Fixture, "GPUs outside the capability table, or without fp8 conversion, get errors naming their capability") {
  machine.compute_major = 7;
  machine.compute_minor = 5;
  expect_rejected(KJIT_ERROR_UNSUPPORTED, "compute capability 7.5");
}

TEST_CASE_FIXTURE(Fixture, "an Ampere GPU is told fp8 dequant needs 8.9") {
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

namespace {

struct GemmFixture : Fixture {
  FakeBuffer a{64 * 256 * 2, 0}, w{4 * 128 * 256 * 2, 0}, y{64 * 128 * 2, 0}, offsets{4 * 4, 0};
  kjit_grouped_gemm_desc g{};

  GemmFixture() {
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = g.b_dtype = g.out_dtype = KJIT_DTYPE_BF16;
    g.rows = 64;
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
  // 64 rows over 4 experts: 16 per expert, the decode bucket (one consumer warpgroup, 64 x 256 tiles).
  CHECK(machine.block_x == 256);
  CHECK(machine.grid[0] == 1 * 5);  // (ceil(64 / 64) + 4 partial tiles) x 1 n-tile, under 132 SMs
  CHECK(machine.shared_bytes > 48 * 1024);
  CHECK(machine.shared_opt_in == static_cast<int>(machine.shared_bytes));
  REQUIRE(machine.tensor_map_dims.size() == 2);
  CHECK(machine.tensor_map_dims[0] == std::vector<cuuint64_t>{256, 64});      // A: K, rows
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
  CHECK(machine.grid[0] == 1 + 4);  // ceil(64 / 64) + one partial tile per expert
  CHECK(machine.grid[1] == 1);      // ceil(128 / 128)
  CHECK(machine.tensor_map_dims.empty());
}

TEST_CASE_FIXTURE(GemmFixture, "kernel and tile requests are checked against the arch") {
  g.tile_m = 96;
  expect_gemm_rejected("tile 96x256x64");
  g.tile_m = 128;
  g.tile_n = 512;
  expect_gemm_rejected("is not supported");
  g.tile_n = 0;
  const int unknown_kernel = 4;  // what a C caller may pass; C++ cannot name it as the enum
  std::memcpy(&g.kernel, &unknown_kernel, sizeof unknown_kernel);
  expect_gemm_rejected("kernel must be KJIT_GEMM_KERNEL_AUTO, _PORTABLE, _SM90 or _SM90_SWAP_AB, got 4");
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
  expect_gemm_rejected("K must be a positive multiple of 8, got 100");
  g.k = 256;
  g.n = 0;
  expect_gemm_rejected("N must be a positive multiple of 8, got 0");
  g.n = 128;
  g.a_dtype = KJIT_DTYPE_F8_E4M3FN;
  expect_gemm_rejected("operands must be KJIT_DTYPE_BF16");
  g.a_dtype = KJIT_DTYPE_BF16;
  g.offsets = nullptr;
  expect_gemm_rejected("'offsets' is NULL");
  g.offsets = reinterpret_cast<const int32_t*>(offsets.data());
  g.a = a.data() + 2;
  expect_gemm_rejected("'a' is not 16-byte aligned");
  g.a = a.data();
  FakeBuffer out_on_1(64 * 128 * 2, 1);
  g.out = out_on_1.data();
  expect_gemm_rejected("'out' is on device 1 but 'b' is on device 0");
}

TEST_CASE_FIXTURE(Fixture, "routing and combine argument errors are named and launch nothing") {
  FakeBuffer ids(64 * 4, 0), counts(16 * 4, 0), offsets(17 * 4, 0), sorted(64 * 4, 0), inverse(64 * 4, 0);
  kjit_moe_routing_desc r;
  kjit_moe_routing_desc_init(&r);
  r.tokens = 8;
  r.top_k = 8;
  r.experts_total = 64;
  r.expert_base = 56;
  r.experts_local = 16;  // [56, 72) leaves [0, 64)
  r.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
  r.topk_ids = reinterpret_cast<const int32_t*>(ids.data());
  r.counts = reinterpret_cast<int32_t*>(counts.data());
  r.offsets = reinterpret_cast<int32_t*>(offsets.data());
  r.sorted_to_flat = reinterpret_cast<int32_t*>(sorted.data());
  r.flat_to_sorted = reinterpret_cast<int32_t*>(inverse.data());
  auto bad_range = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_FALSE(bad_range.has_value());
  CHECK(bad_range.error().message.find("this rank's experts [56, 72) must lie in [0, experts_total = 64)") !=
        std::string::npos);
  r.expert_base = 48;
  r.counts = nullptr;
  auto no_counts = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_FALSE(no_counts.has_value());
  CHECK(no_counts.error().message == "'counts' is NULL");
  r.counts = reinterpret_cast<int32_t*>(counts.data());
  auto ok = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_MESSAGE(ok.has_value(), ok.error().message);
  CHECK(machine.launches == 1);
  CHECK(machine.grid[0] == 1);
  // 64 ids fit one block: a workspace changes nothing.
  FakeBuffer workspace(1 << 20, 0);
  r.workspace = workspace.data();
  r.workspace_bytes = 4;
  REQUIRE(kjit::ops::moe_routing(runtime, r, fake_stream(0)).has_value());
  CHECK(machine.launches == 2);
  // 100000 x 8 ids: 98 blocks of 8192 in three launches (count, scan, place) over
  // (1 + 98 + 98 x 16) ints of workspace, which must all be there.
  CHECK(kjit_moe_routing_workspace_bytes(100000, 8, 16) == (1 + 98 + 98 * 16) * 4);
  CHECK(kjit_moe_routing_workspace_bytes(1024, 8, 16) == 0);
  r.tokens = 100000;
  auto small = kjit::ops::moe_routing(runtime, r, fake_stream(0));
  REQUIRE_FALSE(small.has_value());
  CHECK(small.error().message.find("need 6668 (kjit_moe_routing_workspace_bytes)") != std::string::npos);
  CHECK(machine.launches == 2);
  r.workspace_bytes = 6668;
  REQUIRE(kjit::ops::moe_routing(runtime, r, fake_stream(0)).has_value());
  CHECK(machine.launches == 5);
  CHECK(machine.grid[0] == 98);  // the last launch: placement

  kjit_moe_combine_desc c;
  kjit_moe_combine_desc_init(&c);
  c.tokens = 8;
  c.top_k = 8;
  c.hidden = 12;
  c.rows = 64;
  c.in_dtype = KJIT_DTYPE_BF16;
  c.out_dtype = KJIT_DTYPE_BF16;
  auto bad_hidden = kjit::ops::moe_combine(runtime, c, fake_stream(0));
  REQUIRE_FALSE(bad_hidden.has_value());
  CHECK(bad_hidden.error().message == "moe_combine: hidden must be a positive multiple of 8, got 12");
  CHECK(machine.launches == 5);  // none for the bad combine
}
