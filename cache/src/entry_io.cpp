// Reading, removing and enumerating entry files inside an open root: the file
// level beneath the Store (see store_impl.hpp).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <fmt/format.h>

#include "store_impl.hpp"

namespace kjit::cache::detail {
namespace {

// Directories planted at an entry's name are removed this deep, no deeper.
constexpr int kMaxRemovedDepth = 16;

void set_status(Inspection& out, ReadStatus status, std::string problem) {
  out.status = status;
  out.problem = std::move(problem);
}

void apply(Inspection& out, format::Decoded& decoded) {
  out.header = decoded.header;
  switch (decoded.verdict) {
    case format::Verdict::ok:
      out.meta = std::move(decoded.meta);
      out.fields = std::move(decoded.fields);
      return set_status(out, ReadStatus::ok, {});
    case format::Verdict::other_format:
      return set_status(out, ReadStatus::other_format, std::move(decoded.problem));
    case format::Verdict::corrupt:
      break;
  }
  set_status(out, ReadStatus::corrupt, std::move(decoded.problem));
}

// A short read of a file that is never rewritten in place is corruption (it
// was truncated); an I/O error is not the entry's fault.
void read_failed(Inspection& out, const SysError& error) {
  set_status(out, error.err == 0 ? ReadStatus::corrupt : ReadStatus::unreadable, error.message);
}

// Reads the header, then the meta, then (for a whole read) the payload into a
// buffer of its own, which becomes the Inspection's: the payload is never copied.
void read_entry(Inspection& out, int fd, const std::string& path, std::string_view key, ReadDepth depth) {
  auto head = read_exactly(fd, 0, std::min<uint64_t>(out.file_bytes, format::kHeaderBytes), path);
  if (!head) return read_failed(out, head.error());
  format::HeaderCheck check = format::check_header(*head, out.file_bytes);
  if (check.verdict != format::Verdict::ok) {
    format::Decoded decoded{check.verdict, check.problem, check.header, {}, {}, {}};
    return apply(out, decoded);
  }
  auto meta = read_exactly(fd, format::kHeaderBytes, check.header.meta_bytes, path);
  if (!meta) return read_failed(out, meta.error());
  if (depth == ReadDepth::header_and_meta) {
    format::Decoded decoded = format::decode_meta_only(check, *meta, key);
    return apply(out, decoded);
  }
  auto payload = read_exactly(fd, format::kHeaderBytes + check.header.meta_bytes, check.header.payload_bytes, path);
  if (!payload) return read_failed(out, payload.error());
  format::Decoded decoded = depth == ReadDepth::payload ? format::decode_bookkeeping(*head, *meta, *payload, key)
                                                        : format::decode(*head, *meta, *payload, key);
  if (decoded.verdict == format::Verdict::ok) out.payload = std::move(*payload);
  apply(out, decoded);
}

// Identifies what is at `name` without following a link, for unlink_if_same.
void identify(Inspection& out, int shard_fd, const std::string& name) {
  struct stat st {};
  if (::fstatat(shard_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  out.device = st.st_dev;
  out.inode = st.st_ino;
}

// Empties and removes the directory `name` in `dir_fd`, never following a link.
SysExpected<void> remove_directory(int dir_fd, const std::string& name, const std::string& path, int depth_left) {
  if (depth_left <= 0) return sys_error(ELOOP, "remove the deeply nested directory", path);
  auto dir = open_subdirectory(dir_fd, name, path);
  if (!dir) return std::unexpected(dir.error());
  for (const std::string& inner : directory_names(dir->get())) {
    std::string inner_path = join_path(path, inner);
    if (::unlinkat(dir->get(), inner.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR) return sys_error(errno, "remove", inner_path);
    KJIT_TRY(remove_directory(dir->get(), inner, inner_path, depth_left - 1));
  }
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) == 0 || errno == ENOENT) return {};
  return sys_error(errno, "remove", path);
}

}  // namespace

Inspection inspect_entry(int shard_fd, const std::string& name, const std::string& path, std::string_view key,
                         ReadDepth depth) {
  Inspection out;
  // O_NONBLOCK: a FIFO planted under an entry's name must not block the
  // reader; it is rejected below as not a regular file.
  int raw = ::openat(shard_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (raw < 0) {
    int err = errno;
    if (err == ENOENT) return out;
    if (err == ELOOP) {
      // The link itself is the bad entry: identify it for unlink_if_same.
      identify(out, shard_fd, name);
      set_status(out, ReadStatus::corrupt, "is a symbolic link");
      return out;
    }
    // A socket cannot be opened (ENXIO): still not a file, so corrupt, not unreadable.
    struct stat st {};
    if (::fstatat(shard_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)) {
      identify(out, shard_fd, name);
      set_status(out, ReadStatus::corrupt, "is not a regular file");
      return out;
    }
    set_status(out, ReadStatus::unreadable, sys_error(err, "open", path).error().message);
    return out;
  }
  Fd fd(raw);
  auto st = stat_fd(fd.get(), path);
  if (!st) {
    set_status(out, ReadStatus::unreadable, st.error().message);
    return out;
  }
  out.file_bytes = static_cast<uint64_t>(st->st_size);
  out.mtime_ns = nanoseconds(st->st_mtim);
  out.device = st->st_dev;
  out.inode = st->st_ino;
  if (!S_ISREG(st->st_mode)) {
    out.file_bytes = 0;  // a directory's size is not entry bytes
    set_status(out, ReadStatus::corrupt, S_ISDIR(st->st_mode) ? "is a directory" : "is not a regular file");
    return out;
  }
  read_entry(out, fd.get(), path, key, depth);
  return out;
}

SysExpected<bool> remove_at(int dir_fd, const std::string& name, const std::string& path) {
  if (::unlinkat(dir_fd, name.c_str(), 0) == 0) return true;
  if (errno == ENOENT) return false;
  if (errno != EISDIR) return sys_error(errno, "remove", path);
  KJIT_TRY(remove_directory(dir_fd, name, path, kMaxRemovedDepth));
  return true;
}

SysExpected<bool> unlink_at(int dir_fd, const std::string& name, const std::string& path) {
  if (::unlinkat(dir_fd, name.c_str(), 0) == 0) return true;
  if (errno == ENOENT) return false;
  return sys_error(errno, "remove", path);
}

SysExpected<bool> unlink_if_same(int dir_fd, const std::string& name, const std::string& path, dev_t device,
                                 ino_t inode) {
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return false;
    return sys_error(errno, "stat", path);
  }
  if (st.st_dev != device || st.st_ino != inode) return false;
  return remove_at(dir_fd, name, path);
}

void for_each_shard(int root_fd, const std::string& root_path, RootRole role, const ShardVisitor& visit,
                    std::vector<Failure>* unopened) {
  std::vector<std::string> shards = directory_names(root_fd);
  std::sort(shards.begin(), shards.end());
  for (const std::string& shard : shards) {
    if (!is_shard_name(shard)) continue;
    auto shard_fd = open_shard(root_fd, root_path, shard, role, false);
    if (!shard_fd) {
      if (shard_fd.error().err == 0) warn_once("untrusted:" + join_path(root_path, shard), shard_fd.error().message);
      if (unopened && shard_fd.error().err != ENOENT)  // ENOENT: removed since the listing
        unopened->push_back({join_path(root_path, shard), shard_fd.error().message});
      continue;
    }
    std::vector<std::string> names = directory_names(shard_fd->get());
    std::sort(names.begin(), names.end());
    std::vector<ScannedFile> files;
    files.reserve(names.size());
    for (std::string& name : names) {
      struct stat st {};
      if (::fstatat(shard_fd->get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
      ScannedFile file;
      file.shard = shard;
      file.parsed = parse_name(name);
      file.name = std::move(name);
      file.bytes = static_cast<uint64_t>(st.st_size);
      file.mtime_ns = nanoseconds(st.st_mtim);
      file.regular = S_ISREG(st.st_mode);
      files.push_back(std::move(file));
    }
    visit(shard_fd->get(), join_path(root_path, shard), files);
  }
}

}  // namespace kjit::cache::detail
