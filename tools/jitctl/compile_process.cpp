// jitctl precompile's compile processes (see compile_process.hpp).
#include "compile_process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <initializer_list>
#include <new>
#include <optional>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "kjit/cache/store.hpp"
#include "output.hpp"

extern char** environ;

namespace kjit::tools {
namespace {

constexpr int kWorkerFd = 3;                    // the worker's end of the socket
constexpr size_t kMaxField = size_t{1} << 30;   // a compile log is long, never this long

std::string errno_text(int error) { return std::error_code(error, std::generic_category()).message(); }

// Messages on the socket: a fixed number of fields, each "<decimal length>:<bytes>",
// so that any bytes (a path, a compile log) cross unchanged. Requests and
// replies alternate, one at a time: nothing is ever left buffered after a reply.
class Channel {
 public:
  explicit Channel(int fd) : fd_(fd) {}

  // False when the peer is gone (never SIGPIPE: MSG_NOSIGNAL).
  bool send(std::initializer_list<std::string_view> fields) {
    std::string message;
    for (const std::string_view field : fields) message += fmt::format("{}:{}", field.size(), field);
    std::string_view rest(message);
    while (!rest.empty()) {
      const ssize_t n = ::send(fd_, rest.data(), rest.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      rest.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // `count` fields; nullopt at the end of the stream or on anything malformed.
  std::optional<std::vector<std::string>> receive(size_t count) {
    std::vector<std::string> fields;
    for (size_t f = 0; f < count; ++f) {
      size_t length = 0;
      for (int digits = 0;; ++digits) {
        const auto c = next();
        if (!c) return std::nullopt;
        if (*c == ':' && digits > 0) break;
        if (*c < '0' || *c > '9' || digits == 10) return std::nullopt;
        length = length * 10 + static_cast<size_t>(*c - '0');
      }
      if (length > kMaxField) return std::nullopt;
      std::string field;
      while (field.size() < length) {
        if (pos_ == buffer_.size() && !fill()) return std::nullopt;
        const size_t take = std::min(length - field.size(), buffer_.size() - pos_);
        field.append(buffer_, pos_, take);
        pos_ += take;
      }
      fields.push_back(std::move(field));
    }
    return fields;
  }

 private:
  bool fill() {
    buffer_.resize(size_t{1} << 16);
    for (;;) {
      const ssize_t n = ::read(fd_, buffer_.data(), buffer_.size());
      if (n < 0 && errno == EINTR) continue;
      buffer_.resize(n > 0 ? static_cast<size_t>(n) : 0);
      pos_ = 0;
      return n > 0;
    }
  }
  std::optional<char> next() {
    if (pos_ == buffer_.size() && !fill()) return std::nullopt;
    return buffer_[pos_++];
  }

  int fd_;
  std::string buffer_;
  size_t pos_ = 0;
};

constexpr std::string_view kind_name(JobOutcome::Kind kind) {
  switch (kind) {
    case JobOutcome::Kind::compiled: return "compiled";
    case JobOutcome::Kind::cached: return "cached";
    case JobOutcome::Kind::failed: break;
  }
  return "failed";
}

JobOutcome failed(std::string why) {
  JobOutcome outcome;
  outcome.error = std::move(why);
  return outcome;
}

// A worker's death by `signal`, with its likely cause.
std::string died_of(int signal) {
  const char* name = ::sigabbrev_np(signal);
  const char* description = ::sigdescr_np(signal);
  std::string what = fmt::format("the compile process (NVRTC) died with {} ({})",
                                 name ? fmt::format("SIG{}", name) : fmt::format("signal {}", signal),
                                 description ? description : "unknown signal");
  rlimit address_space{};
  const bool limited = ::getrlimit(RLIMIT_AS, &address_space) == 0 && address_space.rlim_cur != RLIM_INFINITY;
  if (limited && (signal == SIGABRT || signal == SIGSEGV || signal == SIGBUS))
    what += fmt::format(": likely out of memory: each compile may map {} MiB (ulimit -v {}) and NVRTC's LLVM aborts "
                        "when an allocation fails; raise the limit",
                        address_space.rlim_cur >> 20, address_space.rlim_cur / 1024);
  else if (signal == SIGABRT)
    what += ": NVRTC's LLVM aborts when an allocation fails, so likely out of memory";
  else if (signal == SIGKILL)
    what += ": killed, likely by the kernel's out-of-memory killer; fewer compile threads (-j) need less memory";
  return what;
}

}  // namespace

JobOutcome build_here(Builder& builder, const codegen::KernelSpec& spec, const codegen::ArchInfo& arch) {
  try {
    auto built = builder.build(spec, arch);
    if (!built) return failed(std::move(built.error().message));
    JobOutcome outcome;
    outcome.kind = built->origin == CubinOrigin::disk_cache ? JobOutcome::Kind::cached : JobOutcome::Kind::compiled;
    outcome.key = std::move(built->key);
    return outcome;
  } catch (const std::bad_alloc&) {
    return failed("out of memory while building it");
  } catch (const std::exception& e) {
    return failed(fmt::format("unexpected error while building it: {}", e.what()));
  }
}

Expected<CompileProcess> CompileProcess::start() {
  int ends[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
    return fail(KJIT_ERROR_INTERNAL, fmt::format("cannot start a compile process: socketpair: {}", errno_text(errno)));
  // The worker's end above the standard descriptors, so that dup2 onto fd 3
  // always copies it (clearing close-on-exec there only); every other
  // descriptor, other threads' sockets included, is close-on-exec.
  const int worker_end = ::fcntl(ends[1], F_DUPFD_CLOEXEC, 10);
  const int dup_error = errno;
  ::close(ends[1]);
  if (worker_end < 0) {
    ::close(ends[0]);
    return fail(KJIT_ERROR_INTERNAL, fmt::format("cannot start a compile process: dup: {}", errno_text(dup_error)));
  }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, worker_end, kWorkerFd);
  ::posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // Its stdout is jitctl's stderr: nothing it prints may land in a --json report.
  if (::fcntl(STDERR_FILENO, F_GETFD) >= 0)
    ::posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  else
    ::posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  std::string arg0 = "jitctl", arg1 = kCompileWorkerCommand;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = -1;
  const int error = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(worker_end);
  if (error != 0) {
    ::close(ends[0]);
    return fail(KJIT_ERROR_INTERNAL, fmt::format("cannot start a compile process (/proc/self/exe): {}", errno_text(error)));
  }
  return CompileProcess(pid, ends[0]);
}

CompileProcess::CompileProcess(CompileProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), socket_(std::exchange(other.socket_, -1)) {}

CompileProcess::~CompileProcess() {
  if (alive()) end();
}

std::string CompileProcess::end() {
  ::close(socket_);  // a worker waiting for a job reads the end and exits
  socket_ = -1;
  int status = 0;
  pid_t got;
  while ((got = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
  }
  const int wait_error = errno;
  pid_ = -1;
  if (got < 0) return fmt::format("the compile process ended unseen (waitpid: {})", errno_text(wait_error));
  if (WIFSIGNALED(status)) return died_of(WTERMSIG(status));
  return fmt::format("the compile process exited with status {} before answering (its messages above say why)",
                     WEXITSTATUS(status));
}

JobOutcome CompileProcess::build(const codegen::KernelSpec& spec, const codegen::ArchInfo& arch) {
  if (!alive()) return failed("no compile process");
  Channel channel(socket_);
  std::optional<std::vector<std::string>> reply;
  if (channel.send({arch.target, codegen::to_json(spec).dump()})) reply = channel.receive(4);
  if (!reply) return failed(end());
  auto& fields = *reply;
  JobOutcome outcome;
  if (fields[0] == kind_name(JobOutcome::Kind::compiled)) outcome.kind = JobOutcome::Kind::compiled;
  else if (fields[0] == kind_name(JobOutcome::Kind::cached)) outcome.kind = JobOutcome::Kind::cached;
  outcome.key = std::move(fields[1]);
  outcome.error = std::move(fields[2]);
  const std::string& evicted = fields[3];
  std::from_chars(evicted.data(), evicted.data() + evicted.size(), outcome.evicted);
  if (outcome.kind == JobOutcome::Kind::failed && outcome.error.empty()) outcome.error = "the compile process failed it";
  return outcome;
}

int compile_worker_main() {
  struct stat st {};
  if (::fstat(kWorkerFd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
    err("jitctl: error: {} is jitctl precompile's compile process, not a command\n", kCompileWorkerCommand);
    return kExitUsage;
  }
  Channel channel(kWorkerFd);
  cache::Store store(cache::config_from_environment());
  Builder builder(store);
  while (auto job = channel.receive(2)) {
    JobOutcome outcome;
    auto arch = codegen::arch_for_target((*job)[0]);
    const auto json = nlohmann::json::parse((*job)[1], nullptr, /*allow_exceptions=*/false);
    auto spec = json.is_discarded() ? Expected<codegen::KernelSpec>(fail(KJIT_ERROR_INTERNAL, "a spec that is not JSON"))
                                    : codegen::spec_from_json(json);
    if (!arch) {
      outcome = failed(arch.error().message);
    } else if (!spec) {
      outcome = failed(spec.error().message);
    } else {
      const uint64_t evicted = store.counters().evicted;
      outcome = build_here(builder, *spec, **arch);
      outcome.evicted = store.counters().evicted - evicted;
    }
    if (!channel.send({kind_name(outcome.kind), outcome.key, outcome.error, std::to_string(outcome.evicted)}))
      return kExitFailure;  // jitctl is gone
  }
  return kExitOk;
}

}  // namespace kjit::tools
