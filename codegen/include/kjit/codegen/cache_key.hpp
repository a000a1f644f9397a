// The cache key: a BLAKE3 hash over everything that changes the compiled
// cubin, and nothing that does not. Inputs: kjit's entry format version, the
// exact NVRTC version, a content hash of the CUDA headers NVRTC compiles
// against, the exact arch string, the compile options in order, and the
// rendered source (which already contains the template text). No absolute
// paths, host names or times take part.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace kjit::codegen {

struct CompileInputs {
  std::string_view source;
  std::string_view arch;  // e.g. "sm_90a"
  std::span<const std::string> options;
  std::string_view nvrtc_version;  // e.g. "13.0"
  int entry_format_version = 0;
  std::string_view cuda_headers;  // content hash of the CUDA header set (kjit::cuda_headers_digest)
};

// 64 lowercase hex characters.
std::string cache_key(const CompileInputs& inputs);

}  // namespace kjit::codegen
