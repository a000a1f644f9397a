// Devices, the spec -> loaded-kernel path, and launching.
#include "runtime.hpp"

#include <chrono>

#include <fmt/format.h>

#include "kjit/base/log.hpp"
#include "kjit/codegen/cache_key.hpp"
#include "kjit/kjit.h"
#include "dequant_params.h"
#include "grouped_gemm_params.h"
#include "moe_routing_params.h"
#include "nvrtc.hpp"

namespace kjit {
namespace {

// A cuLaunchKernelEx configuration for `g` with its cluster size, as both the
// launch and the occupancy query need it.
struct ClusterLaunch {
  CUlaunchAttribute cluster{};
  CUlaunchConfig config{};
  ClusterLaunch(const codegen::LaunchGeometry& g, CUstream stream) {
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = g.cluster_x;
    cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
    config.gridDimX = g.grid_x;
    config.gridDimY = g.grid_y;
    config.gridDimZ = g.grid_z;
    config.blockDimX = g.block_x;
    config.blockDimY = config.blockDimZ = 1;
    config.sharedMemBytes = g.shared_bytes;
    config.hStream = stream;
    config.attrs = &cluster;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points at cluster
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

std::string_view memory_type_name(unsigned int type) {
  switch (type) {
    case CU_MEMORYTYPE_HOST: return "pinned host memory";
    case CU_MEMORYTYPE_ARRAY: return "a CUDA array";
    default: return "not CUDA memory (a host pointer?)";
  }
}

}  // namespace

KernelFamily family_of(const codegen::KernelSpec& spec) {
  if (std::holds_alternative<codegen::GroupedGemmSpec>(spec)) return KernelFamily::grouped_gemm;
  if (std::holds_alternative<codegen::DequantSpec>(spec)) return KernelFamily::fp8_dequant;
  return KernelFamily::moe_routing;
}

Runtime::Runtime(Expected<const DriverApi*> driver, cache::StoreConfig cache_config)
    : driver_(std::move(driver)), store_(std::make_unique<cache::Store>(std::move(cache_config))) {}

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
  if (auto ok = check(**driver_, (*driver_)->cuDeviceGetCount(&count), "cuDeviceGetCount"); !ok)
    return std::unexpected(ok.error());
  return count;
}

Expected<DeviceState*> Runtime::device(int ordinal) {
  if (ordinal >= 0 && ordinal < kMaxDevices)
    if (DeviceState* ready = devices_[static_cast<size_t>(ordinal)].load(std::memory_order_acquire)) return ready;
  auto count = device_count();
  if (!count) return std::unexpected(count.error());
  if (ordinal < 0 || ordinal >= *count || ordinal >= kMaxDevices)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("device {} does not exist ({} device{} visible)", ordinal, *count, *count == 1 ? "" : "s"));

  std::lock_guard lock(devices_mutex_);
  auto& slot = devices_[static_cast<size_t>(ordinal)];
  if (DeviceState* ready = slot.load(std::memory_order_acquire)) return ready;
  const DriverApi& api = **driver_;
  auto state = std::make_unique<DeviceState>();
  state->ordinal = ordinal;
  if (auto ok = check(api, api.cuDeviceGet(&state->device, ordinal), "cuDeviceGet"); !ok)
    return std::unexpected(ok.error());
  int major = 0, minor = 0;
  api.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, state->device);
  api.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, state->device);
  api.cuDeviceGetAttribute(&state->multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, state->device);
  char name[256] = {};
  api.cuDeviceGetName(name, sizeof name, state->device);
  state->name = name;
  auto arch = arch_for_capability(major, minor);
  if (!arch)
    return fail(arch.error().code, fmt::format("device {} ({}): {}", ordinal, state->name, arch.error().message));
  state->arch = *arch;
  if (auto ok = check(api, api.cuDevicePrimaryCtxRetain(&state->context, state->device), "cuDevicePrimaryCtxRetain");
      !ok)
    return std::unexpected(ok.error());
  {
    ScopedContext scope(api, state->context);
    if (auto ok = scope.status(); !ok) return std::unexpected(ok.error());
    if (auto ok = check(api, api.cuMemAlloc(&state->error_words, 2 * sizeof(uint32_t)), "cuMemAlloc"); !ok)
      return std::unexpected(ok.error());
    if (auto ok = check(api, api.cuMemsetD32(state->error_words, 0, 2), "cuMemsetD32"); !ok)
      return std::unexpected(ok.error());
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
    if (auto ok = check(api, api.cuPointerGetAttributes(2, attributes, data, reinterpret_cast<CUdeviceptr>(pointer)),
                        "cuPointerGetAttributes");
        !ok)
      return std::unexpected(ok.error());
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
  if (auto ok = check(api, api.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing"); !ok) return ok;
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) return {};
  CUdevice stream_device = 0;
  if (auto ok = check(api, api.cuStreamGetDevice(stream, &stream_device), "cuStreamGetDevice"); !ok)
    return std::unexpected(ok.error());
  if (stream_device != device.device)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("the stream belongs to device {} but the data is on device {}", static_cast<int>(stream_device),
                            device.ordinal));
  return {};
}

Expected<Cubin> Runtime::cubin(const codegen::KernelSpec& spec, const std::string& arch) {
  if (auto ok = codegen::validate_for_target(spec, arch); !ok) return std::unexpected(ok.error());
  auto row = arch_for_target(arch);
  if (!row) return std::unexpected(row.error());
  if (auto ok = require_family(**row, family_of(spec)); !ok) return std::unexpected(ok.error());

  const auto rendered = codegen::render(spec);
  const auto options = compile_options(arch);
  Cubin out;
  auto lookup = [&](const std::string& nvrtc_version) {
    out.key = codegen::cache_key({rendered.source, arch, options, nvrtc_version, kEntryFormatVersion});
    auto entry = store_->load(out.key);
    if (entry) {
      out.image = std::move(entry->payload);
      out.origin = CubinOrigin::disk_cache;
    }
    return entry.has_value();
  };
  // Keys name the NVRTC that compiles. The common case is the toolkit kjit
  // was built with, so that key is tried first without loading NVRTC (a
  // disk hit then costs no dlopen of libnvrtc, and works where there is none).
  std::string nvrtc_version = built_with_cuda_version();
  if (lookup(nvrtc_version)) return out;
  const auto nvrtc = Nvrtc::load();
  if (!nvrtc)
    return fail(KJIT_ERROR_COMPILE, fmt::format("{} for {} is not in the cache and cannot be compiled: {}",
                                                codegen::canonical(spec), arch, nvrtc.error().message));
  if ((*nvrtc)->version() != nvrtc_version) {
    nvrtc_version = (*nvrtc)->version();
    if (lookup(nvrtc_version)) return out;
  }
  if (!(*nvrtc)->supports(arch))
    return fail(KJIT_ERROR_UNSUPPORTED, fmt::format("NVRTC {} cannot build for {}", nvrtc_version, arch));
  // Another process may be compiling this kernel right now: wait a bounded
  // while for its advisory lock and look again before compiling ourselves.
  // Correctness never depends on the lock (publish is atomic either way).
  const auto lock = store_->try_lock(out.key, std::chrono::seconds(10));
  if (lock.held() && lookup(nvrtc_version)) return out;

  auto compiled =
      (*nvrtc)->compile(rendered.source, std::string(codegen::op_name(spec)) + ".cu", arch, compile_flags(arch));
  if (!compiled)
    return fail(compiled.error().code,
                fmt::format("compiling {}: {}", codegen::canonical(spec), compiled.error().message));
  log::info("compiled {} for {} in {:.0f} ms", codegen::canonical(spec), arch, compiled->seconds * 1e3);

  nlohmann::json meta = {{"spec", codegen::to_json(spec)},
                         {"canonical", codegen::canonical(spec)},
                         {"op", codegen::op_name(spec)},
                         {"arch", arch},
                         {"nvrtc", nvrtc_version},
                         {"kjit", kjit_version()},
                         {"options", options},
                         {"entry_point", rendered.entry_point},
                         {"compile_seconds", compiled->seconds},
                         {"source", rendered.source},
                         {"log", compiled->log}};
  // A cache that cannot be written is not fatal: the store has warned once and
  // the kernel is served from memory.
  (void)store_->publish(out.key, meta, compiled->cubin);
  out.image = std::move(compiled->cubin);
  out.compile_seconds = compiled->seconds;
  return out;
}

Expected<LoadedKernel> Runtime::load_module(const DeviceState& device, const std::vector<char>& image) const {
  const DriverApi& api = **driver_;
  ScopedContext scope(api, device.context);
  if (auto ok = scope.status(); !ok) return std::unexpected(ok.error());
  LoadedKernel kernel;
  if (auto ok = check(api, api.cuModuleLoadData(&kernel.module, image.data()), "cuModuleLoadData"); !ok)
    return std::unexpected(ok.error());
  return kernel;
}

Expected<const LoadedKernel*> Runtime::kernel(DeviceState& device, const codegen::KernelSpec& spec, CUstream stream) {
  if (const auto* hit = registry_.find(device.ordinal, spec)) return hit;
  return registry_.get_or_load(device.ordinal, spec, [&]() -> Expected<LoadedKernel> {
    const DriverApi& api = **driver_;
    {
      // The legacy stream resolves to the current context's: ask inside ours.
      ScopedContext scope(api, device.context);
      if (auto ok = scope.status(); !ok) return std::unexpected(ok.error());
      CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
      const CUresult r = api.cuStreamIsCapturing(stream, &capture);
      // IMPLICIT: the legacy stream while another stream captures globally.
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
        return std::unexpected(check(api, r, "cuStreamIsCapturing").error());
      if (r != CUDA_SUCCESS || capture != CU_STREAM_CAPTURE_STATUS_NONE)
        return fail(KJIT_ERROR_CAPTURING,
                    fmt::format("{} is not loaded on device {} and the stream is capturing a CUDA graph, where kjit "
                                "never compiles or loads: call the op's prepare function before capture",
                                codegen::canonical(spec), device.ordinal));
    }
    auto image = cubin(spec, device.arch->target);
    if (!image) return std::unexpected(image.error());
    auto loaded = load_module(device, image->image);
    if (!loaded) return std::unexpected(loaded.error());
    const auto rendered = codegen::render(spec);
    if (auto ok = check(api, api.cuModuleGetFunction(&loaded->function, loaded->module, rendered.entry_point.c_str()),
                        "cuModuleGetFunction");
        !ok)
      return std::unexpected(ok.error());
    // Dynamic shared memory past 48 KB is an opt-in per function.
    if (rendered.dynamic_shared_bytes > 48 * 1024) {
      ScopedContext scope(api, device.context);
      if (auto ok = scope.status(); !ok) return std::unexpected(ok.error());
      if (auto ok = check(api,
                          api.cuFuncSetAttribute(loaded->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                 rendered.dynamic_shared_bytes),
                          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
          !ok)
        return std::unexpected(ok.error());
    }
    // How many blocks fit at once: one per SM for the big-shared-memory
    // kernels, fewer when clusters must land on SMs of one GPC.
    loaded->resident_blocks = device.multiprocessors;
    if (rendered.cluster_x > 1) {
      ScopedContext scope(api, device.context);
      if (auto ok = scope.status(); !ok) return std::unexpected(ok.error());
      codegen::LaunchGeometry whole_device;
      whole_device.grid_x = static_cast<uint32_t>(rendered.cluster_x * std::max(device.multiprocessors, 1));
      whole_device.block_x = static_cast<uint32_t>(rendered.threads_per_block);
      whole_device.shared_bytes = static_cast<uint32_t>(rendered.dynamic_shared_bytes);
      whole_device.cluster_x = static_cast<uint32_t>(rendered.cluster_x);
      ClusterLaunch launch(whole_device, nullptr);
      int clusters = 0;
      if (auto ok = check(api, api.cuOccupancyMaxActiveClusters(&clusters, loaded->function, &launch.config),
                          "cuOccupancyMaxActiveClusters");
          !ok)
        return std::unexpected(ok.error());
      if (clusters < 1)
        return fail(KJIT_ERROR_UNSUPPORTED, fmt::format("{}: no cluster of {} blocks fits on device {}",
                                                        codegen::canonical(spec), rendered.cluster_x, device.ordinal));
      loaded->resident_blocks = clusters * rendered.cluster_x;
    }
    return loaded;
  });
}

Expected<void> Runtime::launch(const DeviceState& device, const LoadedKernel& kernel,
                               const codegen::LaunchGeometry& g, void* params, CUstream stream) const {
  const DriverApi& api = **driver_;
  ScopedContext scope(api, device.context);
  if (auto ok = scope.status(); !ok) return ok;
  void* args[] = {params};
  if (g.cluster_x > 1) {
    ClusterLaunch launch(g, stream);
    return check(api, api.cuLaunchKernelEx(&launch.config, kernel.function, args, nullptr), "cuLaunchKernelEx");
  }
  return check(api,
               api.cuLaunchKernel(kernel.function, g.grid_x, g.grid_y, g.grid_z, g.block_x, 1, 1, g.shared_bytes,
                                  stream, args, nullptr),
               "cuLaunchKernel");
}

Expected<void> Runtime::take_device_errors(int ordinal) {
  auto state = device(ordinal);
  if (!state) return std::unexpected(state.error());
  const DriverApi& api = **driver_;
  ScopedContext scope(api, (*state)->context);
  if (auto ok = scope.status(); !ok) return ok;
  if (auto ok = check(api, api.cuCtxSynchronize(), "cuCtxSynchronize"); !ok) return ok;
  uint32_t words[2] = {};
  if (auto ok = check(api, api.cuMemcpyDtoH(words, (*state)->error_words, sizeof words), "cuMemcpyDtoH"); !ok)
    return ok;
  if (words[0] == 0) return {};
  if (auto ok = check(api, api.cuMemsetD32((*state)->error_words, 0, 2), "cuMemsetD32"); !ok) return ok;
  if (words[0] == KJIT_DEVICE_ERROR_OFFSETS_NOT_MONOTONIC)
    return fail(KJIT_ERROR_DEVICE_REPORTED,
                fmt::format("a grouped GEMM on device {} was given expert offsets that decrease at expert {}; it "
                            "wrote nothing",
                            ordinal, words[1]));
  if (words[0] == KJIT_DEVICE_ERROR_OFFSETS_OUT_OF_RANGE)
    return fail(KJIT_ERROR_DEVICE_REPORTED,
                fmt::format("a grouped GEMM on device {} was given an offset for expert {} outside [0, rows] (or a "
                            "first offset that is not 0); it wrote nothing",
                            ordinal, words[1]));
  if (words[0] == KJIT_DEVICE_ERROR_GLOBAL_EXPERT_ID_OUT_OF_RANGE)
    return fail(KJIT_ERROR_DEVICE_REPORTED,
                fmt::format("MoE routing on device {} was given expert id {} outside [0, experts_total); it wrote "
                            "nothing",
                            ordinal, static_cast<int32_t>(words[1])));
  if (words[0] == KJIT_DEVICE_ERROR_COMBINE_INDEX_OUT_OF_RANGE)
    return fail(KJIT_ERROR_DEVICE_REPORTED,
                fmt::format("MoE combine on device {} was given sorted row {} past the rows of expert_out; that "
                            "term was left out",
                            ordinal, static_cast<int32_t>(words[1])));
  if (words[0] == KJIT_DEVICE_ERROR_EXPERT_ID_OUT_OF_RANGE)
    return fail(KJIT_ERROR_DEVICE_REPORTED,
                fmt::format("a dequant launch on device {} was given expert id {} outside [0, experts); it wrote "
                            "nothing",
                            ordinal, static_cast<int32_t>(words[1])));
  return fail(KJIT_ERROR_DEVICE_REPORTED, fmt::format("device {} reported error code {}", ordinal, words[0]));
}

}  // namespace kjit
