// The one place kjit talks to the CUDA driver. libcuda is dlopen'ed and every
// entry point resolved through cuGetProcAddress with the ABI version kjit was
// written against, so kjit starts (precompile, list, info) on machines with no
// driver, and tests can substitute a fake table.
#pragma once

#include <cuda.h>

#include <string>

#include "kjit/base/expected.hpp"

namespace kjit {

struct DriverApi {
#define KJIT_DRIVER_FN(name) decltype(&::name) name = nullptr;
  KJIT_DRIVER_FN(cuInit)
  KJIT_DRIVER_FN(cuDriverGetVersion)
  KJIT_DRIVER_FN(cuGetErrorName)
  KJIT_DRIVER_FN(cuGetErrorString)
  KJIT_DRIVER_FN(cuDeviceGetCount)
  KJIT_DRIVER_FN(cuDeviceGet)
  KJIT_DRIVER_FN(cuDeviceGetName)
  KJIT_DRIVER_FN(cuDeviceGetAttribute)
  KJIT_DRIVER_FN(cuDevicePrimaryCtxRetain)
  KJIT_DRIVER_FN(cuDevicePrimaryCtxRelease)
  KJIT_DRIVER_FN(cuCtxPushCurrent)
  KJIT_DRIVER_FN(cuCtxPopCurrent)
  KJIT_DRIVER_FN(cuCtxSetCurrent)
  KJIT_DRIVER_FN(cuCtxSynchronize)
  KJIT_DRIVER_FN(cuPointerGetAttributes)
  KJIT_DRIVER_FN(cuModuleLoadData)
  KJIT_DRIVER_FN(cuModuleGetFunction)
  KJIT_DRIVER_FN(cuFuncSetAttribute)
  KJIT_DRIVER_FN(cuTensorMapEncodeTiled)
  KJIT_DRIVER_FN(cuLaunchKernel)
  KJIT_DRIVER_FN(cuLaunchKernelEx)
  KJIT_DRIVER_FN(cuOccupancyMaxActiveClusters)
  KJIT_DRIVER_FN(cuStreamIsCapturing)
  KJIT_DRIVER_FN(cuStreamGetDevice)
  KJIT_DRIVER_FN(cuStreamCreate)
  KJIT_DRIVER_FN(cuStreamDestroy)
  KJIT_DRIVER_FN(cuStreamSynchronize)
  KJIT_DRIVER_FN(cuStreamBeginCapture)
  KJIT_DRIVER_FN(cuStreamEndCapture)
  KJIT_DRIVER_FN(cuGraphInstantiateWithFlags)
  KJIT_DRIVER_FN(cuGraphLaunch)
  KJIT_DRIVER_FN(cuGraphExecDestroy)
  KJIT_DRIVER_FN(cuGraphDestroy)
  KJIT_DRIVER_FN(cuMemAlloc)
  KJIT_DRIVER_FN(cuMemFree)
  KJIT_DRIVER_FN(cuMemsetD8)
  KJIT_DRIVER_FN(cuMemsetD32)
  KJIT_DRIVER_FN(cuMemsetD32Async)
  KJIT_DRIVER_FN(cuMemcpyHtoD)
  KJIT_DRIVER_FN(cuMemcpyDtoH)
  KJIT_DRIVER_FN(cuMemGetInfo)
#undef KJIT_DRIVER_FN
};

// The driver, loaded once per process. Fails with KJIT_ERROR_NO_DEVICE and a
// message saying what was tried when libcuda is absent or cuInit fails (for
// example: no GPU). KJIT_CUDA_DRIVER_LIBRARY names another libcuda.
Expected<const DriverApi*> load_driver();

// "CUDA_ERROR_INVALID_VALUE (invalid argument)" for a result code.
std::string driver_error_text(const DriverApi& api, CUresult result);

// Turns a failed driver result into an Error naming the call; success is {}.
Expected<void> check(const DriverApi& api, CUresult result, const char* call);

// Pushes `ctx` for the lifetime of the guard, so that every driver call in the
// scope runs in the context of the device that owns the data, whatever the
// calling thread had current; pops it again on every path.
class ScopedContext {
 public:
  ScopedContext(const DriverApi& api, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;
  Expected<void> status() const { return status_; }

 private:
  const DriverApi& api_;
  Expected<void> status_;
};

}  // namespace kjit
