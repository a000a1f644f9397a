// Devices, the spec -> loaded-kernel path, and launching.
#include "kjit/internal/runtime.hpp"

#include <chrono>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "device_errors.h"
#include "kjit/base/log.hpp"

namespace kjit {
namespace {

// A cuLaunchKernelEx configuration for `g`: its cluster size (as both the
// launch and the occupancy query need it) and, for a launch, whether it may
// overlap the previous kernel in the stream (codegen's kernel prologue waits
// for that kernel before it touches memory).
struct LaunchConfig {
  CUlaunchAttribute attributes[2]{};
  CUlaunchConfig config{};
  LaunchConfig(const codegen::LaunchGeometry& g, CUstream stream, bool programmatic) {
    config.gridDimX = g.grid_x;
    config.gridDimY = g.grid_y;
    config.gridDimZ = g.grid_z;
    config.blockDimX = g.block_x;
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = g.shared_bytes;
    config.hStream = stream;
    config.attrs = attributes;
    if (g.cluster_x > 1) {
      CUlaunchAttribute& cluster = attributes[config.numAttrs++];
      cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      cluster.value.clusterDim.x = g.cluster_x;
      cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
    }
    if (programmatic) {
      CUlaunchAttribute& overlap = attributes[config.numAttrs++];
      overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      overlap.value.programmaticStreamSerializationAllowed = 1;
    }
  }
  LaunchConfig(const LaunchConfig&) = delete;  // config points at attributes
  LaunchConfig& operator=(const LaunchConfig&) = delete;
};

// KJIT_PROGRAMMATIC_LAUNCH=0 launches each kernel only after the previous one
// has finished (the escape hatch, and the baseline for measuring the overlap).
bool programmatic_launch_from_environment() {
  const char* value = std::getenv("KJIT_PROGRAMMATIC_LAUNCH");
  return value == nullptr || std::string_view(value) != "0";
}

std::string_view memory_type_name(unsigned int type) {
  switch (type) {
    case CU_MEMORYTYPE_HOST: return "pinned host memory";
    case CU_MEMORYTYPE_ARRAY: return "a CUDA array";
    default: return "not CUDA memory (a host pointer?)";
  }
}

}  // namespace

Runtime::Runtime(Expected<const DriverApi*> driver, cache::StoreConfig cache_config)
    : driver_(std::move(driver)),
      store_(std::make_unique<cache::Store>(std::move(cache_config))),
      builder_(*store_),
      programmatic_launch_(programmatic_launch_from_environment()) {}

Runtime::~Runtime() {
  // Modules and contexts are released only by private runtimes (tests); the
  // global one lives until exit, when the driver may already be shutting down.
  if (!driver_) return;
  const DriverApi& api = **driver_;
  for (const auto& device : owned_devices_) {
    if (device->error_words) {
      ScopedContext scope(api, device->context);
      api.cuMemFree(device->error_words);
    }
    api.cuDevicePrimaryCtxRelease(device->device);
  }
}

Runtime& Runtime::global() {
  static Runtime* runtime = new Runtime(load_driver(), cache::config_from_environment());
  return *runtime;
}

Expected<int> Runtime::device_count() const {
  if (!driver_) return std::unexpected(driver_.error());
  int count = 0;
  KJIT_TRY(check(**driver_, (*driver_)->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  return count;
}

Expected<DeviceState*> Runtime::device(int ordinal) {
  if (ordinal >= 0 && ordinal < kMaxDevices)
    if (DeviceState* ready = devices_[static_cast<size_t>(ordinal)].load(std::memory_order_acquire)) return ready;
  const int count = KJIT_TRY(device_count());
  if (ordinal < 0 || ordinal >= count || ordinal >= kMaxDevices)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("device {} does not exist ({} device{} visible)", ordinal, count, count == 1 ? "" : "s"));

  std::lock_guard lock(devices_mutex_);
  auto& slot = devices_[static_cast<size_t>(ordinal)];
  if (DeviceState* ready = slot.load(std::memory_order_acquire)) return ready;
  const DriverApi& api = **driver_;
  auto state = std::make_unique<DeviceState>();
  state->ordinal = ordinal;
  KJIT_TRY(check(api, api.cuDeviceGet(&state->device, ordinal), "cuDeviceGet"));
  int major = 0, minor = 0;
  api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, state->device);
  api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, state->device);
  api.cuDeviceGetAttribute(&state->multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, state->device);
  char name[256] = {};
  api.cuDeviceGetName(name, sizeof name, state->device);
  state->name = name;
  auto arch = codegen::arch_for_capability(major, minor);
  if (!arch)
    return fail(arch.error().code, fmt::format("device {} ({}): {}", ordinal, state->name, arch.error().message));
  state->arch = *arch;
  KJIT_TRY(check(api, api.cuDevicePrimaryCtxRetain(&state->context, state->device), "cuDevicePrimaryCtxRetain"));
  {
    ScopedContext scope(api, state->context);
    KJIT_TRY(scope.status());
    KJIT_TRY(check(api, api.cuMemAlloc(&state->error_words, 2 * sizeof(uint32_t)), "cuMemAlloc"));
    KJIT_TRY(check(api, api.cuMemsetD32(state->error_words, 0, 2), "cuMemsetD32"));
  }
  log::debug("device {}: {} ({}), context ready", ordinal, state->name, state->arch->target);
  slot.store(state.get(), std::memory_order_release);
  owned_devices_.push_back(std::move(state));
  return owned_devices_.back().get();
}

Expected<int> Runtime::owning_device(std::initializer_list<NamedPointer> pointers) const {
  if (!driver_) return std::unexpected(driver_.error());
  const DriverApi& api = **driver_;
  int owner = -1;
  const char* owner_name = nullptr;
  for (const auto& [pointer, name] : pointers) {
    if (!pointer) continue;  // absence is checked by the op, which knows what is optional
    CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
    unsigned int memory_type = 0;
    int ordinal = -1;
    void* data[] = {&memory_type, &ordinal};
    // Unlike cuPointerGetAttribute, this reports unknown (host) pointers as
    // memory type 0 instead of failing, which gives a clearer message.
    KJIT_TRY(check(api, api.cuPointerGetAttributes(2, attributes, data, reinterpret_cast<CUdeviceptr>(pointer)), "cuPointerGetAttributes"));
    if (memory_type != CU_MEMORYTYPE_DEVICE && memory_type != CU_MEMORYTYPE_UNIFIED)
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("'{}' ({}) is {}; kjit needs device memory", name, pointer, memory_type_name(memory_type)));
    if (owner >= 0 && ordinal != owner)
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("'{}' is on device {} but '{}' is on device {}; all tensors of one call must be on one "
                              "device",
                              name, ordinal, owner_name, owner));
    owner = ordinal;
    owner_name = name;
  }
  if (owner < 0) return fail(KJIT_ERROR_INVALID_ARGUMENT, "no device pointer given");
  return owner;
}

Expected<void> Runtime::check_stream(const DeviceState& device, CUstream stream) const {
  if (stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) return {};
  const DriverApi& api = **driver_;
  // Asking a capturing stream for its device is prohibited and would
  // invalidate the caller's capture, so during capture the check is left to
  // cuLaunchKernel, which rejects a stream of another context with an error.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  KJIT_TRY(check(api, api.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing"));
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) return {};
  CUdevice stream_device = 0;
  KJIT_TRY(check(api, api.cuStreamGetDevice(stream, &stream_device), "cuStreamGetDevice"));
  if (stream_device != device.device)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("the stream belongs to device {} but the data is on device {}", static_cast<int>(stream_device),
                            device.ordinal));
  return {};
}

Expected<LoadedKernel> Runtime::load(const DeviceState& device, const BuiltKernel& built) const {
  const DriverApi& api = **driver_;
  const auto& rendered = built.rendered;
  ScopedContext scope(api, device.context);
  KJIT_TRY(scope.status());
  LoadedKernel kernel;
  KJIT_TRY(check(api, api.cuModuleLoadData(&kernel.module, built.cubin.data()), "cuModuleLoadData"));
  KJIT_TRY(check(api, api.cuModuleGetFunction(&kernel.function, kernel.module, rendered.entry_point.c_str()),
                 "cuModuleGetFunction"));
  // Dynamic shared memory past 48 KB is an opt-in per function.
  if (rendered.dynamic_shared_bytes > 48 * 1024)
    KJIT_TRY(check(api,
                   api.cuFuncSetAttribute(kernel.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          rendered.dynamic_shared_bytes),
                   "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)"));
  // All of the unified L1/shared array as shared memory: the carveout is a hint the driver may otherwise set
  // below what two blocks of a kernel that fits two (the decode GEMM: 72-96 KB each) need at once.
  if (rendered.dynamic_shared_bytes > 48 * 1024)
    KJIT_TRY(check(api,
                   api.cuFuncSetAttribute(kernel.function, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                                          CU_SHAREDMEM_CARVEOUT_MAX_SHARED),
                   "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)"));
  // How many blocks fit at once: one per SM for the big-shared-memory
  // kernels, fewer when clusters must land on SMs of one GPC.
  kernel.resident_blocks = device.multiprocessors;
  if (rendered.cluster_x > 1) {
    codegen::LaunchGeometry whole_device;
    whole_device.grid_x = static_cast<uint32_t>(rendered.cluster_x * std::max(device.multiprocessors, 1));
    whole_device.block_x = static_cast<uint32_t>(rendered.threads_per_block);
    whole_device.shared_bytes = static_cast<uint32_t>(rendered.dynamic_shared_bytes);
    whole_device.cluster_x = static_cast<uint32_t>(rendered.cluster_x);
    LaunchConfig launch(whole_device, nullptr, false);
    int clusters = 0;
    KJIT_TRY(check(api, api.cuOccupancyMaxActiveClusters(&clusters, kernel.function, &launch.config),
                   "cuOccupancyMaxActiveClusters"));
    if (clusters < 1)
      return fail(KJIT_ERROR_UNSUPPORTED, fmt::format("{}: no cluster of {} blocks fits on device {}",
                                                      rendered.entry_point, rendered.cluster_x, device.ordinal));
    kernel.resident_blocks = clusters * rendered.cluster_x;
  }
  return kernel;
}

Expected<const LoadedKernel*> Runtime::kernel(DeviceState& device, const codegen::KernelSpec& launched,
                                              CUstream stream) {
  // One kernel per identity: a grouped GEMM's expert count is its launch's.
  const codegen::KernelSpec spec = codegen::kernel_identity(launched);
  if (const auto* hit = registry_.find(device.ordinal, spec)) return hit;
  return registry_.get_or_load(device.ordinal, spec, [&]() -> Expected<LoadedKernel> {
    // An unsupported spec is that, whether or not the stream captures.
    KJIT_TRY(codegen::validate_for_target(spec, *device.arch));
    const DriverApi& api = **driver_;
    {
      // The legacy stream resolves to the current context's: ask inside ours.
      ScopedContext scope(api, device.context);
      KJIT_TRY(scope.status());
      CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
      const CUresult r = api.cuStreamIsCapturing(stream, &capture);
      // IMPLICIT: the legacy stream while another stream captures globally.
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) KJIT_TRY(check(api, r, "cuStreamIsCapturing"));
      if (r != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE)
        return fail(KJIT_ERROR_CAPTURING,
                    fmt::format("{} is not loaded on device {} and the stream is capturing a CUDA graph, where kjit "
                                "never compiles or loads: call the op's prepare function before capture",
                                codegen::canonical(spec), device.ordinal));
    }
    // Where a first call's time goes (KJIT_LOG=debug): the cache read or the compile, then the module load.
    using Clock = std::chrono::steady_clock;
    const auto milliseconds = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
    const auto start = Clock::now();
    const auto built = KJIT_TRY(builder_.build(spec, *device.arch));
    const auto found = Clock::now();
    auto loaded = KJIT_TRY(load(device, built));
    log::debug("loaded {} ({}) on device {}: {} in {:.2f} ms, module load {:.2f} ms", built.key,
               built.rendered.entry_point, device.ordinal,
               built.origin == CubinOrigin::disk_cache ? "read from the disk cache" : "compiled",
               milliseconds(found - start), milliseconds(Clock::now() - found));
    return loaded;
  });
}

Expected<void> Runtime::launch(const DeviceState& device, const LoadedKernel& kernel,
                               const codegen::LaunchGeometry& g, void* params, CUstream stream) const {
  const DriverApi& api = **driver_;
  ScopedContext scope(api, device.context);
  KJIT_TRY(scope.status());
  void* args[] = {params};
  // Programmatic dependent launch is Hopper's and later's (the entry's wait compiles to nothing before sm_90).
  LaunchConfig launch(g, stream, programmatic_launch_ && device.arch->major >= 9);
  return check(api, api.cuLaunchKernelEx(&launch.config, kernel.function, args, nullptr), "cuLaunchKernelEx");
}

Expected<void> Runtime::take_device_errors(int ordinal) {
  DeviceState* state = KJIT_TRY(device(ordinal));
  const DriverApi& api = **driver_;
  ScopedContext scope(api, state->context);
  KJIT_TRY(scope.status());
  KJIT_TRY(check(api, api.cuCtxSynchronize(), "cuCtxSynchronize"));
  uint32_t words[2] = {};
  KJIT_TRY(check(api, api.cuMemcpyDtoH(words, state->error_words, sizeof words), "cuMemcpyDtoH"));
  if (words[0] == 0) return {};
  KJIT_TRY(check(api, api.cuMemsetD32(state->error_words, 0, 2), "cuMemsetD32"));
  // The message beside each code in abi/device_errors.h.
  struct Text {
    uint32_t code;
    const char* format;
  };
#define KJIT_DEVICE_ERROR_TEXT(name, code, message) Text{code, message},
  static constexpr Text kTexts[] = {KJIT_DEVICE_ERRORS(KJIT_DEVICE_ERROR_TEXT)};
#undef KJIT_DEVICE_ERROR_TEXT
  for (const auto& text : kTexts)
    if (text.code == words[0])
      return fail(KJIT_ERROR_DEVICE_REPORTED, fmt::format(fmt::runtime(text.format), fmt::arg("device", ordinal),
                                                          fmt::arg("value", static_cast<int32_t>(words[1]))));
  return fail(KJIT_ERROR_DEVICE_REPORTED, fmt::format("device {} reported error code {}", ordinal, words[0]));
}

}  // namespace kjit
