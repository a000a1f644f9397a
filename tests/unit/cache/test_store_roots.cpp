// The cache store's roots: read-only roots beneath the writable one, and
// writable roots that cannot be written or must not be trusted.
#include <doctest/doctest.h>

#include "cache_test_support.hpp"

namespace kjit::cache::test {
namespace {

const nlohmann::json kMeta = {{"kernel", "dequant_nvfp4"}};

StoreConfig layered(const std::string& writable, std::vector<std::string> read_only) {
  StoreConfig config = config_at(writable);
  config.read_only_roots = std::move(read_only);
  return config;
}

// A root holding `keys`, like one baked into an image: made read-only.
std::string image_root(const TempDir& dir, const std::string& name, const std::vector<uint64_t>& keys) {
  std::string root = dir.sub(name);
  Store store(config_at(root));
  for (uint64_t n : keys) REQUIRE(store.publish(key_of(n), {{"from", name}}, payload_of(n, 500)).has_value());
  for (auto& item : fs::recursive_directory_iterator(root))
    if (item.is_directory()) fs::permissions(item.path(), fs::perms::owner_read | fs::perms::owner_exec);
  fs::permissions(root, fs::perms::owner_read | fs::perms::owner_exec);
  return root;
}

void flip_last_byte(const std::string& path) {
  fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all);
  std::vector<char> file = read_file(path);
  file.back() ^= 1;
  write_file(path, file);
}

TEST_CASE("hits come from a read-only root and new entries go to the writable root") {
  TempDir dir;
  std::string image = image_root(dir, "image", {1, 2});
  std::string writable = dir.sub("writable");
  Store store(layered(writable, {image}));

  auto entry = store.load(key_of(1));
  REQUIRE(entry.has_value());
  CHECK(entry->root == image);
  CHECK(entry->payload == payload_of(1, 500));
  CHECK_MESSAGE(files_containing(image, ".used").empty(), "a read-only root was stamped");

  REQUIRE(store.publish(key_of(3), kMeta, payload_of(3, 10)).has_value());
  CHECK(fs::exists(store.entry_path(key_of(3))));
  CHECK(files_containing(image, key_of(3)).empty());

  std::vector<EntryInfo> infos = store.list();
  REQUIRE(infos.size() == 3);
  for (const EntryInfo& info : infos) CHECK(info.read_only == (info.root == image));
  CHECK(infos.front().root == writable);  // the writable root is listed first
}

TEST_CASE("the writable root is searched before the read-only roots") {
  TempDir dir;
  std::string image = image_root(dir, "image", {1});
  Store store(layered(dir.sub("writable"), {image}));
  REQUIRE(store.publish(key_of(1), kMeta, payload_of(1001, 10)).has_value());
  auto entry = store.load(key_of(1));
  REQUIRE(entry.has_value());
  CHECK(entry->root == dir.sub("writable"));
  CHECK(entry->payload == payload_of(1001, 10));
}

TEST_CASE("a corrupt entry in a read-only root is skipped and never deleted") {
  TempDir dir;
  std::string first = image_root(dir, "first", {1, 2});
  std::string second = image_root(dir, "second", {1});
  std::string damaged = first + "/" + key_of(1).substr(0, 2) + "/" + key_of(1) + ".kjit";
  flip_last_byte(damaged);
  flip_last_byte(first + "/" + key_of(2).substr(0, 2) + "/" + key_of(2) + ".kjit");
  Store store(layered(dir.sub("writable"), {first, second}));

  auto entry = store.load(key_of(1));
  REQUIRE_MESSAGE(entry.has_value(), "the next root's good copy should be found");
  CHECK(entry->root == second);
  CHECK_FALSE(store.load(key_of(2)).has_value());
  CHECK(store.counters().corrupt == 2);
  CHECK(fs::exists(damaged));

  CHECK(store.verify(true).bad.size() == 2);
  CHECK_MESSAGE(fs::exists(damaged), "verify(fix) deleted from a read-only root");
  REQUIRE(store.prune(0).has_value());
  REQUIRE(store.clear().has_value());
  CHECK(fs::exists(damaged));
  CHECK(store.load(key_of(1)).has_value());
}

TEST_CASE("a writable root that cannot be created still loads and publish fails with one warning") {
  TempDir dir;
  std::string image = image_root(dir, "image", {1});
  write_file(dir.sub("not-a-dir"), std::vector<char>{'x'});
  std::string root = dir.sub("not-a-dir/cache");  // its parent is a regular file
  Store store(layered(root, {image}));

  StderrCapture stderr_text;
  for (int i = 0; i < 3; ++i) {
    auto published = store.publish(key_of(10 + i), kMeta, payload_of(10, 10));
    REQUIRE_FALSE(published.has_value());
    CHECK(published.error().code == KJIT_ERROR_CACHE);
    CHECK_MESSAGE(published.error().message.find("not-a-dir") != std::string::npos, published.error().message);
    CHECK_MESSAGE(published.error().message.find("Not a directory") != std::string::npos, published.error().message);
  }
  CHECK(store.load(key_of(1)).has_value());
  CHECK_FALSE(store.load(key_of(10)).has_value());
  std::string warnings = stderr_text.text();
  CHECK_MESSAGE(count_of(warnings, "warning") == 1, "expected one warning, got: " << warnings);
  CHECK(count_of(warnings, root) >= 1);
  CHECK(store.counters().write_failures == 3);
}

TEST_CASE("a read-only HOME leaves loads working and publishes failing") {
  TempDir dir;
  std::string image = image_root(dir, "image", {1});
  write_file(dir.sub("home"), std::vector<char>{'x'});
  ScopedEnv kjit_dir("KJIT_CACHE_DIR", nullptr);
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  ScopedEnv home("HOME", dir.sub("home").c_str());
  ScopedEnv path("KJIT_CACHE_PATH", image.c_str());
  StderrCapture quiet;
  Store store(config_from_environment());
  CHECK(store.config().writable_root == dir.sub("home") + "/.cache/kjit");
  CHECK(store.load(key_of(1)).has_value());
  CHECK_FALSE(store.publish(key_of(2), kMeta, payload_of(2, 10)).has_value());
  CHECK(store.list().size() == 1);
}

TEST_CASE("a writable root without write permission still loads and publish fails") {
  if (running_as_root()) {
    MESSAGE("skipped: permissions do not bind root; the test above covers an unwritable root");
    return;
  }
  TempDir dir;
  std::string root = dir.sub("root");
  REQUIRE(Store(config_at(root)).publish(key_of(1), kMeta, payload_of(1, 10)).has_value());
  fs::permissions(root, fs::perms::owner_read | fs::perms::owner_exec);
  fs::permissions(fs::path(Store(config_at(root)).entry_path(key_of(1))).parent_path(),
                  fs::perms::owner_read | fs::perms::owner_exec);
  Store store(config_at(root));
  StderrCapture stderr_text;
  CHECK(store.load(key_of(1)).has_value());
  auto published = store.publish(key_of(2), kMeta, payload_of(2, 10));
  REQUIRE_FALSE(published.has_value());
  CHECK(published.error().code == KJIT_ERROR_CACHE);
  CHECK_MESSAGE(published.error().message.find("Permission denied") != std::string::npos, published.error().message);
  CHECK_MESSAGE(store.publish(key_of(1), kMeta, payload_of(1, 10)).has_value(), "a valid entry already there counts");
  CHECK(count_of(stderr_text.text(), "warning") == 1);
}

TEST_CASE("a writable root that group or others can write is neither written nor read") {
  for (fs::perms loose : {fs::perms::owner_all | fs::perms::others_all, fs::perms::owner_all | fs::perms::group_all}) {
    TempDir dir;
    std::string root = dir.sub("root");
    REQUIRE(Store(config_at(root)).publish(key_of(1), kMeta, payload_of(1, 10)).has_value());
    fs::permissions(root, loose);

    Store store(config_at(root));
    StderrCapture stderr_text;
    auto published = store.publish(key_of(2), kMeta, payload_of(2, 10));
    REQUIRE_FALSE_MESSAGE(published.has_value(), "published into a root of mode " << std::oct << mode_of(root));
    CHECK(published.error().code == KJIT_ERROR_CACHE);
    CHECK_MESSAGE(published.error().message.find("writable by group or others") != std::string::npos,
                  published.error().message);
    CHECK_FALSE(fs::exists(store.entry_path(key_of(2))));
    CHECK_FALSE_MESSAGE(store.load(key_of(1)).has_value(), "an entry was read from an untrusted root");
    CHECK(store.list().empty());
    CHECK_FALSE(store.publish(key_of(3), kMeta, payload_of(3, 10)).has_value());
    std::string warnings = stderr_text.text();
    CHECK_MESSAGE(count_of(warnings, "warning") == 1, "expected one warning, got: " << warnings);
  }
}

TEST_CASE("a writable root owned by another user is refused") {
  if (!running_as_root()) {
    MESSAGE("skipped: only root can give a directory to another user");
    return;
  }
  TempDir dir;
  std::string root = dir.sub("root");
  fs::create_directories(root);
  fs::permissions(root, fs::perms::owner_all);
  REQUIRE(::chown(root.c_str(), 65534, 65534) == 0);
  Store store(config_at(root));
  StderrCapture quiet;
  auto published = store.publish(key_of(1), kMeta, payload_of(1, 10));
  REQUIRE_FALSE(published.has_value());
  CHECK_MESSAGE(published.error().message.find("owned by uid 65534") != std::string::npos, published.error().message);
}

TEST_CASE("a read-only root that others can write is skipped") {
  TempDir dir;
  std::string image = image_root(dir, "image", {1});
  fs::permissions(image, fs::perms::owner_all | fs::perms::others_all);
  Store store(layered(dir.sub("writable"), {image}));
  StderrCapture quiet;
  CHECK_FALSE(store.load(key_of(1)).has_value());
  CHECK(quiet.text().find("writable by others") != std::string::npos);
}

}  // namespace
}  // namespace kjit::cache::test
