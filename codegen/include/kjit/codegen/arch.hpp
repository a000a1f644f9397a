// The capability table: compute capability -> the exact compile target and
// what the hardware offers there. Gates and tuning ask these traits, never
// `major == 9` or a target string, so a new GPU generation is one row, and a
// cubin is only ever built for, cached under and loaded on the target it
// names. Knows nothing of devices: precompile names targets on machines with
// no GPU, the runtime looks a device's capability up.
#pragma once

#include <span>
#include <string_view>

#include "kjit/base/expected.hpp"

namespace kjit::codegen {

struct ArchInfo {
  int major;
  int minor;
  std::string_view target;  // NVRTC --gpu-architecture, e.g. "sm_90a"
  bool fp8_conversion;      // cvt between e4m3x2/e5m2x2 and f16x2 in hardware (sm_89 and newer)
  bool wgmma_tma;           // wgmma, TMA, clusters and setmaxnreg: the arch-specific sm_90a target only
  int shared_bytes_per_block;  // the dynamic shared memory a block may opt into (the CUDA guide's per-arch table)
  std::string_view note;       // shown by `jitctl info`
};

std::span<const ArchInfo> capability_table();

// The shared memory Hopper's kernels (wgmma_tma) may use per block: the smallest opt-in of the archs they build
// for. Their configurations are checked without an arch (they build for those archs only), so pipeline depths
// are sized to it.
int wgmma_tma_shared_bytes_per_block();

// The row for a device's capability; an unknown capability is an error that names it.
Expected<const ArchInfo*> arch_for_capability(int major, int minor);
// The row whose target is `target` (precompile's --arch list); unknown targets are errors listing the known ones.
Expected<const ArchInfo*> arch_for_target(std::string_view target);

}  // namespace kjit::codegen
