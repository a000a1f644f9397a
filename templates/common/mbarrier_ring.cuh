// Rings of shared-memory slots guarded by mbarriers: waiting on a barrier's
// phase, and where a position counted over the whole kernel falls in a ring
// (its slot and that slot's phase). The SM90 GEMMs' stage ring and tile
// queue and the decode kernel's per-warp ring use it.
#pragma once

#include "ptx.cuh"

namespace kjit {

__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned phase) {
  while (!ptx::mbarrier_try_wait_parity(bar, phase)) {
  }
}

// Position i of a ring of kSlots slots, each guarded by an mbarrier per
// direction: slot i % kSlots, on pass i / kSlots, whose parity is the phase
// the slot's barriers complete in on that pass. Who waits for a slot to be
// filled waits on phase(i); who waits for it to be handed back waits a pass
// behind (phase(i) ^ 1), which a fresh barrier reports complete at once: the
// ring starts empty. Positions count over the whole kernel, the same sequence
// in every role, so no role keeps a phase bit of its own.
template <int kSlots>
struct Ring {
  static __device__ __forceinline__ unsigned slot(unsigned i) { return i % kSlots; }
  static __device__ __forceinline__ unsigned phase(unsigned i) { return (i / kSlots) & 1; }
  static __device__ __forceinline__ void wait_filled(unsigned long long* bars, unsigned i) {
    mbarrier_wait(&bars[slot(i)], phase(i));
  }
  static __device__ __forceinline__ void wait_emptied(unsigned long long* bars, unsigned i) {
    mbarrier_wait(&bars[slot(i)], phase(i) ^ 1);
  }
};

}  // namespace kjit
