// Shared pieces of the jitctl subcommands: their options (parsed and checked
// in main.cpp, with CLI11, before any command runs) and exit codes.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kjit::tools {

// Conventional exit codes: 0 success, 1 the work found or hit a failure,
// 2 the command line was wrong, 77 nothing to do here (automake's "skipped",
// which ctest and the main-job script read as such).
enum ExitCode { kExitOk = 0, kExitFailure = 1, kExitUsage = 2, kExitSkipped = 77 };

struct InfoOptions {
  bool json = false;
};

struct ListOptions {
  bool json = false;
  bool summary = false;  // counts per op and arch instead of one line per entry
  std::string op, arch;
};

struct ShowOptions {
  std::string key;    // or a unique prefix of one
  std::string cubin;  // where to write the cubin; empty: nowhere
  bool json = false;
};

struct ClearOptions {
  std::string op, arch;
  std::optional<std::chrono::seconds> older_than;
  bool yes = false;  // no confirmation for clearing a large cache without a filter
  bool json = false;
};

struct PruneOptions {
  std::optional<uint64_t> max_bytes;  // default: the cap in force
  bool json = false;
};

struct VerifyOptions {
  bool fix = false;
  bool json = false;
};

struct PrecompileOptions {
  std::string manifest;
  std::vector<std::string> archs;
  unsigned jobs = 0;  // 0: one per hardware thread
  bool json = false;
};

struct SelftestOptions {
  bool json = false;
  bool exhaustive = false;  // the full checks (harness::Depth::exhaustive) instead of the quick ones
  std::string filter;       // an ECMAScript regex searched in each kernel's canonical text; empty: all
  unsigned jobs = 0;        // checks at once; 0: one per CPU, at most 16
};

int cmd_info(const InfoOptions& options);
int cmd_list(const ListOptions& options);
int cmd_show(const ShowOptions& options);
int cmd_clear(const ClearOptions& options);
int cmd_prune(const PruneOptions& options);
int cmd_verify(const VerifyOptions& options);
int cmd_precompile(const PrecompileOptions& options);
int cmd_selftest(const SelftestOptions& options);

// Prints "jitctl: error: ..." to stderr, pointing at `jitctl [command] --help`,
// and returns kExitUsage.
int usage_error(std::string_view message, std::string_view command = "");

}  // namespace kjit::tools
