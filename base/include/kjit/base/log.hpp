// kjit's one logger: lines on stderr prefixed "kjit: <level>:", filtered by
// KJIT_LOG (error, warn, info, debug; default warn), read once per process.
// An unknown KJIT_LOG value is reported once and treated as the default.
// A callback (kjit_set_log_callback, which the Python module points at
// Python's logging) replaces stderr: it receives each message up to its own
// level, without the prefix and the newline, and KJIT_LOG is not consulted.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kjit/base/text.hpp"

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

// The callback and its user data; callback_level(): the most verbose level it takes (-1: none, stderr).
using Callback = void (*)(int level, const char* message, void* user_data);
struct Sink {
  Callback callback = nullptr;
  void* user_data = nullptr;
};
inline std::mutex& sink_mutex() {
  static std::mutex mutex;
  return mutex;
}
inline Sink& sink() {
  static Sink s;
  return s;
}
inline std::atomic<int>& callback_level() {
  static std::atomic<int> level{-1};
  return level;
}

// Sends messages of `max_level` (clamped to error..debug) and below to `callback` (nullptr: back to
// stderr under KJIT_LOG).
inline void set_callback(Callback callback, void* user_data, int max_level) {
  std::lock_guard lock(sink_mutex());
  sink() = {callback, user_data};
  callback_level().store(callback ? std::clamp(max_level, 0, static_cast<int>(Level::debug)) : -1);
}

inline bool enabled(Level level) {
  const int to_callback = callback_level().load(std::memory_order_relaxed);
  if (to_callback >= 0) return static_cast<int>(level) <= to_callback;
  return level <= threshold();
}

template <class... Args>
void write(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (!enabled(level)) return;
  // Paths and entry text may hold any bytes: escaped here, for every sink.
  std::string message = text::printable(fmt::format(format, std::forward<Args>(args)...), true);
  Sink target;
  {
    std::lock_guard lock(sink_mutex());
    target = sink();
  }
  if (target.callback) {  // called outside the lock: it may take its time (Python's GIL)
    target.callback(static_cast<int>(level), message.c_str(), target.user_data);
    return;
  }
  if (level > threshold()) return;  // the callback was removed since enabled()
  static constexpr const char* names[] = {"error", "warning", "info", "debug"};
  std::string line = fmt::format("kjit: {}: {}\n", names[static_cast<int>(level)], message);
  std::fputs(line.c_str(), stderr);  // one call per line: lines from threads don't interleave
}

template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) { write(Level::warn, f, std::forward<Args>(a)...); }
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... a) { write(Level::info, f, std::forward<Args>(a)...); }
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) { write(Level::debug, f, std::forward<Args>(a)...); }

}  // namespace kjit::log
