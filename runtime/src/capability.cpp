// The capability table and its gates.
#include "capability.hpp"

#include <array>

#include <fmt/format.h>

namespace kjit {
namespace {

// Every listed arch runs the portable mma.sync grouped GEMM (sm_80+); Hopper
// runs its own wgmma + TMA kernel (sm_90a only; the portable one when asked).
// SM100 and SM120 use the portable kernel until they get their own.
constexpr const char* kPortableGemm = "mma.sync (portable)";
constexpr const char* kHopperGemm = "wgmma + TMA, persistent, warp-specialised (SM90); mma.sync on request";

constexpr std::array kTable{
    ArchRow{8, 0, "sm_80", false, kPortableGemm, "Ampere A100: no fp8 conversion instructions"},
    ArchRow{8, 6, "sm_86", false, kPortableGemm, "Ampere: no fp8 conversion instructions"},
    ArchRow{8, 7, "sm_87", false, kPortableGemm, "Orin: no fp8 conversion instructions"},
    ArchRow{8, 9, "sm_89", true, kPortableGemm, "Ada"},
    ArchRow{9, 0, "sm_90a", true, kHopperGemm, "Hopper (H100, H200): wgmma and TMA targets"},
    ArchRow{10, 0, "sm_100a", true, kPortableGemm, "Blackwell datacenter (B200, GB200)"},
    ArchRow{10, 3, "sm_103a", true, kPortableGemm, "Blackwell Ultra (B300, GB300)"},
    ArchRow{11, 0, "sm_110a", true, kPortableGemm, "Thor"},
    ArchRow{12, 0, "sm_120a", true, kPortableGemm, "Blackwell workstation/consumer (RTX PRO 6000, RTX 50xx)"},
    ArchRow{12, 1, "sm_121a", true, kPortableGemm, "DGX Spark (GB10)"},
};

}  // namespace

std::span<const ArchRow> capability_table() { return kTable; }

Expected<const ArchRow*> arch_for_capability(int major, int minor) {
  for (const auto& row : kTable)
    if (row.major == major && row.minor == minor) return &row;
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("GPU of compute capability {}.{} is not in kjit's capability table (supported: 8.0-12.1, "
                          "see `jitctl info`)",
                          major, minor));
}

Expected<const ArchRow*> arch_for_target(std::string_view target) {
  for (const auto& row : kTable)
    if (target == row.target) return &row;
  std::string known;
  for (const auto& row : kTable) known += fmt::format("{}{}", known.empty() ? "" : ", ", row.target);
  return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("unknown arch '{}' (known: {})", target, known));
}

Expected<void> require_family(const ArchRow& row, KernelFamily family) {
  switch (family) {
    case KernelFamily::fp8_dequant:
      if (row.fp8_dequant) return {};
      return fail(KJIT_ERROR_UNSUPPORTED,
                  fmt::format("fp8 dequant needs compute capability 8.9 or newer; this GPU is {}.{} ({})", row.major,
                              row.minor, row.note));
    case KernelFamily::grouped_gemm:
    case KernelFamily::moe_routing:
      return {};  // portable kernels: they run on every arch in the table
  }
  return fail(KJIT_ERROR_INTERNAL, "unknown kernel family");
}

}  // namespace kjit
