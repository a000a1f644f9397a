// kjit's on-disk kernel cache: a content-addressed store of compiled kernels.
//
// A key is an opaque lowercase hex string (the codegen layer hashes everything
// that changes the cubin into it); the cache never interprets it beyond using
// it, sharded, as a file name. An entry is one file: an integrity header, a
// JSON metadata document and the payload (the cubin). Entries are published
// atomically and validated on every read; a bad entry is a miss, never data.
//
// Roots: one writable root (KJIT_CACHE_DIR, default $XDG_CACHE_HOME/kjit or
// ~/.cache/kjit) over zero or more read-only roots (KJIT_CACHE_PATH, colon
// separated). This layer knows nothing of CUDA or codegen.
//
// On disk, inside a root:
//   <root>/<key[0:2]>/<key>.kjit     the entry (layout: kjit/cache/entry_format.hpp)
//   <root>/<key[0:2]>/<key>.used     last-used stamp, its mtime set on load (at
//                                    most once per Store and key); LRU order is
//                                    max(mtime of .kjit, mtime of .used). Only a
//                                    stamp kjit made (a file of ours with one
//                                    link) is touched; anything else there is
//                                    replaced by a new one, never written through
//   <root>/<key[0:2]>/<key>.lock     advisory lock of try_lock(); never required;
//                                    removed with its entry when nobody holds it
//   <root>/<key[0:2]>/<key>.tmp-<host>-<pid>-<tid>-<random>   a publish in flight
// The writable root and its shard directories are 0700, files 0600.
//
// Trust: the writable root (and each shard) must be owned by this process's
// effective uid and not writable by group or others, else it is not used at
// all, neither written nor read (anyone who can write there could plant an
// entry with a valid hash): one warning, and the Store works from memory and
// the read-only roots. A read-only root writable by others is skipped likewise.
// Symlinks inside a root are never followed (O_NOFOLLOW, openat on the root).
//
// Test-only fault hook, in test builds only (the kjit_cache_testing library,
// compiled with KJIT_TEST_HOOKS; libkjit and jitctl ignore the variable): with
// KJIT_TEST_FAULT=kill-during-publish in the environment, publish() raises
// SIGKILL after writing half of its temp file, before the rename, to test
// recovery from writers that die.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kjit/base/expected.hpp"
#include "kjit/cache/entry_format.hpp"

namespace kjit::cache {

inline constexpr uint64_t kDefaultMaxBytes = uint64_t{4} << 30;  // 4 GiB

// True for 16..128 lowercase hex digits: the only keys the store accepts
// (nothing else from a caller ever becomes part of a path).
bool is_valid_key(std::string_view key);

// "4294967296", "512K", "64M", "4G", "1T" (also "4GB", "4GiB"; suffixes are
// powers of 1024, case-insensitive). nullopt for anything else or on overflow.
std::optional<uint64_t> parse_byte_size(std::string_view text);

// "45s", "30m", "12h", "7d", "2w": a count and a unit, which is required (a
// bare number is refused, not taken as seconds). nullopt for anything else,
// a sign, or a value past what std::chrono::seconds holds.
std::optional<std::chrono::seconds> parse_duration(std::string_view text);

// kjit::text::printable (kjit/base/text.hpp): `text` safe to print on a
// terminal (invalid UTF-8, control bytes and C1 controls escaped).
std::string printable(std::string_view text, bool keep_newlines = false);

struct StoreConfig {
  std::string writable_root;                // may be empty: memory only, no writes
  std::vector<std::string> read_only_roots; // searched after the writable root
  uint64_t max_bytes = 0;                   // cap on entry file bytes in the writable root;
                                            // 0 = kDefaultMaxBytes (config() shows the cap in force)
};

// Reads KJIT_CACHE_DIR, XDG_CACHE_HOME, HOME, KJIT_CACHE_PATH, KJIT_CACHE_MAX_BYTES.
// The writable root is KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit (when
// absolute), else $HOME/.cache/kjit, else the passwd entry's home; empty when
// none is known. Empty components of KJIT_CACHE_PATH are skipped. A
// KJIT_CACHE_MAX_BYTES that does not parse warns and keeps the default.
StoreConfig config_from_environment();

struct Entry {
  nlohmann::json meta;        // as published, plus the "kjit_entry" bookkeeping object
  std::vector<char> payload;  // the cubin
  std::string root;           // the root it came from
};

enum class EntryState {
  ok,            // header and meta (and, from load/verify, the hash) check out
  corrupt,       // truncated, bad magic, bad hash, bad meta, not a regular file
  other_format,  // written by a kjit with another entry format: a miss, removed by prune
  unreadable,    // could not be opened or read (permissions, I/O error): a miss, never removed
};

struct EntryInfo {
  std::string key;
  nlohmann::json meta;          // null unless state is ok
  format::Fields fields;        // the meta's checked fields; empty unless state is ok
  bool verified = false;        // the payload was hashed too (verify(), list with hash_payloads);
                                // otherwise an ok state vouches for the header and meta only
  uint64_t file_bytes = 0;
  uint64_t payload_bytes = 0;
  std::string root;
  std::string path;             // the entry file
  bool read_only = false;
  // Both in [0, format::kMaxUnixSeconds), so that differences never overflow.
  int64_t created_unix = 0;     // from the meta; the file's mtime when unknown
  int64_t last_used_unix = 0;   // max(mtime of the entry, of its .used stamp)
  uint32_t format_version = 0;  // 0 when the header cannot be read
  EntryState state = EntryState::ok;
  std::string problem;          // why it is not ok; empty when ok
};

struct Counters {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t corrupt = 0;         // entries found bad on read (removed or skipped)
  uint64_t published = 0;       // includes publishes that found a valid entry already there
  uint64_t write_failures = 0;
  uint64_t evicted = 0;         // entries removed to keep the writable root under its cap
};

// A file that maintenance meant to remove and could not (read-only root,
// EACCES, a directory it could not empty...).
struct Failure {
  std::string path;
  std::string message;  // names the path and the errno text
};

struct PruneReport {
  uint64_t removed_entries = 0;       // evicted by LRU to reach the size
  uint64_t removed_other_format = 0;  // entries of another format version
  uint64_t removed_corrupt = 0;       // entries whose header or meta is bad
  uint64_t removed_temp_files = 0;    // temp files of dead or long-gone writers
  uint64_t removed_bytes = 0;         // entry bytes removed, all kinds
  uint64_t remaining_bytes = 0;       // entry bytes left in the writable root
  std::vector<Failure> failures;      // what should have been removed and was not
};

struct ClearReport {
  uint64_t removed_entries = 0;
  std::vector<Failure> failures;      // selected entries (and their files) that could not be removed
};

struct VerifyReport {
  uint64_t checked = 0;               // entry files read and hashed, all roots
  std::vector<EntryInfo> bad;         // corrupt or unreadable, all roots
  uint64_t removed = 0;               // bad ones removed (fix only)
  std::vector<Failure> failures;      // bad ones in the writable root that fix could not remove
  std::vector<Failure> unreadable_shards;  // shard names no load can read (a link, a file, not ours,
                                           // no permission), all roots: their entries are lost to loads
};

struct ListOptions {
  std::string key_prefix;             // only keys starting with it
  bool hash_payloads = false;         // read and hash payloads: ok then means verified
};

// An advisory per-key lock held by this process (flock on <key>.lock), so that
// concurrent processes can avoid compiling the same kernel twice. Nothing
// depends on it for correctness; it is released on destruction or when the
// holder dies. held() is false when it could not be taken in time.
class KeyLock {
 public:
  KeyLock() = default;
  KeyLock(KeyLock&& other) noexcept;
  KeyLock& operator=(KeyLock&& other) noexcept;
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  ~KeyLock();

  bool held() const { return fd_ >= 0; }

 private:
  friend class Store;
  explicit KeyLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Thread-safe: one Store may be used from many threads, and many processes may
// share its roots.
class Store {
 public:
  explicit Store(StoreConfig config);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The validated entry for `key`, searching the writable root then the
  // read-only ones; std::nullopt on a miss. A corrupt or truncated entry
  // counts as a miss and as corrupt, is removed from the writable root and
  // skipped in a read-only one; an other-format entry is a miss, left for
  // prune. An invalid key is a miss. A hit from the writable root pins the key
  // (this Store never evicts it) and stamps its last use. At KJIT_LOG=debug,
  // each root looked at logs the key, the root and hit, miss or corrupt (why).
  std::optional<Entry> load(std::string_view key);

  // load for a reader of the payload (the runtime, precompile): the same
  // roots, misses, pins and stamps, the whole entry hashed, but of the meta only
  // the bookkeeping read and checked (format::decode_bookkeeping), which is all
  // `meta` then holds. A meta member of the wrong type elsewhere is not seen
  // here (list and verify report it).
  std::optional<Entry> load_payload(std::string_view key);

  // Publishes atomically (temp file beside the target, fsync, rename, fsync of
  // the directory; a directory or other non-file at the entry's name is
  // removed first). Many writers of one key end with one valid entry; a valid
  // entry already there counts as published. Rejects an invalid key or a meta
  // that is not an object or null (KJIT_ERROR_INVALID_ARGUMENT). When the
  // writable root is unusable (read-only, full, not ours, none configured),
  // returns KJIT_ERROR_CACHE and warns once per process and root; loads keep
  // working. May evict least-recently-used entries to stay under max_bytes.
  Expected<void> publish(std::string_view key, const nlohmann::json& meta,
                         std::span<const char> payload);

  // Every entry file in every usable root (writable first), from its header
  // and meta only unless options.hash_payloads (then as verify() reads them).
  // Anything at an entry's name that is not a regular file is listed corrupt.
  std::vector<EntryInfo> list(const ListOptions& options = {}) const;

  // Reads and hashes every entry of every usable root; reports the corrupt and
  // unreadable ones, and the shard names that cannot be opened as trusted
  // directories (never removed: what is there may not be kjit's). With `fix`, removes the corrupt ones in the writable root
  // (a directory or other non-file included; read-only roots are never
  // modified) with their stamps and unheld locks, and reports those it could
  // not remove. Other-format entries are not reported: prune removes them.
  VerifyReport verify(bool fix);

  // Brings the writable root to at most `max_bytes` of entries, least recently
  // used first (never an entry this Store has loaded); also removes
  // other-format entries, corrupt ones (payload hashes are checked: prune
  // reads every entry whole), non-files at entry names, temp files of dead
  // writers or older than 10 minutes, stamps without entries, and unheld
  // locks without entries or older than 10 minutes. Reports what it could
  // not remove.
  Expected<PruneReport> prune(uint64_t max_bytes);

  // Removes the writable root's entries for which `filter` is true (all of
  // them when it is empty), whatever their state, non-files at entry names
  // included, with their stamps and unheld locks; also stamps and unheld locks
  // without entries. Reports how many entries went and which could not.
  // Read-only roots are untouched.
  Expected<ClearReport> clear(const std::function<bool(const EntryInfo&)>& filter = {});

  // Removes `key` from the writable root; removing an absent key succeeds.
  // Rejects an invalid key, and fails when no writable root is usable.
  Expected<void> remove(std::string_view key);

  // Takes the advisory lock of `key`, waiting at most `max_wait` (polling: it
  // never blocks in the kernel). Not held when the wait ran out or the
  // writable root is unusable.
  KeyLock try_lock(std::string_view key, std::chrono::milliseconds max_wait);

  // Whether the writable root holds a valid entry for `key` (read whole and
  // hashed, under the trust rules loads apply), without loading it: no stamp,
  // no pin. False for an invalid key or without a usable writable root.
  bool holds(std::string_view key) const;

  // Where `key`'s entry lives (or would live) in the writable root; empty for
  // an invalid key or when there is no writable root.
  std::string entry_path(std::string_view key) const;

  // The configuration in force: trailing slashes stripped, read-only roots
  // deduplicated (the writable root removed from them), max_bytes resolved.
  const StoreConfig& config() const;
  Counters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kjit::cache
