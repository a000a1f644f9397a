// What jitctl writes: every text it prints or puts in JSON passes here, made
// safe by kjit/base/text.hpp (paths, roots, entry text and messages may hold
// any bytes; invalid UTF-8 would make the JSON library throw, control bytes
// would reach the terminal).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kjit/base/text.hpp"

namespace kjit::tools {

// A text as it may reach the terminal, on one line (or several, with keep_newlines).
inline std::string shown(std::string_view text, bool keep_newlines = false) {
  return text::printable(text, keep_newlines);
}

// `value` with every string (object keys included) made valid UTF-8.
inline nlohmann::json json_safe(const nlohmann::json& value) {
  if (value.is_string()) return text::valid_utf8(value.get_ref<const std::string&>());
  if (value.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : value) out.push_back(json_safe(item));
    return out;
  }
  if (value.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, item] : value.items()) out[text::valid_utf8(key)] = json_safe(item);
    return out;
  }
  return value;
}

// The way jitctl prints text: formatted, then made printable whole (newlines
// and tabs kept), so no argument can carry an escape sequence or invalid UTF-8.
template <class... Args>
void out(fmt::format_string<Args...> format, Args&&... args) {
  std::fputs(text::printable(fmt::format(format, std::forward<Args>(args)...), true).c_str(), stdout);
}
template <class... Args>
void err(fmt::format_string<Args...> format, Args&&... args) {
  std::fputs(text::printable(fmt::format(format, std::forward<Args>(args)...), true).c_str(), stderr);
}

// The one way jitctl prints a JSON document: on stdout, indented, never throwing on its text.
inline void print_json(const nlohmann::json& value) { fmt::print("{}\n", json_safe(value).dump(2)); }

}  // namespace kjit::tools
