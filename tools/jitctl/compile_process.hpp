// jitctl precompile's compiles, each in a process of its own: NVRTC's LLVM
// aborts (SIGABRT, or faults) when an allocation fails, inside
// nvrtcCompileProgram, where no handler can catch it. A compile run in a child
// process that dies is a failure of that kernel, with the signal and its likely
// cause, never the end of jitctl.
//
// A CompileProcess is jitctl itself, started with posix_spawn from
// /proc/self/exe in its worker mode (kCompileWorkerCommand; nothing of the
// parent's threads or memory carries over): it builds the jobs it is sent one
// at a time through its own Builder over the environment's cache (lookup,
// NVRTC, publish) and sends each outcome back over a socket. One per compile
// thread, started once and again after a death. libkjit's JIT path compiles in
// its host's process, as a library must; this is jitctl's alone.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "kjit/base/expected.hpp"
#include "kjit/builder/builder.hpp"
#include "kjit/codegen/arch.hpp"
#include "kjit/codegen/kernel_spec.hpp"

namespace kjit::tools {

// What one precompile job came to.
struct JobOutcome {
  enum class Kind { compiled, cached, failed };
  Kind kind = Kind::failed;
  std::string key;       // of the kernel built (compiled or cached)
  std::string error;     // why it failed
  uint64_t evicted = 0;  // entries a compile process's store evicted while building it
};

// Builds `spec` for `arch` in this process, whatever happens short of a
// signal: an exception (out of memory) is a failure with its message.
JobOutcome build_here(Builder& builder, const codegen::KernelSpec& spec, const codegen::ArchInfo& arch);

class CompileProcess {
 public:
  // A started worker, or why none could be (no processes left under
  // ulimit -u, no /proc/self/exe).
  static Expected<CompileProcess> start();
  CompileProcess(CompileProcess&& other) noexcept;
  CompileProcess& operator=(CompileProcess&&) = delete;
  CompileProcess(const CompileProcess&) = delete;
  ~CompileProcess();  // closes the socket (the worker exits) and waits for it

  // `spec` for `arch`, built in the worker. A worker that dies or answers
  // nonsense makes this a failure saying how it ended; it is gone then
  // (alive() is false) and the next job needs another.
  JobOutcome build(const codegen::KernelSpec& spec, const codegen::ArchInfo& arch);
  bool alive() const { return pid_ > 0; }

 private:
  CompileProcess(pid_t pid, int socket) : pid_(pid), socket_(socket) {}
  std::string end();  // closes, reaps; how the worker ended, as a sentence

  pid_t pid_ = -1;
  int socket_ = -1;
};

// argv[1] of a worker: `jitctl __compile-worker` is started by precompile only.
inline constexpr const char* kCompileWorkerCommand = "__compile-worker";

// The worker's main: jobs in, outcomes out, on fd 3, until the parent closes it.
int compile_worker_main();

}  // namespace kjit::tools
