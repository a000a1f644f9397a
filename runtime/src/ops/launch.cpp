// The shared launch path of the ops.
#include "launch.hpp"

#include <fmt/format.h>

namespace kjit::ops {

Expected<void> require_non_null(std::initializer_list<NamedPointer> pointers) {
  for (const auto& [pointer, name] : pointers)
    if (!pointer) return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("'{}' is NULL", name));
  return {};
}

Expected<DeviceState*> owning_device_for(Runtime& runtime, std::initializer_list<NamedPointer> pointers) {
  const int ordinal = KJIT_TRY(runtime.owning_device(pointers));
  return runtime.device(ordinal);
}

Expected<const LoadedKernel*> launchable_kernel(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec,
                                                CUstream stream) {
  KJIT_TRY(runtime.check_stream(device, stream));
  return runtime.kernel(device, spec, stream);
}

Expected<void> launch_kernel(Runtime& runtime, const DeviceState& device, const LoadedKernel& kernel,
                             unsigned int*& device_error, const codegen::LaunchGeometry& geometry, void* params,
                             CUstream stream) {
  device_error = reinterpret_cast<unsigned int*>(device.error_words);
  return runtime.launch(device, kernel, geometry, params, stream);
}

Expected<void> launch_on_owning_device(Runtime& runtime, const codegen::KernelSpec& spec,
                                       std::initializer_list<NamedPointer> pointers, unsigned int*& device_error,
                                       const codegen::LaunchGeometry& geometry, void* params, CUstream stream) {
  DeviceState* device = KJIT_TRY(owning_device_for(runtime, pointers));
  const LoadedKernel* kernel = KJIT_TRY(launchable_kernel(runtime, *device, spec, stream));
  return launch_kernel(runtime, *device, *kernel, device_error, geometry, params, stream);
}

Expected<void> prepare_on_device(Runtime& runtime, const codegen::KernelSpec& spec, int ordinal) {
  DeviceState* device = KJIT_TRY(runtime.device(ordinal));
  KJIT_TRY(runtime.kernel(*device, spec, nullptr));
  return {};
}

}  // namespace kjit::ops
