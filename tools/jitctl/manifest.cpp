// Manifest parsing. Each kernel entry is a spec in codegen's JSON form; a
// field given as a list expands into one spec per value (e.g. "out":
// ["bf16", "f16"]), so model manifests stay short. Nothing expands before
// everything is checked: the text's size and nesting, then every field of
// every entry against the table below (known names, types, values, bounds),
// then the count the lists multiply to. Codegen then checks what spans fields
// (vec divides cols ...) on each expanded spec.
#include "manifest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <unordered_set>

#include <fmt/format.h>

#include "suggest.hpp"

namespace kjit::tools {
namespace {

using nlohmann::json;
using Field = codegen::FieldRule;

constexpr int kManifestVersion = 1;

std::unexpected<Error> invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

// A value as JSON, ASCII only and cut short: it goes into an error message.
std::string excerpt(const json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 60) + " ...";
  return text;
}

// The JSON path of `key` in the object at `path`: path.key, or path["odd key"].
std::string member(std::string_view path, const std::string& key) {
  const bool plain = !key.empty() && key.size() <= 64 && std::all_of(key.begin(), key.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (plain) return path.empty() ? key : fmt::format("{}.{}", path, key);
  return fmt::format("{}[{}]", path, excerpt(json(key)));
}

bool integer_in(const json& v, int64_t min, int64_t max) {
  // A JSON number without a sign parses as unsigned: compare it as one (it may be past INT64_MAX).
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(max) && v.get<int64_t>() >= min;
  return v.is_number_integer() && v.get<int64_t>() >= min && v.get<int64_t>() <= max;
}

std::string expected(const Field& field) {
  switch (field.kind) {
    case Field::Kind::text: return fmt::format("one of: {}", fmt::join(field.values, ", "));
    case Field::Kind::integer: return fmt::format("an integer from {} to {}", field.min, field.max);
    case Field::Kind::boolean: return "true or false";
    case Field::Kind::integers:
      return fmt::format("{}, {} integers from {} to {}", field.shape, field.count, field.min, field.max);
  }
  return {};
}

Expected<void> check_value(const Field& field, const json& v, const std::string& path) {
  const auto wrong = [&](std::string_view what) { return invalid(fmt::format("{}: got {}, expected {}", path, excerpt(v), what)); };
  switch (field.kind) {
    case Field::Kind::text:
      if (!v.is_string() || std::find(field.values.begin(), field.values.end(), v.get<std::string>()) == field.values.end())
        return wrong(expected(field));
      return {};
    case Field::Kind::integer:
      if (!integer_in(v, field.min, field.max)) return wrong(expected(field));
      return {};
    case Field::Kind::boolean:
      if (!v.is_boolean()) return wrong(expected(field));
      return {};
    case Field::Kind::integers:
      if (!v.is_array() || v.size() != field.count) return wrong(expected(field));
      for (size_t i = 0; i < v.size(); ++i)
        if (!integer_in(v[i], field.min, field.max))
          return invalid(fmt::format("{}[{}]: got {}, expected an integer from {} to {}", path, i, excerpt(v[i]),
                                     field.min, field.max));
      return {};
  }
  return {};
}

// A field given as a list: the entry expands into one spec per value.
struct Axis {
  std::string field;
  const json* values;
};

// Checks every field of one kernel entry; returns its list-valued fields.
Expected<std::vector<Axis>> check_entry(const json& entry, const std::string& path) {
  if (!entry.is_object()) return invalid(fmt::format("{}: got {}, expected an object (a kernel spec)", path, excerpt(entry)));
  // The fields and what each may hold are the family's own (codegen's Family<Spec>::schema).
  const auto ops = codegen::spec_ops();
  if (!entry.contains("op"))
    return invalid(fmt::format("{}.op: missing, expected one of: {}", path, fmt::join(ops, ", ")));
  const json& op = entry["op"];
  const std::vector<Field>* fields = op.is_string() ? codegen::spec_schema(op.get<std::string>()) : nullptr;
  if (!fields)
    return invalid(fmt::format("{}.op: got {}, expected one of: {}", path, excerpt(op), fmt::join(ops, ", ")));

  std::vector<Axis> axes;
  for (const auto& [key, value] : entry.items()) {
    if (key == "op") continue;
    const auto at = member(path, key);
    const auto field = std::find_if(fields->begin(), fields->end(), [&](const Field& f) { return f.name == key; });
    if (field == fields->end()) {
      std::vector<std::string_view> known{"op"};
      for (const auto& f : *fields) known.push_back(f.name);
      return invalid(fmt::format("{}: unknown field (known: {})", at, fmt::join(known, ", ")));
    }
    if (value.is_array() && field->kind != Field::Kind::integers) {
      if (value.empty()) return invalid(fmt::format("{}: an empty list expands to no kernel", at));
      for (size_t i = 0; i < value.size(); ++i) KJIT_TRY(check_value(*field, value[i], fmt::format("{}[{}]", at, i)));
      axes.push_back({key, &value});
    } else {
      KJIT_TRY(check_value(*field, value, at));
    }
  }
  for (const auto& field : *fields)
    if (field.required && !entry.contains(field.name))
      return invalid(fmt::format("{}.{}: missing, expected {}", path, field.name, expected(field)));
  return axes;
}

// What an entry's lists multiply to, for the error past the limit:
// "80 x 20 (cols x convention) = 1600 kernels".
std::string expansion(const std::vector<Axis>& axes, uint64_t product, bool overflow) {
  if (axes.empty()) return "1 kernel";
  std::vector<size_t> sizes;
  std::vector<std::string_view> names;
  for (const auto& axis : axes) {
    sizes.push_back(axis.values->size());
    names.push_back(axis.field);
  }
  return fmt::format("{} ({}) = {} kernels", fmt::join(sizes, " x "), fmt::join(names, " x "),
                     overflow ? std::string("more than 2^64") : std::to_string(product));
}

// Specs in first-seen order, without repeats (hashed: a manifest may list 100k).
struct SpecList {
  std::vector<codegen::KernelSpec>& kernels;
  std::unordered_set<codegen::KernelSpec, codegen::SpecHash> seen{kernels.begin(), kernels.end()};
  void add(const codegen::KernelSpec& spec) {
    if (seen.insert(spec).second) kernels.push_back(spec);
  }
};

// Every spec of one checked entry, the last list varying fastest.
Expected<void> expand(const json& entry, const std::vector<Axis>& axes, const std::string& path, SpecList& out) {
  json one = entry;
  std::vector<size_t> at(axes.size(), 0);
  while (true) {
    std::string chosen;
    for (size_t a = 0; a < axes.size(); ++a) {
      const json& value = (*axes[a].values)[at[a]];
      one[axes[a].field] = value;
      chosen += fmt::format("{}{}[{}] = {}", a == 0 ? " with " : ", ", axes[a].field, at[a], excerpt(value));
    }
    // Codegen reads a block only beside per_block scales: anywhere else it would be dropped silently.
    if (one.contains("block") && (!one.contains("scale") || one["scale"] != "per_block"))
      return invalid(fmt::format("{}.block{}: only meaningful with scale per_block", path, chosen));
    auto spec = codegen::spec_from_json(one);
    if (!spec) return fail(spec.error().code, fmt::format("{}{}: {}", path, chosen, spec.error().message));
    out.add(*spec);
    size_t a = axes.size();
    for (; a > 0; --a) {
      if (++at[a - 1] < axes[a - 1].values->size()) break;
      at[a - 1] = 0;
    }
    if (a == 0) return {};
  }
}

// The deepest nesting, checked on the text: nlohmann's parser does not
// recurse, but copying, comparing and printing a parsed value do.
Expected<void> check_nesting(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        const auto line_start = text.rfind('\n', i);
        const size_t column = line_start == std::string_view::npos ? i + 1 : i - line_start;
        return invalid(fmt::format("line {}, column {} (byte {}): arrays and objects nested deeper than {} levels",
                                   1 + std::count(text.begin(), text.begin() + static_cast<long>(i), '\n'), column,
                                   i, max_depth));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return {};
}

// A parser callback that sets `repeated` to the JSON path of the first field
// an object names twice: JSON allows it and nlohmann keeps the last value,
// so {"cols": 64, "cols": 128} would drop a value silently.
json::parser_callback_t repeated_fields(std::string& repeated) {
  struct Frame {
    bool array;
    size_t index = 0;                     // array: the element being read
    std::string key = {};                 // object: the field being read
    std::unordered_set<std::string> keys = {};  // object: the fields read
  };
  auto frames = std::make_shared<std::vector<Frame>>();
  return [frames, &repeated](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: frames->push_back({.array = false}); break;
      case json::parse_event_t::array_start: frames->push_back({.array = true}); break;
      case json::parse_event_t::key: {
        auto& object = frames->back();
        object.key = parsed.get<std::string>();
        if (!object.keys.insert(object.key).second && repeated.empty()) {
          for (const auto& frame : *frames)
            repeated = frame.array ? fmt::format("{}[{}]", repeated, frame.index) : member(repeated, frame.key);
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames->pop_back();
        [[fallthrough]];
      case json::parse_event_t::value:
        if (!frames->empty() && frames->back().array) ++frames->back().index;
        break;
    }
    return true;
  };
}

struct Parsed {
  Manifest manifest;
  size_t expanded = 0;  // specs before de-duplication
};

// Parses one document; `expanded_before` counts specs of manifests read
// before it (its includer and earlier includes) against the kernel limit.
Expected<Parsed> parse_document(std::string_view text, const ManifestLimits& limits, size_t expanded_before) {
  if (text.size() > limits.max_bytes)
    return invalid(fmt::format("{} bytes, more than the limit {}", text.size(), limits.max_bytes));
  KJIT_TRY(check_nesting(text, limits.max_depth));
  json doc;
  std::string repeated;  // the path of the first field an object names twice
  try {
    doc = json::parse(text, repeated_fields(repeated));
  } catch (const json::exception& e) {
    // e.g. "[json.exception.parse_error.101] parse error at line 3, column 7: syntax error ... last read: '..'"
    std::string why = e.what();
    if (why.size() > 300) why = why.substr(0, 296) + " ...";
    return invalid(fmt::format("not valid JSON: {}", why));
  }
  if (!repeated.empty()) return invalid(fmt::format("{}: given twice in one object (JSON would keep the last)", repeated));
  if (!doc.is_object()) return invalid(fmt::format("got {}, expected a JSON object", excerpt(doc)));
  static const std::vector<std::string_view> kTopLevel{"kjit_manifest", "name", "source", "include", "kernels"};
  for (const auto& [key, value] : doc.items())
    if (std::find(kTopLevel.begin(), kTopLevel.end(), key) == kTopLevel.end())
      return invalid(fmt::format("{}: unknown field (known: {})", member("", key), fmt::join(kTopLevel, ", ")));
  if (!doc.contains("kjit_manifest") || !integer_in(doc["kjit_manifest"], kManifestVersion, kManifestVersion))
    return invalid(fmt::format("kjit_manifest: got {}, expected {} (the format version)",
                               doc.contains("kjit_manifest") ? excerpt(doc["kjit_manifest"]) : "nothing",
                               kManifestVersion));
  Parsed parsed;
  Manifest& m = parsed.manifest;
  for (const char* field : {"name", "source"})
    if (doc.contains(field) && !doc[field].is_string())
      return invalid(fmt::format("{}: got {}, expected a string", field, excerpt(doc[field])));
  if (doc.contains("name")) m.name = doc["name"].get<std::string>();
  if (doc.contains("include")) {
    const json& include = doc["include"];
    if (!include.is_array()) return invalid(fmt::format("include: got {}, expected a list of file names", excerpt(include)));
    for (size_t i = 0; i < include.size(); ++i) {
      if (!include[i].is_string() || include[i].get<std::string>().empty())
        return invalid(fmt::format("include[{}]: got {}, expected a file name", i, excerpt(include[i])));
      m.includes.push_back(include[i].get<std::string>());
    }
  }
  if (!doc.contains("kernels") || !doc["kernels"].is_array())
    return invalid(fmt::format("kernels: got {}, expected a list of kernel specs",
                               doc.contains("kernels") ? excerpt(doc["kernels"]) : "nothing"));
  const json& kernels = doc["kernels"];
  if (kernels.empty() && m.includes.empty()) return invalid("kernels: empty and nothing included: the manifest compiles nothing");

  std::vector<std::vector<Axis>> axes;
  for (size_t i = 0; i < kernels.size(); ++i) axes.push_back(KJIT_TRY(check_entry(kernels[i], fmt::format("kernels[{}]", i))));

  size_t total = expanded_before;
  for (size_t i = 0; i < kernels.size(); ++i) {
    uint64_t product = 1;
    bool overflow = false;
    for (const auto& axis : axes[i]) overflow |= __builtin_mul_overflow(product, axis.values->size(), &product);
    if (overflow || product > limits.max_kernels)
      return invalid(fmt::format("kernels[{}] expands to {}, more than the limit {}", i,
                                 expansion(axes[i], product, overflow), limits.max_kernels));
    total += product;
    if (total > limits.max_kernels)
      return invalid(fmt::format("kernels[{}] expands to {}, {} with the entries before it, more than the limit {}", i,
                                 expansion(axes[i], product, false), total, limits.max_kernels));
  }
  parsed.expanded = total - expanded_before;

  SpecList list{m.kernels};
  for (size_t i = 0; i < kernels.size(); ++i) KJIT_TRY(expand(kernels[i], axes[i], fmt::format("kernels[{}]", i), list));
  return parsed;
}

// The whole file, if it is a regular one of at most `max_bytes` (checked
// before reading and while reading: it may grow).
Expected<std::string> read_regular_file(const std::filesystem::path& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return invalid(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0) return invalid(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) return invalid(fmt::format("{}: not a regular file", path.string()));
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    return invalid(fmt::format("{}: {} bytes, more than the limit {}", path.string(), st.st_size, max_bytes));
  std::string text(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t used = 0;
  while (true) {
    if (used == text.size()) {
      if (used > max_bytes)
        return invalid(fmt::format("{}: grew past the limit {} bytes while read", path.string(), max_bytes));
      text.resize(std::min(2 * text.size(), max_bytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + used, text.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return invalid(fmt::format("{}: cannot read: {}", path.string(), std::strerror(errno)));
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  text.resize(used);
  return text;
}

const BundledManifest* find_bundled(std::string_view file) {
  for (const auto& bundled : bundled_manifests())
    if (bundled.file == file) return &bundled;
  return nullptr;
}

struct Reader {
  Reader(const ManifestLimits& limits_, bool bundled_) : limits(limits_), bundled(bundled_) {}
  const ManifestLimits& limits;
  bool bundled;         // the files are bundled_manifests(), their paths "bundled/NAME.json"
  size_t bytes = 0;     // read so far, includes together
  size_t expanded = 0;  // specs so far, includes together
  std::vector<std::filesystem::path> chain;  // the files including the one being read, for cycles

  Expected<std::string> text_of(const std::filesystem::path& path) const {
    if (!bundled) return read_regular_file(path, limits.max_bytes);
    const BundledManifest* found = path.parent_path() == "bundled" ? find_bundled(path.filename().string()) : nullptr;
    if (!found) return invalid(fmt::format("{}: no such bundled manifest", path.string()));
    if (found->text.size() > limits.max_bytes)
      return invalid(fmt::format("{}: {} bytes, more than the limit {}", path.string(), found->text.size(),
                                 limits.max_bytes));
    return std::string(found->text);
  }

  Expected<Manifest> read(const std::filesystem::path& path) {
    auto text = KJIT_TRY(text_of(path));
    bytes += text.size();
    if (bytes > limits.max_bytes)
      return invalid(fmt::format("{}: with the manifests read before it, {} bytes, more than the limit {}",
                                 path.string(), bytes, limits.max_bytes));
    // Includes nest a few levels: deeper is a mistake (and each level is a stack frame).
    if (chain.size() > 8) return invalid(fmt::format("{}: includes nest more than 8 deep", path.string()));
    std::error_code ec;
    const auto canonical = bundled ? path.lexically_normal() : std::filesystem::canonical(path, ec);
    if (std::find(chain.begin(), chain.end(), canonical) != chain.end())
      return invalid(fmt::format("{}: includes itself", path.string()));
    auto parsed = parse_document(text, limits, expanded);
    if (!parsed) return fail(parsed.error().code, fmt::format("{}: {}", path.string(), parsed.error().message));
    expanded += parsed->expanded;
    Manifest m = std::move(parsed->manifest);
    chain.push_back(canonical);
    SpecList list{m.kernels};
    for (const auto& included : m.includes) {
      auto sub = read(path.parent_path() / included);
      if (!sub) return fail(sub.error().code, fmt::format("{} (included from {})", sub.error().message, path.string()));
      for (const auto& spec : sub->kernels) list.add(spec);
    }
    chain.pop_back();
    return m;
  }
};

}  // namespace

Expected<Manifest> parse_manifest(std::string_view text, const ManifestLimits& limits) {
  auto parsed = KJIT_TRY(parse_document(text, limits, 0));
  return std::move(parsed.manifest);
}

Expected<Manifest> read_manifest(const std::string& path, const ManifestLimits& limits) {
  return Reader(limits, false).read(path);
}

std::vector<std::string> bundled_manifest_names() {
  std::vector<std::string> names;
  for (const auto& bundled : bundled_manifests()) {
    std::string_view file = bundled.file;
    file.remove_suffix(std::string_view(".json").size());
    names.emplace_back(file);
  }
  return names;
}

Expected<Manifest> read_bundled_manifest(std::string_view name, const ManifestLimits& limits) {
  std::string file(name);
  if (!file.ends_with(".json")) file += ".json";
  if (file.find('/') != std::string::npos || !find_bundled(file)) {
    std::string stem = file.substr(0, file.size() - 5);
    const auto names = bundled_manifest_names();
    return invalid(fmt::format("no manifest file or bundled manifest named '{}'{}; bundled: {} (or give a path)",
                               name, did_you_mean(stem, names), fmt::join(names, ", ")));
  }
  return Reader(limits, true).read(std::filesystem::path("bundled") / file);
}

Expected<Manifest> load_manifest(const std::string& path_or_name, const ManifestLimits& limits) {
  std::error_code ec;
  if (path_or_name.find('/') != std::string::npos || std::filesystem::exists(path_or_name, ec))
    return read_manifest(path_or_name, limits);
  return read_bundled_manifest(path_or_name, limits);
}

}  // namespace kjit::tools
