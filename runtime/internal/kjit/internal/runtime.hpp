// The runtime: devices and their primary contexts, the path from a spec to a
// loaded kernel (registry, else the Builder: disk cache or NVRTC), and
// launching. One Runtime serves the whole process (Runtime::global()); tests
// build their own with a fake driver table or a private cache root.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kjit/internal/driver.hpp"
#include "kjit/builder/builder.hpp"
#include "kjit/cache/store.hpp"
#include "kjit/codegen/arch.hpp"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/registry.hpp"

namespace kjit {

struct DeviceState {
  int ordinal = -1;
  CUdevice device = 0;
  CUcontext context = nullptr;  // the primary context, retained for the process
  const codegen::ArchInfo* arch = nullptr;
  int multiprocessors = 0;
  CUdeviceptr error_words = 0;  // two uint32: code, value (kjit_device_errors)
  std::string name;
};

// A pointer argument to check, with the name the error should use.
struct NamedPointer {
  const void* pointer;
  const char* name;
};

class Runtime {
 public:
  Runtime(Expected<const DriverApi*> driver, cache::StoreConfig cache_config);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The process-wide runtime (driver loaded lazily, cache from the environment).
  static Runtime& global();

  Expected<const DriverApi*> driver() const { return driver_; }
  cache::Store& store() { return *store_; }
  Builder& builder() { return builder_; }
  const Registry& registry() const { return registry_; }

  Expected<int> device_count() const;
  // The device's state, initialised on first use: primary context retained,
  // capability looked up, error words allocated. Not for the hot path's first call.
  Expected<DeviceState*> device(int ordinal);

  // The device that owns every pointer; host pointers, unknown pointers and
  // pointers on different devices are errors naming the argument.
  Expected<int> owning_device(std::initializer_list<NamedPointer> pointers) const;

  // The stream must belong to `device` (or be a default stream). Not asked of
  // a capturing stream (the driver forbids it); the launch checks it then.
  Expected<void> check_stream(const DeviceState& device, CUstream stream) const;

  // The loaded kernel of `spec` on `device`. On a registry miss, checks that
  // the spec runs on the device's arch, then builds it (disk cache or NVRTC)
  // and loads it, unless `stream` is capturing a graph.
  Expected<const LoadedKernel*> kernel(DeviceState& device, const codegen::KernelSpec& spec, CUstream stream);

  // Launches `function` on `stream` inside the device's context.
  Expected<void> launch(const DeviceState& device, const LoadedKernel& kernel,
                        const codegen::LaunchGeometry& geometry, void* params, CUstream stream) const;

  // Reads and clears the device's error words (synchronises the device).
  Expected<void> take_device_errors(int ordinal);

 private:
  Expected<LoadedKernel> load(const DeviceState& device, const BuiltKernel& built) const;

  Expected<const DriverApi*> driver_;
  std::unique_ptr<cache::Store> store_;
  Builder builder_;
  // Kernels may overlap the one before them in the stream (KJIT_PROGRAMMATIC_LAUNCH=0: never).
  bool programmatic_launch_;
  Registry registry_;
  // Device states by ordinal, published once initialised: the hot path reads
  // an atomic pointer, only first use takes the mutex.
  static constexpr int kMaxDevices = 64;
  std::mutex devices_mutex_;
  std::array<std::atomic<DeviceState*>, kMaxDevices> devices_{};
  std::vector<std::unique_ptr<DeviceState>> owned_devices_;
};

}  // namespace kjit
