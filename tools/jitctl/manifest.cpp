// Manifest parsing. Each kernel entry is a spec in codegen's JSON form; a
// field given as a list expands into one spec per value (e.g. "out":
// ["bf16", "f16"]), so model manifests stay short.
#include "manifest.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace kjit::tools {
namespace {

constexpr int kManifestVersion = 1;

// Expands list-valued fields into the cartesian product of plain specs.
std::vector<nlohmann::json> expand(const nlohmann::json& entry) {
  std::vector<nlohmann::json> out{nlohmann::json::object()};
  for (const auto& [field, value] : entry.items()) {
    // A block ([rows, cols]) and a tile ([m, n, k]) are one value each, not alternatives.
    const bool listed = value.is_array() && field != "block" && field != "tile";
    std::vector<nlohmann::json> next;
    for (const auto& partial : out) {
      if (!listed) {
        next.push_back(partial);
        next.back()[field] = value;
        continue;
      }
      for (const auto& v : value) {
        next.push_back(partial);
        next.back()[field] = v;
      }
    }
    out = std::move(next);
  }
  return out;
}

}  // namespace

Expected<Manifest> parse_manifest(std::string_view text) {
  const auto doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return fail(KJIT_ERROR_INVALID_ARGUMENT, "manifest is not valid JSON");
  if (!doc.is_object()) return fail(KJIT_ERROR_INVALID_ARGUMENT, "manifest must be a JSON object");
  if (!doc.contains("kjit_manifest") || doc["kjit_manifest"] != kManifestVersion)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("manifest must have \"kjit_manifest\": {} (its format version)", kManifestVersion));
  if (!doc.contains("kernels") || !doc["kernels"].is_array())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "manifest must have a \"kernels\" array");
  Manifest m;
  if (doc.contains("name") && doc["name"].is_string()) m.name = doc["name"].get<std::string>();
  if (doc.contains("include")) {
    if (!doc["include"].is_array())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "manifest \"include\" must be an array of file names");
    for (const auto& inc : doc["include"]) {
      if (!inc.is_string()) return fail(KJIT_ERROR_INVALID_ARGUMENT, "manifest \"include\" entries must be strings");
      m.includes.push_back(inc.get<std::string>());
    }
  }
  size_t index = 0;
  for (const auto& entry : doc["kernels"]) {
    if (!entry.is_object())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("kernels[{}] must be a JSON object", index));
    for (const auto& one : expand(entry)) {
      auto spec = codegen::spec_from_json(one);
      if (!spec)
        return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("kernels[{}]: {}", index, spec.error().message));
      if (std::find(m.kernels.begin(), m.kernels.end(), *spec) == m.kernels.end()) m.kernels.push_back(*spec);
    }
    ++index;
  }
  return m;
}

namespace {

Expected<Manifest> read_manifest_at_depth(const std::filesystem::path& path, int depth) {
  // Includes nest at most a few levels; a cycle is an error, not a hang.
  if (depth > 8) return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("{}: includes nest too deeply (a cycle?)", path.string()));
  std::ifstream file(path, std::ios::binary);
  if (!file) return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("cannot open manifest '{}'", path.string()));
  std::stringstream text;
  text << file.rdbuf();
  auto m = parse_manifest(text.str());
  if (!m) return fail(m.error().code, fmt::format("{}: {}", path.string(), m.error().message));
  for (const auto& included : m->includes) {
    auto sub = read_manifest_at_depth(path.parent_path() / included, depth + 1);
    if (!sub) return std::unexpected(sub.error());
    for (const auto& spec : sub->kernels)
      if (std::find(m->kernels.begin(), m->kernels.end(), spec) == m->kernels.end()) m->kernels.push_back(spec);
  }
  return m;
}

}  // namespace

Expected<Manifest> read_manifest(const std::string& path) { return read_manifest_at_depth(path, 0); }

}  // namespace kjit::tools
