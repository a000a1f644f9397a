// NVRTC, dlopen'ed on first compile: kjit serves a precompiled cache on a
// machine without the CUDA toolkit and only needs libnvrtc to compile.
#pragma once

#include <string>
#include <vector>

#include "kjit/base/expected.hpp"

namespace kjit {

struct CompiledKernel {
  std::vector<char> cubin;
  std::string log;  // NVRTC's log, kept even on success (warnings)
  double seconds = 0;
};

class Nvrtc {
 public:
  // Loads libnvrtc: KJIT_NVRTC_LIBRARY, then libnvrtc.so.<major> on the loader
  // path, then the toolkit's lib64 (CUDA_HOME, CUDA_PATH, /usr/local/cuda).
  static Expected<const Nvrtc*> load();

  // "13.0"
  const std::string& version() const { return version_; }
  // Real path of the loaded library, for `jitctl info`.
  const std::string& library_path() const { return library_path_; }
  // Targets this NVRTC can build cubins for, e.g. "sm_90a".
  bool supports(const std::string& arch) const;

  // Compiles one translation unit to a cubin for `arch`; on failure the
  // error carries NVRTC's log.
  Expected<CompiledKernel> compile(const std::string& source, const std::string& name, const std::string& arch,
                                   const std::vector<std::string>& options) const;

 private:
  struct Api;
  const Api* api_ = nullptr;
  std::string version_;
  bool has_own_cache_ = false;  // NVRTC 12.9+ caches compiles in the driver's compute cache unless told not to
  std::string library_path_;
  std::vector<int> archs_;  // numeric, e.g. 90, 100, 120
};

// "13.0": the CUDA toolkit kjit was built against, the NVRTC version cache
// keys assume until NVRTC itself is loaded (see Runtime::cubin).
std::string built_with_cuda_version();

// The compile options kjit uses for `arch`, in order (they enter the key). No
// include path: a rendered source is self-contained (the templates include only
// each other and codegen inlines them), so NVRTC reads no file and nothing
// outside the source, the options, the NVRTC version and the arch can change a
// cubin. A template that includes a toolkit header fails to compile.
// `lineinfo` adds -lineinfo: profilers' and compute-sanitizer's source lines,
// the same code in a cubin about three times the size.
std::vector<std::string> compile_options(const std::string& arch, bool lineinfo = false);

// KJIT_LINEINFO=1 in the environment: kernels compiled with line information.
bool lineinfo_from_environment();

}  // namespace kjit
