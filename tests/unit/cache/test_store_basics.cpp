// The cache store's basic contract: round trips, misses, key and meta
// validation, file modes, removal, listing, clearing, the advisory lock, and
// the configuration read from the environment.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>

#include "cache_test_support.hpp"
#include "kjit/cache/entry_format.hpp"

namespace kjit::cache::test {
namespace {

const nlohmann::json kMeta = {{"kernel", "dequant_fp8"}, {"arch", "sm_90a"}, {"tile", {128, 128}}};

TEST_CASE("publish then load returns the same meta and payload") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::string key = key_of(1);
  std::vector<char> payload = payload_of(1, 4096);

  auto published = store.publish(key, kMeta, payload);
  REQUIRE_MESSAGE(published.has_value(), published.error().message);

  std::optional<Entry> entry = store.load(key);
  REQUIRE_MESSAGE(entry.has_value(), "a published key must load");
  CHECK(entry->payload == payload);
  CHECK(entry->root == dir.sub("root"));
  for (auto& [name, value] : kMeta.items()) CHECK_MESSAGE(entry->meta[name] == value, "meta member " << name);
  const nlohmann::json& book = entry->meta[format::kBookkeepingKey];
  CHECK(book["format"] == format::kFormatVersion);
  CHECK(book["key"] == key);
  CHECK(book["payload_bytes"] == payload.size());
  CHECK(book["created_unix"].get<int64_t>() > 0);

  Counters counters = store.counters();
  CHECK(counters.published == 1);
  CHECK(counters.hits == 1);
  CHECK(counters.misses == 0);
}

TEST_CASE("an empty payload and null meta round-trip") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(2), nullptr, {}).has_value());
  auto entry = store.load(key_of(2));
  REQUIRE(entry.has_value());
  CHECK(entry->payload.empty());
  CHECK(entry->meta.is_object());
}

TEST_CASE("a second Store sees entries published by the first") {
  TempDir dir;
  std::vector<char> payload = payload_of(3, 100);
  REQUIRE(Store(config_at(dir.sub("root"))).publish(key_of(3), kMeta, payload).has_value());
  Store reader(config_at(dir.sub("root")));
  auto entry = reader.load(key_of(3));
  REQUIRE(entry.has_value());
  CHECK(entry->payload == payload);
}

TEST_CASE("loading an unknown key is a miss") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  CHECK_FALSE(store.load(key_of(4)).has_value());
  REQUIRE(store.publish(key_of(5), kMeta, payload_of(5, 10)).has_value());
  CHECK_FALSE(store.load(key_of(4)).has_value());
  CHECK(store.counters().misses == 2);
  CHECK(store.counters().corrupt == 0);
}

TEST_CASE("keys other than 16 to 128 lowercase hex digits are rejected") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  const std::vector<std::string> bad = {
      "",
      "0123456789abcde",                       // 15 digits
      std::string(129, 'a'),                   // too long
      "0123456789ABCDEF",                      // uppercase
      "../../../../etc/passwd0123",            // a path
      "0123456789abcdeg",                      // not hex
      std::string("0123456789abcdef\0", 17),   // embedded NUL
      "0123456789abcdef/0123456789abcdef",     // separator
  };
  for (const std::string& key : bad) {
    CHECK_FALSE_MESSAGE(is_valid_key(key), "accepted \"" << key << "\"");
    auto published = store.publish(key, kMeta, payload_of(6, 10));
    REQUIRE_FALSE_MESSAGE(published.has_value(), "published under \"" << key << "\"");
    CHECK(published.error().code == KJIT_ERROR_INVALID_ARGUMENT);
    CHECK_FALSE(store.load(key).has_value());
    CHECK(store.remove(key).error().code == KJIT_ERROR_INVALID_ARGUMENT);
    CHECK(store.entry_path(key).empty());
  }
  CHECK(is_valid_key(std::string(16, 'f')));
  CHECK(is_valid_key(std::string(128, '0')));
  CHECK_FALSE(fs::exists(dir.sub("root")));
}

TEST_CASE("meta that is not an object or null is rejected") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  auto published = store.publish(key_of(7), nlohmann::json::array({1, 2}), payload_of(7, 10));
  REQUIRE_FALSE(published.has_value());
  CHECK(published.error().code == KJIT_ERROR_INVALID_ARGUMENT);
  auto not_utf8 = store.publish(key_of(7), {{"name", std::string("\xff\xfe")}}, payload_of(7, 10));
  REQUIRE_FALSE(not_utf8.has_value());
  CHECK(not_utf8.error().code == KJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("the root and shards are created 0700 and entries 0600 in the documented place") {
  TempDir dir;
  std::string root = dir.sub("a/b/root");
  Store store(config_at(root));
  std::string key = key_of(8);
  REQUIRE(store.publish(key, kMeta, payload_of(8, 10)).has_value());
  std::string shard = root + "/" + key.substr(0, 2);
  std::string entry = shard + "/" + key + ".kjit";
  CHECK(store.entry_path(key) == entry);
  CHECK_MESSAGE(mode_of(root) == 0700, "root mode " << std::oct << mode_of(root));
  CHECK_MESSAGE(mode_of(shard) == 0700, "shard mode " << std::oct << mode_of(shard));
  CHECK_MESSAGE(mode_of(entry) == 0600, "entry mode " << std::oct << mode_of(entry));
  CHECK(temp_files_in(root).empty());
}

TEST_CASE("publishing a key that already holds a valid entry succeeds and keeps one entry") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(9), kMeta, payload_of(9, 10)).has_value());
  REQUIRE(store.publish(key_of(9), kMeta, payload_of(9, 10)).has_value());
  CHECK(store.counters().published == 2);
  CHECK(store.list().size() == 1);
  CHECK(temp_files_in(dir.sub("root")).empty());
}

TEST_CASE("remove deletes an entry and removing an absent key succeeds") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(10), kMeta, payload_of(10, 10)).has_value());
  REQUIRE(store.load(key_of(10)).has_value());
  REQUIRE(store.remove(key_of(10)).has_value());
  CHECK_FALSE(store.load(key_of(10)).has_value());
  CHECK_FALSE(fs::exists(store.entry_path(key_of(10))));
  CHECK(files_containing(dir.sub("root"), ".used").empty());
  CHECK(store.remove(key_of(10)).has_value());
  CHECK(store.remove(key_of(11)).has_value());
}

TEST_CASE("list reports every entry with its meta and sizes without loading it") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  for (int i = 0; i < 5; ++i) REQUIRE(store.publish(key_of(20 + i), {{"i", i}}, payload_of(i, 100 + i)).has_value());
  std::vector<EntryInfo> infos = store.list();
  REQUIRE(infos.size() == 5);
  for (const EntryInfo& info : infos) {
    CHECK(info.state == EntryState::ok);
    CHECK(info.problem.empty());
    CHECK(info.root == dir.sub("root"));
    CHECK(info.path == store.entry_path(info.key));
    CHECK_FALSE(info.read_only);
    CHECK(info.format_version == format::kFormatVersion);
    int i = info.meta["i"].get<int>();
    CHECK(info.key == key_of(20 + i));
    CHECK(info.payload_bytes == 100u + i);
    CHECK(info.file_bytes == fs::file_size(info.path));
    CHECK(info.created_unix > 0);
    CHECK(info.last_used_unix >= info.created_unix - 1);
  }
  CHECK(store.counters().hits == 0);
}

TEST_CASE("clear removes the entries its filter selects and only those") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  for (int i = 0; i < 6; ++i)
    REQUIRE(store.publish(key_of(30 + i), {{"even", i % 2 == 0}}, payload_of(i, 10)).has_value());
  auto cleared = store.clear([](const EntryInfo& info) { return info.meta.value("even", false); });
  REQUIRE(cleared.has_value());
  CHECK(cleared->removed_entries == 3);
  CHECK(store.list().size() == 3);
  for (const EntryInfo& info : store.list()) CHECK_FALSE(info.meta["even"].get<bool>());
  CHECK(store.clear()->removed_entries == 3);
  CHECK(store.list().empty());
}

TEST_CASE("the advisory lock is exclusive and its wait is bounded") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::string key = key_of(40);
  KeyLock first = store.try_lock(key, std::chrono::milliseconds(0));
  REQUIRE(first.held());

  auto start = std::chrono::steady_clock::now();
  KeyLock second = store.try_lock(key, std::chrono::milliseconds(100));
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK_FALSE(second.held());
  CHECK(waited >= std::chrono::milliseconds(90));
  CHECK(waited < std::chrono::seconds(5));

  CHECK(store.try_lock(key_of(41), std::chrono::milliseconds(0)).held());  // other keys are independent
  first = KeyLock();
  CHECK(store.try_lock(key, std::chrono::milliseconds(0)).held());
}

TEST_CASE("a lock held by a process that dies is released") {
  TempDir dir;
  std::string root = dir.sub("root");
  std::string key = key_of(42);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    Store store(config_at(root));
    KeyLock lock = store.try_lock(key, std::chrono::milliseconds(0));
    char c = lock.held() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  REQUIRE(c == 'y');
  Store store(config_at(root));
  CHECK_FALSE(store.try_lock(key, std::chrono::milliseconds(0)).held());
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(store.try_lock(key, std::chrono::milliseconds(1000)).held());
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("byte sizes parse with K M G T suffixes and reject anything else") {
  CHECK(parse_byte_size("0") == 0u);
  CHECK(parse_byte_size("4294967296") == 4294967296u);
  CHECK(parse_byte_size("512K") == 512u << 10);
  CHECK(parse_byte_size("64m") == 64u << 20);
  CHECK(parse_byte_size("4G") == uint64_t{4} << 30);
  CHECK(parse_byte_size("4GB") == uint64_t{4} << 30);
  CHECK(parse_byte_size("4GiB") == uint64_t{4} << 30);
  CHECK(parse_byte_size("2T") == uint64_t{2} << 40);
  for (const char* bad : {"", "G", "-1", "1.5G", "4X", "4 G", "4GG", "99999999999999999999", "16777216T"})
    CHECK_FALSE_MESSAGE(parse_byte_size(bad).has_value(), "accepted \"" << bad << "\"");
}

TEST_CASE("durations need a unit of s m h d or w and reject signs, overflow and anything else") {
  CHECK(parse_duration("0s") == std::chrono::seconds(0));
  CHECK(parse_duration("45s") == std::chrono::seconds(45));
  CHECK(parse_duration("30m") == std::chrono::minutes(30));
  CHECK(parse_duration("12h") == std::chrono::hours(12));
  CHECK(parse_duration("7d") == std::chrono::hours(7 * 24));
  CHECK(parse_duration("2w") == std::chrono::hours(14 * 24));
  CHECK(parse_duration("106751991167300d") == std::chrono::seconds(int64_t{106751991167300} * 86400));
  for (const char* bad : {"", "7", "d", "-5d", "+5d", "1.5h", "7 d", "7D", "7dd", "7days", "999999999999999999d",
                          "106751991167301d", "99999999999999999999s"})
    CHECK_FALSE_MESSAGE(parse_duration(bad).has_value(), "accepted \"" << bad << "\"");
}

TEST_CASE("configuration comes from KJIT_CACHE_DIR then XDG_CACHE_HOME then HOME") {
  ScopedEnv path("KJIT_CACHE_PATH", "/images/a::/images/b:");
  ScopedEnv max("KJIT_CACHE_MAX_BYTES", "512M");
  {
    ScopedEnv dir("KJIT_CACHE_DIR", "/explicit");
    StoreConfig config = config_from_environment();
    CHECK(config.writable_root == "/explicit");
    CHECK(config.read_only_roots == std::vector<std::string>{"/images/a", "/images/b"});
    CHECK(config.max_bytes == uint64_t{512} << 20);
  }
  ScopedEnv dir("KJIT_CACHE_DIR", nullptr);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    CHECK(config_from_environment().writable_root == "/xdg/kjit");
  }
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "relative/ignored");
    ScopedEnv home("HOME", "/home/someone");
    CHECK(config_from_environment().writable_root == "/home/someone/.cache/kjit");
  }
}

TEST_CASE("an unparsable KJIT_CACHE_MAX_BYTES keeps the default cap") {
  ScopedEnv max("KJIT_CACHE_MAX_BYTES", "lots");
  StoreConfig config = config_from_environment();
  CHECK(config.max_bytes == 0);
  Store store(config);
  CHECK(store.config().max_bytes == kDefaultMaxBytes);
}

TEST_CASE("a Store with no writable root loads nothing and refuses to publish") {
  Store store(StoreConfig{});
  CHECK_FALSE(store.load(key_of(50)).has_value());
  auto published = store.publish(key_of(50), kMeta, payload_of(50, 10));
  REQUIRE_FALSE(published.has_value());
  CHECK(published.error().code == KJIT_ERROR_CACHE);
  CHECK(store.counters().write_failures == 1);
  CHECK(store.list().empty());
}

}  // namespace
}  // namespace kjit::cache::test
