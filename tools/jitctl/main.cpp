// jitctl: manage kjit's kernel cache and precompile it (see `jitctl --help`).
// The command line is CLI11's: every option and value is parsed and checked
// here, before any command runs, so a value that fails to parse (a size, a
// duration, an arch) is a usage error (exit 2) and never reaches a command
// that removes entries.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <new>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kjit/codegen/arch.hpp"
#include "kjit/codegen/kernel_spec.hpp"
#include "cli.hpp"
#include "compile_process.hpp"
#include "output.hpp"
#include "suggest.hpp"
#include "kjit/cache/store.hpp"
#include "kjit/kjit.h"

namespace kjit::tools {
namespace {

constexpr const char* kEnvironment = R"(environment:
  KJIT_CACHE_DIR        writable cache root (default $XDG_CACHE_HOME/kjit or ~/.cache/kjit)
  KJIT_CACHE_PATH       read-only roots searched after it, colon separated
  KJIT_CACHE_MAX_BYTES  size cap of the writable root (e.g. 4G)
  KJIT_LOG              error, warn (default), info or debug
  (every variable kjit reads: docs/environment.md)

aliases: jitctl help [COMMAND] (--help), jitctl version and -V (--version)

exit status: 0 success, 1 a failure (named on stderr), 2 a wrong command line,
77 skipped (selftest with nothing to run))";

CLI::Option* add_json(CLI::App& command, bool& json) {
  return command.add_flag("--json", json, "print the result as one JSON document on stdout");
}

// The names codegen knows, as strings (for the messages and did_you_mean).
std::vector<std::string> known_ops() {
  std::vector<std::string> ops;
  for (auto op : codegen::spec_ops()) ops.emplace_back(op);
  return ops;
}
std::vector<std::string> known_archs() {
  std::vector<std::string> archs;
  for (const auto& row : codegen::capability_table()) archs.emplace_back(row.target);
  return archs;
}

// "'sm_90' is not a known arch (did you mean 'sm_90a'?); known: sm_80, ..."
std::string unknown_value(std::string_view what, const std::string& value, const std::vector<std::string>& known) {
  return fmt::format("'{}' is not a known {}{}; known: {}", value, what, did_you_mean(value, known),
                     fmt::join(known, ", "));
}

// A filter's value is checked against what kjit knows, so that a typo is an
// error rather than an empty listing (or a clear that removes nothing).
CLI::Validator one_of(std::string_view what, std::vector<std::string> (*known)()) {
  return CLI::Validator(
      [what, known](std::string& value) {
        const auto names = known();
        return std::find(names.begin(), names.end(), value) != names.end() ? std::string()
                                                                           : unknown_value(what, value, names);
      },
      std::string(what == "op" ? "OP" : "ARCH"));
}

CLI::Option* add_filters(CLI::App& command, std::string& op, std::string& arch) {
  command.add_option("--op", op, "only entries of this op (fp8_dequant, grouped_gemm, ...)")
      ->type_name("OP")
      ->check(one_of("op", known_ops));
  return command.add_option("--arch", arch, "only entries built for this target (e.g. sm_90a)")
      ->type_name("ARCH")
      ->check(one_of("arch", known_archs));
}

// The long and short names of `command`'s options ("--json", "-j").
std::vector<std::string> option_names(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const auto& name : option->get_lnames()) names.push_back("--" + name);
    for (const auto& name : option->get_snames()) names.push_back("-" + name);
  }
  return names;
}

// Commands and options that do not exist, named with the nearest that does,
// before CLI11 parses (whose messages for these are "A subcommand is required"
// and "The following argument was not expected"). Empty when all are known.
std::string unknown_names(const CLI::App& app, const std::vector<std::string>& args, std::string& command) {
  const CLI::App* scope = &app;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") break;
    if (arg.size() > 1 && arg[0] == '-') {
      if (arg[1] != '-' && arg.size() > 2) continue;  // -j4: CLI11's to judge
      const std::string name = arg.substr(0, arg.find('='));
      const auto names = option_names(*scope);
      if (std::find(names.begin(), names.end(), name) == names.end())
        return fmt::format("unknown option '{}'{}{}", name, scope == &app ? "" : fmt::format(" of '{}'", command),
                           did_you_mean(name, names));
    } else if (scope == &app) {
      std::vector<std::string> commands;
      for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
        commands.push_back(sub->get_name());
      if (std::find(commands.begin(), commands.end(), arg) == commands.end()) {
        const auto near = did_you_mean(arg, commands);
        return fmt::format("unknown command '{}'{}", arg,
                           near.empty() ? fmt::format(" (commands: {})", fmt::join(commands, ", ")) : near);
      }
      command = arg;
      scope = app.get_subcommand(arg);
    }
    // Anything else is a positional argument or an option's value: CLI11 checks those.
  }
  return {};
}

// The aliases: `help [COMMAND]` is `[COMMAND] --help`, `version` is `--version`.
std::vector<std::string> with_aliases(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() >= 2 && args[1] == "help") {
    args.erase(args.begin() + 1);
    args.push_back("--help");
  } else if (args.size() == 2 && args[1] == "version") {
    args[1] = "--version";
  }
  return args;
}

// Parsed by the cache library's parsers, the ones KJIT_CACHE_MAX_BYTES uses.
CLI::Option* add_size(CLI::App& command, const std::string& name, std::optional<uint64_t>& out,
                      const std::string& help) {
  return command
      .add_option_function<std::string>(
          name,
          [&out, name](const std::string& text) {
            out = cache::parse_byte_size(text);
            if (!out)
              throw CLI::ValidationError(
                  name, fmt::format("takes a size like 4G, 512M or 1048576 (below 16E, no sign), got '{}'", text));
          },
          help)
      ->type_name("SIZE");
}

CLI::Option* add_duration(CLI::App& command, const std::string& name, std::optional<std::chrono::seconds>& out,
                          const std::string& help) {
  return command
      .add_option_function<std::string>(
          name,
          [&out, name](const std::string& text) {
            out = cache::parse_duration(text);
            if (!out)
              throw CLI::ValidationError(
                  name, fmt::format("takes a count and a unit (s, m, h, d or w), like 7d or 12h, got '{}'", text));
          },
          help)
      ->type_name("DURATION");
}

}  // namespace

int usage_error(std::string_view message, std::string_view command) {
  err("jitctl: error: {}\n(see jitctl {}{}--help)\n", message, command, command.empty() ? "" : " ");
  return kExitUsage;
}

int run(int argc, char** argv) {
  CLI::App app("jitctl: manage kjit's kernel cache and precompile it", "jitctl");
  app.set_version_flag("-V,--version", std::string("jitctl (kjit) ") + kjit_version());
  app.footer(kEnvironment);
  app.require_subcommand(1);

  InfoOptions info;
  auto* info_cmd = app.add_subcommand("info", "devices, capabilities, driver and NVRTC versions, cache roots");
  add_json(*info_cmd, info.json);

  ListOptions list;
  auto* list_cmd = app.add_subcommand("list", "cached kernels in every root");
  add_filters(*list_cmd, list.op, list.arch);
  list_cmd->add_flag("--summary", list.summary, "entry counts and sizes per op and arch, not one line per entry");
  add_json(*list_cmd, list.json);

  ShowOptions show;
  auto* show_cmd = app.add_subcommand("show", "one entry: spec, source, compile log");
  show_cmd->add_option("key", show.key, "the entry's key, or a unique prefix of one")
      ->required()
      ->type_name("KEY")
      ->check(CLI::Validator(
          [](std::string& key) {
            return !key.empty() && key.find_first_not_of("0123456789abcdef") == std::string::npos
                       ? std::string()
                       : fmt::format("a key is lowercase hex digits (as `jitctl list` prints them), got '{}'", key);
          },
          "KEY"));
  show_cmd->add_option("--cubin", show.cubin, "also write the entry's cubin to FILE (for cuobjdump -sass)")
      ->type_name("FILE");
  add_json(*show_cmd, show.json);

  ClearOptions clear;
  auto* clear_cmd = app.add_subcommand(
      "clear", "remove entries of the writable root (read-only roots are never touched)");
  add_filters(*clear_cmd, clear.op, clear.arch);
  add_duration(*clear_cmd, "--older-than", clear.older_than, "only entries last used longer ago than DURATION");
  clear_cmd->add_flag("--yes", clear.yes, "clear a cache of many entries without a filter without asking");
  add_json(*clear_cmd, clear.json);

  PruneOptions prune;
  auto* prune_cmd = app.add_subcommand("prune", "evict least recently used entries down to a size, and debris");
  add_size(*prune_cmd, "--max-bytes", prune.max_bytes, "the size to prune to (default: the cap in force)");
  add_json(*prune_cmd, prune.json);

  VerifyOptions verify;
  auto* verify_cmd = app.add_subcommand("verify", "check every entry; exit 1 if any is bad");
  verify_cmd->add_flag("--fix", verify.fix, "remove the bad entries of the writable root");
  add_json(*verify_cmd, verify.json);

  PrecompileOptions precompile;
  auto* precompile_cmd = app.add_subcommand(
      "precompile", "compile a manifest's kernels into the writable root (needs no GPU)");
  // Both required; checked by cmd_precompile, whose message says what it needs.
  precompile_cmd
      ->add_option("--manifest", precompile.manifest,
                   "a manifest file, or a bundled manifest's name (default, deepseek-v3, ...: "
                   "tools/manifests/*.json, compiled into jitctl); required")
      ->type_name("FILE|NAME");
  precompile_cmd->add_option("--arch", precompile.archs, "targets, comma separated (e.g. sm_90a,sm_100a); required")
      ->delimiter(',')
      ->type_name("LIST")
      ->check(one_of("arch", known_archs));
  precompile_cmd->add_option("-j,--jobs", precompile.jobs,
                             "compile with N threads (default: one per CPU this process may use: its affinity "
                             "mask, capped by a cgroup CPU quota)")
      ->check(CLI::Range(1, 1024))
      ->type_name("N");
  add_json(*precompile_cmd, precompile.json);

  SelftestOptions selftest;
  auto* selftest_cmd = app.add_subcommand(
      "selftest",
      "launch each cached kernel kind once per GPU arch and check it against the CPU (77: nothing to run)");
  selftest_cmd->add_flag("--exhaustive", selftest.exhaustive,
                         "the full checks: every column of the sampled rows, three routed experts (the GPU tests')");
  selftest_cmd
      ->add_option("--filter", selftest.filter, "only kernels whose canonical text matches REGEX (ECMAScript, searched)")
      ->type_name("REGEX")
      ->check(CLI::Validator(
          [](std::string& pattern) {
            try {
              std::regex compiled(pattern);
              return std::string();
            } catch (const std::regex_error& e) {
              return fmt::format("'{}' is not a valid regular expression ({})", pattern, e.what());
            }
          },
          ""));
  selftest_cmd->add_option("-j,--jobs", selftest.jobs, "run N checks at once (default: one per CPU, at most 16)")
      ->check(CLI::Range(1, 1024))
      ->type_name("N");
  add_json(*selftest_cmd, selftest.json);

  if (argc <= 1) {
    std::fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  std::vector<std::string> args = with_aliases(argc, argv);
  std::string command;
  if (const std::string unknown = unknown_names(app, args, command); !unknown.empty())
    return usage_error(unknown, command);
  std::vector<char*> arg_pointers;
  for (auto& arg : args) arg_pointers.push_back(arg.data());
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    const auto commands = app.get_subcommands();
    return usage_error(e.what(), commands.empty() ? "" : commands.front()->get_name());
  }
  if (*info_cmd) return cmd_info(info);
  if (*list_cmd) return cmd_list(list);
  if (*show_cmd) return cmd_show(show);
  if (*clear_cmd) return cmd_clear(clear);
  if (*prune_cmd) return cmd_prune(prune);
  if (*verify_cmd) return cmd_verify(verify);
  if (*precompile_cmd) return cmd_precompile(precompile);
  if (*selftest_cmd) return cmd_selftest(selftest);
  return usage_error("no command given");
}

}  // namespace kjit::tools

int main(int argc, char** argv) {
  // Under a file-size limit (ulimit -f) a write past it must fail with EFBIG,
  // which the cache reports as an error naming the file, not kill jitctl.
  std::signal(SIGXFSZ, SIG_IGN);
  // Whatever escapes a command (out of memory, say) is an error with a message, not an abort.
  try {
    // A compile process of `jitctl precompile` (compile_process.hpp), never a command typed.
    if (argc == 2 && std::string_view(argv[1]) == kjit::tools::kCompileWorkerCommand)
      return kjit::tools::compile_worker_main();
    return kjit::tools::run(argc, argv);
  } catch (const std::bad_alloc&) {
    kjit::tools::err("jitctl: error: out of memory\n");
  } catch (const std::exception& e) {
    kjit::tools::err("jitctl: error: {}\n", e.what());
  }
  return kjit::tools::kExitFailure;
}
