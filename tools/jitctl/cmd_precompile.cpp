// jitctl precompile: compile a manifest for a list of archs into the writable
// root, in parallel, with a progress line (redrawn on a terminal, about one
// line per 10% otherwise). Idempotent: a second run finds everything in the
// cache. Exits 1 when any kernel failed to build or is not in the writable
// root afterwards, naming each. A kernel an arch cannot run (an FP8 family on
// sm_80, Hopper's kernels elsewhere) is skipped, named with the reason, and
// does not fail the run: a fleet manifest lists kernels for several archs.
// Each compile runs in a compile process (compile_process.hpp): one that dies
// (NVRTC's LLVM aborts when out of memory) fails its kernel, not jitctl.
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <system_error>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"
#include "compile_process.hpp"
#include "output.hpp"
#include "kjit/builder/builder.hpp"
#include "kjit/builder/nvrtc.hpp"
#include "kjit/cache/store.hpp"
#include "kjit/codegen/arch.hpp"
#include "manifest.hpp"

namespace kjit::tools {
namespace {

struct Job {
  codegen::KernelSpec spec;
  const codegen::ArchInfo* arch;
};

// The terminal's width: the window's, else $COLUMNS, else 80.
size_t terminal_columns() {
  winsize size{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  if (const char* columns = std::getenv("COLUMNS")) {
    size_t n = 0;
    const std::string_view text(columns);
    if (auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
        ec == std::errc() && end == text.data() + text.size() && n > 0)
      return n;
  }
  return 80;
}

// Whether stderr is a terminal that understands \r and "erase line".
bool stderr_redraws() {
  const char* term = std::getenv("TERM");
  return isatty(STDERR_FILENO) == 1 && term != nullptr && *term != '\0' && std::string_view(term) != "dumb";
}

std::string short_duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// Progress on stderr: on a terminal (TERM set and not dumb) one line, redrawn
// with \r, that fits its width, with a bar where there is room; otherwise
// plain lines, one per tenth of the work and one per failure.
class Progress {
 public:
  explicit Progress(size_t total)
      : total_(total), redraw_(stderr_redraws()), start_(std::chrono::steady_clock::now()) {}

  void done(const Job& job, const JobOutcome& outcome) {
    std::lock_guard lock(mutex_);
    ++finished_;
    const bool failed = outcome.kind == JobOutcome::Kind::failed;
    if (failed) ++failed_;
    else if (outcome.kind == JobOutcome::Kind::cached) ++cached_;
    else ++compiled_;
    const std::string what = fmt::format("{} {}", job.arch->target, codegen::canonical(job.spec));
    if (redraw_) {
      // The redraw's own control sequences, around text made printable.
      if (failed) std::fputs(fmt::format("\r\033[Kfailed: {}\n", shown(what)).c_str(), stderr);
      std::fputs(fmt::format("\r\033[K{}", fitted(terminal_columns() - 1)).c_str(), stderr);
      if (finished_ == total_) std::fputs("\n", stderr);
      return;
    }
    if (failed) err("failed: {}\n", what);
    const size_t tenth = finished_ * 10 / total_;
    if (tenth > printed_tenth_ || finished_ == total_) {
      printed_tenth_ = tenth;
      err("{}\n", status());
    }
  }
  size_t compiled() const { return compiled_; }
  size_t cached() const { return cached_; }
  size_t failed() const { return failed_; }

 private:
  // "[12/216]", "5%", "3.1/s", "ETA 1m05s", "compiled 10", "cached 2", "failed 0"
  std::vector<std::string> fields() const {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(finished_) / elapsed : 0;
    const std::string eta =
        finished_ == total_ ? "done" : rate > 0 ? short_duration(static_cast<double>(total_ - finished_) / rate) : "?";
    return {fmt::format("[{}/{}]", finished_, total_), fmt::format("{}%", 100 * finished_ / total_),
            fmt::format("{:.1f}/s", rate),            fmt::format("ETA {}", eta),
            fmt::format("compiled {}", compiled_),    fmt::format("cached {}", cached_),
            fmt::format("failed {}", failed_)};
  }
  std::string status() const { return fmt::format("{}", fmt::join(fields(), "  ")); }
  // As many whole fields as fit in `width`, after a bar where there is room.
  std::string fitted(size_t width) const {
    std::string line;
    for (const auto& field : fields()) {
      if (line.size() + 2 + field.size() > width) break;
      if (!line.empty()) line += "  ";
      line += field;
    }
    constexpr size_t kMinBar = 10, kMaxBar = 40;
    if (line.size() + kMinBar + 3 <= width) {
      const size_t bar = std::min(kMaxBar, width - line.size() - 3);
      const size_t filled = bar * finished_ / total_;
      line = fmt::format("[{}{}] {}", std::string(filled, '#'), std::string(bar - filled, '.'), line);
    }
    return line;
  }

  std::mutex mutex_;
  size_t total_, finished_ = 0, compiled_ = 0, cached_ = 0, failed_ = 0, printed_tenth_ = 0;
  bool redraw_;
  std::chrono::steady_clock::time_point start_;
};

// The CPUs a cgroup CPU quota (docker --cpus, a Kubernetes CPU limit) lets
// this process use, rounded up; nullopt where no quota applies. cgroup v2:
// cpu.max ("QUOTA PERIOD" or "max PERIOD") of the process's group and every
// group above it; v1: cpu.cfs_quota_us / cpu.cfs_period_us (-1: none). The
// group's own files where the hierarchy is mounted with the process's path,
// else the mount's root (a container's view). The smallest quota wins.
std::optional<unsigned> cgroup_cpu_limit() {
  std::optional<unsigned> limit;
  auto consider = [&](double quota, double period) {
    if (quota <= 0 || period <= 0) return;
    const auto cpus = static_cast<unsigned>(std::max(1.0, std::ceil(quota / period)));
    if (!limit || cpus < *limit) limit = cpus;
  };
  auto read_v2 = [&](const std::string& dir) {
    std::ifstream file(dir + "/cpu.max");
    std::string quota;
    double period = 0;
    if (file >> quota >> period && quota != "max") consider(std::atof(quota.c_str()), period);
  };
  auto read_v1 = [&](const std::string& dir) {
    std::ifstream quota_file(dir + "/cpu.cfs_quota_us"), period_file(dir + "/cpu.cfs_period_us");
    double quota = 0, period = 0;
    if (quota_file >> quota && period_file >> period) consider(quota, period);
  };
  std::ifstream groups("/proc/self/cgroup");
  std::string line;
  while (std::getline(groups, line)) {
    // "ID:CONTROLLERS:PATH": v2's one line is "0::PATH", v1's has "cpu" among its controllers.
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    std::string path = line.substr(second + 1);
    std::string base;
    bool v2 = false;
    if (controllers.empty()) {
      base = "/sys/fs/cgroup";
      v2 = true;
    } else {
      bool cpu = false;
      size_t start = 0;
      while (start <= controllers.size()) {
        const size_t end = std::min(controllers.find(',', start), controllers.size());
        if (controllers.compare(start, end - start, "cpu") == 0) cpu = true;
        start = end + 1;
      }
      if (!cpu) continue;
      for (const char* mount : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"}) {
        struct stat st {};
        if (::stat(mount, &st) == 0 && S_ISDIR(st.st_mode)) {
          base = mount;
          break;
        }
      }
      if (base.empty()) continue;
    }
    // The group and each one above it, then the mount's root.
    while (path.size() > 1 && path.front() == '/') {
      v2 ? read_v2(base + path) : read_v1(base + path);
      path.resize(path.rfind('/'));
    }
    v2 ? read_v2(base) : read_v1(base);
  }
  return limit;
}

// The CPUs this process can run on: its affinity mask (taskset, a cpuset),
// capped by a cgroup CPU quota. std::thread::hardware_concurrency() counts the
// machine's CPUs whatever the process may use: a container limited to 2 of
// 32 would run 32 compiles on 2 CPUs' worth of time.
unsigned available_cpus() {
  unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  for (int size = 1024; size <= (1 << 16); size *= 2) {  // masks past 1024 CPUs need a bigger set
    cpu_set_t* set = CPU_ALLOC(size);
    if (!set) break;
    const size_t bytes = CPU_ALLOC_SIZE(size);
    const int got = sched_getaffinity(0, bytes, set);
    const int error = errno;
    if (got == 0) cpus = static_cast<unsigned>(std::max(1, CPU_COUNT_S(bytes, set)));
    CPU_FREE(set);
    if (got == 0 || error != EINVAL) break;
  }
  if (const auto quota = cgroup_cpu_limit()) cpus = std::min(cpus, *quota);
  return std::max(1u, cpus);
}

nlohmann::json with(nlohmann::json object, const char* field, const std::string& value) {
  object[field] = value;
  return object;
}

// Runs `worker` on up to `threads` threads, each taking jobs until none are
// left. A thread the system refuses (ulimit -u) is one fewer; with none, the
// calling thread runs it. `worker` must not throw.
void run_parallel(unsigned threads, const std::function<void()>& worker) {
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    try {
      pool.emplace_back(worker);
    } catch (const std::system_error& e) {
      err("jitctl: warning: compiling with {} thread{}: another could not be started ({})\n", pool.size(),
          pool.size() == 1 ? "" : "s", e.what());
      break;
    }
  }
  if (pool.empty()) worker();
  for (auto& thread : pool) thread.join();
}

// One compile thread's builds: in a compile process of its own, started at its
// first job and again after one dies; in jitctl's process only where none can
// be started (no processes left under ulimit -u), with a warning once.
class JobRunner {
 public:
  JobRunner(Builder& builder, std::atomic<bool>& warned) : builder_(builder), warned_(warned) {}

  JobOutcome build(const Job& job) {
    if (!here_ && !(process_ && process_->alive())) {
      process_.reset();
      if (auto started = CompileProcess::start()) {
        process_.emplace(std::move(*started));
      } else {
        here_ = true;
        if (!warned_.exchange(true))
          err("jitctl: warning: compiling in jitctl's own process ({}): a compile that runs out of memory there "
              "ends jitctl\n",
              started.error().message);
      }
    }
    return here_ ? build_here(builder_, job.spec, *job.arch) : process_->build(job.spec, *job.arch);
  }

 private:
  Builder& builder_;
  std::atomic<bool>& warned_;
  std::optional<CompileProcess> process_;
  bool here_ = false;
};

// Whether the store can write its writable root at all, tried the store's own
// way (a probe entry published and removed), so that nothing is compiled for
// a root that would keep none of it; the reason when not.
Expected<void> probe_writable_root(cache::Store& store) {
  static const std::string kProbeKey(64, '0');  // no kernel's key: a hash
  KJIT_TRY(store.publish(kProbeKey, nlohmann::json{{"probe", "jitctl precompile"}}, std::span<const char>()));
  return store.remove(kProbeKey);
}

}  // namespace

int cmd_precompile(const PrecompileOptions& options) {
  const unsigned threads = options.jobs > 0 ? options.jobs : available_cpus();
  // Each target once, in the order given: a repeated --arch value is the same work.
  std::vector<std::string> archs;
  for (const auto& arch : options.archs)
    if (std::find(archs.begin(), archs.end(), arch) == archs.end()) archs.push_back(arch);
  if (options.manifest.empty())
    return usage_error(fmt::format("precompile needs --manifest FILE or a bundled manifest's name ({})",
                                   fmt::join(bundled_manifest_names(), ", ")),
                       "precompile");
  if (archs.empty()) return usage_error("precompile needs --arch LIST (e.g. sm_90a,sm_100a,sm_120a)", "precompile");

  auto manifest = load_manifest(options.manifest);
  if (!manifest) {
    err("jitctl: error: {}\n", manifest.error().message);
    return kExitFailure;
  }
  auto nvrtc = Nvrtc::load();
  if (!nvrtc) {
    err("jitctl: error: {}\n", nvrtc.error().message);
    return kExitFailure;
  }
  const std::string built_with = built_with_cuda_version();
  if ((*nvrtc)->version() != built_with)
    err("jitctl: warning: compiling with NVRTC {} but kjit was built with CUDA {}: a serving machine without "
               "NVRTC will look for CUDA {} entries and not find these\n",
               (*nvrtc)->version(), built_with, built_with);

  // Precompiling needs no driver: the Builder over the environment's cache.
  cache::Store store(cache::config_from_environment());
  Builder builder(store);
  const std::string& root = store.config().writable_root;
  if (auto writable = probe_writable_root(store); !writable) {
    err("jitctl: error: nothing would be kept: the writable cache root {} cannot be written: {}\n",
               root.empty() ? "(none)" : root, writable.error().message);
    return kExitFailure;
  }

  // The manifest's limit on specs bounds the expanded work too: specs x archs,
  // and what each spec expands into (a grouped GEMM's configurations).
  const size_t max_jobs = ManifestLimits{}.max_kernels;
  if (manifest->kernels.size() > max_jobs / archs.size()) {
    err("jitctl: error: {} specs for {} archs is more than {} kernels to build\n", manifest->kernels.size(),
        archs.size(), max_jobs);
    return kExitFailure;
  }
  std::vector<Job> jobs;
  std::vector<std::pair<Job, std::string>> skipped;  // with why the arch cannot run it
  // Problems that differ only in their expert count share their kernels (kernel_identity): each is built once.
  std::set<std::pair<std::string_view, std::string>> seen;
  for (const auto& target : archs) {
    const codegen::ArchInfo* arch = *codegen::arch_for_target(target);  // validated with the arguments
    for (const auto& spec : manifest->kernels)
      for (auto kernel : codegen::kernels_for_target(spec, *arch)) {
        kernel = codegen::kernel_identity(kernel);
        if (!seen.emplace(arch->target, codegen::canonical(kernel)).second) continue;
        if (jobs.size() + skipped.size() >= max_jobs) {
          err("jitctl: error: the manifest expands to more than {} kernels to build for {}\n", max_jobs,
              fmt::join(archs, ","));
          return kExitFailure;
        }
        // Any other invalid spec is the Builder's to report, as a failure.
        if (auto fits = codegen::validate_for_target(kernel, *arch); !fits && fits.error().code == KJIT_ERROR_UNSUPPORTED)
          skipped.push_back({{std::move(kernel), arch}, fits.error().message});
        else
          jobs.push_back({std::move(kernel), arch});
      }
  }
  err("precompiling {} kernel{} ({} spec{} for {} arch{}) with {} thread{}\n", jobs.size(),
             jobs.size() == 1 ? "" : "s", manifest->kernels.size(), manifest->kernels.size() == 1 ? "" : "s",
             archs.size(), archs.size() == 1 ? "" : "s", threads, threads == 1 ? "" : "s");

  Progress progress(jobs.size());
  std::vector<std::string> failures(jobs.size());
  std::vector<std::string> keys(jobs.size());  // of the kernels built
  std::atomic<size_t> next{0};
  std::atomic<bool> warned{false};
  std::atomic<uint64_t> evicted_by_workers{0};  // by the compile processes' stores
  const auto start = std::chrono::steady_clock::now();
  run_parallel(static_cast<unsigned>(std::min<size_t>(threads, jobs.size())), [&] {
    JobRunner runner(builder, warned);
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const JobOutcome outcome = runner.build(jobs[i]);
      if (outcome.kind == JobOutcome::Kind::failed) failures[i] = outcome.error;
      else keys[i] = outcome.key;
      evicted_by_workers += outcome.evicted;
      progress.done(jobs[i], outcome);
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Checked at the end, not as each job finishes: a later publish may have
  // evicted an earlier kernel to keep the root under KJIT_CACHE_MAX_BYTES.
  std::vector<std::string> not_stored(jobs.size());  // keys built but absent from the writable root now
  for (size_t i = 0; i < jobs.size(); ++i)
    if (!keys[i].empty() && !store.holds(keys[i])) not_stored[i] = keys[i];
  const auto missing = static_cast<size_t>(std::count_if(not_stored.begin(), not_stored.end(),
                                                         [](const std::string& key) { return !key.empty(); }));
  const uint64_t evicted = store.counters().evicted + evicted_by_workers;
  const bool ok = progress.failed() == 0 && missing == 0;
  if (options.json) {
    nlohmann::json out = {{"kernels", jobs.size()},      {"compiled", progress.compiled()},
                          {"cached", progress.cached()}, {"failed", progress.failed()},
                          {"skipped", skipped.size()},   {"seconds", seconds},
                          {"root", root},                {"evicted", evicted},
                          {"failures", nlohmann::json::array()},
                          {"not_stored", nlohmann::json::array()}, {"skips", nlohmann::json::array()}};
    for (const auto& [job, why] : skipped)
      out["skips"].push_back({{"arch", std::string(job.arch->target)}, {"spec", codegen::canonical(job.spec)},
                              {"reason", why}});
    for (size_t i = 0; i < jobs.size(); ++i) {
      const nlohmann::json kernel = {{"arch", std::string(jobs[i].arch->target)}, {"spec", codegen::canonical(jobs[i].spec)}};
      if (!failures[i].empty()) out["failures"].push_back(with(kernel, "error", failures[i]));
      if (!not_stored[i].empty()) out["not_stored"].push_back(with(kernel, "key", not_stored[i]));
    }
    print_json(out);
  } else {
    out("precompile: {} compiled, {} already cached, {} failed, {} not stored, {} evicted in {:.1f} s{}\n",
               progress.compiled(), progress.cached(), progress.failed(), missing, evicted, seconds,
               skipped.empty() ? "" : fmt::format("; {} skipped (not supported on their arch)", skipped.size()));
  }
  for (const auto& [job, why] : skipped)
    err("skipped: {} {}\n  {}\n", job.arch->target, codegen::canonical(job.spec), why);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (!failures[i].empty())
      err("failed: {} {}\n  {}\n", jobs[i].arch->target, codegen::canonical(jobs[i].spec), failures[i]);
    if (!not_stored[i].empty())
      err("not stored in {}: {} {} (key {})\n", root, jobs[i].arch->target, codegen::canonical(jobs[i].spec),
                 not_stored[i]);
  }
  if (missing > 0 && evicted > 0)
    err("jitctl: error: {} entr{} evicted to keep {} under its size cap of {} bytes (KJIT_CACHE_MAX_BYTES): "
        "raise the cap to hold the manifest\n",
        evicted, evicted == 1 ? "y was" : "ies were", root, store.config().max_bytes);
  return ok ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
