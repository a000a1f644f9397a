// kjit::cache::Store: load, publish, remove and the advisory key lock. The
// maintenance half (list, verify, prune, clear, eviction) is maintenance.cpp;
// files are read and enumerated by entry_io.cpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "kjit/base/log.hpp"
#include "kjit/base/text.hpp"
#include "store_impl.hpp"

namespace kjit::cache {

using detail::Fd;
using detail::join_path;
using detail::RootRef;
using detail::ReadDepth;
using detail::RootRole;
using detail::SysError;
using detail::SysExpected;

namespace {

constexpr int kRenameAttempts = 5;
constexpr int kTempNameAttempts = 3;
constexpr auto kLockPollCeiling = std::chrono::milliseconds(50);

// Test-only fault hook (see store.hpp), compiled into test builds alone
// (kjit_cache_testing): a release library never reads KJIT_TEST_FAULT, so a
// process that inherits it cannot kill itself. Read on every publish, so that
// a test can set it in a forked child.
#ifdef KJIT_TEST_HOOKS
bool fault_requested(std::string_view fault) {
  const char* value = std::getenv("KJIT_TEST_FAULT");
  return value != nullptr && fault == value;
}
#else
constexpr bool fault_requested(std::string_view) { return false; }
#endif

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

StoreConfig normalized(StoreConfig config) {
  config.writable_root = strip_trailing_slashes(std::move(config.writable_root));
  std::vector<std::string> read_only;
  for (std::string& root : config.read_only_roots) {
    root = strip_trailing_slashes(std::move(root));
    if (root.empty() || root == config.writable_root) continue;
    if (std::find(read_only.begin(), read_only.end(), root) != read_only.end()) continue;
    read_only.push_back(std::move(root));
  }
  config.read_only_roots = std::move(read_only);
  if (config.max_bytes == 0) config.max_bytes = kDefaultMaxBytes;
  return config;
}

std::string shard_path_of(const std::string& root, std::string_view key) {
  return join_path(root, detail::shard_of(key));
}

Error cache_error(const SysError& error) { return Error{KJIT_ERROR_CACHE, error.message}; }

// A key as it may appear in a message: control bytes escaped, long ones cut.
std::string printable_key(std::string_view key) {
  constexpr std::size_t kShown = 40;
  std::string out;
  for (char c : key.substr(0, kShown)) {
    auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7F && c != '"' && c != '\\') {
      out += c;
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  if (key.size() > kShown) out += fmt::format("... ({} bytes)", key.size());
  return out;
}

}  // namespace

std::string printable(std::string_view text, bool keep_newlines) { return text::printable(text, keep_newlines); }

namespace {

Expected<void> invalid_key(std::string_view key) {
  return fail(KJIT_ERROR_INVALID_ARGUMENT,
              fmt::format("invalid cache key \"{}\": expected 16 to 128 lowercase hex digits", printable_key(key)));
}

// Logs why a root could not be opened: an untrusted root warns once, an absent
// one is normal, anything else is worth a debug line.
void report_unopened(const RootRef& root, const SysError& error) {
  if (error.err == 0) {
    detail::warn_once("untrusted:" + root.path, error.message + "; not using it");
  } else if (error.err != ENOENT) {
    log::debug("cache root skipped: {}", error.message);
  }
}

// One warning per process and root when publishing fails; an untrusted root
// shares its warning with the loads that skip it.
void report_unwritable(const RootRef& root, const SysError& error) {
  if (error.err == 0) {
    detail::warn_once("untrusted:" + root.path, error.message + "; not using it");
    return;
  }
  detail::warn_once("unwritable:" + root.path,
                    fmt::format("cache root {} cannot be written ({}); compiled kernels will be kept in memory only",
                                root.path, error.message));
}

struct CreatedTemp {
  Fd fd;
  std::string name;
};

SysExpected<CreatedTemp> create_temp(int shard_fd, const std::string& shard_path, std::string_view key) {
  for (int attempt = 0;; ++attempt) {
    std::string name = detail::temp_name(key);
    int fd = ::openat(shard_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) return CreatedTemp{Fd(fd), std::move(name)};
    if (errno != EEXIST || attempt + 1 >= kTempNameAttempts)
      return detail::sys_error(errno, "create", join_path(shard_path, name));
  }
}

// Removes a temp file on scope exit unless it was renamed into place.
class TempGuard {
 public:
  TempGuard(int dir_fd, std::string name) : dir_fd_(dir_fd), name_(std::move(name)) {}
  TempGuard(const TempGuard&) = delete;
  TempGuard& operator=(const TempGuard&) = delete;
  ~TempGuard() {
    if (!kept_) ::unlinkat(dir_fd_, name_.c_str(), 0);
  }
  void keep() { kept_ = true; }

 private:
  int dir_fd_;
  std::string name_;
  bool kept_ = false;
};

SysExpected<void> write_temp(int fd, std::span<const char> file, const std::string& path) {
  if (fault_requested("kill-during-publish")) {
    (void)detail::write_all(fd, file.first(file.size() / 2), path);
    // Test-only: die the way a killed writer does, with a half-written temp file.
    ::raise(SIGKILL);
  }
  return detail::write_all(fd, file, path);
}

}  // namespace

// ---------------------------------------------------------------- construction

Store::Impl::Impl(StoreConfig c) : config(normalized(std::move(c))), max_bytes(config.max_bytes) {}

std::vector<RootRef> Store::Impl::roots() const {
  std::vector<RootRef> all;
  if (!config.writable_root.empty()) all.push_back({config.writable_root, RootRole::writable});
  for (const std::string& root : config.read_only_roots) all.push_back({root, RootRole::read_only});
  return all;
}

bool Store::Impl::is_pinned(const std::string& key) const {
  std::lock_guard lock(mutex);
  return pinned.contains(key);
}

// ---------------------------------------------------------------- load

std::optional<Entry> Store::Impl::load(std::string_view key, ReadDepth depth) {
  if (!is_valid_key(key)) {
    log::debug("cache load of invalid key \"{}\": a miss", printable_key(key));
    ++misses;
    return std::nullopt;
  }
  for (const RootRef& root : roots()) {
    if (std::optional<Entry> entry = load_from(root, key, depth)) {
      ++hits;
      return entry;
    }
  }
  ++misses;
  return std::nullopt;
}

std::optional<Entry> Store::Impl::load_from(const RootRef& root, std::string_view key, ReadDepth depth) {
  auto root_fd = detail::open_root(root.path, root.role);
  if (!root_fd) {
    log::debug("cache lookup {} in {}: miss (root not usable)", key, root.path);
    report_unopened(root, root_fd.error());
    return std::nullopt;
  }
  auto shard = detail::open_shard(root_fd->get(), root.path, detail::shard_of(key), root.role, false);
  if (!shard) {
    log::debug("cache lookup {} in {}: miss (no usable shard)", key, root.path);
    report_unopened(RootRef{shard_path_of(root.path, key), root.role}, shard.error());
    return std::nullopt;
  }
  std::string shard_path = shard_path_of(root.path, key);
  std::string name = detail::entry_name(key);
  std::string path = join_path(shard_path, name);
  detail::Inspection found = detail::inspect_entry(shard->get(), name, path, key, depth);
  switch (found.status) {
    case detail::ReadStatus::ok:
      log::debug("cache lookup {} in {}: hit", key, root.path);
      if (root.role == RootRole::writable) note_use(shard->get(), shard_path, key);
      return Entry{std::move(found.meta), std::move(found.payload), root.path};
    case detail::ReadStatus::absent:
      log::debug("cache lookup {} in {}: miss", key, root.path);
      return std::nullopt;
    case detail::ReadStatus::other_format:
    case detail::ReadStatus::unreadable:
      log::debug("cache lookup {} in {}: miss, entry skipped ({})", key, root.path, found.problem);
      return std::nullopt;
    case detail::ReadStatus::corrupt:
      break;
  }
  log::debug("cache lookup {} in {}: corrupt ({})", key, root.path, found.problem);
  ++corrupt;
  if (root.role == RootRole::read_only) {
    log::warn("cache entry {} is corrupt ({}); skipping it (read-only root)", path, found.problem);
    return std::nullopt;
  }
  auto removed = detail::unlink_if_same(shard->get(), name, path, found.device, found.inode);
  std::string outcome = !removed ? removed.error().message : *removed ? "removed it" : "a new entry replaced it";
  log::warn("cache entry {} is corrupt ({}); {}", path, found.problem, outcome);
  return std::nullopt;
}

// Pins `key` and, the first time this Store loads it, stamps its last use. The
// stamp is a sidecar file rather than the entry's atime: relatime and noatime
// mounts make atime useless, and writing the entry itself is never done.
void Store::Impl::note_use(int shard_fd, const std::string& shard_path, std::string_view key) {
  bool first = false;
  {
    std::lock_guard lock(mutex);
    pinned.emplace(key);
    first = stamped.emplace(key).second;
  }
  if (!first) return;
  std::string name = detail::used_name(key);
  std::string path = join_path(shard_path, name);
  // Only the stamp's mtime is used, so it is set with futimens and nothing is
  // written. And only on a stamp kjit made: a file of ours with one link. A
  // hard link planted at the name would otherwise make a load touch a file
  // outside the root; it (or a FIFO, a link) is removed and a new stamp made.
  if (Fd fd(::openat(shard_fd, name.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)); fd) {
    struct stat st {};
    if (::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == ::geteuid()) {
      if (::futimens(fd.get(), nullptr) != 0)
        log::debug("could not stamp the last use of {}: {}", path, detail::errno_text(errno));
      return;
    }
  }
  if (::unlinkat(shard_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
    log::debug("could not replace the last-use stamp {}: {}", path, detail::errno_text(errno));
    return;
  }
  Fd fd(::openat(shard_fd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) log::debug("could not stamp the last use of {}: {}", path, detail::errno_text(errno));
}

// ---------------------------------------------------------------- publish

Expected<void> Store::Impl::publish(std::string_view key, const nlohmann::json& meta, std::span<const char> payload) {
  if (!is_valid_key(key)) return invalid_key(key);
  auto full_meta = format::with_bookkeeping(meta, key, payload.size(), detail::now_unix_seconds());
  if (!full_meta) return std::unexpected(full_meta.error());
  auto file = format::encode(*full_meta, payload);
  if (!file) return std::unexpected(file.error());
  if (config.writable_root.empty()) {
    ++write_failures;
    return fail(KJIT_ERROR_CACHE, "no writable cache root is configured (set KJIT_CACHE_DIR or HOME)");
  }
  auto wrote = write_entry(key, *file);
  if (!wrote) {
    ++write_failures;
    report_unwritable(RootRef{config.writable_root, RootRole::writable}, wrote.error());
    return std::unexpected(cache_error(wrote.error()));
  }
  ++published;
  if (*wrote) account_and_evict(key, file->size());
  return {};
}

// True when a new file was written; false when a valid entry was already there.
SysExpected<bool> Store::Impl::write_entry(std::string_view key, std::span<const char> file) {
  auto root = detail::open_root_for_writing(config.writable_root);
  if (!root) return std::unexpected(root.error());
  open_for_writing(root->get());
  auto shard = detail::open_shard(root->get(), config.writable_root, detail::shard_of(key), RootRole::writable, true);
  if (!shard) return std::unexpected(shard.error());
  std::string shard_path = shard_path_of(config.writable_root, key);
  if (valid_entry_at(shard->get(), shard_path, key)) return false;

  auto temp = create_temp(shard->get(), shard_path, key);
  if (!temp) return std::unexpected(temp.error());
  TempGuard guard(shard->get(), temp->name);
  std::string temp_path = join_path(shard_path, temp->name);
  KJIT_TRY(write_temp(temp->fd.get(), file, temp_path));
  // Sync the data before the rename makes it visible: otherwise a crash can
  // leave the new name pointing at a file whose blocks were never written.
  KJIT_TRY(detail::sync_fd(temp->fd.get(), temp_path));
  KJIT_TRY(temp->fd.close_checked(temp_path));
  KJIT_TRY(rename_into_place(shard->get(), shard_path, temp->name, key));
  guard.keep();
  // The rename is a change to the directory: durable only once it is synced.
  KJIT_TRY(detail::sync_fd(shard->get(), shard_path));
  return true;
}

SysExpected<void> Store::Impl::rename_into_place(int shard_fd, const std::string& shard_path,
                                                 const std::string& temp, std::string_view key) {
  std::string final_name = detail::entry_name(key);
  for (int attempt = 0;; ++attempt) {
    // rename(2) replaces an existing entry atomically: a reader opens the old
    // file or the new one, never a mix, and one that has the old file open
    // keeps reading the old inode. So a bad or other-format entry is simply
    // replaced, and two writers of one key both succeed, the last one winning.
    if (::renameat(shard_fd, temp.c_str(), shard_fd, final_name.c_str()) == 0) return {};
    int err = errno;
    // NFS: when a RENAME reply is lost the client resends the call, and the
    // server, having done the first, answers ENOENT although the entry is in
    // place; some servers answer EBUSY while another client holds the target
    // open. Either may pass: accept a valid entry, else retry a few times.
    bool transient = err == ENOENT || err == EBUSY || err == EINTR;
    if (valid_entry_at(shard_fd, shard_path, key)) return {};
    // A directory planted at the entry's name would block the key for good.
    if ((err == EISDIR || err == ENOTEMPTY || err == EEXIST) && attempt + 1 < kRenameAttempts) {
      if (auto removed = detail::remove_at(shard_fd, final_name, join_path(shard_path, final_name)); removed) {
        log::warn("removed the non-file at cache entry {}", join_path(shard_path, final_name));
        continue;
      }
    }
    if (!transient || attempt + 1 >= kRenameAttempts)
      return detail::sys_error(err, fmt::format("rename {} to", join_path(shard_path, temp)),
                               join_path(shard_path, final_name));
    std::this_thread::sleep_for(std::chrono::milliseconds(1 << attempt));
  }
}

bool Store::Impl::valid_entry_at(int shard_fd, const std::string& shard_path, std::string_view key) {
  std::string name = detail::entry_name(key);
  return detail::inspect_entry(shard_fd, name, join_path(shard_path, name), key, detail::ReadDepth::whole).status ==
         detail::ReadStatus::ok;
}

// ---------------------------------------------------------------- remove, lock

Expected<void> Store::Impl::remove(std::string_view key) {
  if (!is_valid_key(key)) return invalid_key(key);
  if (config.writable_root.empty()) return fail(KJIT_ERROR_CACHE, "no writable cache root is configured");
  auto root = detail::open_root(config.writable_root, RootRole::writable);
  if (!root && root.error().err == ENOENT) return {};
  if (!root) return std::unexpected(cache_error(root.error()));
  auto shard = detail::open_shard(root->get(), config.writable_root, detail::shard_of(key), RootRole::writable, false);
  if (!shard && shard.error().err == ENOENT) return {};
  if (!shard) return std::unexpected(cache_error(shard.error()));
  std::string shard_path = shard_path_of(config.writable_root, key);
  std::string name = detail::entry_name(key);
  if (auto removed = detail::unlink_at(shard->get(), name, join_path(shard_path, name)); !removed)
    return std::unexpected(cache_error(removed.error()));
  std::string used = detail::used_name(key);
  (void)detail::unlink_at(shard->get(), used, join_path(shard_path, used));
  std::lock_guard lock(mutex);
  stamped.erase(std::string(key));
  return {};
}

KeyLock Store::Impl::try_lock(std::string_view key, std::chrono::milliseconds max_wait) {
  if (!is_valid_key(key) || config.writable_root.empty()) return {};
  auto root = detail::open_root_for_writing(config.writable_root);
  if (!root) return {};
  auto shard = detail::open_shard(root->get(), config.writable_root, detail::shard_of(key), RootRole::writable, true);
  if (!shard) return {};
  std::string name = detail::lock_name(key);
  Fd fd(::openat(shard->get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) {
    log::debug("could not open lock {}: {}", join_path(shard_path_of(config.writable_root, key), name),
               detail::errno_text(errno));
    return {};
  }
  // Polls with LOCK_NB instead of blocking in flock: the wait stays bounded even
  // on file systems whose lock calls never return (some NFS setups).
  auto deadline = std::chrono::steady_clock::now() + max_wait;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return KeyLock(fd.release());
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      log::debug("advisory cache lock unavailable for {}: {}", key, detail::errno_text(errno));
      return {};
    }
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return {};
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kLockPollCeiling);
  }
}

// ---------------------------------------------------------------- KeyLock

KeyLock::KeyLock(KeyLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

KeyLock& KeyLock::operator=(KeyLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

// Closing the descriptor releases the flock. The lock file stays: unlinking it
// while another process waits on it would let a third lock a new file.
KeyLock::~KeyLock() {
  if (fd_ >= 0) ::close(fd_);
}

// ---------------------------------------------------------------- Store

Store::Store(StoreConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Store::~Store() = default;

std::optional<Entry> Store::load(std::string_view key) { return impl_->load(key, ReadDepth::whole); }
std::optional<Entry> Store::load_payload(std::string_view key) {
  return impl_->load(key, ReadDepth::payload);
}

Expected<void> Store::publish(std::string_view key, const nlohmann::json& meta, std::span<const char> payload) {
  return impl_->publish(key, meta, payload);
}

std::vector<EntryInfo> Store::list(const ListOptions& options) const { return impl_->list(options); }
VerifyReport Store::verify(bool fix) { return impl_->verify(fix); }
Expected<PruneReport> Store::prune(uint64_t max_bytes) { return impl_->prune(max_bytes); }

Expected<ClearReport> Store::clear(const std::function<bool(const EntryInfo&)>& filter) {
  return impl_->clear(filter);
}

Expected<void> Store::remove(std::string_view key) { return impl_->remove(key); }

KeyLock Store::try_lock(std::string_view key, std::chrono::milliseconds max_wait) {
  return impl_->try_lock(key, max_wait);
}

bool Store::holds(std::string_view key) const {
  const std::string& root_path = impl_->config.writable_root;
  if (!is_valid_key(key) || root_path.empty()) return false;
  auto root = detail::open_root(root_path, RootRole::writable);
  if (!root) return false;
  auto shard = detail::open_shard(root->get(), root_path, detail::shard_of(key), RootRole::writable, false);
  if (!shard) return false;
  std::string name = detail::entry_name(key);
  return detail::inspect_entry(shard->get(), name, join_path(shard_path_of(root_path, key), name), key,
                               detail::ReadDepth::whole)
             .status == detail::ReadStatus::ok;
}

std::string Store::entry_path(std::string_view key) const {
  if (!is_valid_key(key) || impl_->config.writable_root.empty()) return {};
  return join_path(shard_path_of(impl_->config.writable_root, key), detail::entry_name(key));
}

const StoreConfig& Store::config() const { return impl_->config; }

Counters Store::counters() const {
  return Counters{impl_->hits.load(),      impl_->misses.load(),         impl_->corrupt.load(),
                  impl_->published.load(), impl_->write_failures.load(), impl_->evicted.load()};
}

}  // namespace kjit::cache
