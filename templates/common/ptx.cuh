// The handful of Hopper PTX instructions the SM90 and decode kernels issue
// (mbarriers, cluster barriers, TMA tensor and bulk copies), as inline asm,
// instead of CCCL's <cuda/ptx>: parsing that header cost NVRTC's front end
// ~0.4 s of CPU in every kernel that included it, most of the front end's
// time for a GEMM.
//
// Names and argument lists follow <cuda/ptx> (cuda::ptx::mbarrier_init,
// ptx::space_cluster, ...), so call sites read as before with kjit::ptx in
// place of cuda::ptx. Each function emits the instruction, operand
// constraints, volatility and "memory" clobber that CCCL's wrapper of the
// same overload emits, and is declared as those are (a function template,
// static inline, scalars by const reference): __forceinline__ wrappers are
// inlined at another point of NVVM's pipeline, which renumbered PTX registers
// and moved ptxas's register assignment. As declared here the SASS of every
// kernel compared equal, before and after (tools/bench/sass_compare.py).
// Only what the kernels use is here; add an overload from the PTX ISA when a
// kernel needs one.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "kjit/ptx.cuh: Hopper (sm_90) instructions"
#endif

namespace kjit {
namespace ptx {

// The operand tags of the overloads (state spaces, semantics, scopes).
struct space_shared_t {};
struct space_cluster_t {};
struct space_global_t {};
struct sem_acquire_t {};
struct sem_release_t {};
struct scope_cta_t {};
struct scope_cluster_t {};
constexpr space_shared_t space_shared{};
constexpr space_cluster_t space_cluster{};
constexpr space_global_t space_global{};
constexpr sem_acquire_t sem_acquire{};
constexpr sem_release_t sem_release{};
constexpr scope_cta_t scope_cta{};
constexpr scope_cluster_t scope_cluster{};

// A shared-memory address as the 32-bit operand the instructions take.
inline __device__ unsigned smem(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

// mbarrier.init.shared.b64 [addr], count;
template <class = void>
__device__ static inline void mbarrier_init(unsigned long long* addr, const unsigned& count) {
  asm("mbarrier.init.shared.b64 [%0], %1;" : : "r"(smem(addr)), "r"(count) : "memory");
}

// fence.mbarrier_init.release.cluster;
template <class = void>
__device__ static inline void fence_mbarrier_init(sem_release_t, scope_cluster_t) {
  asm volatile("fence.mbarrier_init.release.cluster;" : : : "memory");
}

// mbarrier.arrive.shared.b64 state, [addr];
template <class = void>
__device__ static inline unsigned long long mbarrier_arrive(unsigned long long* addr) {
  unsigned long long state;
  asm("mbarrier.arrive.shared.b64 %0, [%1];" : "=l"(state) : "r"(smem(addr)) : "memory");
  return state;
}

// mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [addr], tx_count;
template <class = void>
__device__ static inline unsigned long long mbarrier_arrive_expect_tx(sem_release_t, scope_cta_t, space_shared_t,
                                                                      unsigned long long* addr,
                                                                      const unsigned& tx_count) {
  unsigned long long state;
  asm("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 %0, [%1], %2;"
      : "=l"(state)
      : "r"(smem(addr)), "r"(tx_count)
      : "memory");
  return state;
}

// mbarrier.try_wait.parity.shared::cta.b64 complete, [addr], parity; (acquire, cta scope)
template <class = void>
__device__ static inline bool mbarrier_try_wait_parity(unsigned long long* addr, const unsigned& parity) {
  unsigned complete;
  asm("{\n\t.reg .pred P_OUT;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P_OUT, [%1], %2;\n\t"
      "selp.b32 %0, 1, 0, P_OUT;\n"
      "}"
      : "=r"(complete)
      : "r"(smem(addr)), "r"(parity)
      : "memory");
  return static_cast<bool>(complete);
}

// mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 complete, [addr], parity;
template <class = void>
__device__ static inline bool mbarrier_try_wait_parity(sem_acquire_t, scope_cluster_t, unsigned long long* addr,
                                                       const unsigned& parity) {
  unsigned complete;
  asm("{\n\t.reg .pred P_OUT;\n\t"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P_OUT, [%1], %2;\n\t"
      "selp.b32 %0, 1, 0, P_OUT;\n"
      "}"
      : "=r"(complete)
      : "r"(smem(addr)), "r"(parity)
      : "memory");
  return static_cast<bool>(complete);
}

// barrier.cluster.arrive.release; / barrier.cluster.wait.acquire;
template <class = void>
__device__ static inline void barrier_cluster_arrive(sem_release_t) {
  asm volatile("barrier.cluster.arrive.release;" : : : "memory");
}
template <class = void>
__device__ static inline void barrier_cluster_wait(sem_acquire_t) {
  asm volatile("barrier.cluster.wait.acquire;" : : : "memory");
}

// cp.async.bulk.tensor.{2,3}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
//   [dst], [map, {coords}], [bar];            and with .multicast::cluster ..., cta_mask;
template <class = void>
__device__ static inline void cp_async_bulk_tensor(space_cluster_t, space_global_t, void* dst, const void* map,
                                                   const int (&c)[2], unsigned long long* bar) {
  asm("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
      :
      : "r"(smem(dst)), "l"(map), "r"(c[0]), "r"(c[1]), "r"(smem(bar))
      : "memory");
}
template <class = void>
__device__ static inline void cp_async_bulk_tensor(space_cluster_t, space_global_t, void* dst, const void* map,
                                                   const int (&c)[3], unsigned long long* bar) {
  asm("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];"
      :
      : "r"(smem(dst)), "l"(map), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(smem(bar))
      : "memory");
}
template <class = void>
__device__ static inline void cp_async_bulk_tensor(space_cluster_t, space_global_t, void* dst, const void* map,
                                                   const int (&c)[2], unsigned long long* bar,
                                                   const unsigned short& cta_mask) {
  asm("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3}], [%4], %5;"
      :
      : "r"(smem(dst)), "l"(map), "r"(c[0]), "r"(c[1]), "r"(smem(bar)), "h"(cta_mask)
      : "memory");
}
template <class = void>
__device__ static inline void cp_async_bulk_tensor(space_cluster_t, space_global_t, void* dst, const void* map,
                                                   const int (&c)[3], unsigned long long* bar,
                                                   const unsigned short& cta_mask) {
  asm("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4}], [%5], %6;"
      :
      : "r"(smem(dst)), "l"(map), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(smem(bar)), "h"(cta_mask)
      : "memory");
}

// fence.proxy.async.shared::cta; (generic-proxy accesses to shared memory ordered before later async-proxy ones)
template <class = void>
__device__ static inline void fence_proxy_async_shared_cta() {
  asm volatile("fence.proxy.async.shared::cta;" : : : "memory");
}

// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size, [bar];
// (1-D: `size` contiguous bytes, a multiple of 16, both addresses 16-byte aligned)
template <class = void>
__device__ static inline void cp_async_bulk(space_cluster_t, space_global_t, void* dst, const void* src,
                                            const unsigned& size, unsigned long long* bar) {
  asm("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      :
      : "r"(smem(dst)), "l"(src), "r"(size), "r"(smem(bar))
      : "memory");
}

}  // namespace ptx
}  // namespace kjit
