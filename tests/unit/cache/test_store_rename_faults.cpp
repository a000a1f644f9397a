// How publish() meets the rename failures of network file systems: a reply
// lost after the server renamed (ENOENT although the entry is in place), a
// target held busy for a while (EBUSY), a target busy for good, and an error
// that is not transient. The faults come from a renameat() defined in this
// test program, which the statically linked store calls instead of libc's
// (its own executable: the other cache tests keep the real call).
#include <dlfcn.h>

#include <cerrno>
#include <cstring>

#include <doctest/doctest.h>

#include "cache_test_support.hpp"

namespace {

// One scripted call: fail with `err`, after doing the rename when `performed`.
struct RenameFault {
  int err;
  bool performed;
};

struct RenameScript {
  std::vector<RenameFault> faults;  // consumed in order; real calls once empty
  std::size_t next = 0;
  int calls = 0;
};
RenameScript script;

}  // namespace

extern "C" int renameat(int old_dir, const char* old_name, int new_dir, const char* new_name) {
  using Real = int (*)(int, const char*, int, const char*);
  static const auto real = reinterpret_cast<Real>(::dlsym(RTLD_NEXT, "renameat"));
  ++script.calls;
  if (script.next < script.faults.size()) {
    const RenameFault fault = script.faults[script.next++];
    if (fault.performed && real(old_dir, old_name, new_dir, new_name) != 0) return -1;
    errno = fault.err;
    return -1;
  }
  return real(old_dir, old_name, new_dir, new_name);
}

namespace kjit::cache::test {
namespace {

const nlohmann::json kMeta = {{"kernel", "grouped_gemm"}, {"n", 4096}};

// Publishes key 1 into a fresh root under `faults`; what publish returned and
// how many renames it tried, with the root left for inspection.
struct Outcome {
  Expected<void> published;
  int renames;
};

Outcome publish_with(Store& store, std::vector<RenameFault> faults) {
  script = RenameScript{std::move(faults)};
  StderrCapture quiet;  // a failed publish warns; the tests check the error itself
  auto published = store.publish(key_of(1), kMeta, payload_of(1, 3000));
  const int renames = script.calls;
  script = RenameScript{};
  return {std::move(published), renames};
}

TEST_CASE("a rename whose reply was lost (done, then ENOENT) publishes without retrying") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  auto outcome = publish_with(store, {{ENOENT, true}});
  REQUIRE_MESSAGE(outcome.published.has_value(), outcome.published.error().message);
  CHECK(outcome.renames == 1);
  auto entry = store.load(key_of(1));
  REQUIRE(entry.has_value());
  CHECK(entry->payload == payload_of(1, 3000));
  CHECK(temp_files_in(dir.sub("root")).empty());
}

TEST_CASE("a target busy twice (EBUSY) is retried until the rename goes through") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  auto outcome = publish_with(store, {{EBUSY, false}, {EBUSY, false}});
  REQUIRE_MESSAGE(outcome.published.has_value(), outcome.published.error().message);
  CHECK(outcome.renames == 3);
  REQUIRE(store.load(key_of(1)).has_value());
  CHECK(temp_files_in(dir.sub("root")).empty());
}

// A target busy for good, and ENOENT with no entry in place (the reply was
// not lost: the rename did not happen): both transient, neither clears.
TEST_CASE("a transient error that never clears fails after five attempts, says so, and leaves nothing behind") {
  for (const int err : {EBUSY, ENOENT}) {
    CAPTURE(std::strerror(err));
    TempDir dir;
    Store store(config_at(dir.sub("root")));
    auto outcome = publish_with(store, std::vector<RenameFault>(5, {err, false}));
    REQUIRE_FALSE(outcome.published.has_value());
    CHECK(outcome.renames == 5);
    const std::string& message = outcome.published.error().message;
    CHECK_MESSAGE(message.find("rename") != std::string::npos, message);
    CHECK_MESSAGE(message.find(std::strerror(err)) != std::string::npos, message);
    CHECK(outcome.published.error().code == KJIT_ERROR_CACHE);
    CHECK_FALSE(store.load(key_of(1)).has_value());
    CHECK(temp_files_in(dir.sub("root")).empty());
  }
}

TEST_CASE("an error that is not transient (EXDEV) fails at once") {
  TempDir dir;
  Store store(config_at(dir.sub("root")));
  auto outcome = publish_with(store, {{EXDEV, false}});
  REQUIRE_FALSE(outcome.published.has_value());
  CHECK(outcome.renames == 1);
  const std::string& message = outcome.published.error().message;
  CHECK_MESSAGE(message.find(std::strerror(EXDEV)) != std::string::npos, message);
  CHECK(temp_files_in(dir.sub("root")).empty());
}

}  // namespace
}  // namespace kjit::cache::test
