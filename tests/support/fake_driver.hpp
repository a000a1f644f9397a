// A fake CUDA driver for testing the ops without a GPU: two sm_90 devices
// whose "device memory" is host buffers registered with an ordinal, streams
// that are small integers naming a device, and a record of every launch,
// tensor map and memset. Module loading accepts any ELF image, so the real
// NVRTC compiles into a private cache first.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dequant_params.h"
#include "kjit/internal/driver.hpp"
#include "kjit/internal/runtime.hpp"

namespace kjit::testing {

struct FakeMachine {
  std::map<uintptr_t, std::pair<size_t, int>> allocations;  // base -> (bytes, device)
  int compute_major = 9, compute_minor = 0;
  bool capturing = false;
  int launches = 0;
  unsigned grid[3] = {};
  kjit_dequant_params last_params{};
  int modules_loaded = 0;
  unsigned block_x = 0, shared_bytes = 0, cluster_x = 0;
  bool programmatic = false;             // the last launch may overlap the kernel before it
  int shared_opt_in = 0;                 // cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
  std::vector<std::vector<cuuint64_t>> tensor_map_dims, tensor_map_boxes;  // each cuTensorMapEncodeTiled
  bool reject_tensor_maps = false;
  int contexts_pushed = 0;  // the driver needs a current context for some calls
  std::vector<std::pair<CUdeviceptr, CUstream>> async_memsets;  // each cuMemsetD32Async: where, in which stream
};
extern FakeMachine machine;

// The driver table whose calls act on `machine`.
extern kjit::DriverApi fake_api;

CUstream fake_stream(int device);

// A new private, empty directory under the system's temporary directory.
std::string fresh_cache_dir();

// Device buffers of the fake machine.
struct FakeBuffer {
  std::vector<unsigned char> bytes;
  FakeBuffer(size_t n, int device);
  ~FakeBuffer();
  unsigned char* data();  // 16-byte aligned start
};

// The call failed with `code`, a message containing `needle`, and launched nothing.
void check_rejected(const kjit::Expected<void>& r, kjit_status code, const std::string& needle);

// A runtime over the fake driver and a private cache, with the machine back
// to two idle sm_90 devices.
struct FakeRuntimeFixture {
  std::string cache_dir = fresh_cache_dir();
  kjit::Runtime runtime{&fake_api, kjit::cache::StoreConfig{cache_dir, {}, 0}};

  FakeRuntimeFixture();
  ~FakeRuntimeFixture();
};

}  // namespace kjit::testing
