// The shared launch path of the ops.
#include "launch.hpp"

#include <algorithm>

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

int64_t pointer_alignment(const void* pointer) {
  const auto address = reinterpret_cast<uintptr_t>(pointer);
  int64_t a = 16;
  while (a > 1 && address % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}

std::vector<int> vector_widths(int out_element_bytes, const std::function<int(int64_t, int64_t)>& vector_for) {
  std::vector<int> widths;
  for (int64_t in_alignment = 16; in_alignment >= 1; in_alignment /= 2)
    for (int64_t out_alignment = 16; out_alignment >= out_element_bytes; out_alignment /= 2) {
      const int vec = vector_for(in_alignment, out_alignment);
      if (vec > 0 && std::find(widths.begin(), widths.end(), vec) == widths.end()) widths.push_back(vec);
    }
  std::sort(widths.rbegin(), widths.rend());
  return widths;
}

Expected<void> prepare_on_device(Runtime& runtime, const codegen::KernelSpec& spec, int ordinal) {
  DeviceState* device = KJIT_TRY(runtime.device(ordinal));
  KJIT_TRY(runtime.kernel(*device, spec, nullptr));
  return {};
}

Expected<void> encode_tensor_map(const DriverApi& api, kjit_tensor_map& map, CUtensorMapDataType element,
                                 const void* base, uint32_t rank, const cuuint64_t* dims,
                                 const cuuint64_t* byte_strides, const cuuint32_t* box, const char* what,
                                 CUtensorMapSwizzle swizzle) {
  static_assert(sizeof(kjit_tensor_map) == sizeof(CUtensorMap) && alignof(kjit_tensor_map) == alignof(CUtensorMap));
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = api.cuTensorMapEncodeTiled(
      reinterpret_cast<CUtensorMap*>(&map), element, rank, const_cast<void*>(base), dims, byte_strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("cuTensorMapEncodeTiled rejected the {} tensor: {}", what, driver_error_text(api, r)));
  return {};
}

Expected<void> zero_tile_counter(const DriverApi& api, unsigned int* counter, CUstream stream) {
  return check(api, api.cuMemsetD32Async(reinterpret_cast<CUdeviceptr>(counter), 0, 1, stream), "cuMemsetD32Async");
}

}  // namespace kjit::ops
