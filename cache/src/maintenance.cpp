// The maintenance half of kjit::cache::Store: listing, verifying, pruning,
// clearing, sweeping stale temp files and size-capped LRU eviction.
//
// Size accounting: the first publish of a Store scans its writable root (and
// sweeps stale temp files, the "opening" of the root); later publishes add
// their bytes to that estimate, and only when it passes the cap is the root
// scanned again and, if it really is over, trimmed to 90% of the cap so that
// the next publishes do not each scan. Other processes' publishes are seen at
// the next scan; each of them keeps its own estimate and trims too.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>

#include <fmt/format.h>

#include "kjit/base/log.hpp"
#include "store_impl.hpp"

namespace kjit::cache {

using detail::join_path;
using detail::RootRef;
using detail::RootRole;
using detail::Candidate;
using detail::Removed;
using detail::ScannedFile;

namespace {

constexpr int64_t kNanosPerSecond = 1'000'000'000;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t stale_age_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(detail::kStaleAge).count(); }

// A temp file whose writer is gone: too old to be a publish in flight, or
// written on this machine by a pid that no longer exists.
bool is_stale_temp(const ScannedFile& file, int64_t now) {
  if (now - file.mtime_ns >= stale_age_ns()) return true;
  return file.parsed.host_tag == detail::host_tag() && detail::process_is_dead(file.parsed.pid);
}

// An old lock file nobody holds. Racy by nature (a process may open it just
// before the unlink and lock a file no one else sees), which costs at most a
// duplicated compile: the lock is advisory.
bool is_abandoned_lock(int shard_fd, const ScannedFile& file, int64_t now) {
  if (now - file.mtime_ns < stale_age_ns()) return false;
  detail::Fd fd(::openat(shard_fd, file.name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  return fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
}

// key -> mtime of its last-used stamp, for one shard's files.
std::map<std::string, int64_t> used_stamps(const std::vector<ScannedFile>& files) {
  std::map<std::string, int64_t> stamps;
  for (const ScannedFile& file : files)
    if (file.parsed.kind == detail::FileKind::used_stamp) stamps[file.parsed.key] = file.mtime_ns;
  return stamps;
}

int64_t last_used_ns(const ScannedFile& entry, const std::map<std::string, int64_t>& stamps) {
  auto it = stamps.find(entry.parsed.key);
  return it == stamps.end() ? entry.mtime_ns : std::max(entry.mtime_ns, it->second);
}

// Removes the lock file of `key` unless someone holds it: it is unlinked while
// this process holds it, so a holder never loses a lock it has. Racy like
// is_abandoned_lock, at the same price. False when it is held or absent.
detail::SysExpected<bool> remove_unheld_lock(int shard_fd, const std::string& shard_path, const std::string& key) {
  std::string name = detail::lock_name(key);
  detail::Fd fd(::openat(shard_fd, name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd) {
    if (errno == ENOENT) return false;
    // Not openable (say, a directory or a link): not a lock anyone holds.
    return detail::remove_at(shard_fd, name, join_path(shard_path, name));
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;
  return detail::remove_at(shard_fd, name, join_path(shard_path, name));
}

void note_failure(std::vector<Failure>* failures, const std::string& path, const detail::SysError& error) {
  if (failures) failures->push_back({path, error.message});
}

// Removes an entry (whatever is at its name), its stamp and its lock unless
// held. False when the entry was already gone. Failures to remove the stamp or
// lock go to `failures` when given.
detail::SysExpected<bool> remove_entry_files(int shard_fd, const std::string& shard_path, const std::string& key,
                                             std::vector<Failure>* failures = nullptr) {
  std::string name = detail::entry_name(key);
  auto removed = detail::remove_at(shard_fd, name, join_path(shard_path, name));
  if (!removed) return removed;  // its stamp and lock stay with it
  std::string used = detail::used_name(key);
  if (auto gone = detail::unlink_at(shard_fd, used, join_path(shard_path, used)); !gone)
    note_failure(failures, join_path(shard_path, used), gone.error());
  if (auto gone = remove_unheld_lock(shard_fd, shard_path, key); !gone)
    note_failure(failures, join_path(shard_path, detail::lock_name(key)), gone.error());
  return removed;
}

// Removes stamps and unheld locks whose entry is not in `entries`.
void remove_orphans(int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files,
                    const std::set<std::string>& entries, std::vector<Failure>& failures) {
  for (const ScannedFile& file : files) {
    if (entries.contains(file.parsed.key)) continue;
    std::string path = join_path(shard_path, file.name);
    detail::SysExpected<bool> gone = false;
    if (file.parsed.kind == detail::FileKind::used_stamp) gone = detail::remove_at(shard_fd, file.name, path);
    if (file.parsed.kind == detail::FileKind::lock) gone = remove_unheld_lock(shard_fd, shard_path, file.parsed.key);
    if (!gone) failures.push_back({path, gone.error().message});
  }
}

std::set<std::string> entry_keys(const std::vector<ScannedFile>& files) {
  std::set<std::string> keys;
  for (const ScannedFile& file : files)
    if (file.parsed.kind == detail::FileKind::entry) keys.insert(file.parsed.key);
  return keys;
}

// A time from the file system or an entry, clamped into [0, kMaxUnixSeconds).
int64_t bounded_unix(int64_t seconds) { return std::clamp<int64_t>(seconds, 0, format::kMaxUnixSeconds - 1); }

std::string fs_parent(const std::string& path) { return path.substr(0, path.rfind('/')); }

EntryState state_of(detail::ReadStatus status) {
  switch (status) {
    case detail::ReadStatus::ok:
      return EntryState::ok;
    case detail::ReadStatus::other_format:
      return EntryState::other_format;
    case detail::ReadStatus::unreadable:
      return EntryState::unreadable;
    case detail::ReadStatus::absent:
    case detail::ReadStatus::corrupt:
      break;
  }
  return EntryState::corrupt;
}

EntryInfo describe(const RootRef& root, const std::string& shard_path, const ScannedFile& file,
                   detail::Inspection& found, const std::map<std::string, int64_t>& stamps, detail::ReadDepth depth) {
  EntryInfo info;
  info.key = file.parsed.key;
  info.root = root.path;
  info.path = join_path(shard_path, file.name);
  info.read_only = root.role == RootRole::read_only;
  info.file_bytes = found.file_bytes != 0 ? found.file_bytes : file.bytes;  // open may have failed
  info.payload_bytes = found.header.payload_bytes;
  info.format_version = found.header.version;
  info.state = state_of(found.status);
  info.problem = found.problem;
  info.last_used_unix = bounded_unix(last_used_ns(file, stamps) / kNanosPerSecond);
  info.created_unix = bounded_unix(file.mtime_ns / kNanosPerSecond);
  if (found.status == detail::ReadStatus::ok) {
    info.created_unix = found.fields.created_unix;  // checked by the decoder to be in range
    info.meta = std::move(found.meta);
    info.fields = std::move(found.fields);
    info.verified = depth == detail::ReadDepth::whole;
  }
  return info;
}

}  // namespace

// ---------------------------------------------------------------- opening, eviction

void Store::Impl::open_for_writing(int root_fd) {
  std::call_once(opened_for_writing, [&] {
    uint64_t total = 0;
    uint64_t swept = 0;
    int64_t now = now_ns();
    auto visit = [&](int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files) {
      for (const ScannedFile& file : files) {
        if (file.parsed.kind == detail::FileKind::entry && file.regular) total += file.bytes;
        if (file.parsed.kind != detail::FileKind::temp || !is_stale_temp(file, now)) continue;
        if (detail::unlink_at(shard_fd, file.name, join_path(shard_path, file.name)).value_or(false)) ++swept;
      }
    };
    detail::for_each_shard(root_fd, config.writable_root, RootRole::writable, visit);
    if (swept > 0) log::info("removed {} stale temp files from {}", swept, config.writable_root);
    std::lock_guard lock(mutex);
    estimated_bytes = total;
  });
}

void Store::Impl::account_and_evict(std::string_view just_published, uint64_t bytes) {
  {
    std::lock_guard lock(mutex);
    estimated_bytes = estimated_bytes.value_or(0) + bytes;
    if (*estimated_bytes <= max_bytes) return;
  }
  std::unique_lock evicting(eviction, std::try_to_lock);
  if (!evicting.owns_lock()) return;  // another thread of this Store is trimming the root now
  auto root = detail::open_root(config.writable_root, RootRole::writable);
  if (!root) return;

  std::vector<Candidate> candidates;
  uint64_t total = 0;
  auto visit = [&](int, const std::string&, const std::vector<ScannedFile>& files) {
    auto stamps = used_stamps(files);
    for (const ScannedFile& file : files) {
      if (file.parsed.kind != detail::FileKind::entry || !file.regular) continue;
      candidates.push_back({file.parsed.key, file.shard, file.bytes, last_used_ns(file, stamps)});
      total += file.bytes;
    }
  };
  detail::for_each_shard(root->get(), config.writable_root, RootRole::writable, visit);
  if (total > max_bytes) {
    uint64_t target = max_bytes - max_bytes / 10;
    Removed removed = evict_lru(root->get(), candidates, total, target, just_published);
    evicted += removed.count;
    if (removed.count > 0)
      log::info("evicted {} cache entries ({} bytes) from {} to stay under {} bytes", removed.count, removed.bytes,
                config.writable_root, max_bytes);
    total -= removed.bytes;
  }
  std::lock_guard lock(mutex);
  estimated_bytes = total;
}

// Removes candidates, least recently used first, until `total` is at most
// `target`; never a key this Store has loaded, nor `keep`. What it could not
// remove goes to `failures` when given.
Removed Store::Impl::evict_lru(int root_fd, std::vector<Candidate>& candidates, uint64_t total, uint64_t target,
                               std::string_view keep, std::vector<Failure>* failures) {
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.last_used_ns != b.last_used_ns ? a.last_used_ns < b.last_used_ns : a.key < b.key;
  });
  Removed removed;
  for (const Candidate& candidate : candidates) {
    if (total - removed.bytes <= target) break;
    if (candidate.key == keep || is_pinned(candidate.key)) continue;
    auto shard = detail::open_shard(root_fd, config.writable_root, candidate.shard, RootRole::writable, false);
    if (!shard) continue;
    std::string shard_path = join_path(config.writable_root, candidate.shard);
    auto gone = remove_entry_files(shard->get(), shard_path, candidate.key, failures);
    if (!gone) {
      log::debug("eviction: {}", gone.error().message);
      note_failure(failures, join_path(shard_path, detail::entry_name(candidate.key)), gone.error());
      continue;
    }
    // Already gone (another process evicted it) still frees the bytes counted.
    ++removed.count;
    removed.bytes += candidate.bytes;
  }
  return removed;
}

// ---------------------------------------------------------------- list, verify

std::vector<EntryInfo> Store::Impl::list_root(const RootRef& root, detail::ReadDepth depth,
                                              std::string_view key_prefix, const detail::EntryVisitor& visit,
                                              std::vector<Failure>* unopened) const {
  std::vector<EntryInfo> infos;
  auto root_fd = detail::open_root(root.path, root.role);
  if (!root_fd) {
    if (root_fd.error().err == 0)
      detail::warn_once("untrusted:" + root.path, root_fd.error().message + "; not using it");
    return infos;
  }
  auto visit_shard = [&](int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files) {
    auto stamps = used_stamps(files);
    for (const ScannedFile& file : files) {
      if (file.parsed.kind != detail::FileKind::entry || !file.parsed.key.starts_with(key_prefix)) continue;
      std::string path = join_path(shard_path, file.name);
      detail::Inspection found = detail::inspect_entry(shard_fd, file.name, path, file.parsed.key, depth);
      if (found.status == detail::ReadStatus::absent) continue;  // removed meanwhile
      EntryInfo info = describe(root, shard_path, file, found, stamps, depth);
      if (visit) visit(shard_fd, file, found, info);
      infos.push_back(std::move(info));
    }
  };
  detail::for_each_shard(root_fd->get(), root.path, root.role, visit_shard, unopened);
  return infos;
}

std::vector<EntryInfo> Store::Impl::list(const ListOptions& options) const {
  auto depth = options.hash_payloads ? detail::ReadDepth::whole : detail::ReadDepth::header_and_meta;
  std::vector<EntryInfo> all;
  for (const RootRef& root : roots()) {
    std::vector<EntryInfo> infos = list_root(root, depth, options.key_prefix);
    std::move(infos.begin(), infos.end(), std::back_inserter(all));
  }
  return all;
}

VerifyReport Store::Impl::verify(bool fix) {
  VerifyReport report;
  for (const RootRef& root : roots()) {
    bool remove_bad = fix && root.role == RootRole::writable;
    auto fix_entry = [&](int shard_fd, const ScannedFile& file, const detail::Inspection& found, EntryInfo& info) {
      if (!remove_bad || found.status != detail::ReadStatus::corrupt) return;
      auto removed = detail::unlink_if_same(shard_fd, file.name, info.path, found.device, found.inode);
      if (!removed) {
        report.failures.push_back({info.path, removed.error().message});
        return;
      }
      if (*removed) ++report.removed;
      std::string shard_path = fs_parent(info.path);
      std::string used = detail::used_name(file.parsed.key);
      if (auto gone = detail::unlink_at(shard_fd, used, join_path(shard_path, used)); !gone)
        report.failures.push_back({join_path(shard_path, used), gone.error().message});
      if (auto gone = remove_unheld_lock(shard_fd, shard_path, file.parsed.key); !gone)
        report.failures.push_back({join_path(shard_path, detail::lock_name(file.parsed.key)), gone.error().message});
    };
    for (EntryInfo& info : list_root(root, detail::ReadDepth::whole, {}, fix_entry, &report.unreadable_shards)) {
      ++report.checked;
      if (info.state == EntryState::corrupt || info.state == EntryState::unreadable)
        report.bad.push_back(std::move(info));
    }
  }
  return report;
}

// ---------------------------------------------------------------- prune, clear

Expected<PruneReport> Store::Impl::prune(uint64_t target_bytes) {
  if (config.writable_root.empty()) return fail(KJIT_ERROR_CACHE, "no writable cache root is configured");
  auto root = detail::open_root(config.writable_root, RootRole::writable);
  if (!root && root.error().err == ENOENT) return PruneReport{};
  if (!root) return fail(KJIT_ERROR_CACHE, root.error().message);
  std::lock_guard evicting(eviction);

  PruneReport report;
  std::vector<Candidate> candidates;
  uint64_t total = 0;
  int64_t now = now_ns();
  auto visit = [&](int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files) {
    prune_shard(shard_fd, shard_path, files, now, report, candidates, total);
  };
  detail::for_each_shard(root->get(), config.writable_root, RootRole::writable, visit);
  if (total > target_bytes) {
    Removed removed = evict_lru(root->get(), candidates, total, target_bytes, {}, &report.failures);
    report.removed_entries = removed.count;
    report.removed_bytes += removed.bytes;
    total -= removed.bytes;
  }
  report.remaining_bytes = total;
  std::lock_guard lock(mutex);
  estimated_bytes = total;
  return report;
}

// One shard's share of prune: removes dead files and bad entries at once and
// collects the good entries as eviction candidates.
void Store::Impl::prune_shard(int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files,
                              int64_t now, PruneReport& report, std::vector<Candidate>& candidates, uint64_t& total) {
  auto stamps = used_stamps(files);
  std::set<std::string> entries = entry_keys(files);
  auto unlink = [&](const ScannedFile& file) {
    auto gone = detail::remove_at(shard_fd, file.name, join_path(shard_path, file.name));
    if (!gone) report.failures.push_back({join_path(shard_path, file.name), gone.error().message});
    return gone.value_or(false);
  };
  for (const ScannedFile& file : files) {
    switch (file.parsed.kind) {
      case detail::FileKind::temp:
        if (is_stale_temp(file, now) && unlink(file)) ++report.removed_temp_files;
        break;
      case detail::FileKind::lock:
        if (!entries.contains(file.parsed.key)) {
          if (auto gone = remove_unheld_lock(shard_fd, shard_path, file.parsed.key); !gone)
            report.failures.push_back({join_path(shard_path, file.name), gone.error().message});
        } else if (is_abandoned_lock(shard_fd, file, now)) {
          unlink(file);
        }
        break;
      case detail::FileKind::used_stamp:
        if (!entries.contains(file.parsed.key)) unlink(file);
        break;
      case detail::FileKind::entry:
        prune_entry(shard_fd, shard_path, file, report, stamps, candidates, total);
        break;
      case detail::FileKind::other:
        break;
    }
  }
}

void Store::Impl::prune_entry(int shard_fd, const std::string& shard_path, const ScannedFile& file,
                              PruneReport& report, const std::map<std::string, int64_t>& stamps,
                              std::vector<Candidate>& candidates, uint64_t& total) {
  std::string path = join_path(shard_path, file.name);
  // A whole read: an entry whose payload no longer matches its hash goes too.
  detail::Inspection found =
      detail::inspect_entry(shard_fd, file.name, path, file.parsed.key, detail::ReadDepth::whole);
  bool bad = found.status == detail::ReadStatus::corrupt || found.status == detail::ReadStatus::other_format;
  if (!bad) {
    if (found.status == detail::ReadStatus::absent) return;
    candidates.push_back({file.parsed.key, file.shard, found.file_bytes, last_used_ns(file, stamps)});
    total += found.file_bytes;
    return;
  }
  auto removed = detail::unlink_if_same(shard_fd, file.name, path, found.device, found.inode);
  if (!removed) report.failures.push_back({path, removed.error().message});
  if (!removed.value_or(false)) return;
  std::string used = detail::used_name(file.parsed.key);
  (void)detail::unlink_at(shard_fd, used, join_path(shard_path, used));
  (void)remove_unheld_lock(shard_fd, shard_path, file.parsed.key);
  log::info("pruned cache entry {}: {}", path, found.problem);
  ++(found.status == detail::ReadStatus::other_format ? report.removed_other_format : report.removed_corrupt);
  report.removed_bytes += found.file_bytes;
}

Expected<ClearReport> Store::Impl::clear(const std::function<bool(const EntryInfo&)>& filter) {
  if (config.writable_root.empty()) return fail(KJIT_ERROR_CACHE, "no writable cache root is configured");
  auto root = detail::open_root(config.writable_root, RootRole::writable);
  if (!root && root.error().err == ENOENT) return ClearReport{};
  if (!root) return fail(KJIT_ERROR_CACHE, root.error().message);
  RootRef writable{config.writable_root, RootRole::writable};
  ClearReport report;
  uint64_t kept_bytes = 0;
  auto visit = [&](int shard_fd, const std::string& shard_path, const std::vector<ScannedFile>& files) {
    auto stamps = used_stamps(files);
    std::set<std::string> kept;
    for (const ScannedFile& file : files) {
      if (file.parsed.kind != detail::FileKind::entry) continue;
      std::string path = join_path(shard_path, file.name);
      detail::Inspection found =
          detail::inspect_entry(shard_fd, file.name, path, file.parsed.key, detail::ReadDepth::header_and_meta);
      if (found.status == detail::ReadStatus::absent) continue;  // removed meanwhile
      if (filter && !filter(describe(writable, shard_path, file, found, stamps, detail::ReadDepth::header_and_meta))) {
        kept_bytes += found.file_bytes;
        kept.insert(file.parsed.key);
        continue;
      }
      auto removed = remove_entry_files(shard_fd, shard_path, file.parsed.key, &report.failures);
      if (!removed) {
        report.failures.push_back({path, removed.error().message});
        kept.insert(file.parsed.key);
      } else if (*removed) {
        ++report.removed_entries;
      }
    }
    remove_orphans(shard_fd, shard_path, files, kept, report.failures);
  };
  detail::for_each_shard(root->get(), config.writable_root, RootRole::writable, visit);
  std::lock_guard lock(mutex);
  estimated_bytes = kept_bytes;
  return report;
}

}  // namespace kjit::cache
