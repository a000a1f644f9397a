// The store's configuration from the environment, and the small parsers it
// needs (keys, byte sizes, durations). The only place in cache/ that reads environment
// variables, apart from the test-only fault hook in store.cpp.
#include <pwd.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>

#include "kjit/cache/store.hpp"
#include "kjit/base/log.hpp"
#include "posix_io.hpp"

namespace kjit::cache {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

std::string home_from_passwd() {
  struct passwd entry {};
  struct passwd* found = nullptr;
  char buffer[4096];
  if (::getpwuid_r(::geteuid(), &entry, buffer, sizeof buffer, &found) != 0 || found == nullptr) return {};
  return found->pw_dir ? std::string(found->pw_dir) : std::string();
}

std::string default_writable_root() {
  if (std::string dir = env("KJIT_CACHE_DIR"); !dir.empty()) return dir;
  // The XDG base directory spec says relative values are invalid and ignored.
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg.front() == '/')
    return detail::join_path(xdg, "kjit");
  std::string home = env("HOME");
  if (home.empty()) home = home_from_passwd();
  if (home.empty()) return {};
  return detail::join_path(detail::join_path(home, ".cache"), "kjit");
}

std::vector<std::string> split_path_list(std::string_view list) {
  std::vector<std::string> parts;
  while (!list.empty()) {
    std::size_t colon = list.find(':');
    std::string_view part = list.substr(0, colon);
    if (!part.empty()) parts.emplace_back(part);
    if (colon == std::string_view::npos) break;
    list.remove_prefix(colon + 1);
  }
  return parts;
}

// The multiplier of a size suffix ("", "K", "KB", "KiB", ... any case), or 0.
uint64_t suffix_multiplier(std::string_view suffix) {
  if (suffix.empty()) return 1;
  static constexpr std::string_view units = "KMGT";
  std::size_t power = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
  if (power == std::string_view::npos) return 0;
  std::string rest;
  for (char c : suffix.substr(1)) rest += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (rest != "" && rest != "b" && rest != "ib") return 0;
  return uint64_t{1} << (10 * (power + 1));
}

}  // namespace

bool is_valid_key(std::string_view key) {
  if (key.size() < 16 || key.size() > 128) return false;
  for (char c : key)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  uint64_t number = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  uint64_t multiplier = suffix_multiplier(text.substr(static_cast<std::size_t>(end - text.data())));
  if (multiplier == 0) return std::nullopt;
  if (number > std::numeric_limits<uint64_t>::max() / multiplier) return std::nullopt;
  return number * multiplier;
}

std::optional<std::chrono::seconds> parse_duration(std::string_view text) {
  int64_t count = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), count);
  if (ec != std::errc() || end == text.data() || count < 0 || text.front() == '-') return std::nullopt;
  const std::string_view unit = text.substr(static_cast<std::size_t>(end - text.data()));
  int64_t unit_seconds = 0;
  if (unit == "s") unit_seconds = 1;
  else if (unit == "m") unit_seconds = 60;
  else if (unit == "h") unit_seconds = 3600;
  else if (unit == "d") unit_seconds = 86400;
  else if (unit == "w") unit_seconds = 7 * 86400;
  else return std::nullopt;
  if (count > std::numeric_limits<int64_t>::max() / unit_seconds) return std::nullopt;
  return std::chrono::seconds(count * unit_seconds);
}

StoreConfig config_from_environment() {
  StoreConfig config;
  config.writable_root = default_writable_root();
  config.read_only_roots = split_path_list(env("KJIT_CACHE_PATH"));
  if (std::string max = env("KJIT_CACHE_MAX_BYTES"); !max.empty()) {
    auto bytes = parse_byte_size(max);
    if (bytes && *bytes > 0) {
      config.max_bytes = *bytes;
    } else {
      log::warn("KJIT_CACHE_MAX_BYTES={} is not a positive size (e.g. 4294967296, 512M, 4G); using {} bytes", max,
                kDefaultMaxBytes);
    }
  }
  return config;
}

}  // namespace kjit::cache
