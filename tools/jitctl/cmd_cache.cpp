// jitctl list / show / clear / prune / verify: the cache as a user sees it.
// Read-only roots are never modified; to manage one, make it the writable
// root for the command (KJIT_CACHE_DIR=/path jitctl clear).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "cli.hpp"
#include "runtime.hpp"

namespace kjit::tools {
namespace {

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

// "7d", "12h", "30m", "45s" or plain seconds; -1 when malformed.
int64_t parse_duration(const std::string& text) {
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || n < 0) return -1;
  const std::string unit(end);
  if (unit.empty() || unit == "s") return n;
  if (unit == "m") return n * 60;
  if (unit == "h") return n * 3600;
  if (unit == "d") return n * 86400;
  return -1;
}

// "4G", "512M", "100K" or plain bytes; nullopt when malformed.
std::optional<uint64_t> parse_size(const std::string& text) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return std::nullopt;
  const std::string unit(end);
  if (unit.empty()) return n;
  if (unit == "K") return n << 10;
  if (unit == "M") return n << 20;
  if (unit == "G") return n << 30;
  return std::nullopt;
}

// A meta text as it may reach the terminal (the cache checked its type, not its bytes).
std::string shown(const std::string& text) { return cache::printable(text); }

// Names what maintenance could not remove; true when there was any.
bool report_failures(const std::vector<cache::Failure>& failures) {
  for (const auto& f : failures) fmt::print(stderr, "jitctl: error: not removed: {}\n", shown(f.message));
  return !failures.empty();
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
    j["spec"] = e.meta.value("spec", nlohmann::json());  // depth-bounded by the cache
    j["canonical"] = e.fields.canonical;
    j["nvrtc"] = e.fields.nvrtc;
  } else {
    j["problem"] = e.problem;
  }
  return j;
}

}  // namespace

int cmd_list(Args& args) {
  const bool json = args.flag("--json");
  Filter filter;
  filter.op = args.value("--op").value_or("");
  filter.arch = args.value("--arch").value_or("");
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  auto entries = Runtime::global().store().list();
  std::erase_if(entries, [&](const cache::EntryInfo& e) { return !filter.matches(e); });
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& e : entries) out.push_back(entry_json(e));
    fmt::print("{}\n", out.dump(2));
    return kExitOk;
  }
  if (entries.empty()) {
    fmt::print("no cached kernels\n");
    return kExitOk;
  }
  fmt::print("{:<16} {:<12} {:<8} {:>8} {:>5} {:>5}  {:<3} {}\n", "KEY", "OP", "ARCH", "SIZE", "AGE", "USED", "RO",
             "SPEC");
  const int64_t now = now_unix();
  uint64_t total = 0;
  for (const auto& e : entries) {
    total += e.file_bytes;
    const std::string spec = e.state == cache::EntryState::ok
                                 ? shown(e.fields.canonical)
                                 : fmt::format("({}: {})", state_name(e.state), shown(e.problem));
    // The cache bounds both times to [0, 2^40): the differences cannot overflow.
    fmt::print("{:<16} {:<12} {:<8} {:>8} {:>5} {:>5}  {:<3} {}\n", e.key.substr(0, 16), shown(e.fields.op),
               shown(e.fields.arch), human_bytes(e.file_bytes), human_age(now - e.created_unix),
               human_age(now - e.last_used_unix), e.read_only ? "yes" : "", spec);
  }
  fmt::print("{} entr{}, {} (unverified: headers and meta checked, payload hashes not; `jitctl verify` checks them)\n",
             entries.size(), entries.size() == 1 ? "y" : "ies", human_bytes(total));
  return kExitOk;
}

int cmd_show(Args& args) {
  const auto cubin_path = args.value("--cubin");
  const auto prefix = args.positional();
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  if (!prefix || prefix->empty()) return usage_error("show needs a KEY (or a unique prefix of one)");
  std::vector<cache::EntryInfo> found;
  // Hashed: show prints only meta whose entry is verified whole.
  for (auto& e : Runtime::global().store().list({*prefix, true})) found.push_back(std::move(e));
  if (found.empty()) {
    fmt::print(stderr, "jitctl: error: no cached kernel has a key starting with '{}'\n", *prefix);
    return kExitFailure;
  }
  const bool same_key = std::all_of(found.begin(), found.end(), [&](const auto& e) { return e.key == found[0].key; });
  if (!same_key) {
    fmt::print(stderr, "jitctl: error: '{}' matches {} keys; give more characters\n", *prefix, found.size());
    return kExitFailure;
  }
  const auto& e = found.front();  // the writable root's copy comes first
  fmt::print("key:      {}\nfile:     {}\nstate:    {}{}\nsize:     {} bytes\n", e.key, shown(e.path),
             e.state == cache::EntryState::ok ? "ok (hash verified)" : state_name(e.state),
             e.problem.empty() ? "" : " (" + shown(e.problem) + ")", e.file_bytes);
  if (e.state != cache::EntryState::ok) return kExitFailure;
  const auto& fields = e.fields;
  fmt::print("spec:     {}\narch:     {}\nnvrtc:    {}\nkjit:     {}\noptions:  {}\ncompile:  {}\n", shown(fields.canonical),
             shown(fields.arch), shown(fields.nvrtc), shown(fields.kjit), shown(nlohmann::json(fields.options).dump()),
             fields.compile_seconds ? fmt::format("{:.0f} ms", *fields.compile_seconds * 1e3) : "unknown");
  if (cubin_path) {
    // The cubin alone, for cuobjdump / nvdisasm.
    auto entry = Runtime::global().store().load(e.key);
    if (!entry) {
      fmt::print(stderr, "jitctl: error: entry {} could not be read back\n", e.key);
      return kExitFailure;
    }
    std::FILE* f = std::fopen(cubin_path->c_str(), "wb");
    const bool written = f && std::fwrite(entry->payload.data(), 1, entry->payload.size(), f) == entry->payload.size();
    if (f && std::fclose(f) != 0) f = nullptr;
    if (!written || !f) {
      fmt::print(stderr, "jitctl: error: cannot write {}\n", *cubin_path);
      return kExitFailure;
    }
    fmt::print("cubin:    {} ({} bytes)\n", *cubin_path, entry->payload.size());
  }
  fmt::print("\n--- compile log ---\n{}\n--- source ---\n{}", fields.log.empty() ? "(empty)" : cache::printable(fields.log, true),
             cache::printable(fields.source, true));
  return kExitOk;
}

int cmd_clear(Args& args) {
  Filter filter;
  filter.op = args.value("--op").value_or("");
  filter.arch = args.value("--arch").value_or("");
  if (auto older = args.value("--older-than")) {
    filter.older_than = parse_duration(*older);
    if (filter.older_than < 0) return usage_error(fmt::format("--older-than takes 7d, 12h, 30m or 45s, got '{}'", *older));
  }
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  auto removed = Runtime::global().store().clear([&](const cache::EntryInfo& e) { return filter.matches(e); });
  if (!removed) {
    fmt::print(stderr, "jitctl: error: {}\n", removed.error().message);
    return kExitFailure;
  }
  fmt::print("removed {} entr{} from {}\n", removed->removed_entries, removed->removed_entries == 1 ? "y" : "ies",
             Runtime::global().store().config().writable_root);
  return report_failures(removed->failures) ? kExitFailure : kExitOk;
}

int cmd_prune(Args& args) {
  auto& store = Runtime::global().store();
  uint64_t max_bytes = store.config().max_bytes;
  if (auto text = args.value("--max-bytes")) {
    auto parsed = parse_size(*text);
    if (!parsed) return usage_error(fmt::format("--max-bytes takes a size like 4G, 512M or 1048576, got '{}'", *text));
    max_bytes = *parsed;
  }
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  auto report = store.prune(max_bytes);
  if (!report) {
    fmt::print(stderr, "jitctl: error: {}\n", report.error().message);
    return kExitFailure;
  }
  fmt::print("pruned to {}: removed {} least recently used, {} of another format, {} corrupt, {} temp files; "
             "{} freed, {} remain\n",
             human_bytes(max_bytes), report->removed_entries, report->removed_other_format, report->removed_corrupt,
             report->removed_temp_files, human_bytes(report->removed_bytes), human_bytes(report->remaining_bytes));
  return report_failures(report->failures) ? kExitFailure : kExitOk;
}

int cmd_verify(Args& args) {
  const bool fix = args.flag("--fix");
  if (auto e = args.leftover_error(); !e.empty()) return usage_error(e);
  auto& store = Runtime::global().store();
  const auto report = store.verify(fix);
  for (const auto& e : report.bad)
    fmt::print("bad: {} ({}){}: {}\n", e.key, shown(e.root), e.read_only ? " [read-only]" : "", shown(e.problem));
  fmt::print("verified {} entr{}: {} bad{}\n", report.checked, report.checked == 1 ? "y" : "ies", report.bad.size(),
             fix ? fmt::format(", {} removed", report.removed) : "");
  report_failures(report.failures);
  return report.bad.empty() ? kExitOk : kExitFailure;
}

}  // namespace kjit::tools
