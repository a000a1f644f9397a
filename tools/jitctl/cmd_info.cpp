// jitctl info: what this machine offers kjit.
#include <fmt/format.h>

#include "kjit/codegen/arch.hpp"
#include "cli.hpp"
#include "kjit/kjit.h"
#include "kjit/builder/nvrtc.hpp"
#include "kjit/internal/runtime.hpp"

namespace kjit::tools {

int cmd_info(Args& args) {
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  Runtime& runtime = Runtime::global();
  fmt::print("kjit {}\n", kjit_version());

  const auto& cfg = runtime.store().config();
  fmt::print("cache:\n  writable root: {}\n", cfg.writable_root.empty() ? "(none: memory only)" : cfg.writable_root);
  for (const auto& root : cfg.read_only_roots) fmt::print("  read-only root: {}\n", root);
  fmt::print("  size cap: {} bytes\n", cfg.max_bytes);

  if (auto nvrtc = Nvrtc::load()) {
    fmt::print("nvrtc: {} ({})\n", (*nvrtc)->version(), (*nvrtc)->library_path());
    std::string targets;
    for (const auto& row : codegen::capability_table())
      if ((*nvrtc)->supports(std::string(row.target))) targets += fmt::format(" {}", row.target);
    fmt::print("  can build:{}\n", targets);
  } else {
    fmt::print("nvrtc: not available (kjit serves cached kernels only)\n  {}\n", nvrtc.error().message);
  }
  const auto include = cuda_include_dir();
  fmt::print("cuda headers: {}\n", include.empty() ? "not found" : include);

  auto driver = runtime.driver();
  if (!driver) {
    fmt::print("driver: not available\n  {}\ndevices: no GPU\n", driver.error().message);
    return kExitOk;
  }
  int version = 0;
  (*driver)->cuDriverGetVersion(&version);
  fmt::print("driver: CUDA {}.{}\n", version / 1000, (version % 1000) / 10);
  auto count = runtime.device_count();
  if (!count || *count == 0) {
    fmt::print("devices: no GPU\n");
    return kExitOk;
  }
  fmt::print("devices:\n");
  for (int i = 0; i < *count; ++i) {
    CUdevice dev = 0;
    (*driver)->cuDeviceGet(&dev, i);
    char name[256] = {};
    (*driver)->cuDeviceGetName(name, sizeof name, dev);
    int major = 0, minor = 0;
    (*driver)->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    (*driver)->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    auto row = codegen::arch_for_capability(major, minor);
    if (!row) {
      fmt::print("  {}: {} (compute capability {}.{}): unsupported\n", i, name, major, minor);
      continue;
    }
    fmt::print("  {}: {} (compute capability {}.{}), target {}, fp8 dequant: {}, grouped GEMM: {}\n", i, name, major,
               minor, (*row)->target, (*row)->fp8_conversion ? "yes" : "no",
               (*row)->wgmma_tma ? "wgmma + TMA, persistent, warp-specialised (SM90); mma.sync on request"
                                 : "mma.sync (portable)");
  }
  return kExitOk;
}

}  // namespace kjit::tools
