// Precompile manifests: JSON documents listing kernel specs, bundled under
// tools/manifests/ (format and limits in tools/manifests/README.md).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/kernel_spec.hpp"

namespace kjit::tools {

struct Manifest {
  std::string name;
  std::vector<codegen::KernelSpec> kernels;  // deduplicated, in file order
  std::vector<std::string> includes;         // other manifests, relative to this one
};

// What a manifest may cost before it is refused: a file or a careless list
// must not exhaust memory, the stack or the precompile's time.
struct ManifestLimits {
  size_t max_bytes = size_t{16} << 20;  // of one file, and of a manifest and its includes together
  int max_depth = 32;                   // nesting of arrays and objects (the bundled ones nest 4 deep)
  size_t max_kernels = 100'000;         // specs the kernel entries expand to, includes together
};

// Parses a manifest document: every field of every entry is checked before
// anything expands; errors name the JSON path (kernels[2].cols[1]) and what
// was expected.
Expected<Manifest> parse_manifest(std::string_view text, const ManifestLimits& limits = {});
// Reads a manifest file (a regular file) and the manifests it includes (paths
// relative to it); errors start with the file's path.
Expected<Manifest> read_manifest(const std::string& path, const ManifestLimits& limits = {});

// The manifests of tools/manifests/, compiled in (cmake/EmbedManifests.cmake):
// file name ("deepseek-v3.json") and text, sorted by name.
struct BundledManifest {
  std::string_view file;
  std::string_view text;
};
std::span<const BundledManifest> bundled_manifests();
// Their names: the file names without ".json" ("deepseek-v3").
std::vector<std::string> bundled_manifest_names();
// A bundled manifest by name ("deepseek-v3" or "deepseek-v3.json"); the
// manifests it includes are bundled ones. An unknown name is an error listing
// the bundled names (and the nearest one).
Expected<Manifest> read_bundled_manifest(std::string_view name, const ManifestLimits& limits = {});
// What `--manifest` takes: a path (it has a '/' or names an existing file), or
// else the name of a bundled manifest.
Expected<Manifest> load_manifest(const std::string& path_or_name, const ManifestLimits& limits = {});

}  // namespace kjit::tools
