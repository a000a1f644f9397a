// File names inside a cache root (see the layout in kjit/cache/store.hpp):
// building them from a key and recognising them when scanning a shard.
// Internal to cache/.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

namespace kjit::cache::detail {

inline constexpr std::string_view kEntrySuffix = ".kjit";
inline constexpr std::string_view kUsedSuffix = ".used";
inline constexpr std::string_view kLockSuffix = ".lock";
inline constexpr std::string_view kTempMarker = ".tmp-";

enum class FileKind { entry, used_stamp, lock, temp, other };

struct ParsedName {
  FileKind kind = FileKind::other;
  std::string key;
  // For temp files: the writer's host tag and pid (see temp_name).
  std::string host_tag;
  pid_t pid = 0;
};

std::string shard_of(std::string_view key);  // the first two hex digits
std::string entry_name(std::string_view key);
std::string used_name(std::string_view key);
std::string lock_name(std::string_view key);

// A fresh temp name for `key`: <key>.tmp-<host tag>-<pid>-<tid>-<random hex>.
// Unique across threads, processes and hosts sharing a root.
std::string temp_name(std::string_view key);

// What a file name found in a shard directory is.
ParsedName parse_name(std::string_view name);

// A short tag naming this machine and pid namespace (hostname, boot id, pid
// namespace), so that a scan judges a temp file's pid only when the pid means
// the same process here as it did to its writer.
const std::string& host_tag();

bool is_shard_name(std::string_view name);

}  // namespace kjit::cache::detail
