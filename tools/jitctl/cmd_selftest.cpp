// jitctl selftest: on a GPU machine, launches every cached kernel kind built
// for a present device's arch once, on fresh random data, and checks it
// against a CPU reference through the shared harness (tools/harness, also
// used by the GPU tests): dequant bit for bit, grouped GEMM to 1e-2 relative
// error on sampled rows, MoE routing exactly in every output, MoE combine to
// the GPU tests' tolerance. By default the GEMM checks are quick (two routed
// experts, sampled columns of the sampled rows: harness::Depth); --exhaustive
// runs the full ones. The checks run on several threads (their host work is
// most of a check's time; launches take turns), within the device's free
// memory. Exit 0 when all match, 1 when one does not, 77 when there is nothing
// to run (no GPU, or no cached kernel for it).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "output.hpp"
#include "harness.hpp"
#include "kjit/internal/runtime.hpp"

namespace kjit::tools {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Check {
  DeviceState* device;
  std::string target;
  codegen::KernelSpec spec;
  std::string canonical;
  harness::Outcome outcome{false, "not run"};
  double seconds = 0;
};

// Device memory lent to the checks running at once: a check takes its
// harness::device_bytes (all of the budget at most, so that the largest runs
// alone) and gives it back when done.
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t bytes) : total_(bytes), free_(bytes) {}
  uint64_t take(uint64_t wanted) {
    const uint64_t taken = std::min(wanted, total_);
    std::unique_lock lock(mutex_);
    returned_.wait(lock, [&] { return free_ >= taken; });
    free_ -= taken;
    return taken;
  }
  void give_back(uint64_t taken) {
    {
      std::lock_guard lock(mutex_);
      free_ += taken;
    }
    returned_.notify_all();
  }

 private:
  const uint64_t total_;
  uint64_t free_;
  std::mutex mutex_;
  std::condition_variable returned_;
};

// Four fifths of the device's free memory (8 GiB where the driver does not say).
uint64_t memory_budget(Runtime& runtime, const DeviceState& device) {
  constexpr uint64_t kFallback = uint64_t{8} << 30;
  auto driver = runtime.driver();
  if (!driver) return kFallback;
  const DriverApi& api = **driver;
  ScopedContext scope(api, device.context);
  size_t free = 0, total = 0;
  if (!scope.status() || api.cuMemGetInfo(&free, &total) != CUDA_SUCCESS || free == 0) return kFallback;
  return free / 5 * 4;
}

// "12s", "1m05s".
std::string eta_text(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  return s < 60 ? fmt::format("{}s", s) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

// The results as they come: the text line of each check on stdout (unless
// --json), and on stderr a progress line at each tenth of the checks
// ("selftest: [38/380] 10%  4.2/s  ETA 1m21s  failed 0").
class Report {
 public:
  Report(size_t total, bool json) : total_(total), json_(json), start_(Clock::now()) {}
  void done(const Check& check) {
    std::lock_guard lock(mutex_);
    ++finished_;
    if (!check.outcome.ok) ++failed_;
    if (!json_)
      out("device {} {} {}: {}\n", check.device->ordinal, check.target, check.canonical, check.outcome.text);
    const size_t tenth = finished_ * 10 / total_;
    if (tenth == printed_tenth_) return;
    printed_tenth_ = tenth;
    const double elapsed = seconds_since(start_), rate = static_cast<double>(finished_) / std::max(elapsed, 1e-9);
    std::fflush(stdout);
    err("selftest: [{}/{}] {}%  {:.1f}/s  ETA {}  failed {}\n", finished_, total_, 100 * finished_ / total_, rate,
        finished_ == total_ ? "done" : eta_text(static_cast<double>(total_ - finished_) / rate), failed_);
  }

 private:
  const size_t total_;
  const bool json_;
  const Clock::time_point start_;
  std::mutex mutex_;
  size_t finished_ = 0, failed_ = 0, printed_tenth_ = 0;
};

// Runs `checks` of one device on `threads` threads, the largest (in device
// memory) first, each with a generator seeded from `seed` and its index.
void run_checks(Runtime& runtime, std::vector<Check*>& checks, unsigned threads, harness::Depth depth, uint64_t seed,
                Report& report) {
  if (checks.empty()) return;
  std::vector<size_t> order(checks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return harness::device_bytes(checks[a]->spec) > harness::device_bytes(checks[b]->spec);
  });
  MemoryBudget budget(memory_budget(runtime, *checks.front()->device));
  std::atomic<size_t> next{0};
  const auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < order.size();) {
      Check& check = *checks[order[i]];
      std::seed_seq seeds{seed, static_cast<uint64_t>(check.device->ordinal), static_cast<uint64_t>(order[i])};
      std::mt19937_64 rng(seeds);
      const uint64_t taken = budget.take(harness::device_bytes(check.spec));
      const auto start = Clock::now();
      try {
        check.outcome = harness::check_spec(runtime, *check.device, check.spec, rng, depth);
      } catch (const std::exception& e) {  // out of host memory, say: this check's failure, not jitctl's
        check.outcome = {false, fmt::format("error: {}", e.what())};
      }
      check.seconds = seconds_since(start);
      budget.give_back(taken);
      report.done(check);
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < std::min<size_t>(threads, checks.size()); ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error&) {
      break;  // the system lends fewer threads (ulimit -u): the ones started, or this one, do the work
    }
  }
  if (pool.empty()) worker();
  for (auto& thread : pool) thread.join();
}

unsigned default_jobs() { return std::clamp(std::thread::hardware_concurrency(), 1u, 16u); }

}  // namespace

int cmd_selftest(const SelftestOptions& options) {
  const auto start = Clock::now();
  const harness::Depth depth = options.exhaustive ? harness::Depth::exhaustive : harness::Depth::quick;
  const unsigned jobs = options.jobs ? options.jobs : default_jobs();
  const uint64_t seed = std::random_device{}() * uint64_t{0x100000001} ^ std::random_device{}();
  nlohmann::json doc = {{"depth", options.exhaustive ? "exhaustive" : "quick"},
                        {"filter", options.filter.empty() ? nlohmann::json() : nlohmann::json(options.filter)},
                        {"jobs", jobs},
                        {"seed", seed},
                        {"devices", nlohmann::json::array()},
                        {"kernels", nlohmann::json::array()},
                        {"unchecked", nlohmann::json::array()}};
  // Nothing checked is not a pass: 77 says "skipped" to ctest and main-job.
  const auto skipped = [&](const std::string& reason) {
    if (options.json) {
      doc.update({{"skipped", true}, {"reason", reason}, {"passed", 0}, {"failed", 0}, {"seconds", seconds_since(start)}});
      print_json(doc);
    } else {
      out("selftest: skipped: {}\n", reason);
    }
    return kExitSkipped;
  };

  Runtime& runtime = Runtime::global();
  auto count = runtime.device_count();
  if (!count || *count == 0)
    return skipped(fmt::format("no GPU ({})", count ? "the driver reports no device" : count.error().message));
  const std::optional<std::regex> filter =
      options.filter.empty() ? std::nullopt : std::optional<std::regex>(std::regex(options.filter));

  std::vector<Check> checks;
  std::vector<std::string> tested_targets;  // each kind once: on the first device of its arch
  size_t filtered_out = 0;
  for (int ordinal = 0; ordinal < *count; ++ordinal) {
    auto device = runtime.device(ordinal);
    if (!device) {
      if (!options.json) out("device {}: skipped: {}\n", ordinal, device.error().message);
      doc["devices"].push_back({{"ordinal", ordinal}, {"skipped", device.error().message}});
      continue;
    }
    const std::string target((*device)->arch->target);
    const bool first_of_arch = std::find(tested_targets.begin(), tested_targets.end(), target) == tested_targets.end();
    doc["devices"].push_back({{"ordinal", ordinal},
                              {"arch", target},
                              {"name", (*device)->name},
                              {"checked", first_of_arch}});
    if (!first_of_arch) continue;
    tested_targets.push_back(target);
    for (const auto& entry : runtime.store().list()) {
      if (entry.state != cache::EntryState::ok || !entry.meta.is_object() || entry.meta.value("arch", "") != target)
        continue;
      auto spec = codegen::spec_from_json(entry.meta.value("spec", nlohmann::json()));
      if (!spec) {  // a kind (or form) this jitctl does not know: nothing to launch it with
        const auto canonical = entry.meta.find("canonical");
        const std::string name =
            canonical != entry.meta.end() && canonical->is_string() ? canonical->get<std::string>() : entry.key;
        if (filter && !std::regex_search(name, *filter)) continue;
        if (!options.json)
          out("device {} {} {}: not checked by selftest: {}\n", ordinal, target, name, spec.error().message);
        doc["unchecked"].push_back(
            {{"device", ordinal}, {"arch", target}, {"kernel", name}, {"reason", spec.error().message}});
        continue;
      }
      std::string canonical = codegen::canonical(*spec);
      if (filter && !std::regex_search(canonical, *filter)) {
        ++filtered_out;
        continue;
      }
      checks.push_back({*device, target, *spec, std::move(canonical)});
    }
  }
  if (tested_targets.empty()) return skipped("no usable GPU (see the device lines above)");
  if (checks.empty()) {
    if (filtered_out > 0)
      return skipped(fmt::format("no cached kernel for the present devices ({}) matches --filter '{}' ({} do not)",
                                 fmt::join(tested_targets, ", "), options.filter, filtered_out));
    return skipped(fmt::format("no cached kernel for the present devices ({}); run jitctl precompile --arch {}",
                               fmt::join(tested_targets, ", "), fmt::join(tested_targets, ",")));
  }

  Report report(checks.size(), options.json);
  for (const std::string& target : tested_targets) {
    std::vector<Check*> of_target;
    for (auto& check : checks)
      if (check.target == target) of_target.push_back(&check);
    run_checks(runtime, of_target, jobs, depth, seed, report);
  }
  int passed = 0, failed = 0;
  for (const auto& check : checks) {
    (check.outcome.ok ? passed : failed)++;
    doc["kernels"].push_back({{"device", check.device->ordinal},
                              {"arch", check.target},
                              {"canonical", check.canonical},
                              {"ok", check.outcome.ok},
                              {"detail", check.outcome.text},
                              {"seconds", check.seconds}});
  }
  if (options.json) {
    doc.update({{"skipped", false}, {"passed", passed}, {"failed", failed}, {"seconds", seconds_since(start)}});
    print_json(doc);
  } else {
    out("selftest: {} passed, {} failed\n", passed, failed);
  }
  return failed == 0 ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
