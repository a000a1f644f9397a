// The cache key: a BLAKE3 hash over everything that changes the compiled
// cubin, and nothing that does not. Inputs: kjit's entry format version, the
// exact NVRTC version (its built-in headers with it; NVRTC reads no other
// file: kjit::compile_options), the exact arch string, the compile options in order, and the
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
};

// 64 lowercase hex characters.
std::string cache_key(const CompileInputs& inputs);

}  // namespace kjit::codegen
