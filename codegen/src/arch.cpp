// The capability table.
#include "kjit/codegen/arch.hpp"

#include <array>
#include <string>

#include <fmt/format.h>

namespace kjit::codegen {
namespace {

constexpr int kKiB = 1024;

constexpr std::array kTable{
    ArchInfo{8, 0, "sm_80", false, false, 163 * kKiB, "Ampere A100: no fp8 conversion instructions"},
    ArchInfo{8, 6, "sm_86", false, false, 99 * kKiB, "Ampere: no fp8 conversion instructions"},
    ArchInfo{8, 7, "sm_87", false, false, 163 * kKiB, "Orin: no fp8 conversion instructions"},
    ArchInfo{8, 9, "sm_89", true, false, 99 * kKiB, "Ada"},
    ArchInfo{9, 0, "sm_90a", true, true, 227 * kKiB,
             "Hopper (H100, H200): wgmma and TMA targets; FP8 mma.sync only through f16 (the FP8 GEMM uses wgmma)"},
    ArchInfo{10, 0, "sm_100a", true, false, 227 * kKiB,
             "Blackwell datacenter (B200, GB200): no tcgen05 kernels yet; FP8 mma.sync runs through f16"},
    ArchInfo{10, 3, "sm_103a", true, false, 227 * kKiB, "Blackwell Ultra (B300, GB300)"},
    ArchInfo{11, 0, "sm_110a", true, false, 227 * kKiB, "Thor"},
    ArchInfo{12, 0, "sm_120a", true, false, 99 * kKiB, "Blackwell workstation/consumer (RTX PRO 6000, RTX 50xx)"},
    ArchInfo{12, 1, "sm_121a", true, false, 99 * kKiB, "DGX Spark (GB10)"},
};

constexpr int min_wgmma_tma_shared_bytes() {
  int bytes = 0;
  for (const auto& row : kTable)
    if (row.wgmma_tma && (bytes == 0 || row.shared_bytes_per_block < bytes)) bytes = row.shared_bytes_per_block;
  return bytes;
}
static_assert(min_wgmma_tma_shared_bytes() > 0, "Hopper's kernels need a row with wgmma_tma");

}  // namespace

std::span<const ArchInfo> capability_table() { return kTable; }

int wgmma_tma_shared_bytes_per_block() { return min_wgmma_tma_shared_bytes(); }

Expected<const ArchInfo*> arch_for_capability(int major, int minor) {
  for (const auto& row : kTable)
    if (row.major == major && row.minor == minor) return &row;
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("GPU of compute capability {}.{} is not in kjit's capability table (supported: 8.0-12.1, "
                          "see `jitctl info`)",
                          major, minor));
}

Expected<const ArchInfo*> arch_for_target(std::string_view target) {
  for (const auto& row : kTable)
    if (target == row.target) return &row;
  std::string known;
  for (const auto& row : kTable) known += fmt::format("{}{}", known.empty() ? "" : ", ", row.target);
  return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("unknown arch '{}' (known: {})", target, known));
}

}  // namespace kjit::codegen
