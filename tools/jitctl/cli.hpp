// Shared pieces of the jitctl subcommands: argument access and exit codes.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kjit::tools {

// Conventional exit codes: 0 success, 1 the work found or hit a failure,
// 2 the command line was wrong.
enum ExitCode { kExitOk = 0, kExitFailure = 1, kExitUsage = 2 };

// The arguments after the subcommand, consumed as options are read; whatever
// is left over at the end is an error the subcommand reports.
class Args {
 public:
  explicit Args(std::vector<std::string> args) : args_(std::move(args)) {}
  bool flag(std::string_view name);                         // --json
  std::optional<std::string> value(std::string_view name);  // --arch X or --arch=X
  std::optional<std::string> positional();
  // Non-empty when an option was left unread or lacked its value.
  std::string leftover_error() const;

 private:
  std::vector<std::string> args_;
  std::string missing_value_;
};

int cmd_info(Args& args);
int cmd_list(Args& args);
int cmd_show(Args& args);
int cmd_clear(Args& args);
int cmd_prune(Args& args);
int cmd_verify(Args& args);
int cmd_precompile(Args& args);
int cmd_selftest(Args& args);

// Prints "jitctl: error: ..." to stderr and returns kExitUsage.
int usage_error(std::string_view message);

}  // namespace kjit::tools
