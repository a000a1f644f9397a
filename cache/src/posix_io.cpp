// POSIX file helpers of the cache store: see posix_io.hpp.
#include "posix_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <limits>

#include <fmt/format.h>

namespace kjit::cache::detail {

std::string errno_text(int err) {
  char buffer[256];
  // The GNU strerror_r returns the message, which may or may not be `buffer`.
  return ::strerror_r(err, buffer, sizeof buffer);
}

std::unexpected<SysError> sys_error(int err, std::string_view what, std::string_view path) {
  std::string message = err != 0 ? fmt::format("could not {} {}: {}", what, path, errno_text(err))
                                 : fmt::format("could not {} {}", what, path);
  return std::unexpected<SysError>(SysError{err, std::move(message)});
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

SysExpected<void> Fd::close_checked(const std::string& path) {
  int fd = release();
  // Linux releases the descriptor even when close fails, so it is never retried.
  if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) return sys_error(errno, "close", path);
  return {};
}

std::string join_path(std::string_view dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return fmt::format("{}{}", dir, name);
  return fmt::format("{}/{}", dir, name);
}

SysExpected<Fd> open_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return sys_error(errno, "open directory", path);
  return Fd(fd);
}

SysExpected<Fd> open_subdirectory(int dir_fd, const std::string& name, const std::string& path) {
  int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return sys_error(errno, "open directory", path);
  return Fd(fd);
}

SysExpected<void> create_directories(const std::string& path, mode_t mode) {
  if (path.empty()) return sys_error(ENOENT, "create directory", "(empty path)");
  for (std::size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    std::string prefix = path.substr(0, end);
    if (!prefix.empty() && prefix.back() != '/' && ::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST)
      return sys_error(errno, "create directory", prefix);
    if (end == std::string::npos) return {};
  }
}

SysExpected<struct stat> stat_fd(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return sys_error(errno, "stat", path);
  return st;
}

SysExpected<std::vector<char>> read_exactly(int fd, uint64_t offset, std::size_t bytes, const std::string& path) {
  std::vector<char> data(bytes);
  std::size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pread(fd, data.data() + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_error(errno, "read", path);
    if (n == 0) return sys_error(0, fmt::format("read {} bytes (file ended after {}) from", bytes, done), path);
    done += static_cast<std::size_t>(n);
  }
  return data;
}

SysExpected<void> write_all(int fd, std::span<const char> data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return sys_error(errno, "write", path);
    data = data.subspan(static_cast<std::size_t>(n));
  }
  return {};
}

SysExpected<void> sync_fd(int fd, const std::string& path) {
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    // Some file systems cannot sync a directory; the data is as safe as they allow.
    if (errno == EINVAL || errno == EROFS) return {};
    return sys_error(errno, "fsync", path);
  }
  return {};
}

std::vector<std::string> directory_names(int dir_fd) {
  std::vector<std::string> names;
  // fdopendir takes ownership of its descriptor and shares the offset with
  // `dir_fd`'s, so it gets a fresh descriptor of the same directory.
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(dir);
  return names;
}

bool process_is_dead(pid_t pid) {
  if (pid <= 0) return false;
  // EPERM means it exists but belongs to someone else: alive.
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

int64_t nanoseconds(const struct timespec& t) {
  // Clamped: a file's mtime can be set to anything, and the product must not overflow.
  constexpr int64_t kMaxSeconds = std::numeric_limits<int64_t>::max() / 1'000'000'000 - 1;
  return std::clamp<int64_t>(t.tv_sec, -kMaxSeconds, kMaxSeconds) * 1'000'000'000 + t.tv_nsec;
}

int64_t now_unix_seconds() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace kjit::cache::detail
