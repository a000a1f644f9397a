// File names inside a cache root: see layout.hpp.
#include "layout.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <llvm/Support/BLAKE3.h>

#include "kjit/cache/store.hpp"

namespace kjit::cache::detail {
namespace {

bool is_hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

std::string first_line_of(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string pid_namespace() {
  char target[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<std::size_t>(n)) : std::string();
}

uint64_t random_u64() {
  // Seeded per thread; a forked child inherits the state, but its pid differs,
  // and O_EXCL on the temp file catches any remaining collision.
  thread_local std::mt19937_64 engine{std::random_device{}() ^ static_cast<uint64_t>(::gettid())};
  return engine();
}

// "<key><suffix>" with a valid key: the key, else nullopt.
std::optional<std::string> key_with_suffix(std::string_view name, std::string_view suffix) {
  if (!name.ends_with(suffix)) return std::nullopt;
  std::string_view key = name.substr(0, name.size() - suffix.size());
  if (!is_valid_key(key)) return std::nullopt;
  return std::string(key);
}

// Temp name tail after ".tmp-": <host>-<pid>-<tid>-<random>.
bool parse_temp_tail(std::string_view tail, ParsedName& out) {
  std::size_t dash = tail.find('-');
  if (dash == std::string_view::npos) return false;
  out.host_tag = std::string(tail.substr(0, dash));
  std::string_view rest = tail.substr(dash + 1);
  long pid = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (ec != std::errc() || end == rest.data() || *end != '-') return false;
  out.pid = static_cast<pid_t>(pid);
  return true;
}

// "<key>.tmp-<tail>": fills in the key, host tag and pid.
bool is_temp_name(std::string_view name, ParsedName& out) {
  std::size_t marker = name.find(kTempMarker);
  if (marker == std::string_view::npos || !is_valid_key(name.substr(0, marker))) return false;
  if (!parse_temp_tail(name.substr(marker + kTempMarker.size()), out)) return false;
  out.key = std::string(name.substr(0, marker));
  return true;
}

}  // namespace

bool is_shard_name(std::string_view name) {
  return name.size() == 2 && is_hex_digit(name[0]) && is_hex_digit(name[1]);
}

std::string shard_of(std::string_view key) { return std::string(key.substr(0, 2)); }
std::string entry_name(std::string_view key) { return fmt::format("{}{}", key, kEntrySuffix); }
std::string used_name(std::string_view key) { return fmt::format("{}{}", key, kUsedSuffix); }
std::string lock_name(std::string_view key) { return fmt::format("{}{}", key, kLockSuffix); }

std::string temp_name(std::string_view key) {
  return fmt::format("{}{}{}-{}-{}-{:016x}", key, kTempMarker, host_tag(), ::getpid(), ::gettid(), random_u64());
}

ParsedName parse_name(std::string_view name) {
  ParsedName parsed;
  if (auto key = key_with_suffix(name, kEntrySuffix)) {
    parsed.kind = FileKind::entry;
    parsed.key = *key;
  } else if (auto used = key_with_suffix(name, kUsedSuffix)) {
    parsed.kind = FileKind::used_stamp;
    parsed.key = *used;
  } else if (auto lock = key_with_suffix(name, kLockSuffix)) {
    parsed.kind = FileKind::lock;
    parsed.key = *lock;
  } else if (is_temp_name(name, parsed)) {
    parsed.kind = FileKind::temp;
  }
  return parsed;
}

const std::string& host_tag() {
  static const std::string tag = [] {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    std::string identity = fmt::format("{}\n{}\n{}", host, first_line_of("/proc/sys/kernel/random/boot_id"),
                                       pid_namespace());
    llvm::BLAKE3 hasher;
    hasher.update(identity);
    auto digest = hasher.final<4>();
    return fmt::format("{:02x}{:02x}{:02x}{:02x}", digest[0], digest[1], digest[2], digest[3]);
  }();
  return tag;
}

}  // namespace kjit::cache::detail
