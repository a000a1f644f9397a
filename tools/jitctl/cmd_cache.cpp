// jitctl list / show / clear / prune / verify: the cache as a user sees it.
// Read-only roots are never modified; to manage one, make it the writable
// root for the command (KJIT_CACHE_DIR=/path jitctl clear).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include <fmt/format.h>

#include "cli.hpp"
#include "output.hpp"
#include "kjit/cache/store.hpp"

namespace kjit::tools {
namespace {

// The cache of the environment (KJIT_CACHE_DIR, KJIT_CACHE_PATH): listing and
// maintenance need no driver, so jitctl does not load one for them.
cache::Store& cache_store() {
  static cache::Store store(cache::config_from_environment());
  return store;
}

int64_t now_unix() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string human_bytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.1f}G", static_cast<double>(bytes) / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f}M", static_cast<double>(bytes) / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f}K", static_cast<double>(bytes) / (1ull << 10));
  return fmt::format("{}B", bytes);
}

std::string human_age(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds >= 86400) return fmt::format("{}d", seconds / 86400);
  if (seconds >= 3600) return fmt::format("{}h", seconds / 3600);
  if (seconds >= 60) return fmt::format("{}m", seconds / 60);
  return fmt::format("{}s", seconds);
}

// Names what maintenance could not act on; true when there was any.
bool report_failures(const std::vector<cache::Failure>& failures) {
  for (const auto& f : failures) err("jitctl: error: not removed: {}\n", shown(f.message));
  return !failures.empty();
}

nlohmann::json failures_json(const std::vector<cache::Failure>& failures) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& f : failures) out.push_back(f.message);
  return out;
}

struct Filter {
  std::string op, arch;
  int64_t older_than = -1;
  bool matches(const cache::EntryInfo& e) const {
    if (!op.empty() && e.fields.op != op) return false;
    if (!arch.empty() && e.fields.arch != arch) return false;
    if (older_than >= 0 && now_unix() - e.last_used_unix < older_than) return false;
    return true;
  }
};

std::string_view state_name(cache::EntryState s) {
  switch (s) {
    case cache::EntryState::ok: return "ok";
    case cache::EntryState::corrupt: return "corrupt";
    case cache::EntryState::other_format: return "other-format";
    case cache::EntryState::unreadable: return "unreadable";
  }
  return "?";
}

nlohmann::json entry_json(const cache::EntryInfo& e) {
  nlohmann::json j = {{"key", e.key},
                      {"state", state_name(e.state)},
                      {"root", e.root},
                      {"read_only", e.read_only},
                      {"bytes", e.file_bytes},
                      {"created_unix", e.created_unix},
                      {"last_used_unix", e.last_used_unix},
                      {"verified", e.verified}};
  if (e.state == cache::EntryState::ok) {
    j["op"] = e.fields.op;
    j["arch"] = e.fields.arch;
    j["spec"] = e.meta.value("spec", nlohmann::json());
    j["canonical"] = e.fields.canonical;
    j["nvrtc"] = e.fields.nvrtc;
  } else {
    j["problem"] = e.problem;
  }
  return j;
}

// Entry counts and bytes per op and arch (entries that are not ok under their state).
int print_summary(const std::vector<cache::EntryInfo>& entries, bool json) {
  struct Group {
    uint64_t entries = 0, bytes = 0;
  };
  std::map<std::pair<std::string, std::string>, Group> groups;
  uint64_t total = 0;
  for (const auto& e : entries) {
    const std::string op = e.state == cache::EntryState::ok ? e.fields.op
                                                            : fmt::format("({})", state_name(e.state));
    auto& group = groups[{op, e.fields.arch}];
    ++group.entries;
    group.bytes += e.file_bytes;
    total += e.file_bytes;
  }
  if (json) {
    nlohmann::json out = {{"entries", entries.size()}, {"bytes", total}, {"groups", nlohmann::json::array()}};
    for (const auto& [name, group] : groups)
      out["groups"].push_back({{"op", name.first}, {"arch", name.second}, {"entries", group.entries},
                               {"bytes", group.bytes}});
    print_json(out);
    return kExitOk;
  }
  out("{:<14} {:<8} {:>7} {:>8}\n", "OP", "ARCH", "ENTRIES", "SIZE");
  for (const auto& [name, group] : groups)
    out("{:<14} {:<8} {:>7} {:>8}\n", shown(name.first), shown(name.second), group.entries, human_bytes(group.bytes));
  out("{} entr{}, {} (`jitctl list` shows each)\n", entries.size(), entries.size() == 1 ? "y" : "ies",
             human_bytes(total));
  return kExitOk;
}

// The directory `path` names, resolved (links followed); empty when it cannot be.
std::string resolved_directory(const std::string& path) {
  std::error_code ec;
  auto resolved = std::filesystem::canonical(path, ec);
  return ec ? std::string() : resolved.string();
}

// The cache root (writable or read-only) that `directory` lies in, if any.
std::optional<std::string> cache_root_holding(const std::string& directory) {
  const auto& config = cache_store().config();
  std::vector<std::string> roots = config.read_only_roots;
  roots.push_back(config.writable_root);
  for (const auto& root : roots) {
    const std::string resolved = root.empty() ? std::string() : resolved_directory(root);
    if (resolved.empty()) continue;
    if (directory == resolved || directory.starts_with(resolved + "/")) return root;
  }
  return std::nullopt;
}

// Writes the cubin alone, for cuobjdump / nvdisasm; its size, or nullopt
// after saying why on stderr. Never inside a cache root (the entry's own file
// or another's), and never through what is at `path`: the bytes go to a new
// file beside it, renamed over it, so a link planted there (hard or
// symbolic) is replaced, never written through.
std::optional<size_t> write_cubin(const std::string& key, const std::string& path) {
  const std::filesystem::path target(path);
  const std::string parent = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  const std::string directory = resolved_directory(parent);
  if (directory.empty()) {
    err("jitctl: error: cannot write {}: its directory {} does not exist\n", path, parent);
    return std::nullopt;
  }
  if (auto root = cache_root_holding(directory)) {
    err("jitctl: error: refusing to write {}: it is inside the cache root {} (pick a path outside the cache)\n",
        path, *root);
    return std::nullopt;
  }
  auto entry = cache_store().load(key);
  if (!entry) {
    err("jitctl: error: entry {} could not be read back\n", key);
    return std::nullopt;
  }
  const std::string temp = fmt::format("{}.jitctl-{}.tmp", path, ::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  bool written = fd >= 0;
  for (size_t done = 0; written && done < entry->payload.size();) {
    const ssize_t n = ::write(fd, entry->payload.data() + done, entry->payload.size() - done);
    if (n < 0 && errno == EINTR) continue;
    written = n > 0;
    if (written) done += static_cast<size_t>(n);
  }
  const int saved = written ? 0 : errno;
  if (fd >= 0 && ::close(fd) != 0 && written) written = false;
  if (written && ::rename(temp.c_str(), path.c_str()) == 0) return entry->payload.size();
  const int why = saved != 0 ? saved : errno;
  if (fd >= 0) ::unlink(temp.c_str());
  err("jitctl: error: cannot write {}: {}\n", path, std::strerror(why));
  return std::nullopt;
}

// A clear that would remove every entry, more than this many, asks first (or needs --yes).
constexpr size_t kClearAllAsksAbove = 20;

bool confirmed_on_terminal(const std::string& question) {
  err("{} [y/N] ", question);
  std::fflush(stderr);
  std::string answer;
  std::getline(std::cin, answer);
  return answer == "y" || answer == "Y" || answer == "yes";
}

}  // namespace

int cmd_list(const ListOptions& options) {
  const bool json = options.json;
  Filter filter;
  filter.op = options.op;
  filter.arch = options.arch;
  auto entries = cache_store().list();
  std::erase_if(entries, [&](const cache::EntryInfo& e) { return !filter.matches(e); });
  if (options.summary) return print_summary(entries, json);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : entries) out.push_back(entry_json(e));
    print_json(out);
    return kExitOk;
  }
  if (entries.empty()) {
    out("no cached kernels\n");
    return kExitOk;
  }
  out("{:<16} {:<12} {:<8} {:>8} {:>5} {:>5}  {:<3} {}\n", "KEY", "OP", "ARCH", "SIZE", "AGE", "USED", "RO",
             "SPEC");
  const int64_t now = now_unix();
  uint64_t total = 0;
  for (const auto& e : entries) {
    total += e.file_bytes;
    const std::string spec = e.state == cache::EntryState::ok
                                 ? shown(e.fields.canonical)
                                 : fmt::format("({}: {})", state_name(e.state), shown(e.problem));
    // The cache bounds both times to [0, 2^40): the differences cannot overflow.
    out("{:<16} {:<12} {:<8} {:>8} {:>5} {:>5}  {:<3} {}\n", e.key.substr(0, 16), shown(e.fields.op),
               shown(e.fields.arch), human_bytes(e.file_bytes), human_age(now - e.created_unix),
               human_age(now - e.last_used_unix), e.read_only ? "yes" : "", spec);
  }
  out("{} entr{}, {} (unverified: headers and meta checked, payload hashes not; `jitctl verify` checks them)\n",
             entries.size(), entries.size() == 1 ? "y" : "ies", human_bytes(total));
  return kExitOk;
}

int cmd_show(const ShowOptions& options) {
  const std::optional<std::string> cubin_path =
      options.cubin.empty() ? std::nullopt : std::optional<std::string>(options.cubin);
  const std::string& prefix = options.key;
  if (prefix.empty()) return usage_error("show needs a KEY (or a unique prefix of one)", "show");
  std::vector<cache::EntryInfo> found;
  // Hashed: show prints only meta whose entry is verified whole.
  for (auto& e : cache_store().list({prefix, true})) found.push_back(std::move(e));
  if (found.empty()) {
    err("jitctl: error: no cached kernel has a key starting with '{}'\n", prefix);
    return kExitFailure;
  }
  const bool same_key = std::all_of(found.begin(), found.end(), [&](const auto& e) { return e.key == found[0].key; });
  if (!same_key) {
    err("jitctl: error: '{}' matches {} keys; give more characters\n", prefix, found.size());
    return kExitFailure;
  }
  const auto& e = found.front();  // the writable root's copy comes first
  if (options.json) {
    nlohmann::json out = entry_json(e);
    out["path"] = e.path;
    if (e.state == cache::EntryState::ok) {
      out["kjit"] = e.fields.kjit;
      out["options"] = e.fields.options;
      out["log"] = e.fields.log;
      out["source"] = e.fields.source;
      if (cubin_path) {
        auto bytes = write_cubin(e.key, *cubin_path);
        if (!bytes) return kExitFailure;
        out["cubin"] = {{"path", *cubin_path}, {"bytes", *bytes}};
      }
    }
    print_json(out);
    return e.state == cache::EntryState::ok ? kExitOk : kExitFailure;
  }
  out("key:      {}\nfile:     {}\nstate:    {}{}\nsize:     {} bytes\n", e.key, shown(e.path),
             e.state == cache::EntryState::ok ? "ok (hash verified)" : state_name(e.state),
             e.problem.empty() ? "" : " (" + shown(e.problem) + ")", e.file_bytes);
  if (e.state != cache::EntryState::ok) return kExitFailure;
  const auto& fields = e.fields;
  out("spec:     {}\narch:     {}\nnvrtc:    {}\nkjit:     {}\noptions:  {}\ncompile:  {}\n", shown(fields.canonical),
             shown(fields.arch), shown(fields.nvrtc), shown(fields.kjit), shown(json_safe(fields.options).dump()),
             fields.compile_seconds ? fmt::format("{:.0f} ms", *fields.compile_seconds * 1e3) : "unknown");
  if (cubin_path) {
    auto bytes = write_cubin(e.key, *cubin_path);
    if (!bytes) return kExitFailure;
    out("cubin:    {} ({} bytes)\n", *cubin_path, *bytes);
  }
  out("\n--- compile log ---\n{}\n--- source ---\n{}",
             fields.log.empty() ? "(empty)" : cache::printable(fields.log, true), cache::printable(fields.source, true));
  return kExitOk;
}

int cmd_clear(const ClearOptions& options) {
  Filter filter;
  filter.op = options.op;
  filter.arch = options.arch;
  if (options.older_than) filter.older_than = options.older_than->count();
  // Whatever the filter: a clear that would take every entry of a large
  // writable root asks first (--older-than 0s selects them all, as no filter does).
  if (!options.yes) {
    auto& store = cache_store();
    size_t writable = 0, selected = 0;
    for (const auto& e : store.list()) {
      if (e.read_only) continue;
      ++writable;
      if (filter.matches(e)) ++selected;
    }
    if (selected > kClearAllAsksAbove && selected == writable) {
      const auto what = fmt::format("all {} entries of {}", writable, store.config().writable_root);
      if (isatty(STDIN_FILENO) != 1)
        return usage_error(fmt::format("refusing to remove {} without --yes (or a filter that keeps some: --op, "
                                       "--arch, --older-than)",
                                       what),
                           "clear");
      if (!confirmed_on_terminal(fmt::format("remove {}?", what))) {
        err("jitctl: nothing removed\n");
        return kExitFailure;
      }
    }
  }
  auto removed = cache_store().clear([&](const cache::EntryInfo& e) { return filter.matches(e); });
  if (!removed) {
    err("jitctl: error: {}\n", removed.error().message);
    return kExitFailure;
  }
  if (options.json) {
    print_json(nlohmann::json{{"removed", removed->removed_entries},
                                      {"root", cache_store().config().writable_root},
                                      {"failures", failures_json(removed->failures)}}
                            );
    return removed->failures.empty() ? kExitOk : kExitFailure;
  }
  out("removed {} entr{} from {}\n", removed->removed_entries, removed->removed_entries == 1 ? "y" : "ies",
             cache_store().config().writable_root);
  return report_failures(removed->failures) ? kExitFailure : kExitOk;
}

int cmd_prune(const PruneOptions& options) {
  auto& store = cache_store();
  const uint64_t max_bytes = options.max_bytes.value_or(store.config().max_bytes);
  auto report = store.prune(max_bytes);
  if (!report) {
    err("jitctl: error: {}\n", report.error().message);
    return kExitFailure;
  }
  if (options.json) {
    print_json(nlohmann::json{{"max_bytes", max_bytes},
                                      {"removed_entries", report->removed_entries},
                                      {"removed_other_format", report->removed_other_format},
                                      {"removed_corrupt", report->removed_corrupt},
                                      {"removed_temp_files", report->removed_temp_files},
                                      {"removed_bytes", report->removed_bytes},
                                      {"remaining_bytes", report->remaining_bytes},
                                      {"failures", failures_json(report->failures)}}
                            );
    return report->failures.empty() ? kExitOk : kExitFailure;
  }
  out("pruned to {}: removed {} least recently used, {} of another format, {} corrupt, {} temp files; "
             "{} freed, {} remain\n",
             human_bytes(max_bytes), report->removed_entries, report->removed_other_format, report->removed_corrupt,
             report->removed_temp_files, human_bytes(report->removed_bytes), human_bytes(report->remaining_bytes));
  return report_failures(report->failures) ? kExitFailure : kExitOk;
}

int cmd_verify(const VerifyOptions& options) {
  const bool fix = options.fix;
  auto& store = cache_store();
  const auto report = store.verify(fix);
  const bool ok = report.bad.empty() && report.failures.empty() && report.unreadable_shards.empty();
  if (options.json) {
    nlohmann::json out = {{"verified", report.checked},
                          {"fixed", fix},
                          {"removed", report.removed},
                          {"bad", nlohmann::json::array()},
                          {"unreadable_shards", failures_json(report.unreadable_shards)},
                          {"failures", failures_json(report.failures)}};
    for (const auto& e : report.bad)
      out["bad"].push_back({{"key", e.key}, {"root", e.root}, {"read_only", e.read_only}, {"problem", e.problem}});
    print_json(out);
    return ok ? kExitOk : kExitFailure;
  }
  for (const auto& e : report.bad)
    out("bad: {} ({}){}: {}\n", e.key, e.root, e.read_only ? " [read-only]" : "", e.problem);
  // Not removed by --fix: what is at a shard's name may not be kjit's.
  for (const auto& f : report.unreadable_shards) out("bad shard (its entries cannot be loaded): {}\n", f.message);
  out("verified {} entr{}: {} bad{}{}\n", report.checked, report.checked == 1 ? "y" : "ies", report.bad.size(),
      report.unreadable_shards.empty() ? "" : fmt::format(", {} unreadable shards", report.unreadable_shards.size()),
      fix ? fmt::format(", {} removed", report.removed) : "");
  report_failures(report.failures);
  return ok ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
