// Maintenance on a root whose files cannot be removed (a read-only mount:
// EROFS, whoever runs it, root included): clear, prune and verify --fix report
// each entry they could not act on instead of claiming success. The failures
// come from an unlinkat() defined in this test program, which the statically
// linked store calls instead of libc's.
#include <dlfcn.h>

#include <cerrno>

#include <doctest/doctest.h>

#include "cache_test_support.hpp"

namespace {
int unlink_error = 0;  // while non-zero, every unlinkat fails with it
}  // namespace

extern "C" int unlinkat(int dir, const char* name, int flags) {
  using Real = int (*)(int, const char*, int);
  static const auto real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "unlinkat"));
  if (unlink_error != 0) {
    errno = unlink_error;
    return -1;
  }
  return real(dir, name, flags);
}

namespace kjit::cache::test {
namespace {

const nlohmann::json kMeta = {{"op", "dequant"}};

// Injects `err` into every unlinkat for one scope.
struct UnlinkFailure {
  explicit UnlinkFailure(int err) { unlink_error = err; }
  ~UnlinkFailure() { unlink_error = 0; }
  UnlinkFailure(const UnlinkFailure&) = delete;
  UnlinkFailure& operator=(const UnlinkFailure&) = delete;
};

bool names(const std::vector<Failure>& failures, const std::string& path) {
  for (const Failure& failure : failures)
    if (failure.path == path && failure.message.find(path) != std::string::npos) return true;
  return false;
}

TEST_CASE("clear on a root it cannot write reports every entry it could not remove") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  for (uint64_t n = 1; n <= 3; ++n) REQUIRE(store.publish(key_of(n), kMeta, payload_of(n, 10)).has_value());
  UnlinkFailure read_only(EROFS);
  auto cleared = store.clear();
  REQUIRE(cleared.has_value());
  CHECK(cleared->removed_entries == 0);
  CHECK(cleared->failures.size() == 3);
  for (uint64_t n = 1; n <= 3; ++n) {
    CHECK(names(cleared->failures, store.entry_path(key_of(n))));
    CHECK(fs::exists(store.entry_path(key_of(n))));
  }
}

TEST_CASE("prune on a root it cannot write reports the entries it could not evict or remove") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  for (uint64_t n = 1; n <= 2; ++n) REQUIRE(store.publish(key_of(n), kMeta, payload_of(n, 10)).has_value());
  write_file(store.entry_path(key_of(2)), std::vector<char>(100, 'x'));
  UnlinkFailure read_only(EROFS);
  auto report = store.prune(0);
  REQUIRE(report.has_value());
  CHECK(report->removed_entries == 0);
  CHECK(report->removed_corrupt == 0);
  CHECK(names(report->failures, store.entry_path(key_of(1))));
  CHECK(names(report->failures, store.entry_path(key_of(2))));
}

TEST_CASE("verify --fix on a root it cannot write reports the bad entries it could not remove") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  REQUIRE(store.publish(key_of(1), kMeta, payload_of(1, 10)).has_value());
  write_file(store.entry_path(key_of(1)), std::vector<char>(100, 'x'));
  UnlinkFailure read_only(EROFS);
  VerifyReport report = store.verify(true);
  CHECK(report.bad.size() == 1);
  CHECK(report.removed == 0);
  REQUIRE(report.failures.size() == 1);
  CHECK(names(report.failures, store.entry_path(key_of(1))));
}

}  // namespace
}  // namespace kjit::cache::test
