// cp.async (sm_80+): copies from global to shared memory that complete in
// the background, each thread waiting for its own (cp.async.wait_group), so
// a thread can keep several chunks of loads in flight without holding
// registers for them. Only what the kernels use; names follow the PTX.
#pragma once

namespace kjit {

// A shared-memory address as the 32-bit operand the instructions take.
__device__ __forceinline__ unsigned cp_async_smem(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// cp.async.cg.shared.global [dst], [src], 16, src_size: 16 bytes through L2
// only; with `in_range` false nothing is read and dst gets zeros (src must
// still be a valid global address: the caller passes its base).
__device__ __forceinline__ void cp_async_cg_16(void* dst, const void* src, bool in_range) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(cp_async_smem(dst)), "l"(src),
               "r"(in_range ? 16 : 0)
               : "memory");
}

// cp.async.ca.shared.global [dst], [src], 4, src_size: one 4-byte word (zeros when not `in_range`).
__device__ __forceinline__ void cp_async_ca_4(void* dst, const void* src, bool in_range) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(cp_async_smem(dst)), "l"(src),
               "r"(in_range ? 4 : 0)
               : "memory");
}

// cp.async.commit_group: the thread's copies issued since the last commit form a group.
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// cp.async.wait_group N: all but the thread's N most recent groups are complete and visible to it.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace kjit
