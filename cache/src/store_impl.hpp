// The state behind kjit::cache::Store and the pieces shared by store.cpp (load,
// publish, locks) and maintenance.cpp (scans, list, verify, prune, clear,
// eviction). Internal to cache/.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "kjit/cache/entry_format.hpp"
#include "kjit/cache/store.hpp"
#include "layout.hpp"
#include "posix_io.hpp"
#include "root_access.hpp"

namespace kjit::cache {

namespace detail {

// Temp files this old are dead whatever their pid says, and so are unheld locks.
inline constexpr std::chrono::seconds kStaleAge = std::chrono::minutes(10);

struct RootRef {
  std::string path;
  RootRole role;
};

// What reading one entry file found.
enum class ReadStatus { ok, absent, corrupt, other_format, unreadable };

struct Inspection {
  ReadStatus status = ReadStatus::absent;
  std::string problem;
  format::Header header;
  nlohmann::json meta;
  format::Fields fields;
  std::vector<char> payload;  // only from a whole read of an ok entry
  uint64_t file_bytes = 0;
  int64_t mtime_ns = 0;
  dev_t device = 0;
  ino_t inode = 0;
};

enum class ReadDepth { header_and_meta, whole, payload };

// Opens and checks `name` in `shard_fd`. A whole read hashes the entry; a
// header_and_meta read checks only what list() can see without the payload; a
// payload read hashes the entry and reads the meta's bookkeeping only
// (format::decode_bookkeeping: what a loader of the payload needs).
Inspection inspect_entry(int shard_fd, const std::string& name, const std::string& path, std::string_view key,
                         ReadDepth depth);

// Removes `name`, a directory planted there with what it holds (never through
// a link, a bounded depth). False when nothing was there.
SysExpected<bool> remove_at(int dir_fd, const std::string& name, const std::string& path);

// Removes `name` (as remove_at) unless it is no longer the file that was
// inspected: a writer may have renamed a fresh entry over the bad one since.
SysExpected<bool> unlink_if_same(int dir_fd, const std::string& name, const std::string& path, dev_t device,
                                 ino_t inode);
SysExpected<bool> unlink_at(int dir_fd, const std::string& name, const std::string& path);

// One file found by a scan of a root.
struct ScannedFile {
  std::string shard;
  std::string name;
  ParsedName parsed;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
  bool regular = false;
};

// Calls `visit` once per shard directory of an open root (those that pass the
// trust rules of `role`; symlinks skipped), with the shard's files sorted by
// name. One shard is open at a time. A shard name that cannot be opened as a
// trusted directory (a link, a file, no permission, not ours) is skipped and,
// when `unopened` is given, reported there: no load can read its entries.
using ShardVisitor =
    std::function<void(int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files)>;
void for_each_shard(int root_fd, const std::string& root_path, RootRole role, const ShardVisitor& visit,
                    std::vector<Failure>* unopened = nullptr);

// An entry that eviction may remove.
struct Candidate {
  std::string key;
  std::string shard;
  uint64_t bytes = 0;
  int64_t last_used_ns = 0;  // max(mtime of the entry, of its .used stamp)
};

struct Removed {
  uint64_t count = 0;
  uint64_t bytes = 0;
};

// Called by list_root for each entry, with the shard still open.
using EntryVisitor =
    std::function<void(int shard_fd, const ScannedFile& file, const Inspection& found, EntryInfo& info)>;

}  // namespace detail

struct Store::Impl {
  explicit Impl(StoreConfig c);

  StoreConfig config;
  uint64_t max_bytes = kDefaultMaxBytes;

  std::atomic<uint64_t> hits{0}, misses{0}, corrupt{0}, published{0}, write_failures{0}, evicted{0};

  mutable std::mutex mutex;                  // guards the members below
  std::unordered_set<std::string> pinned;    // keys loaded through this Store: never evicted by it
  std::unordered_set<std::string> stamped;   // keys whose last-used stamp this Store has set
  std::optional<uint64_t> estimated_bytes;   // entry bytes in the writable root, as last seen plus publishes
  std::once_flag opened_for_writing;         // stale temps swept, size estimated
  std::mutex eviction;                       // one eviction at a time per Store

  // Roots in search order: the writable one (if any), then the read-only ones.
  std::vector<detail::RootRef> roots() const;

  // store.cpp
  std::optional<Entry> load(std::string_view key, detail::ReadDepth depth);
  std::optional<Entry> load_from(const detail::RootRef& root, std::string_view key, detail::ReadDepth depth);
  void note_use(int shard_fd, const std::string& shard_path, std::string_view key);
  Expected<void> publish(std::string_view key, const nlohmann::json& meta, std::span<const char> payload);
  detail::SysExpected<bool> write_entry(std::string_view key, std::span<const char> file);
  detail::SysExpected<void> rename_into_place(int shard_fd, const std::string& shard_path, const std::string& temp,
                                              std::string_view key);
  bool valid_entry_at(int shard_fd, const std::string& shard_path, std::string_view key);
  Expected<void> remove(std::string_view key);
  KeyLock try_lock(std::string_view key, std::chrono::milliseconds max_wait);

  // maintenance.cpp
  void open_for_writing(int root_fd);
  void account_and_evict(std::string_view just_published, uint64_t bytes);
  detail::Removed evict_lru(int root_fd, std::vector<detail::Candidate>& candidates, uint64_t total, uint64_t target,
                            std::string_view keep, std::vector<Failure>* failures = nullptr);
  std::vector<EntryInfo> list_root(const detail::RootRef& root, detail::ReadDepth depth, std::string_view key_prefix,
                                   const detail::EntryVisitor& visit = {},
                                   std::vector<Failure>* unopened = nullptr) const;
  std::vector<EntryInfo> list(const ListOptions& options) const;
  VerifyReport verify(bool fix);
  Expected<PruneReport> prune(uint64_t target_bytes);
  void prune_shard(int shard_fd, const std::string& shard_path, const std::vector<detail::ScannedFile>& files,
                   int64_t now, PruneReport& report, std::vector<detail::Candidate>& candidates, uint64_t& total);
  void prune_entry(int shard_fd, const std::string& shard_path, const detail::ScannedFile& file, PruneReport& report,
                   const std::map<std::string, int64_t>& stamps, std::vector<detail::Candidate>& candidates,
                   uint64_t& total);
  Expected<ClearReport> clear(const std::function<bool(const EntryInfo&)>& filter);
  bool is_pinned(const std::string& key) const;
};

}  // namespace kjit::cache
