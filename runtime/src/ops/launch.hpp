// The one path every op takes from checked arguments to a launch: the device
// that owns the pointers, the stream check, the kernel (checked against the
// device's arch, never compiled while the stream captures), the error words,
// the launch.
#pragma once

#include <initializer_list>

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

// Compiles (or finds) and loads `spec` on `device` ahead of time.
Expected<void> prepare_on_device(Runtime& runtime, const codegen::KernelSpec& spec, int device);

}  // namespace kjit::ops
