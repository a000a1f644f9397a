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

constexpr uint64_t kMaxEntryBytes = format::kHeaderBytes + format::kMaxMetaBytes + format::kMaxPayloadBytes;

Inspection& set_status(Inspection& out, ReadStatus status, std::string problem) {
  out.status = status;
  out.problem = std::move(problem);
  return out;
}

Inspection& apply(Inspection& out, format::Decoded& decoded) {
  out.header = decoded.header;
  switch (decoded.verdict) {
    case format::Verdict::ok:
      out.meta = std::move(decoded.meta);
      return set_status(out, ReadStatus::ok, {});
    case format::Verdict::other_format:
      return set_status(out, ReadStatus::other_format, std::move(decoded.problem));
    case format::Verdict::corrupt:
      break;
  }
  return set_status(out, ReadStatus::corrupt, std::move(decoded.problem));
}

// A short read of a file that is never rewritten in place is corruption (it
// was truncated); an I/O error is not the entry's fault.
Inspection& read_failed(Inspection& out, const SysError& error) {
  return set_status(out, error.err == 0 ? ReadStatus::corrupt : ReadStatus::unreadable, error.message);
}

Inspection& read_whole(Inspection& out, int fd, const std::string& path, std::string_view key) {
  if (out.file_bytes > kMaxEntryBytes)
    return set_status(out, ReadStatus::corrupt, fmt::format("{} bytes, larger than any entry", out.file_bytes));
  auto data = read_exactly(fd, 0, out.file_bytes, path);
  if (!data) return read_failed(out, data.error());
  format::Decoded decoded = format::decode(*data, key);
  if (decoded.verdict == format::Verdict::ok) out.payload.assign(decoded.payload.begin(), decoded.payload.end());
  return apply(out, decoded);
}

Inspection& read_header_and_meta(Inspection& out, int fd, const std::string& path, std::string_view key) {
  auto head = read_exactly(fd, 0, std::min<uint64_t>(out.file_bytes, format::kHeaderBytes), path);
  if (!head) return read_failed(out, head.error());
  format::HeaderCheck check = format::check_header(*head, out.file_bytes);
  if (check.verdict != format::Verdict::ok) {
    format::Decoded decoded{check.verdict, check.problem, check.header, {}, {}};
    return apply(out, decoded);
  }
  auto meta = read_exactly(fd, format::kHeaderBytes, check.header.meta_bytes, path);
  if (!meta) return read_failed(out, meta.error());
  format::Decoded decoded = format::decode_meta_only(check, *meta, key);
  return apply(out, decoded);
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
      struct stat link {};
      if (::fstatat(shard_fd, name.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0) {
        out.device = link.st_dev;
        out.inode = link.st_ino;
      }
      return set_status(out, ReadStatus::corrupt, "is a symbolic link");
    }
    return set_status(out, ReadStatus::unreadable, sys_error(err, "open", path).error().message);
  }
  Fd fd(raw);
  auto st = stat_fd(fd.get(), path);
  if (!st) return set_status(out, ReadStatus::unreadable, st.error().message);
  out.file_bytes = static_cast<uint64_t>(st->st_size);
  out.mtime_ns = nanoseconds(st->st_mtim);
  out.device = st->st_dev;
  out.inode = st->st_ino;
  if (!S_ISREG(st->st_mode)) return set_status(out, ReadStatus::corrupt, "is not a regular file");
  if (depth == ReadDepth::whole) return read_whole(out, fd.get(), path, key);
  return read_header_and_meta(out, fd.get(), path, key);
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
  return unlink_at(dir_fd, name, path);
}

void for_each_shard(int root_fd, const std::string& root_path, RootRole role, const ShardVisitor& visit) {
  std::vector<std::string> shards = directory_names(root_fd);
  std::sort(shards.begin(), shards.end());
  for (const std::string& shard : shards) {
    if (!is_shard_name(shard)) continue;
    auto shard_fd = open_shard(root_fd, root_path, shard, role, false);
    if (!shard_fd) {
      if (shard_fd.error().err == 0) warn_once("untrusted:" + join_path(root_path, shard), shard_fd.error().message);
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
