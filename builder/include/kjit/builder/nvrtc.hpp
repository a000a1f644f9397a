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
  std::string library_path_;
  std::vector<int> archs_;  // numeric, e.g. 90, 100, 120
};

// "13.0": the CUDA toolkit kjit was built against, the NVRTC version cache
// keys assume until NVRTC itself is loaded (see Runtime::cubin).
std::string built_with_cuda_version();

// The compile options kjit uses for `arch`, in order (they enter the key).
std::vector<std::string> compile_options(const std::string& arch);

// The CUDA toolkit's include directory, found without the user setting
// anything: KJIT_CUDA_INCLUDE, CUDA_HOME, CUDA_PATH, next to libnvrtc,
// /usr/local/cuda. Empty when none holds cuda_fp16.h.
std::string cuda_include_dir();

// compile_options plus the toolkit's include directories (CCCL's <cuda/ptx>
// for the SM90 kernels). The paths stay out of the key; the headers' content
// is in it (cuda_headers_digest).
std::vector<std::string> compile_flags(const std::string& arch);

// A content hash of a header set: SHA-256 of the lines "<path> <SHA-256 of its
// bytes>\n", one per regular file under `dir` (links to files followed, paths
// relative to `dir`, sorted bytewise). builder/CMakeLists.txt computes the
// build's the same way. Empty when `dir` cannot be listed.
std::string headers_digest_of(const std::string& dir);

// A cheap stand-in for the digest: SHA-256 of the lines "<path> <size>
// <modification time, s>\n" over headers_digest_of's files (builder/CMakeLists.txt
// computes the build's the same way). Empty when `dir` cannot be listed.
std::string headers_fingerprint_of(const std::string& dir);

// The content hash of the CUDA headers NVRTC compiles against (those under
// cuda_include_dir(), KJIT_CUDA_INCLUDE or the toolkit's), computed once per
// process (where the headers show the build's fingerprint, the build's digest:
// no header is read): part of every cache key, so that other headers (an edited copy,
// another toolkit's) never share a key with these. Without a header directory
// (a serving machine without the toolkit, which cannot compile) it is
// built_with_cuda_headers(): such a machine finds what the build's toolkit
// compiled, as it does with the NVRTC version.
const std::string& cuda_headers_digest();

// headers_digest_of the include directory of the toolkit kjit was built with,
// computed at configure time.
std::string built_with_cuda_headers();
// headers_fingerprint_of the same directory, at configure time.
std::string built_with_cuda_headers_fingerprint();

}  // namespace kjit
