// The handful of POSIX file operations the store is built from. Each keeps the
// errno (the store decides from it whether a root is unwritable or full) and a
// message that names the path and the errno text. Internal to cache/.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kjit::cache::detail {

struct SysError {
  int err = 0;          // the errno, 0 when the failure is not a system call's
  std::string message;  // "could not <what> <path>: <errno text>"
};

template <class T>
using SysExpected = std::expected<T, SysError>;

std::string errno_text(int err);
std::unexpected<SysError> sys_error(int err, std::string_view what, std::string_view path);

// An owned file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release();
  // Closes now and reports the error: NFS reports deferred write errors at close.
  SysExpected<void> close_checked(const std::string& path);

 private:
  int fd_ = -1;
};

std::string join_path(std::string_view dir, std::string_view name);

// Opens a directory by path, following symlinks: a root itself may be a link.
SysExpected<Fd> open_directory(const std::string& path);
// Opens `name` inside `dir_fd` as a directory, refusing a symlink.
SysExpected<Fd> open_subdirectory(int dir_fd, const std::string& name, const std::string& path);
// mkdir -p: creates the missing components of `path` with `mode`.
SysExpected<void> create_directories(const std::string& path, mode_t mode);
SysExpected<struct stat> stat_fd(int fd, const std::string& path);

// Reads `bytes` at `offset`; a short file is an error (err 0).
SysExpected<std::vector<char>> read_exactly(int fd, uint64_t offset, std::size_t bytes, const std::string& path);
SysExpected<void> write_all(int fd, std::span<const char> data, const std::string& path);
SysExpected<void> sync_fd(int fd, const std::string& path);

// Names in the directory, without "." and "..". Empty when it cannot be read.
std::vector<std::string> directory_names(int dir_fd);

// True only when no process with this pid exists in our pid namespace.
bool process_is_dead(pid_t pid);
int64_t nanoseconds(const struct timespec& t);
int64_t now_unix_seconds();

}  // namespace kjit::cache::detail
