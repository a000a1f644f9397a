// The cache store under concurrent writers: processes and threads publishing
// into one root at once, and writers killed in the middle of a publish.
#include <doctest/doctest.h>

#include <signal.h>

#include <atomic>
#include <thread>

#include "cache_test_support.hpp"

namespace kjit::cache::test {
namespace {

constexpr int kProcesses = 8;
constexpr int kThreads = 8;
constexpr int kOwnKeys = 4;
constexpr int kRounds = 3;
const std::string kSharedKey = key_of(999);
const std::vector<char> kSharedPayload = payload_of(999, 64 * 1024);

std::string own_key(int writer, int j) { return key_of(1000 + static_cast<uint64_t>(writer) * 10 + j); }
std::vector<char> own_payload(int writer, int j) { return payload_of(1000 + writer * 10 + j, 3000 + 100 * j); }

// One writer's work: the shared key a few times, interleaved with its own
// keys. Returns how many publishes failed.
int publish_all(Store& store, int writer) {
  int failures = 0;
  for (int round = 0; round < kRounds; ++round) {
    if (!store.publish(kSharedKey, {{"writer", writer}}, kSharedPayload)) ++failures;
    for (int j = round; j < kOwnKeys; j += kRounds)
      if (!store.publish(own_key(writer, j), {{"writer", writer}}, own_payload(writer, j))) ++failures;
  }
  return failures;
}

TEST_CASE("8 processes and 8 threads publishing one key and their own keys into an empty root all succeed") {
  TempDir dir;
  std::string root = dir.sub("root");  // does not exist yet: its creation races too
  int start[2];
  REQUIRE(::pipe(start) == 0);

  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(start[1]);
      char c;
      (void)!::read(start[0], &c, 1);  // returns at EOF: when the parent closes its end
      Store store(config_at(root));
      ::_exit(publish_all(store, p) == 0 ? 0 : 1);
    }
    children.push_back(pid);
  }
  ::close(start[0]);

  Store shared(config_at(root));
  std::atomic<bool> go{false};
  std::atomic<bool> writers_done{false};
  std::atomic<int> thread_failures{0};
  std::atomic<int> bad_reads{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go) std::this_thread::yield();
      thread_failures += publish_all(shared, kProcesses + t);
    });
  }
  std::thread reader([&] {
    Store store(config_at(root));
    while (!go) std::this_thread::yield();
    while (!writers_done) {
      if (auto entry = store.load(kSharedKey); entry && entry->payload != kSharedPayload) ++bad_reads;
    }
    if (store.counters().corrupt != 0) ++bad_reads;
  });
  go = true;
  ::close(start[1]);

  for (std::thread& t : threads) t.join();
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "child " << pid << " status " << status);
  }
  writers_done = true;
  reader.join();

  CHECK(thread_failures == 0);
  CHECK_MESSAGE(bad_reads == 0, "a concurrent reader saw a wrong payload or a corrupt entry");
  CHECK(temp_files_in(root).empty());
  std::vector<EntryInfo> bad = shared.verify(false).bad;
  CHECK_MESSAGE(bad.empty(), bad.size() << " bad entries, first: " << (bad.empty() ? "" : bad[0].problem));
  CHECK(shared.list().size() == 1 + (kProcesses + kThreads) * kOwnKeys);

  Store check(config_at(root));
  auto entry = check.load(kSharedKey);
  REQUIRE(entry.has_value());
  CHECK(entry->payload == kSharedPayload);
  for (int w = 0; w < kProcesses + kThreads; ++w) {
    for (int j = 0; j < kOwnKeys; ++j) {
      auto own = check.load(own_key(w, j));
      REQUIRE_MESSAGE(own.has_value(), "writer " << w << " key " << j << " missing");
      CHECK(own->payload == own_payload(w, j));
    }
  }
  CHECK(check.counters().corrupt == 0);
}

TEST_CASE("a writer killed mid-publish leaves no entry and prune removes its temp file") {
  TempDir dir;
  std::string root = dir.sub("root");
  std::string key = key_of(60);
  std::vector<char> payload = payload_of(60, 1 << 20);

  int status = run_in_child([&] {
    ::setenv("KJIT_TEST_FAULT", "kill-during-publish", 1);
    Store store(config_at(root));
    (void)store.publish(key, {{"doomed", true}}, payload);
    return 0;  // not reached
  });
  REQUIRE_MESSAGE((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL), "the child was not killed: " << status);
  std::vector<std::string> temps = temp_files_in(root);
  REQUIRE_MESSAGE(temps.size() == 1, "the killed writer should leave exactly one temp file");
  CHECK(fs::file_size(temps[0]) > 0);
  CHECK(fs::file_size(temps[0]) < payload.size());

  Store store(config_at(root));
  CHECK_FALSE(store.load(key).has_value());
  CHECK(store.counters().corrupt == 0);
  CHECK(store.list().empty());
  CHECK(store.verify(false).bad.empty());

  auto report = store.prune(kDefaultMaxBytes);
  REQUIRE(report.has_value());
  CHECK(report->removed_temp_files == 1);
  CHECK(temp_files_in(root).empty());

  REQUIRE(store.publish(key, {{"doomed", false}}, payload).has_value());
  auto entry = store.load(key);
  REQUIRE(entry.has_value());
  CHECK(entry->payload == payload);
}

TEST_CASE("the first publish of a Store sweeps temp files of dead writers") {
  TempDir dir;
  std::string root = dir.sub("root");
  int status = run_in_child([&] {
    ::setenv("KJIT_TEST_FAULT", "kill-during-publish", 1);
    (void)Store(config_at(root)).publish(key_of(70), nullptr, payload_of(70, 1000));
    return 0;
  });
  REQUIRE(WIFSIGNALED(status));
  // Two more temp files of the same dead writer (a killed writer's own first
  // publish would already sweep those of writers killed before it).
  std::vector<std::string> temps = temp_files_in(root);
  REQUIRE(temps.size() == 1);
  fs::copy_file(temps[0], temps[0] + "1");
  fs::copy_file(temps[0], temps[0] + "2");

  Store store(config_at(root));
  REQUIRE(store.publish(key_of(80), nullptr, payload_of(80, 10)).has_value());
  CHECK(temp_files_in(root).empty());
  REQUIRE(store.publish(key_of(70), nullptr, payload_of(70, 1000)).has_value());
  CHECK(store.load(key_of(70)).has_value());
}

TEST_CASE("temp files of live writers and of other hosts are kept until they are 10 minutes old") {
  TempDir dir;
  std::string root = dir.sub("root");
  std::string key = key_of(90);
  int status = run_in_child([&] {
    ::setenv("KJIT_TEST_FAULT", "kill-during-publish", 1);
    (void)Store(config_at(root)).publish(key, nullptr, payload_of(90, 1000));
    return 0;
  });
  REQUIRE(WIFSIGNALED(status));
  std::vector<std::string> temps = temp_files_in(root);
  REQUIRE(temps.size() == 1);
  // <key>.tmp-<host tag>-<pid>-<tid>-<random>: reuse this machine's tag.
  std::string dead = fs::path(temps[0]).filename().string();
  std::string tail = dead.substr(dead.find(".tmp-") + 5);
  std::string tag = tail.substr(0, tail.find('-'));
  std::string shard = fs::path(temps[0]).parent_path().string();
  std::string live = shard + "/" + key + ".tmp-" + tag + "-" + std::to_string(::getpid()) + "-1-0";
  std::string elsewhere = shard + "/" + key + ".tmp-otherhost-" + tail.substr(tail.find('-') + 1);
  write_file(live, payload_of(1, 10));
  write_file(elsewhere, payload_of(1, 10));

  Store store(config_at(root));
  REQUIRE(store.prune(kDefaultMaxBytes).value().removed_temp_files == 1);
  CHECK_FALSE_MESSAGE(fs::exists(temps[0]), "the dead writer's temp file should be gone");
  CHECK_MESSAGE(fs::exists(live), "a live writer's temp file was removed");
  CHECK_MESSAGE(fs::exists(elsewhere), "another host's temp file was judged by a pid of this host");
  set_mtime(live, std::time(nullptr) - 11 * 60);
  set_mtime(elsewhere, std::time(nullptr) - 11 * 60);
  CHECK(store.prune(kDefaultMaxBytes).value().removed_temp_files == 2);
  CHECK(temp_files_in(root).empty());
}

}  // namespace
}  // namespace kjit::cache::test
