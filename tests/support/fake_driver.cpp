// The fake driver of fake_driver.hpp.
#include "fake_driver.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace kjit::testing {

FakeMachine machine;

CUstream fake_stream(int device) { return reinterpret_cast<CUstream>(static_cast<uintptr_t>(0x1000 + device)); }

namespace {

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
    machine.cluster_x = 0;
    machine.programmatic = false;
    for (unsigned i = 0; i < c->numAttrs; ++i) {
      if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) machine.cluster_x = c->attrs[i].value.clusterDim.x;
      if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        machine.programmatic = c->attrs[i].value.programmaticStreamSerializationAllowed != 0;
    }
    return r;
  };
  api.cuLaunchKernel = machine_launch;
  return api;
}

}  // namespace

kjit::DriverApi fake_api = fake_driver();

std::string fresh_cache_dir() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("kjit-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::rand()));
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace);
  return dir.string();
}

FakeBuffer::FakeBuffer(size_t n, int device) : bytes(n + 16, 0xAB) {
  machine.allocations[reinterpret_cast<uintptr_t>(data())] = {n, device};
}

FakeBuffer::~FakeBuffer() { machine.allocations.erase(reinterpret_cast<uintptr_t>(data())); }

unsigned char* FakeBuffer::data() {
  return bytes.data() + (16 - reinterpret_cast<uintptr_t>(bytes.data()) % 16) % 16;
}

void check_rejected(const kjit::Expected<void>& r, kjit_status code, const std::string& needle) {
  REQUIRE_FALSE(r.has_value());
  CHECK_MESSAGE(r.error().code == code, r.error().message);
  CHECK_MESSAGE(r.error().message.find(needle) != std::string::npos, r.error().message);
  CHECK(machine.launches == 0);
}

FakeRuntimeFixture::FakeRuntimeFixture() {
  machine.launches = 0;
  machine.capturing = false;
  machine.tensor_map_dims.clear();
  machine.tensor_map_boxes.clear();
  machine.async_memsets.clear();
  machine.reject_tensor_maps = false;
  machine.compute_major = 9;
  machine.compute_minor = 0;
}

FakeRuntimeFixture::~FakeRuntimeFixture() { std::filesystem::remove_all(cache_dir); }

}  // namespace kjit::testing
