// Precompile manifests: JSON documents listing kernel specs, bundled under
// tools/manifests/ (format in tools/manifests/README.md).
#pragma once

#include <string>
#include <vector>

#include "kjit/codegen/kernel_spec.hpp"

namespace kjit::tools {

struct Manifest {
  std::string name;
  std::vector<codegen::KernelSpec> kernels;  // deduplicated, in file order
  std::vector<std::string> includes;         // other manifests, relative to this one
};

// Parses a manifest document; errors name the kernel index and field.
Expected<Manifest> parse_manifest(std::string_view text);
// Reads a manifest file and the manifests it includes (paths relative to it).
Expected<Manifest> read_manifest(const std::string& path);

}  // namespace kjit::tools
