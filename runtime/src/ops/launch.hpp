// The one path every op takes from checked arguments to a launch: the device
// that owns the pointers, the stream check, the kernel (checked against the
// device's arch, never compiled while the stream captures), the error words,
// the launch.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

#include "grouped_gemm_params.h"
#include "kjit/internal/runtime.hpp"

namespace kjit::ops {

// Fails with "'<name>' is NULL" for the first null pointer, in order.
Expected<void> require_non_null(std::initializer_list<NamedPointer> pointers);

// The device that owns `pointers`, initialised.
Expected<DeviceState*> owning_device_for(Runtime& runtime, std::initializer_list<NamedPointer> pointers);

// Checks the stream and finds the kernel of `spec` on `device` (never
// compiling or loading while the stream captures).
Expected<const LoadedKernel*> launchable_kernel(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec,
                                                CUstream stream);

// Launches `kernel` on `device`. `device_error` is the parameter block's
// field that receives the device's error words before the launch.
Expected<void> launch_kernel(Runtime& runtime, const DeviceState& device, const LoadedKernel& kernel,
                             unsigned int*& device_error, const codegen::LaunchGeometry& geometry, void* params,
                             CUstream stream);

// owning_device_for, launchable_kernel and launch_kernel, for ops whose spec
// does not depend on the device.
Expected<void> launch_on_owning_device(Runtime& runtime, const codegen::KernelSpec& spec,
                                       std::initializer_list<NamedPointer> pointers, unsigned int*& device_error,
                                       const codegen::LaunchGeometry& geometry, void* params, CUstream stream);

// A TMA descriptor for a tensor of `rank` dimensions (innermost first) of
// `element` type, swizzled boxes (128-byte unless said; FP4 weight tiles have
// 64-byte rows), zero fill out of bounds (the SM90 GEMMs). Needs a current
// context; `what` names the tensor in the error.
Expected<void> encode_tensor_map(const DriverApi& api, kjit_tensor_map& map, CUtensorMapDataType element,
                                 const void* base, uint32_t rank, const cuuint64_t* dims,
                                 const cuuint64_t* byte_strides, const cuuint32_t* box, const char* what,
                                 CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B);

// Zeroes the swap-AB kernels' tile counter in stream order (a memset node
// when the stream captures). Needs a current context.
Expected<void> zero_tile_counter(const DriverApi& api, unsigned int* counter, CUstream stream);

// The largest power of two, at most 16, that divides the address.
int64_t pointer_alignment(const void* pointer);

// For the ops whose vector width follows their pointers' alignment: the
// distinct widths `vector_for(in_alignment, out_alignment)` gives over every
// pair of pointer alignments (16, 8, 4, 2, 1 bytes), widest first. Output
// alignments below `out_element_bytes` and a width of 0 (what the op
// refuses) are left out.
std::vector<int> vector_widths(int out_element_bytes, const std::function<int(int64_t, int64_t)>& vector_for);

// Compiles (or finds) and loads `spec` on `device` ahead of time.
Expected<void> prepare_on_device(Runtime& runtime, const codegen::KernelSpec& spec, int device);

// prepare_on_device of `spec` at each vector width in `widths`.
template <class Spec>
Expected<void> prepare_each_width(Runtime& runtime, Spec spec, const std::vector<int>& widths, int device) {
  for (int vec : widths) {
    spec.vec = vec;
    KJIT_TRY(prepare_on_device(runtime, spec, device));
  }
  return {};
}

}  // namespace kjit::ops
