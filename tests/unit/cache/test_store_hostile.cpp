// Entries and files written by someone hostile or careless, with valid hashes
// where that matters (anyone who can write a root can compute one): deep
// nesting, wrong types, absurd integers, directories at entry names, terminal
// escapes, stray lock and stamp files. None may crash a reader, block a key,
// or be listed as if verified.
#include <doctest/doctest.h>

#include <sys/file.h>

#include <climits>
#include <functional>
#include <map>

#include "cache_test_support.hpp"
#include "kjit/base/text.hpp"
#include "kjit/cache/entry_format.hpp"

namespace kjit::cache::test {
namespace {

const nlohmann::json kMeta = {{"op", "dequant"}, {"arch", "sm_90a"}, {"compile_seconds", 0.25}};

// An entry file with a valid hash whose meta is the bookkeeping object (with
// `created` as its created_unix) followed by `members` (",\"name\":value...").
std::vector<char> entry_with_meta(const std::string& key, const std::string& members, std::span<const char> payload,
                                  const std::string& created = "1700000000") {
  std::string text = R"({"kjit_entry":{"format":1,"key":")" + key + R"(","created_unix":)" + created +
                     R"(,"payload_bytes":)" + std::to_string(payload.size()) + "}" + members + "}";
  auto file = format::encode_meta_text(text, payload);
  REQUIRE(file.has_value());
  return *file;
}

// ~400 KB of nested brackets: under the 1 MiB meta limit.
std::string nesting_bomb() { return ",\"x\":" + std::string(200'000, '[') + std::string(200'000, ']'); }

void plant(const std::string& path, std::span<const char> bytes) {
  fs::create_directories(fs::path(path).parent_path());
  fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all);
  write_file(path, bytes);
}

std::map<std::string, EntryInfo> by_key(std::vector<EntryInfo> infos) {
  std::map<std::string, EntryInfo> out;
  for (EntryInfo& info : infos) out[info.key] = std::move(info);
  return out;
}

TEST_CASE("an entry with a valid hash and a 400 KB nested meta is a corrupt miss that list, verify and prune survive") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::string key = key_of(1);
  std::vector<char> bomb = entry_with_meta(key, nesting_bomb(), payload_of(1, 100));
  REQUIRE(bomb.size() > 400'000);
  REQUIRE(format::check_header(bomb, bomb.size()).verdict == format::Verdict::ok);
  plant(store.entry_path(key), bomb);

  std::vector<EntryInfo> infos = store.list();
  REQUIRE(infos.size() == 1);
  CHECK(infos[0].state == EntryState::corrupt);
  CHECK_MESSAGE(infos[0].problem.find("nests deeper") != std::string::npos, infos[0].problem);
  VerifyReport report = store.verify(false);
  REQUIRE(report.bad.size() == 1);
  CHECK(report.checked == 1);

  StderrCapture quiet;  // the corrupt load warns
  CHECK_FALSE(store.load(key).has_value());
  CHECK(store.counters().corrupt == 1);
  CHECK_FALSE_MESSAGE(fs::exists(store.entry_path(key)), "the bomb was not removed from the writable root");

  plant(store.entry_path(key), bomb);
  auto pruned = store.prune(kDefaultMaxBytes);
  REQUIRE(pruned.has_value());
  CHECK(pruned->removed_corrupt == 1);
}

TEST_CASE("a nested meta in a read-only root is skipped by every process that looks") {
  TempDir dir;
  std::string image = dir.sub("image");
  std::string key = key_of(2);
  plant(image + "/" + key.substr(0, 2) + "/" + key + ".kjit", entry_with_meta(key, nesting_bomb(), payload_of(2, 10)));
  fs::permissions(image, fs::perms::owner_read | fs::perms::owner_exec);
  StoreConfig config = config_at(dir.sub("root"));
  config.read_only_roots = {image};
  Store store(config);
  StderrCapture quiet;
  CHECK_FALSE(store.load(key).has_value());
  CHECK(store.counters().corrupt == 1);
  CHECK(store.list()[0].state == EntryState::corrupt);
  CHECK(store.verify(true).bad.size() == 1);
}

TEST_CASE("the encoder refuses meta the decoder would refuse as too deep") {
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < format::kMaxMetaDepth + 1; ++i) deep = nlohmann::json::array({deep});
  auto meta = format::with_bookkeeping({{"x", deep}}, key_of(3), 0, 1);
  REQUIRE(meta.has_value());
  auto file = format::encode(*meta, {});
  REQUIRE_FALSE(file.has_value());
  CHECK(file.error().code == KJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("brackets inside meta strings do not count as nesting") {
  std::string key = key_of(4);
  std::string text = ",\"log\":\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"";
  format::Decoded decoded = format::decode(entry_with_meta(key, text, payload_of(4, 10)), key);
  CHECK_MESSAGE(decoded.verdict == format::Verdict::ok, decoded.problem);
}

TEST_CASE("a meta field of the wrong type or out of range makes the entry corrupt, with the field named") {
  struct Case {
    const char* members;
    const char* created;
    const char* named;
  };
  const std::vector<Case> cases = {
      {R"(,"compile_seconds":"slow")", "1", "compile_seconds"},
      {R"(,"compile_seconds":-1)", "1", "compile_seconds"},
      {R"(,"op":5)", "1", "op"},
      {R"(,"arch":null)", "1", "arch"},
      {R"(,"options":"-O3")", "1", "options"},
      {R"(,"options":["-O3",7])", "1", "options"},
      {R"(,"source":{"a":1})", "1", "source"},
      {"", "-9223372036854775808", "created_unix"},
      {"", "18446744073709551615", "created_unix"},
      {"", "4611686018427387904", "created_unix"},
      {"", "1.5", "created_unix"},
      {"", "\"yesterday\"", "created_unix"},
  };
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  uint64_t n = 10;
  for (const Case& c : cases) {
    CAPTURE(c.members);
    CAPTURE(c.created);
    std::string key = key_of(++n);
    std::vector<char> file = entry_with_meta(key, c.members, payload_of(n, 50), c.created);
    format::Decoded decoded = format::decode(file, key);
    CHECK(decoded.verdict == format::Verdict::corrupt);
    CHECK_MESSAGE(decoded.problem.find(c.named) != std::string::npos, decoded.problem);

    plant(store.entry_path(key), file);
    std::vector<EntryInfo> infos = store.list({key, false});
    REQUIRE(infos.size() == 1);
    CHECK(infos[0].state == EntryState::corrupt);
    CHECK(infos[0].created_unix >= 0);  // the file's mtime, never the stored value
    StderrCapture quiet;
    CHECK_FALSE(store.load(key).has_value());
  }
  CHECK(store.counters().corrupt == cases.size());
}

TEST_CASE("load_payload checks the hash and the bookkeeping, and no other member of the meta") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::vector<char> payload = payload_of(60, 64);
  SUBCASE("a wrong-typed member after the bookkeeping, and a nesting bomb there: a hit (load: corrupt)") {
    uint64_t n = 60;
    for (const std::string& members : {std::string(R"(,"source":{"a":1},"log":7)"), nesting_bomb()}) {
      std::string key = key_of(++n);
      plant(store.entry_path(key), entry_with_meta(key, members, payload));
      std::optional<Entry> entry = store.load_payload(key);
      REQUIRE(entry.has_value());
      CHECK(entry->payload == std::vector<char>(payload.begin(), payload.end()));
      CHECK(entry->meta.size() == 1);  // the bookkeeping alone
      CHECK(entry->meta[format::kBookkeepingKey]["key"] == key);
      StderrCapture quiet;
      CHECK_FALSE(store.load(key).has_value());
    }
  }
  SUBCASE("the bookkeeping's own problems, invalid JSON before it and a bad hash: misses, counted corrupt") {
    // Each meta for the key its file is planted under (so that only its own problem can refuse it).
    auto book = [](const std::string& key_json, const std::string& created, int version, int payload_bytes) {
      return R"({"kjit_entry":{"format":)" + std::to_string(version) + R"(,"key":)" + key_json +
             R"(,"created_unix":)" + created + R"(,"payload_bytes":)" + std::to_string(payload_bytes) + "}";
    };
    auto quoted = [](const std::string& k) { return "\"" + k + "\""; };
    const std::vector<std::function<std::string(const std::string&)>> metas = {
        [&](const std::string& k) { return book(quoted(k), R"("yesterday")", 1, 64) + "}"; },
        [&](const std::string&) { return book(R"({"a":1})", "1", 1, 64) + "}"; },
        [&](const std::string& k) { return book(quoted(k), "1", 2, 64) + "}"; },
        [&](const std::string& k) { return book(quoted(k), "1", 1, 63) + "}"; },
        [&](const std::string&) { return std::string(R"({"kjit_entry":5,"source":"x"})"); },
        [&](const std::string& k) { return R"({"arch":[1,},)" + book(quoted(k), "1", 1, 64).substr(1) + "}"; },
        [&](const std::string&) { return std::string(R"(["kjit_entry"])"); },
        [&](const std::string&) { return book(quoted(key_of(99)), "1", 1, 64) + "}"; },
    };
    StderrCapture quiet;
    uint64_t n = 200;
    for (const auto& meta : metas) {
      std::string key = key_of(++n);
      CAPTURE(meta(key));
      auto file = format::encode_meta_text(meta(key), payload);
      REQUIRE(file.has_value());
      plant(store.entry_path(key), *file);
      CHECK_FALSE(store.load_payload(key).has_value());
    }
    std::string key = key_of(++n);
    std::vector<char> flipped = entry_with_meta(key, "", payload);
    flipped.back() ^= 1;
    plant(store.entry_path(key), flipped);
    CHECK_FALSE(store.load_payload(key).has_value());
    CHECK(store.counters().corrupt == metas.size() + 1);
  }
  SUBCASE("members before the bookkeeping are skipped, of any type") {
    std::string key = key_of(80);
    std::string text = R"({"arch":[1,[2,{"b":null}]],"canonical":"x","kjit_entry":{"format":1,"key":")" + key +
                       R"(","created_unix":1700000000,"payload_bytes":64},"source":"s"})";
    auto file = format::encode_meta_text(text, payload);
    REQUIRE(file.has_value());
    plant(store.entry_path(key), *file);
    std::optional<Entry> entry = store.load_payload(key);
    REQUIRE(entry.has_value());
    CHECK(entry->meta[format::kBookkeepingKey]["created_unix"] == 1700000000);
  }
}

TEST_CASE("list gives the typed fields of an entry and times within bounds") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  nlohmann::json meta = kMeta;
  meta["options"] = {"-O3", "--std=c++17"};
  REQUIRE(store.publish(key_of(30), meta, payload_of(30, 10)).has_value());
  set_mtime(store.entry_path(key_of(30)), -4'000'000'000'000LL);
  std::vector<EntryInfo> infos = store.list();
  REQUIRE(infos.size() == 1);
  const EntryInfo& info = infos[0];
  CHECK(info.state == EntryState::ok);
  CHECK(info.fields.op == "dequant");
  CHECK(info.fields.arch == "sm_90a");
  CHECK(info.fields.compile_seconds == 0.25);
  CHECK(info.fields.options == std::vector<std::string>{"-O3", "--std=c++17"});
  CHECK(info.fields.created_unix > 1'700'000'000);
  CHECK(info.created_unix == info.fields.created_unix);
  CHECK(info.last_used_unix >= 0);
  CHECK(info.last_used_unix < format::kMaxUnixSeconds);
}

TEST_CASE("list is marked unverified unless it hashes payloads, and then finds a damaged payload") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(40), kMeta, payload_of(40, 300)).has_value());
  REQUIRE(store.publish(key_of(41), kMeta, payload_of(41, 300)).has_value());
  std::vector<char> file = read_file(store.entry_path(key_of(41)));
  file.back() ^= 0x01;
  write_file(store.entry_path(key_of(41)), file);

  auto quick = by_key(store.list());
  CHECK(quick[key_of(41)].state == EntryState::ok);
  CHECK_FALSE(quick[key_of(41)].verified);
  CHECK_FALSE(quick[key_of(40)].verified);
  auto hashed = by_key(store.list({"", true}));
  CHECK(hashed[key_of(40)].state == EntryState::ok);
  CHECK(hashed[key_of(40)].verified);
  CHECK(hashed[key_of(41)].state == EntryState::corrupt);
  CHECK_FALSE(hashed[key_of(41)].verified);
  CHECK(store.list({key_of(40).substr(0, 10), true}).size() == 1);
}

TEST_CASE("prune removes entries whose payload no longer matches the hash") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(50), kMeta, payload_of(50, 300)).has_value());
  std::vector<char> file = read_file(store.entry_path(key_of(50)));
  file.back() ^= 0x01;
  write_file(store.entry_path(key_of(50)), file);
  auto report = store.prune(kDefaultMaxBytes);
  REQUIRE(report.has_value());
  CHECK(report->removed_corrupt == 1);
  CHECK_FALSE(fs::exists(store.entry_path(key_of(50))));
}

// A directory holding a file and a subdirectory, at `key`'s entry name.
void plant_directory(const Store& store, const std::string& key) {
  std::string at = store.entry_path(key);
  fs::create_directories(at + "/inner");
  write_file(at + "/inner/file", std::vector<char>(10, 'x'));
  write_file(at + "/file", std::vector<char>(10, 'x'));
}

TEST_CASE("a directory at an entry's name is reported by verify and removed by verify --fix") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(60), kMeta, payload_of(60, 10)).has_value());
  plant_directory(store, key_of(61));
  auto listed = by_key(store.list());
  CHECK(listed[key_of(61)].state == EntryState::corrupt);
  CHECK(listed[key_of(61)].problem == "is a directory");

  VerifyReport check = store.verify(false);
  CHECK(check.checked == 2);
  REQUIRE(check.bad.size() == 1);
  CHECK(check.bad[0].key == key_of(61));
  CHECK(check.removed == 0);
  CHECK(fs::exists(store.entry_path(key_of(61))));

  VerifyReport fixed = store.verify(true);
  CHECK(fixed.bad.size() == 1);
  CHECK(fixed.removed == 1);
  CHECK(fixed.failures.empty());
  CHECK_FALSE(fs::exists(store.entry_path(key_of(61))));
  CHECK(store.verify(false).bad.empty());
  CHECK(store.verify(false).checked == 1);
}

TEST_CASE("a directory at an entry's name is removed by prune and clear and does not block a publish") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  plant_directory(store, key_of(70));
  auto pruned = store.prune(kDefaultMaxBytes);
  REQUIRE(pruned.has_value());
  CHECK(pruned->removed_corrupt == 1);
  CHECK(pruned->failures.empty());
  CHECK_FALSE(fs::exists(store.entry_path(key_of(70))));

  plant_directory(store, key_of(70));
  auto cleared = store.clear();
  REQUIRE(cleared.has_value());
  CHECK(cleared->removed_entries == 1);
  CHECK(cleared->failures.empty());
  CHECK_FALSE(fs::exists(store.entry_path(key_of(70))));

  plant_directory(store, key_of(70));
  StderrCapture warnings;
  REQUIRE(store.publish(key_of(70), kMeta, payload_of(70, 10)).has_value());
  CHECK(warnings.text().find("non-file") != std::string::npos);
  auto entry = store.load(key_of(70));
  REQUIRE(entry.has_value());
  CHECK(entry->payload == payload_of(70, 10));
}

std::string lock_path(const Store& store, const std::string& key) {
  std::string path = store.entry_path(key);
  return path.substr(0, path.size() - 5) + ".lock";
}

std::string used_path(const Store& store, const std::string& key) {
  std::string path = store.entry_path(key);
  return path.substr(0, path.size() - 5) + ".used";
}

// Publishes `key` the way the runtime does, under its advisory lock.
void publish_locked(Store& store, const std::string& key, uint64_t n) {
  KeyLock lock = store.try_lock(key, std::chrono::seconds(1));
  REQUIRE(lock.held());
  REQUIRE(store.publish(key, kMeta, payload_of(n, 10)).has_value());
}

TEST_CASE("lock files go with their entries: clear, verify --fix and eviction") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  for (uint64_t n = 80; n < 83; ++n) publish_locked(store, key_of(n), n);
  for (uint64_t n = 80; n < 83; ++n) REQUIRE(fs::exists(lock_path(store, key_of(n))));

  REQUIRE(store.clear([&](const EntryInfo& info) { return info.key == key_of(80); }).has_value());
  CHECK_FALSE(fs::exists(lock_path(store, key_of(80))));
  CHECK(fs::exists(lock_path(store, key_of(81))));

  write_file(store.entry_path(key_of(81)), std::vector<char>(100, 'x'));
  CHECK(store.verify(true).removed == 1);
  CHECK_FALSE(fs::exists(lock_path(store, key_of(81))));

  Store small(config_at(dir.sub("root"), 1));
  publish_locked(small, key_of(83), 83);
  CHECK_FALSE_MESSAGE(fs::exists(lock_path(store, key_of(82))), "eviction left the lock file of " << key_of(82));
}

TEST_CASE("a held lock is never removed, even with its entry") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  KeyLock lock = store.try_lock(key_of(90), std::chrono::seconds(1));
  REQUIRE(lock.held());
  REQUIRE(store.publish(key_of(90), kMeta, payload_of(90, 10)).has_value());
  REQUIRE(store.clear().has_value());
  CHECK_FALSE(fs::exists(store.entry_path(key_of(90))));
  CHECK(fs::exists(lock_path(store, key_of(90))));
  REQUIRE(store.prune(0).has_value());
  CHECK(fs::exists(lock_path(store, key_of(90))));
}

TEST_CASE("orphan lock and stamp files are removed by prune and by clear") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(100), kMeta, payload_of(100, 10)).has_value());
  for (uint64_t n = 101; n < 103; ++n) {
    write_file(lock_path(store, key_of(n)), {});
    write_file(used_path(store, key_of(n)), {});
  }
  auto pruned = store.prune(kDefaultMaxBytes);
  REQUIRE(pruned.has_value());
  CHECK(files_containing(dir.sub("root"), ".lock").empty());
  CHECK(files_containing(dir.sub("root"), ".used").empty());
  CHECK(fs::exists(store.entry_path(key_of(100))));

  write_file(lock_path(store, key_of(101)), {});
  write_file(used_path(store, key_of(102)), {});
  auto cleared = store.clear([](const EntryInfo&) { return false; });
  REQUIRE(cleared.has_value());
  CHECK(cleared->removed_entries == 0);
  CHECK(files_containing(dir.sub("root"), ".lock").empty());
  CHECK(files_containing(dir.sub("root"), ".used").empty());
  CHECK(fs::exists(store.entry_path(key_of(100))));
}

TEST_CASE("clear, prune and verify --fix report the entries they could not remove") {
  if (running_as_root()) {
    MESSAGE("skipped as root (permissions do not stop root); the fault tests inject EROFS instead");
    return;
  }
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(110), kMeta, payload_of(110, 10)).has_value());
  std::string shard = fs::path(store.entry_path(key_of(110))).parent_path().string();
  fs::permissions(shard, fs::perms::owner_read | fs::perms::owner_exec);
  auto cleared = store.clear();
  REQUIRE(cleared.has_value());
  CHECK(cleared->removed_entries == 0);
  REQUIRE(cleared->failures.size() == 1);
  CHECK(cleared->failures[0].path == store.entry_path(key_of(110)));
  CHECK(fs::exists(store.entry_path(key_of(110))));
}

TEST_CASE("printable escapes control bytes and C1 controls and keeps the rest") {
  CHECK(printable("plain text, ünïcode") == "plain text, ünïcode");
  CHECK(printable("\x1b[31mred\x1b[0m") == "\\x1b[31mred\\x1b[0m");
  CHECK(printable("a\nb\tc\x7f") == "a\\x0ab\\x09c\\x7f");
  CHECK(printable("a\nb\tc\r", true) == "a\nb\tc\\x0d");
  CHECK(printable("csi \xc2\x9b" "31m") == "csi \\u009b31m");
}

TEST_CASE("printable and valid_utf8 escape bytes that are not UTF-8 and keep well-formed sequences") {
  CHECK(printable("root\xff\xfe") == "root\\xff\\xfe");
  CHECK(printable("overlong \xc0\xaf, surrogate \xed\xa0\x80") == "overlong \\xc0\\xaf, surrogate \\xed\\xa0\\x80");
  CHECK(printable("cut \xe2\x82") == "cut \\xe2\\x82");
  CHECK(printable("euro \xe2\x82\xac, emoji \xf0\x9f\x98\x80") == "euro \xe2\x82\xac, emoji \xf0\x9f\x98\x80");
  CHECK(text::valid_utf8("a\xff\x1b\n") == "a\\xff\x1b\n");  // controls stay: JSON escapes them itself
  CHECK_NOTHROW((void)nlohmann::json(text::valid_utf8("\xff\xc3")).dump());
}

TEST_CASE("a load never writes through a hard link planted at its .used stamp") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(130), kMeta, payload_of(130, 10)).has_value());
  const std::string outside = dir.sub("outside");
  write_file(outside, std::vector<char>{'k', 'e', 'e', 'p'});
  REQUIRE(::link(outside.c_str(), used_path(store, key_of(130)).c_str()) == 0);
  set_mtime(outside, 1000);
  REQUIRE(store.load(key_of(130)).has_value());
  CHECK(read_file(outside) == std::vector<char>{'k', 'e', 'e', 'p'});
  struct stat st {};
  REQUIRE(::stat(outside.c_str(), &st) == 0);
  CHECK_MESSAGE(st.st_mtime == 1000, "the load touched the linked file");
  CHECK(st.st_nlink == 1);  // the planted link was replaced by a stamp of the store's own
  CHECK(fs::exists(used_path(store, key_of(130))));
}

TEST_CASE("verify reports shard names that cannot be opened: a file, a link") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(140), kMeta, payload_of(140, 10)).has_value());
  write_file(dir.sub("root") + "/ab", std::vector<char>{'x'});
  fs::create_directory(dir.sub("elsewhere"));
  fs::create_directory_symlink(dir.sub("elsewhere"), dir.sub("root") + "/cd");
  const VerifyReport report = store.verify(true);
  REQUIRE(report.unreadable_shards.size() == 2);
  CHECK(report.unreadable_shards[0].path == dir.sub("root") + "/ab");
  CHECK(report.unreadable_shards[1].path == dir.sub("root") + "/cd");
  CHECK(fs::exists(dir.sub("root") + "/ab"));  // never removed: it may not be kjit's
  CHECK(store.holds(key_of(140)));
  CHECK_FALSE(store.holds(key_of(141)));
}

TEST_CASE("at debug level each lookup logs the key, the root and hit, miss or corrupt with the reason") {
  ScopedEnv debug("KJIT_LOG", "debug");  // read once per process: this case runs in its own (ctest)
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(120), kMeta, payload_of(120, 10)).has_value());
  plant(store.entry_path(key_of(121)), std::vector<char>(100, 'x'));
  StderrCapture log;
  CHECK(store.load(key_of(120)).has_value());
  CHECK_FALSE(store.load(key_of(121)).has_value());
  CHECK_FALSE(store.load(key_of(122)).has_value());
  std::string text = log.text();
  std::string root = dir.sub("root");
  CHECK_MESSAGE(text.find(key_of(120) + " in " + root + ": hit") != std::string::npos, text);
  CHECK_MESSAGE(text.find(key_of(121) + " in " + root + ": corrupt (bad magic)") != std::string::npos, text);
  CHECK_MESSAGE(text.find(key_of(122) + " in " + root + ": miss") != std::string::npos, text);
}

}  // namespace
}  // namespace kjit::cache::test
