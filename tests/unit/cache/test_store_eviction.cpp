// The cache store's size cap: least-recently-used eviction on publish, the
// pin on entries a Store has loaded, and prune to a size.
#include <doctest/doctest.h>

#include <ctime>

#include "cache_test_support.hpp"

namespace kjit::cache::test {
namespace {

constexpr std::size_t kPayloadBytes = 10000;

// Publishes `count` entries (keys key_of(first..)) whose last use is `age`
// seconds apart, the first the oldest; returns one entry's file size.
uint64_t publish_aged(Store& store, int first, int count) {
  int64_t now = std::time(nullptr);
  for (int i = 0; i < count; ++i) {
    std::string key = key_of(first + i);
    REQUIRE(store.publish(key, {{"n", 1}}, payload_of(first + i, kPayloadBytes)).has_value());
    set_mtime(store.entry_path(key), now - 1000 + 100 * i);
  }
  return fs::file_size(store.entry_path(key_of(first)));
}

bool present(const Store& store, int n) { return fs::exists(store.entry_path(key_of(n))); }

// Makes `n` look unused for `seconds`, stamp included.
void age(const Store& store, int n, int64_t seconds) {
  std::string path = store.entry_path(key_of(n));
  set_mtime(path, std::time(nullptr) - seconds);
  std::string used = path.substr(0, path.size() - 5) + ".used";
  if (fs::exists(used)) set_mtime(used, std::time(nullptr) - seconds);
}

// The entry size all tests use (they all publish the same shape of entry).
uint64_t entry_bytes() {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  return publish_aged(store, 0, 1);
}

TEST_CASE("publishing past the cap evicts the least recently used entries first") {
  TempDir dir;
  uint64_t size = entry_bytes();
  Store store(config_at(dir.sub("root"), size * 7 / 2));  // room for 3
  publish_aged(store, 1, 3);                               // 1 oldest, then 2, then 3
  age(store, 2, 5000);                                      // now 2 is the oldest, then 1

  REQUIRE(store.publish(key_of(4), nullptr, payload_of(4, kPayloadBytes)).has_value());
  CHECK_FALSE_MESSAGE(present(store, 2), "the least recently used entry should go first");
  CHECK(present(store, 1));
  CHECK(present(store, 3));
  CHECK(present(store, 4));
  CHECK(store.counters().evicted == 1);

  REQUIRE(store.publish(key_of(5), nullptr, payload_of(5, kPayloadBytes)).has_value());
  CHECK_FALSE_MESSAGE(present(store, 1), "the next least recently used entry should go next");
  CHECK(present(store, 3));
  CHECK(present(store, 4));
  CHECK(present(store, 5));
  CHECK(store.counters().evicted == 2);
}

TEST_CASE("a load stamps an entry as recently used so that eviction passes it over") {
  TempDir dir;
  uint64_t size = entry_bytes();
  Store writer(config_at(dir.sub("root"), size * 7 / 2));
  publish_aged(writer, 1, 3);
  Store reader(config_at(dir.sub("root")));
  REQUIRE(reader.load(key_of(1)).has_value());  // 1 was the oldest
  CHECK(fs::exists(dir.sub("root") + "/" + key_of(1).substr(0, 2) + "/" + key_of(1) + ".used"));

  REQUIRE(writer.publish(key_of(4), nullptr, payload_of(4, kPayloadBytes)).has_value());
  CHECK(present(writer, 1));
  CHECK_FALSE(present(writer, 2));
  CHECK(present(writer, 3));
}

TEST_CASE("an entry a Store has loaded is never evicted by that Store") {
  TempDir dir;
  uint64_t size = entry_bytes();
  Store store(config_at(dir.sub("root"), size * 7 / 2));
  publish_aged(store, 1, 3);
  REQUIRE(store.load(key_of(1)).has_value());
  age(store, 1, 5000);  // the oldest again, stamp and all

  REQUIRE(store.publish(key_of(4), nullptr, payload_of(4, kPayloadBytes)).has_value());
  CHECK_MESSAGE(present(store, 1), "the loaded entry was evicted by the Store that loaded it");
  CHECK_FALSE(present(store, 2));

  REQUIRE(store.prune(0).has_value());
  CHECK_MESSAGE(present(store, 1), "prune removed an entry this Store loaded");

  Store other(config_at(dir.sub("root")));
  REQUIRE(other.prune(0).has_value());
  CHECK_FALSE_MESSAGE(present(other, 1), "another Store should be free to evict it");
}

TEST_CASE("prune brings the writable root down to a size least recently used first") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  uint64_t size = publish_aged(store, 1, 5);
  auto report = store.prune(size * 5 / 2);
  REQUIRE(report.has_value());
  CHECK(report->removed_entries == 3);
  CHECK(report->removed_bytes == 3 * size);
  CHECK(report->remaining_bytes == 2 * size);
  for (int n = 1; n <= 3; ++n) CHECK_FALSE(present(store, n));
  CHECK(present(store, 4));
  CHECK(present(store, 5));
}

TEST_CASE("an entry larger than the cap is still published and kept") {
  TempDir dir;
  Store store(config_at(dir.sub("root"), 1000));
  REQUIRE(store.publish(key_of(1), nullptr, payload_of(1, 5000)).has_value());
  REQUIRE(store.publish(key_of(2), nullptr, payload_of(2, 5000)).has_value());
  CHECK(present(store, 2));
  CHECK_FALSE(present(store, 1));
  CHECK(store.load(key_of(2)).has_value());
}

}  // namespace
}  // namespace kjit::cache::test
