// jitctl: manage kjit's kernel cache and precompile it (see `jitctl --help`).
// The command line is CLI11's: every option and value is parsed and checked
// here, before any command runs, so a value that fails to parse (a size, a
// duration, an arch) is a usage error (exit 2) and never reaches a command
// that removes entries.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kjit/codegen/arch.hpp"
#include "cli.hpp"
#include "kjit/cache/store.hpp"
#include "kjit/kjit.h"

namespace kjit::tools {
namespace {

constexpr const char* kEnvironment = R"(environment:
  KJIT_CACHE_DIR        writable cache root (default $XDG_CACHE_HOME/kjit or ~/.cache/kjit)
  KJIT_CACHE_PATH       read-only roots searched after it, colon separated
  KJIT_CACHE_MAX_BYTES  size cap of the writable root (e.g. 4G)
  KJIT_LOG              error, warn (default), info or debug

exit status: 0 success, 1 a failure (named on stderr), 2 a wrong command line,
77 skipped (selftest with nothing to run))";

CLI::Option* add_json(CLI::App& command, bool& json) {
  return command.add_flag("--json", json, "print the result as one JSON document on stdout");
}

CLI::Option* add_filters(CLI::App& command, std::string& op, std::string& arch) {
  command.add_option("--op", op, "only entries of this op (fp8_dequant, grouped_gemm, ...)")->type_name("OP");
  return command.add_option("--arch", arch, "only entries built for this target (e.g. sm_90a)")->type_name("ARCH");
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
  fmt::print(stderr, "jitctl: error: {}\n(see jitctl {}{}--help)\n", message, command, command.empty() ? "" : " ");
  return kExitUsage;
}

int run(int argc, char** argv) {
  CLI::App app("jitctl: manage kjit's kernel cache and precompile it", "jitctl");
  app.set_version_flag("--version", std::string("jitctl (kjit) ") + kjit_version());
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
  show_cmd->add_option("key", show.key, "the entry's key, or a unique prefix of one")->required()->type_name("KEY");
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
  precompile_cmd->add_option("--manifest", precompile.manifest, "the manifest (tools/manifests/*.json); required")
      ->type_name("FILE");
  precompile_cmd->add_option("--arch", precompile.archs, "targets, comma separated (e.g. sm_90a,sm_100a); required")
      ->delimiter(',')
      ->type_name("LIST")
      ->check(CLI::Validator(
          [](std::string& target) {
            auto row = codegen::arch_for_target(target);
            return row ? std::string() : row.error().message;
          },
          "ARCH"));
  precompile_cmd->add_option("-j,--jobs", precompile.jobs, "compile with N threads (default: one per core)")
      ->check(CLI::Range(1, 1024))
      ->type_name("N");
  add_json(*precompile_cmd, precompile.json);

  auto* selftest_cmd = app.add_subcommand(
      "selftest",
      "launch each cached kernel kind once per GPU arch and check it against the CPU (77: nothing to run)");

  if (argc <= 1) {
    std::fputs(app.help().c_str(), stderr);
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
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
  if (*selftest_cmd) return cmd_selftest();
  return usage_error("no command given");
}

}  // namespace kjit::tools

int main(int argc, char** argv) { return kjit::tools::run(argc, argv); }
