// jitctl: manage kjit's kernel cache and precompile it (see `jitctl --help`).
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli.hpp"

namespace kjit::tools {
namespace {

constexpr const char* kUsage = R"(usage: jitctl <command> [options]

commands:
  info                          devices, capabilities, driver and NVRTC versions, cache roots
  list [--json] [--op OP] [--arch ARCH]
                                cached kernels in every root
  show KEY [--cubin FILE]       one entry: spec, source, compile log (KEY may be a unique prefix);
                                --cubin writes its cubin to FILE (for cuobjdump -sass)
  clear [--arch ARCH] [--op OP] [--older-than DURATION] [--include-read-only]
                                remove entries (all of the writable root without filters)
  prune [--max-bytes SIZE]      evict least recently used entries down to SIZE (default: the cap)
  verify [--fix]                check every entry; exit 1 if any is bad (--fix removes them)
  precompile --manifest FILE --arch LIST [-j N]
                                compile a manifest's kernels for each arch into the cache;
                                needs no GPU or driver
  selftest                      on a GPU machine: launch every cached kernel kind built for a present
                                device once on random data and check it bit for bit against the CPU

environment:
  KJIT_CACHE_DIR        writable cache root (default $XDG_CACHE_HOME/kjit or ~/.cache/kjit)
  KJIT_CACHE_PATH       read-only roots searched after it, colon separated
  KJIT_CACHE_MAX_BYTES  size cap of the writable root (e.g. 4G)
  KJIT_LOG              error, warn (default), info or debug
)";

}  // namespace

int usage_error(std::string_view message) {
  fmt::print(stderr, "jitctl: error: {}\n(see jitctl --help)\n", message);
  return kExitUsage;
}

bool Args::flag(std::string_view name) {
  for (auto it = args_.begin(); it != args_.end(); ++it)
    if (*it == name) {
      args_.erase(it);
      return true;
    }
  return false;
}

std::optional<std::string> Args::value(std::string_view name) {
  for (auto it = args_.begin(); it != args_.end(); ++it) {
    if (*it == name) {
      if (it + 1 == args_.end()) {
        missing_value_ = std::string(name);
        args_.erase(it);
        return std::nullopt;
      }
      std::string v = *(it + 1);
      args_.erase(it, it + 2);
      return v;
    }
    if (it->starts_with(name) && it->size() > name.size() && (*it)[name.size()] == '=') {
      std::string v = it->substr(name.size() + 1);
      args_.erase(it);
      return v;
    }
  }
  return std::nullopt;
}

std::optional<std::string> Args::positional() {
  for (auto it = args_.begin(); it != args_.end(); ++it)
    if (!it->starts_with("-")) {
      std::string v = *it;
      args_.erase(it);
      return v;
    }
  return std::nullopt;
}

std::string Args::leftover_error() const {
  if (!missing_value_.empty()) return fmt::format("option {} needs a value", missing_value_);
  if (!args_.empty()) return fmt::format("unexpected argument '{}'", args_.front());
  return "";
}

}  // namespace kjit::tools

int main(int argc, char** argv) {
  using namespace kjit::tools;
  std::vector<std::string> rest(argv + 1, argv + argc);
  if (rest.empty() || rest[0] == "--help" || rest[0] == "-h" || rest[0] == "help") {
    std::fputs(kUsage, rest.empty() ? stderr : stdout);
    return rest.empty() ? kExitUsage : kExitOk;
  }
  const std::string command = rest[0];
  Args args({rest.begin() + 1, rest.end()});
  if (command == "info") return cmd_info(args);
  if (command == "list") return cmd_list(args);
  if (command == "show") return cmd_show(args);
  if (command == "clear") return cmd_clear(args);
  if (command == "prune") return cmd_prune(args);
  if (command == "verify") return cmd_verify(args);
  if (command == "precompile") return cmd_precompile(args);
  if (command == "selftest") return cmd_selftest(args);
  return usage_error(fmt::format("unknown command '{}'", command));
}
