// Loading libcuda and resolving its entry points.
#include "kjit/internal/driver.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace kjit {
namespace {

// The driver ABI these declarations match: cuGetProcAddress hands back the
// entry point with this version's signature (e.g. cuCtxPushCurrent_v2,
// cuStreamGetCaptureInfo_v3) whatever newer driver is installed.
constexpr int kDriverAbiVersion = 12080;

Expected<DriverApi> resolve_driver() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KJIT_CUDA_DRIVER_LIBRARY"); env && *env) candidates.emplace_back(env);
  candidates.emplace_back("libcuda.so.1");
  candidates.emplace_back("libcuda.so");

  void* handle = nullptr;
  std::string tried;
  for (const auto& name : candidates) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle) break;
    const char* why = dlerror();
    tried += fmt::format("\n  {}: {}", name, why ? why : "not found");
  }
  if (!handle)
    return fail(KJIT_ERROR_NO_DEVICE, fmt::format("the CUDA driver (libcuda) could not be loaded:{}", tried));

  using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProcAddress>(dlsym(handle, "cuGetProcAddress_v2"));
  if (!get_proc)
    return fail(KJIT_ERROR_NO_DEVICE, "the CUDA driver is older than CUDA 12.0 (no cuGetProcAddress_v2); kjit needs 12.8 or newer");

  DriverApi api;
  std::string missing;
  auto resolve = [&](const char* symbol, auto& fn) {
    void* p = nullptr;
    CUdriverProcAddressQueryResult found{};
    if (get_proc(symbol, &p, kDriverAbiVersion, CU_GET_PROC_ADDRESS_DEFAULT, &found) != CUDA_SUCCESS ||
        found != CU_GET_PROC_ADDRESS_SUCCESS || !p) {
      missing += fmt::format(" {}", symbol);
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define KJIT_RESOLVE(name) resolve(#name, api.name);
  KJIT_RESOLVE(cuInit) KJIT_RESOLVE(cuDriverGetVersion) KJIT_RESOLVE(cuGetErrorName) KJIT_RESOLVE(cuGetErrorString)
  KJIT_RESOLVE(cuDeviceGetCount) KJIT_RESOLVE(cuDeviceGet) KJIT_RESOLVE(cuDeviceGetName)
  KJIT_RESOLVE(cuDeviceGetAttribute) KJIT_RESOLVE(cuDevicePrimaryCtxRetain)
  KJIT_RESOLVE(cuDevicePrimaryCtxRelease) KJIT_RESOLVE(cuCtxPushCurrent) KJIT_RESOLVE(cuCtxPopCurrent)
  KJIT_RESOLVE(cuCtxSetCurrent) KJIT_RESOLVE(cuCtxSynchronize)
  KJIT_RESOLVE(cuPointerGetAttributes) KJIT_RESOLVE(cuModuleLoadData)
  KJIT_RESOLVE(cuModuleGetFunction) KJIT_RESOLVE(cuFuncSetAttribute) KJIT_RESOLVE(cuTensorMapEncodeTiled)
  KJIT_RESOLVE(cuLaunchKernel) KJIT_RESOLVE(cuLaunchKernelEx) KJIT_RESOLVE(cuOccupancyMaxActiveClusters)
  KJIT_RESOLVE(cuStreamIsCapturing) KJIT_RESOLVE(cuStreamGetDevice) KJIT_RESOLVE(cuStreamCreate)
  KJIT_RESOLVE(cuStreamDestroy) KJIT_RESOLVE(cuStreamSynchronize) KJIT_RESOLVE(cuStreamBeginCapture)
  KJIT_RESOLVE(cuStreamEndCapture) KJIT_RESOLVE(cuGraphInstantiateWithFlags) KJIT_RESOLVE(cuGraphLaunch)
  KJIT_RESOLVE(cuGraphExecDestroy) KJIT_RESOLVE(cuGraphDestroy)
  KJIT_RESOLVE(cuMemAlloc) KJIT_RESOLVE(cuMemFree)
  KJIT_RESOLVE(cuMemsetD8) KJIT_RESOLVE(cuMemsetD32) KJIT_RESOLVE(cuMemsetD32Async)
  KJIT_RESOLVE(cuMemcpyHtoD)
  KJIT_RESOLVE(cuMemcpyDtoH) KJIT_RESOLVE(cuMemGetInfo)
#undef KJIT_RESOLVE
  if (!missing.empty())
    return fail(KJIT_ERROR_NO_DEVICE,
                fmt::format("the CUDA driver lacks entry points kjit needs (driver too old?):{}", missing));

  if (CUresult r = api.cuInit(0); r != CUDA_SUCCESS)
    return fail(KJIT_ERROR_NO_DEVICE, fmt::format("cuInit failed: {} (no usable GPU?)", driver_error_text(api, r)));
  return api;
}

}  // namespace

Expected<const DriverApi*> load_driver() {
  static const Expected<DriverApi> driver = resolve_driver();
  if (!driver) return std::unexpected(driver.error());
  return &*driver;
}

std::string driver_error_text(const DriverApi& api, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.cuGetErrorName) api.cuGetErrorName(result, &name);
  if (api.cuGetErrorString) api.cuGetErrorString(result, &text);
  return fmt::format("{} ({})", name ? name : fmt::format("CUresult {}", static_cast<int>(result)),
                     text ? text : "no description");
}

Expected<void> check(const DriverApi& api, CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return {};
  return fail(KJIT_ERROR_DRIVER, fmt::format("{} failed: {}", call, driver_error_text(api, result)));
}

ScopedContext::ScopedContext(const DriverApi& api, CUcontext ctx)
    : api_(api), status_(check(api, api.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")) {}

ScopedContext::~ScopedContext() {
  if (!status_) return;
  CUcontext popped = nullptr;
  api_.cuCtxPopCurrent(&popped);
}

}  // namespace kjit
