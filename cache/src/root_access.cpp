// Opening cache roots and shards under the trust rules: see root_access.hpp.
#include "root_access.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "kjit/base/expected.hpp"
#include "kjit/base/log.hpp"

namespace kjit::cache::detail {
namespace {

SysExpected<Fd> checked(Fd fd, const std::string& path, RootRole role) {
  auto st = stat_fd(fd.get(), path);
  if (!st) return std::unexpected(st.error());
  if (std::string problem = trust_problem(*st, role); !problem.empty()) {
    std::string fix = role == RootRole::writable ? fmt::format("; fix with: chmod 700 {}", path) : std::string();
    return std::unexpected(SysError{0, fmt::format("refusing cache directory {}: it {}{}", path, problem, fix)});
  }
  return fd;
}

}  // namespace

void warn_once(const std::string& topic, const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> seen;
  bool first = false;
  {
    std::lock_guard lock(mutex);
    first = seen.insert(topic).second;
  }
  if (first) {
    log::warn("{}", message);
  } else {
    log::debug("{}", message);
  }
}

std::string trust_problem(const struct stat& st, RootRole role) {
  if (!S_ISDIR(st.st_mode)) return "is not a directory";
  unsigned mode = st.st_mode & 07777;
  if (role == RootRole::read_only) {
    if (st.st_mode & S_IWOTH) return fmt::format("is writable by others (mode {:04o})", mode);
    return {};
  }
  if (st.st_uid != ::geteuid())
    return fmt::format("is owned by uid {}, not by this process's uid {}", st.st_uid, ::geteuid());
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return fmt::format("is writable by group or others (mode {:04o})", mode);
  return {};
}

SysExpected<Fd> open_root(const std::string& path, RootRole role) {
  auto fd = open_directory(path);
  if (!fd) return std::unexpected(fd.error());
  return checked(std::move(*fd), path, role);
}

SysExpected<Fd> open_root_for_writing(const std::string& path) {
  auto fd = open_directory(path);
  if (!fd && fd.error().err == ENOENT) {
    KJIT_TRY(create_directories(path, 0700));
    fd = open_directory(path);
  }
  if (!fd) return std::unexpected(fd.error());
  return checked(std::move(*fd), path, RootRole::writable);
}

SysExpected<Fd> open_shard(int root_fd, const std::string& root_path, const std::string& shard, RootRole role,
                           bool create) {
  const std::string& name = shard;
  std::string path = join_path(root_path, name);
  if (create) {
    if (::mkdirat(root_fd, name.c_str(), 0700) == 0) {
      // A new directory's own name lives in the root: sync the root so that a
      // crash cannot lose the shard together with entries renamed into it.
      KJIT_TRY(sync_fd(root_fd, root_path));
    } else if (errno != EEXIST) {
      return sys_error(errno, "create directory", path);
    }
  }
  auto fd = open_subdirectory(root_fd, name, path);
  if (!fd) return std::unexpected(fd.error());
  return checked(std::move(*fd), path, role);
}

}  // namespace kjit::cache::detail
