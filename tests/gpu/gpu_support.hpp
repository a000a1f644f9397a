// Shared helpers of the GPU tests: the driver table, checked calls, device
// buffers that make their device current, fresh random numbers.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kjit/internal/driver.hpp"

namespace kjit::testing {

inline const kjit::DriverApi& api() { return **kjit::load_driver(); }

inline void must(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) FAIL(what, ": ", kjit::driver_error_text(api(), r));
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 engine(std::random_device{}());
  return engine;
}

// Makes `ordinal`'s primary context current on this thread (what a framework
// that last touched that device would leave behind).
inline CUcontext make_current(int ordinal) {
  CUdevice dev;
  CUcontext ctx;
  must(api().cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  must(api().cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  must(api().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

struct DeviceBuffer {
  CUdeviceptr ptr = 0;
  size_t bytes = 0;
  CUcontext ctx;
  DeviceBuffer(int device, size_t n) : bytes(n), ctx(make_current(device)) { must(api().cuMemAlloc(&ptr, n), "cuMemAlloc"); }
  ~DeviceBuffer() {
    api().cuCtxSetCurrent(ctx);
    api().cuMemFree(ptr);
  }
  void* get() const { return reinterpret_cast<void*>(ptr); }
  template <class T>
  void upload(const std::vector<T>& host) {
    api().cuCtxSetCurrent(ctx);
    must(api().cuMemcpyHtoD(ptr, host.data(), host.size() * sizeof(T)), "cuMemcpyHtoD");
    settle();
  }
  template <class T>
  std::vector<T> download(size_t offset_bytes, size_t count) const {
    std::vector<T> host(count);
    api().cuCtxSetCurrent(ctx);
    must(api().cuCtxSynchronize(), "cuCtxSynchronize");
    must(api().cuMemcpyDtoH(host.data(), ptr + offset_bytes, count * sizeof(T)), "cuMemcpyDtoH");
    return host;
  }
  // A pattern no dequant can produce (scales here are < 16): -6.3e18 in bf16,
  // f16 NaN with a distinctive payload is avoided by checking bits exactly.
  void poison() {
    api().cuCtxSetCurrent(ctx);
    must(api().cuMemsetD32(ptr, 0xDEADBEEFu, bytes / 4), "cuMemsetD32");
    settle();
  }
  // The copy and the memset above may return before the device has finished
  // them (pageable copies, device memsets), and a non-blocking stream does
  // not wait for the legacy stream they ran on: a graph replayed right after
  // raced with the poison under load (seen: output still poison).
  static void settle() { must(api().cuStreamSynchronize(nullptr), "cuStreamSynchronize"); }
};

}  // namespace kjit::testing
