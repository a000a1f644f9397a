// The cache store's integrity checks: damaged, truncated, foreign-format and
// symlinked entries are misses, never data; verify finds them; and a bounded
// fuzz of the entry reader.
#include <doctest/doctest.h>

#include <functional>
#include <random>

#include "cache_test_support.hpp"
#include "kjit/cache/entry_format.hpp"

namespace kjit::cache::test {
namespace {

const nlohmann::json kMeta = {{"kernel", "grouped_gemm_fp8"}, {"n", 7168}};

struct Damage {
  const char* what;
  std::function<void(std::vector<char>&)> apply;
};

// Each leaves the file different from what was published.
const std::vector<Damage> kDamages = {
    {"flipped magic byte", [](std::vector<char>& f) { f[1] ^= 0x20; }},
    {"flipped header-size byte", [](std::vector<char>& f) { f[12] ^= 0x01; }},
    {"flipped meta-length byte", [](std::vector<char>& f) { f[16] ^= 0x01; }},
    {"flipped payload-length byte", [](std::vector<char>& f) { f[24] ^= 0x04; }},
    {"flipped hash byte", [](std::vector<char>& f) { f[45] ^= 0x10; }},
    {"flipped meta byte", [](std::vector<char>& f) { f[format::kHeaderBytes + 3] ^= 0x01; }},
    {"flipped payload byte", [](std::vector<char>& f) { f[f.size() - 5] ^= static_cast<char>(0x80); }},
    {"truncated by 10 bytes", [](std::vector<char>& f) { f.resize(f.size() - 10); }},
    {"truncated inside the header", [](std::vector<char>& f) { f.resize(20); }},
    {"emptied", [](std::vector<char>& f) { f.clear(); }},
    {"padded by one byte", [](std::vector<char>& f) { f.push_back('\0'); }},
};

void damage_entry(const Store& store, const std::string& key, const Damage& damage) {
  std::vector<char> file = read_file(store.entry_path(key));
  REQUIRE(file.size() > format::kHeaderBytes + 10);
  damage.apply(file);
  write_file(store.entry_path(key), file);
}

TEST_CASE("a damaged or truncated entry in the writable root is a miss that is counted and removed") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  uint64_t n = 100;
  for (const Damage& damage : kDamages) {
    CAPTURE(damage.what);
    std::string key = key_of(++n);
    REQUIRE(store.publish(key, kMeta, payload_of(n, 2000)).has_value());
    damage_entry(store, key, damage);
    uint64_t corrupt_before = store.counters().corrupt;
    StderrCapture stderr_text;
    CHECK_FALSE_MESSAGE(store.load(key).has_value(), "a " << damage.what << " entry was returned");
    CHECK(store.counters().corrupt == corrupt_before + 1);
    CHECK_FALSE_MESSAGE(fs::exists(store.entry_path(key)), "the " << damage.what << " entry was not removed");
    std::string warnings = stderr_text.text();
    CHECK_MESSAGE(warnings.find(store.entry_path(key)) != std::string::npos,
                  "no warning names the entry: " << warnings);
  }
  CHECK(store.counters().hits == 0);
}

TEST_CASE("a damaged entry is replaced by the next publish of its key") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::string key = key_of(120);
  std::vector<char> payload = payload_of(120, 500);
  REQUIRE(store.publish(key, kMeta, payload).has_value());
  damage_entry(store, key, kDamages[6]);
  REQUIRE(store.publish(key, kMeta, payload).has_value());
  auto entry = store.load(key);
  REQUIRE(entry.has_value());
  CHECK(entry->payload == payload);
}

TEST_CASE("verify reports damaged entries and removes them only when asked to fix") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::vector<std::string> damaged;
  for (uint64_t n = 130; n < 140; ++n) {
    REQUIRE(store.publish(key_of(n), kMeta, payload_of(n, 300)).has_value());
    if (n % 3 == 0) {
      damage_entry(store, key_of(n), kDamages[n % kDamages.size()]);
      damaged.push_back(key_of(n));
    }
  }
  std::sort(damaged.begin(), damaged.end());
  auto keys_of = [](const std::vector<EntryInfo>& infos) {
    std::vector<std::string> keys;
    for (const EntryInfo& info : infos) keys.push_back(info.key);
    std::sort(keys.begin(), keys.end());
    return keys;
  };

  std::vector<EntryInfo> bad = store.verify(false).bad;
  CHECK(keys_of(bad) == damaged);
  for (const EntryInfo& info : bad) {
    CHECK(info.state == EntryState::corrupt);
    CHECK_FALSE(info.problem.empty());
    CHECK(fs::exists(info.path));
  }
  CHECK(keys_of(store.verify(true).bad) == damaged);
  for (const std::string& key : damaged) CHECK_FALSE(fs::exists(store.entry_path(key)));
  CHECK(store.verify(false).bad.empty());
  CHECK(store.list().size() == 10 - damaged.size());
}

TEST_CASE("list marks entries whose header or meta is bad and leaves payload checks to verify") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  for (uint64_t n = 150; n < 153; ++n) REQUIRE(store.publish(key_of(n), kMeta, payload_of(n, 300)).has_value());
  damage_entry(store, key_of(150), kDamages[7]);                                              // truncated
  damage_entry(store, key_of(151), {"meta not JSON", [](std::vector<char>& f) { f[64] = '['; }});  // meta
  damage_entry(store, key_of(152), kDamages[6]);                                              // payload
  std::map<std::string, EntryInfo> by_key;
  for (EntryInfo& info : store.list()) by_key[info.key] = info;
  REQUIRE(by_key.size() == 3);
  CHECK(by_key[key_of(150)].state == EntryState::corrupt);
  CHECK(by_key[key_of(151)].state == EntryState::corrupt);
  CHECK(by_key[key_of(152)].state == EntryState::ok);
  CHECK(store.verify(false).bad.size() == 3);
}

std::vector<char> other_format_entry(const std::string& key, uint32_t version) {
  auto meta = format::with_bookkeeping(kMeta, key, 100, 1);
  auto file = format::encode(*meta, payload_of(1, 100));
  REQUIRE(file.has_value());
  for (int i = 0; i < 4; ++i) (*file)[8 + i] = static_cast<char>((version >> (8 * i)) & 0xFF);
  return *file;
}

void plant(const std::string& path, std::span<const char> bytes) {
  fs::create_directories(fs::path(path).parent_path());
  fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all);
  write_file(path, bytes);
}

TEST_CASE("an entry of another format version is a miss left for prune to remove") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::string key = key_of(160);
  plant(store.entry_path(key), other_format_entry(key, format::kFormatVersion + 1));

  CHECK_FALSE(store.load(key).has_value());
  CHECK(store.counters().misses == 1);
  CHECK_MESSAGE(store.counters().corrupt == 0, "another format is not corruption");
  CHECK_MESSAGE(fs::exists(store.entry_path(key)), "load must not remove another format's entry");
  CHECK(store.verify(false).bad.empty());
  std::vector<EntryInfo> infos = store.list();
  REQUIRE(infos.size() == 1);
  CHECK(infos[0].state == EntryState::other_format);
  CHECK(infos[0].format_version == format::kFormatVersion + 1);

  auto report = store.prune(kDefaultMaxBytes);
  REQUIRE(report.has_value());
  CHECK(report->removed_other_format == 1);
  CHECK(report->removed_entries == 0);
  CHECK_FALSE(fs::exists(store.entry_path(key)));
}

TEST_CASE("a publish replaces an entry of another format version") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::string key = key_of(161);
  plant(store.entry_path(key), other_format_entry(key, 0));
  REQUIRE(store.publish(key, kMeta, payload_of(161, 10)).has_value());
  auto entry = store.load(key);
  REQUIRE(entry.has_value());
  CHECK(entry->payload == payload_of(161, 10));
}

TEST_CASE("an entry stored under another key's name is rejected") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(170), kMeta, payload_of(170, 10)).has_value());
  plant(store.entry_path(key_of(171)), read_file(store.entry_path(key_of(170))));
  CHECK_FALSE(store.load(key_of(171)).has_value());
  CHECK(store.counters().corrupt == 1);
}

TEST_CASE("symlinks inside a root are never followed") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  // Three keys in three different shards.
  const std::string linked_entry = "aa" + std::string(62, '1');
  const std::string real_entry = "bb" + std::string(62, '2');
  const std::string in_linked_shard = "cc" + std::string(62, '3');
  REQUIRE(store.publish(real_entry, kMeta, payload_of(181, 10)).has_value());
  std::string outside = dir.sub("outside");
  fs::create_directories(outside);

  // A symlinked entry: a miss, counted, the link removed, its target untouched.
  plant(outside + "/valid.kjit", read_file(store.entry_path(real_entry)));
  fs::create_directories(fs::path(store.entry_path(linked_entry)).parent_path());
  fs::create_symlink(outside + "/valid.kjit", store.entry_path(linked_entry));
  CHECK_FALSE(store.load(linked_entry).has_value());
  CHECK(store.counters().corrupt == 1);
  CHECK_FALSE(fs::is_symlink(store.entry_path(linked_entry)));
  CHECK(fs::exists(outside + "/valid.kjit"));

  // A symlinked shard directory: never written through.
  fs::create_directory_symlink(outside, fs::path(store.entry_path(in_linked_shard)).parent_path());
  auto published = store.publish(in_linked_shard, kMeta, payload_of(182, 10));
  REQUIRE_FALSE_MESSAGE(published.has_value(), "published through a symlinked shard");
  CHECK(published.error().code == KJIT_ERROR_CACHE);
  CHECK(files_containing(outside, in_linked_shard).empty());
  CHECK_FALSE(store.load(in_linked_shard).has_value());
}

// ---------------------------------------------------------------- fuzz

std::vector<char> mutated(const std::vector<char>& original, std::mt19937_64& rng) {
  auto below = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  std::vector<char> file = original;
  switch (rng() % 6) {
    case 0:  // flip a few bits
      for (std::size_t i = 0, n = 1 + below(4); i < n; ++i)
        file[below(file.size())] ^= static_cast<char>(1 << below(8));
      break;
    case 1:  // overwrite one byte
      file[below(file.size())] = static_cast<char>(rng());
      break;
    case 2:  // truncate
      file.resize(below(file.size()));
      break;
    case 3:  // append
      for (std::size_t i = 0, n = 1 + below(16); i < n; ++i) file.push_back(static_cast<char>(rng()));
      break;
    case 4:  // random bytes
      file.resize(below(4000));
      for (char& c : file) c = static_cast<char>(rng());
      break;
    default:  // random body behind a plausible header: reaches the hash check
      for (std::size_t i = format::kHashedHeaderBytes; i < file.size(); ++i) file[i] = static_cast<char>(rng());
      break;
  }
  return file;
}

TEST_CASE("the entry reader never accepts mutated or truncated or random bytes") {
  std::mt19937_64 rng(20261122);
  int accepted_unchanged = 0;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    CAPTURE(iteration);
    std::string key = key_of(rng());
    nlohmann::json meta = {{"i", iteration}, {"s", std::string(rng() % 50, 'x')}};
    std::vector<char> payload = payload_of(rng(), rng() % 3000);
    auto file = format::encode(*format::with_bookkeeping(meta, key, payload.size(), 1), payload);
    REQUIRE(file.has_value());
    std::vector<char> bytes = mutated(*file, rng);

    format::Decoded decoded = format::decode(bytes, key);
    format::HeaderCheck header = format::check_header(bytes, bytes.size());
    if (decoded.verdict == format::Verdict::ok) {
      REQUIRE_MESSAGE(bytes == *file, "accepted bytes that differ from the published entry");
      CHECK(std::equal(decoded.payload.begin(), decoded.payload.end(), payload.begin(), payload.end()));
      CHECK(decoded.meta["i"] == iteration);
      ++accepted_unchanged;
    } else {
      CHECK_FALSE(decoded.problem.empty());
    }
    if (header.verdict != format::Verdict::ok) CHECK(decoded.verdict == header.verdict);
  }
  MESSAGE(accepted_unchanged << " of 2000 mutations happened to leave the entry unchanged");
}

TEST_CASE("the store never returns a mutated entry file") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  std::mt19937_64 rng(7);
  std::string key = key_of(190);
  std::vector<char> payload = payload_of(190, 1500);
  REQUIRE(store.publish(key, kMeta, payload).has_value());
  std::vector<char> original = read_file(store.entry_path(key));
  StderrCapture quiet;  // each damaged load warns
  for (int iteration = 0; iteration < 300; ++iteration) {
    CAPTURE(iteration);
    std::vector<char> bytes = mutated(original, rng);
    write_file(store.entry_path(key), bytes);
    std::optional<Entry> entry = store.load(key);
    if (entry) {
      REQUIRE_MESSAGE(bytes == original, "the store returned a damaged entry");
      CHECK(entry->payload == payload);
    }
  }
}

}  // namespace
}  // namespace kjit::cache::test
