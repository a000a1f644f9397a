// The "only these experts" forms' id check (fp8 and MX dequant): every block
// checks every id before anything is written, so one bad id means the whole
// launch writes nothing; the first block to see it records it.
#pragma once

#include "../abi/device_errors.h"

namespace kjit {

// Params: any ABI block with expert_ids, output_slots (their count), experts
// and device_error.
template <int kThreads, class Params>
__device__ __forceinline__ bool expert_ids_valid(const Params& p) {
  int bad = 0;
  for (long long i = threadIdx.x; i < p.output_slots; i += kThreads) {
    const int id = p.expert_ids[i];
    if (id < 0 || id >= p.experts) {
      bad = 1;
      if (atomicCAS(&p.device_error[0], 0u, KJIT_DEVICE_ERROR_EXPERT_ID_OUT_OF_RANGE) == 0u)
        p.device_error[1] = static_cast<unsigned int>(id);
    }
  }
  return __syncthreads_or(bad) == 0;
}

}  // namespace kjit
