// The shared launch path of the ops.
#include "launch.hpp"

#include <fmt/format.h>

namespace kjit::ops {

Expected<void> require_non_null(std::initializer_list<NamedPointer> pointers) {
  for (const auto& [pointer, name] : pointers)
    if (!pointer) return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("'{}' is NULL", name));
  return {};
}

Expected<DeviceState*> owning_device_for(Runtime& runtime, std::initializer_list<NamedPointer> pointers,
                                         KernelFamily family) {
  auto ordinal = runtime.owning_device(pointers);
  if (!ordinal) return std::unexpected(ordinal.error());
  auto device = runtime.device(*ordinal);
  if (!device) return std::unexpected(device.error());
  if (auto ok = require_family(*(*device)->arch, family); !ok) return std::unexpected(ok.error());
  return *device;
}

Expected<const LoadedKernel*> launchable_kernel(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec,
                                                CUstream stream) {
  if (auto ok = runtime.check_stream(device, stream); !ok) return std::unexpected(ok.error());
  return runtime.kernel(device, spec, stream);
}

Expected<void> launch_kernel(Runtime& runtime, const DeviceState& device, const LoadedKernel& kernel,
                             unsigned int*& device_error, const codegen::LaunchGeometry& geometry, void* params,
                             CUstream stream) {
  device_error = reinterpret_cast<unsigned int*>(device.error_words);
  return runtime.launch(device, kernel, geometry, params, stream);
}

Expected<void> launch_on_device(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec,
                                unsigned int*& device_error, const codegen::LaunchGeometry& geometry, void* params,
                                CUstream stream) {
  auto kernel = launchable_kernel(runtime, device, spec, stream);
  if (!kernel) return std::unexpected(kernel.error());
  return launch_kernel(runtime, device, **kernel, device_error, geometry, params, stream);
}

Expected<void> launch_on_owning_device(Runtime& runtime, const codegen::KernelSpec& spec,
                                       std::initializer_list<NamedPointer> pointers, unsigned int*& device_error,
                                       const codegen::LaunchGeometry& geometry, void* params, CUstream stream) {
  auto device = owning_device_for(runtime, pointers, family_of(spec));
  if (!device) return std::unexpected(device.error());
  return launch_on_device(runtime, **device, spec, device_error, geometry, params, stream);
}

Expected<void> prepare_on_device(Runtime& runtime, const codegen::KernelSpec& spec, int ordinal) {
  auto device = runtime.device(ordinal);
  if (!device) return std::unexpected(device.error());
  if (auto ok = require_family(*(*device)->arch, family_of(spec)); !ok) return ok;
  auto kernel = runtime.kernel(**device, spec, nullptr);
  if (!kernel) return std::unexpected(kernel.error());
  return {};
}

}  // namespace kjit::ops
