// kjit's one logger: lines on stderr prefixed "kjit: <level>:", filtered by
// KJIT_LOG (error, warn, info, debug; default warn), read once per process.
// An unknown KJIT_LOG value is reported once and treated as the default.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace kjit::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

inline Level threshold() {
  static const Level level = [] {
    const char* env = std::getenv("KJIT_LOG");
    const std::string_view v = env ? env : "";
    if (v == "error") return Level::error;
    if (v == "info") return Level::info;
    if (v == "debug") return Level::debug;
    if (!v.empty() && v != "warn" && v != "warning")
      std::fputs(fmt::format("kjit: warning: KJIT_LOG='{}' is not one of error, warn, info, debug; using warn\n", v)
                     .c_str(),
                 stderr);
    return Level::warn;
  }();
  return level;
}

inline bool enabled(Level level) { return level <= threshold(); }

template <class... Args>
void write(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (!enabled(level)) return;
  static constexpr const char* names[] = {"error", "warning", "info", "debug"};
  std::string line = fmt::format("kjit: {}: ", names[static_cast<int>(level)]);
  fmt::format_to(std::back_inserter(line), format, std::forward<Args>(args)...);
  line += '\n';
  std::fputs(line.c_str(), stderr);  // one call per line: lines from threads don't interleave
}

template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) { write(Level::warn, f, std::forward<Args>(a)...); }
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... a) { write(Level::info, f, std::forward<Args>(a)...); }
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) { write(Level::debug, f, std::forward<Args>(a)...); }

}  // namespace kjit::log
