// The Builder: spec + arch -> cubin, with no GPU and no driver. It owns the
// whole path from a spec to bytes: render the spec once, key it, look the key
// up in the cache (the read-only roots too), else compile with NVRTC (under
// the key's advisory lock, looking again once the lock is held) and publish.
// The runtime's miss path, `jitctl precompile` and the tests all build through
// it, and the rendered kernel it returns carries everything a launch needs
// (entry point, threads, shared memory, cluster), so a miss renders once.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kjit/base/expected.hpp"
#include "kjit/builder/nvrtc.hpp"
#include "kjit/cache/store.hpp"
#include "kjit/codegen/kernel_spec.hpp"

namespace kjit {

// Bumped whenever the meaning of a cache entry changes; part of every key.
inline constexpr int kEntryFormatVersion = 1;

// Where a cubin came from, for logs, precompile summaries and tests.
enum class CubinOrigin { disk_cache, compiled };

struct BuiltKernel {
  codegen::RenderedKernel rendered;  // the launch's constants (the source too, for the cache entry)
  std::string key;
  std::vector<char> cubin;
  CubinOrigin origin = CubinOrigin::compiled;
  double compile_seconds = 0;
  // Compiled and published into the writable root. False for a cache hit, and
  // for a compile the store could not keep (no writable root, a full disk):
  // the kernel is then served from memory, and precompile reports it.
  bool stored = false;
  std::string store_error;  // why not stored, after a compile
};

class Builder {
 public:
  // lineinfo: kernels compiled with -lineinfo (compile_options), which enters their keys.
  explicit Builder(cache::Store& store, bool lineinfo = lineinfo_from_environment())
      : store_(store), lineinfo_(lineinfo) {}

  // The cubin of `spec` for `arch`: validated for the arch first (a grouped
  // GEMM problem, Hopper's kernels off sm_90a and fp8 dequant before sm_89 are
  // errors), then from the cache or compiled and published.
  Expected<BuiltKernel> build(const codegen::KernelSpec& spec, const codegen::ArchInfo& arch);

  // What the builds so far did (tests count renders; precompile reports hits).
  struct Counters {
    std::atomic<uint64_t> renders{0};
    std::atomic<uint64_t> disk_hits{0};
    std::atomic<uint64_t> compiles{0};
  };
  const Counters& counters() const { return counters_; }

  cache::Store& store() { return store_; }

 private:
  cache::Store& store_;
  bool lineinfo_;
  Counters counters_;
};

}  // namespace kjit
