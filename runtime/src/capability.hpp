// The capability table: compute capability -> the exact compile target and
// the kernel families allowed there. Gates compare against this table, never
// against `major == 9`, so a new GPU generation is one row, and a cubin is
// only ever built for, cached under and loaded on the target it names.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "kjit/base/expected.hpp"

namespace kjit {

enum class KernelFamily { fp8_dequant, grouped_gemm, moe_routing };

struct ArchRow {
  int major;
  int minor;
  const char* target;  // NVRTC --gpu-architecture, e.g. "sm_90a"
  bool fp8_dequant;    // needs hardware fp8 conversion (cvt.*.e4m3x2): sm_89+
  const char* grouped_gemm;  // which grouped GEMM kernel serves this arch
  const char* note;    // shown by `jitctl info`
};

std::span<const ArchRow> capability_table();

// The row for a device's capability; an unknown capability is an error that
// names it.
Expected<const ArchRow*> arch_for_capability(int major, int minor);
// The row whose target is `target` (for precompile's --arch list).
Expected<const ArchRow*> arch_for_target(std::string_view target);
// Whether `family` may run on `row`; the error names the capability.
Expected<void> require_family(const ArchRow& row, KernelFamily family);

}  // namespace kjit
