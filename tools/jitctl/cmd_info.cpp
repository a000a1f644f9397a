// jitctl info: what this machine offers kjit.
#include <fmt/format.h>

#include "kjit/codegen/arch.hpp"
#include "cli.hpp"
#include "output.hpp"
#include "kjit/kjit.h"
#include "kjit/builder/nvrtc.hpp"
#include "kjit/internal/runtime.hpp"

namespace kjit::tools {

namespace {

// What info reports, gathered once and then printed as text or JSON.
nlohmann::json gather() {
  Runtime& runtime = Runtime::global();
  const auto& cfg = runtime.store().config();
  nlohmann::json out = {{"version", kjit_version()},
                        {"cache",
                         {{"writable_root", cfg.writable_root},
                          {"read_only_roots", cfg.read_only_roots},
                          {"max_bytes", cfg.max_bytes}}}};
  if (auto nvrtc = Nvrtc::load()) {
    nlohmann::json targets = nlohmann::json::array();
    for (const auto& row : codegen::capability_table())
      if ((*nvrtc)->supports(std::string(row.target))) targets.push_back(std::string(row.target));
    out["nvrtc"] = {{"version", (*nvrtc)->version()}, {"library", (*nvrtc)->library_path()}, {"targets", targets}};
  } else {
    out["nvrtc"] = {{"error", nvrtc.error().message}};
  }
  out["devices"] = nlohmann::json::array();
  auto driver = runtime.driver();
  if (!driver) {
    out["driver"] = {{"error", driver.error().message}};
    return out;
  }
  int version = 0;
  (*driver)->cuDriverGetVersion(&version);
  out["driver"] = {{"cuda", fmt::format("{}.{}", version / 1000, (version % 1000) / 10)}};
  auto count = runtime.device_count();
  for (int i = 0; count && i < *count; ++i) {
    CUdevice dev = 0;
    (*driver)->cuDeviceGet(&dev, i);
    char name[256] = {};
    (*driver)->cuDeviceGetName(name, sizeof name, dev);
    int major = 0, minor = 0;
    (*driver)->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    (*driver)->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    nlohmann::json device = {{"ordinal", i}, {"name", name}, {"compute_capability", fmt::format("{}.{}", major, minor)}};
    if (auto row = codegen::arch_for_capability(major, minor)) {
      device["target"] = std::string((*row)->target);
      device["fp8_dequant"] = (*row)->fp8_conversion;
      device["grouped_gemm"] = (*row)->wgmma_tma ? "wgmma + TMA, persistent, warp-specialised (SM90); mma.sync on request"
                                                 : "mma.sync (portable)";
    }
    out["devices"].push_back(device);
  }
  return out;
}

}  // namespace

int cmd_info(const InfoOptions& options) {
  const nlohmann::json info = gather();
  if (options.json) {
    print_json(info);
    return kExitOk;
  }
  const auto& cache = info["cache"];
  out("kjit {}\n", info["version"].get<std::string>());
  const auto writable = cache["writable_root"].get<std::string>();
  out("cache:\n  writable root: {}\n", writable.empty() ? "(none: memory only)" : writable);
  for (const auto& root : cache["read_only_roots"]) out("  read-only root: {}\n", root.get<std::string>());
  out("  size cap: {} bytes\n", cache["max_bytes"].get<uint64_t>());

  const auto& nvrtc = info["nvrtc"];
  if (nvrtc.contains("error")) {
    out("nvrtc: not available (kjit serves cached kernels only)\n  {}\n", nvrtc["error"].get<std::string>());
  } else {
    std::string targets;
    for (const auto& target : nvrtc["targets"]) targets += fmt::format(" {}", target.get<std::string>());
    out("nvrtc: {} ({})\n  can build:{}\n", nvrtc["version"].get<std::string>(),
               nvrtc["library"].get<std::string>(), targets);
  }

  const auto& driver = info["driver"];
  if (driver.contains("error")) {
    out("driver: not available\n  {}\ndevices: no GPU\n", driver["error"].get<std::string>());
    return kExitOk;
  }
  out("driver: CUDA {}\n", driver["cuda"].get<std::string>());
  if (info["devices"].empty()) {
    out("devices: no GPU\n");
    return kExitOk;
  }
  out("devices:\n");
  for (const auto& d : info["devices"]) {
    const auto head = fmt::format("  {}: {} (compute capability {})", d["ordinal"].get<int>(),
                                  d["name"].get<std::string>(), d["compute_capability"].get<std::string>());
    if (!d.contains("target")) {
      out("{}: unsupported\n", head);
      continue;
    }
    out("{}, target {}, fp8 dequant: {}, grouped GEMM: {}\n", head, d["target"].get<std::string>(),
               d["fp8_dequant"].get<bool>() ? "yes" : "no", d["grouped_gemm"].get<std::string>());
  }
  return kExitOk;
}

}  // namespace kjit::tools
