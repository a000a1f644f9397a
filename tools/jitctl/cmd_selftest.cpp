// jitctl selftest: on a GPU machine, launches every cached kernel kind built
// for a present device's arch once, on fresh random data, and checks it
// against a CPU reference through the shared harness (tools/harness, also
// used by the GPU tests): dequant bit for bit, grouped GEMM to 1e-2 relative
// error on sampled rows, MoE routing exactly in every output, MoE combine to
// the GPU tests' tolerance. Exit 0 when all match (or when there is no GPU:
// nothing to run, said so).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "output.hpp"
#include "harness.hpp"
#include "kjit/internal/runtime.hpp"

namespace kjit::tools {

int cmd_selftest() {
  Runtime& runtime = Runtime::global();
  auto count = runtime.device_count();
  if (!count || *count == 0) {
    // Nothing checked is not a pass: 77 says "skipped" to ctest and main-job.
    out("selftest: skipped: no GPU ({})\n", count ? "the driver reports no device" : count.error().message);
    return kExitSkipped;
  }
  std::mt19937_64 rng(std::random_device{}());
  int passed = 0, failed = 0;
  std::vector<std::string> tested_targets;  // each kind once: on the first device of its arch
  for (int ordinal = 0; ordinal < *count; ++ordinal) {
    auto device = runtime.device(ordinal);
    if (!device) {
      out("device {}: skipped: {}\n", ordinal, device.error().message);
      continue;
    }
    const std::string target((*device)->arch->target);
    if (std::find(tested_targets.begin(), tested_targets.end(), target) != tested_targets.end()) continue;
    tested_targets.push_back(target);
    for (const auto& entry : runtime.store().list()) {
      if (entry.state != cache::EntryState::ok || !entry.meta.is_object() || entry.meta.value("arch", "") != target)
        continue;
      auto spec = codegen::spec_from_json(entry.meta.value("spec", nlohmann::json()));
      if (!spec) {  // a kind (or form) this jitctl does not know: nothing to launch it with
        const auto canonical = entry.meta.find("canonical");
        out("device {} {} {}: not checked by selftest: {}\n", ordinal, target,
                   canonical != entry.meta.end() && canonical->is_string() ? canonical->get<std::string>() : entry.key,
                   spec.error().message);
        continue;
      }
      const harness::Outcome outcome = harness::check_spec(runtime, **device, *spec, rng);
      (outcome.ok ? passed : failed)++;
      out("device {} {} {}: {}\n", ordinal, target, codegen::canonical(*spec), outcome.text);
    }
  }
  if (tested_targets.empty()) {
    out("selftest: skipped: no usable GPU (see the device lines above)\n");
    return kExitSkipped;
  }
  if (passed + failed == 0) {
    out("selftest: skipped: no cached kernel for the present devices ({}); run jitctl precompile --arch {}\n",
               fmt::join(tested_targets, ", "), fmt::join(tested_targets, ","));
    return kExitSkipped;
  }
  out("selftest: {} passed, {} failed\n", passed, failed);
  return failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
