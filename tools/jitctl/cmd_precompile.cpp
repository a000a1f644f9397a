// jitctl precompile: compile a manifest for a list of archs into the cache, in
// parallel, with a progress bar on a terminal and one line per kernel
// otherwise. Idempotent: a second run finds everything in the cache.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <llvm/Support/ThreadPool.h>
#include <llvm/Support/Threading.h>

#include "cli.hpp"
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

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Progress output: a redrawn bar on a terminal, plain lines otherwise.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(STDERR_FILENO) == 1) {}

  void done(const Job& job, const Expected<BuiltKernel>& result) {
    std::lock_guard lock(mutex_);
    ++finished_;
    if (!result) ++failed_;
    else if (result->origin == CubinOrigin::disk_cache) ++cached_;
    else ++compiled_;
    const std::string what = fmt::format("{} {}", job.arch->target, codegen::canonical(job.spec));
    if (tty_) {
      if (!result) fmt::print(stderr, "\r\033[Kfailed: {}\n", what);
      constexpr size_t kWidth = 30;
      const size_t filled = kWidth * finished_ / total_;
      fmt::print(stderr, "\r\033[K[{}{}] {}/{}  compiled {}  cached {}  failed {}", std::string(filled, '#'),
                 std::string(kWidth - filled, '.'), finished_, total_, compiled_, cached_, failed_);
      if (finished_ == total_) fmt::print(stderr, "\n");
    } else if (!result) {
      fmt::print(stderr, "[{}/{}] failed {}\n", finished_, total_, what);
    } else {
      fmt::print(stderr, "[{}/{}] {} {}{}\n", finished_, total_,
                 result->origin == CubinOrigin::disk_cache ? "cached  " : "compiled", what,
                 result->origin == CubinOrigin::compiled ? fmt::format(" ({:.0f} ms)", result->compile_seconds * 1e3)
                                                         : "");
    }
  }
  size_t compiled() const { return compiled_; }
  size_t cached() const { return cached_; }
  size_t failed() const { return failed_; }

 private:
  std::mutex mutex_;
  size_t total_, finished_ = 0, compiled_ = 0, cached_ = 0, failed_ = 0;
  bool tty_;
};

}  // namespace

int cmd_precompile(Args& args) {
  const auto manifest_path = args.value("--manifest");
  const auto arch_list = args.value("--arch");
  auto jobs_text = args.value("-j");
  if (!jobs_text) jobs_text = args.value("--jobs");
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  if (!manifest_path) return usage_error("precompile needs --manifest FILE");
  if (!arch_list) return usage_error("precompile needs --arch LIST (e.g. sm_90a,sm_100a,sm_120a)");
  unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  if (jobs_text) {
    char* end = nullptr;
    const long n = std::strtol(jobs_text->c_str(), &end, 10);
    if (*end != '\0' || n < 1 || n > 1024) return usage_error(fmt::format("-j needs a positive count, got '{}'", *jobs_text));
    threads = static_cast<unsigned>(n);
  }
  const auto archs = split_list(*arch_list);
  if (archs.empty()) return usage_error("--arch names no target");
  std::vector<const codegen::ArchInfo*> targets;
  for (const auto& arch : archs) {
    auto row = codegen::arch_for_target(arch);
    if (!row) return usage_error(row.error().message);
    targets.push_back(*row);
  }

  auto manifest = read_manifest(*manifest_path);
  if (!manifest) {
    fmt::print(stderr, "jitctl: error: {}\n", manifest.error().message);
    return kExitFailure;
  }
  auto nvrtc = Nvrtc::load();
  if (!nvrtc) {
    fmt::print(stderr, "jitctl: error: {}\n", nvrtc.error().message);
    return kExitFailure;
  }
  const std::string built_with = built_with_cuda_version();
  if ((*nvrtc)->version() != built_with)
    fmt::print(stderr,
               "jitctl: warning: compiling with NVRTC {} but kjit was built with CUDA {}: a serving machine without "
               "NVRTC will look for CUDA {} entries and not find these\n",
               (*nvrtc)->version(), built_with, built_with);

  std::vector<Job> jobs;
  for (const auto* arch : targets)
    for (const auto& spec : manifest->kernels)
      for (auto& kernel : codegen::kernels_for_target(spec, *arch)) jobs.push_back({std::move(kernel), arch});
  fmt::print(stderr, "precompiling {} kernel{} ({} spec{} for {} arch{}) with {} thread{}\n", jobs.size(),
             jobs.size() == 1 ? "" : "s", manifest->kernels.size(), manifest->kernels.size() == 1 ? "" : "s",
             archs.size(), archs.size() == 1 ? "" : "s", threads, threads == 1 ? "" : "s");

  // Precompiling needs no driver: the Builder over the environment's cache.
  cache::Store store(cache::config_from_environment());
  Builder builder(store);
  Progress progress(jobs.size());
  std::vector<std::string> failures(jobs.size());
  const auto start = std::chrono::steady_clock::now();
  {
    llvm::DefaultThreadPool pool(llvm::hardware_concurrency(threads));
    for (size_t i = 0; i < jobs.size(); ++i)
      pool.async([&, i] {
        auto result = builder.build(jobs[i].spec, *jobs[i].arch);
        if (!result) failures[i] = result.error().message;
        // A kernel the cache could not keep is not precompiled.
        if (result && result->origin == CubinOrigin::compiled && !result->stored) {
          failures[i] = fmt::format("compiled but not stored in the cache: {}", result->store_error);
          result = fail(KJIT_ERROR_CACHE, failures[i]);
        }
        progress.done(jobs[i], result);
      });
    pool.wait();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("precompile: {} compiled, {} already cached, {} failed in {:.1f} s\n", progress.compiled(),
             progress.cached(), progress.failed(), seconds);
  for (size_t i = 0; i < jobs.size(); ++i)
    if (!failures[i].empty())
      fmt::print(stderr, "failed: {} {}\n  {}\n", jobs[i].arch->target, codegen::canonical(jobs[i].spec), failures[i]);
  return progress.failed() == 0 ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
