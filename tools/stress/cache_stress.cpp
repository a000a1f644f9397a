// The processes of tools/stress/kill_storm.sh, over the cache store's API:
//   cache_stress writer  ROOT SECONDS SEED   publish and load a fixed key set
//   cache_stress reader  ROOT SECONDS        load every key, compare with the reference
//   cache_stress maintain ROOT SECONDS SEED  a loop of clear / prune / verify --fix
//   cache_stress final   ROOT                one prune, then a report of what is left
// Every key's payload is a pure function of the key (the reference), so any
// process can tell a served payload that differs: it prints "CORRUPT <key>".
// Writers die now and then in the middle of a publish (the store's test-only
// kill-during-publish hook); the script SIGKILLs them at random as well.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kjit/cache/store.hpp"

namespace {

using kjit::cache::Store;
using Clock = std::chrono::steady_clock;

constexpr int kKeys = 48;

std::string key_of(int k) { return fmt::format("{:016x}{:016x}", 0x5EED0000u + static_cast<unsigned>(k), 0xC0FFEEu); }

std::vector<char> reference(int k) {
  std::vector<char> payload(512 + static_cast<std::size_t>(k) * 4099 % 196'608);
  uint64_t x = static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull + 1;
  for (char& c : payload) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(x >> 56);
  }
  return payload;
}

Store open_store(const std::string& root) {
  kjit::cache::StoreConfig config;
  config.writable_root = root;
  config.max_bytes = 4 << 20;  // small: publishes evict now and then
  return Store(config);
}

// Loads key k; false (and a CORRUPT line) when a payload other than the reference is served.
bool check_load(Store& store, int k, uint64_t& served) {
  auto entry = store.load(key_of(k));
  if (!entry) return true;
  ++served;
  if (entry->payload == reference(k)) return true;
  std::printf("CORRUPT %s (%zu bytes served)\n", key_of(k).c_str(), entry->payload.size());
  std::fflush(stdout);
  return false;
}

int writer(const std::string& root, double seconds, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  uint64_t served = 0;
  int bad = 0;
  while (Clock::now() < deadline) {
    Store store = open_store(root);  // a fresh Store now and then: sweeps, estimates, pins anew
    for (int i = 0; i < 20 && Clock::now() < deadline; ++i) {
      int k = static_cast<int>(rng() % kKeys);
      if (!check_load(store, k, served)) ++bad;
      // Now and then die in the middle of a publish, leaving a half-written temp file.
      if (rng() % 100 == 0) ::setenv("KJIT_TEST_FAULT", "kill-during-publish", 1);
      kjit::cache::KeyLock lock = store.try_lock(key_of(k), std::chrono::milliseconds(500));
      nlohmann::json meta = {{"op", "stress"}, {"arch", "sm_90a"}, {"compile_seconds", 0.01}, {"k", k}};
      auto published = store.publish(key_of(k), meta, reference(k));
      ::unsetenv("KJIT_TEST_FAULT");
      if (!published) std::fprintf(stderr, "publish failed: %s\n", published.error().message.c_str());
    }
  }
  return bad == 0 ? 0 : 3;
}

int reader(const std::string& root, double seconds) {
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  uint64_t served = 0;
  uint64_t rounds = 0;
  int bad = 0;
  while (Clock::now() < deadline) {
    // A fresh Store every 10 rounds, so that its pins do not keep every key from eviction.
    Store store = open_store(root);
    for (int round = 0; round < 10 && Clock::now() < deadline; ++round, ++rounds)
      for (int k = 0; k < kKeys; ++k)
        if (!check_load(store, k, served)) ++bad;
  }
  std::printf("reader: %llu rounds, %llu served, %d corrupt\n", static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(served), bad);
  return bad == 0 ? 0 : 3;
}

int maintain(const std::string& root, double seconds, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  uint64_t ops = 0, bad = 0, slowest_ms = 0;
  while (Clock::now() < deadline) {
    Store store = open_store(root);
    auto started = Clock::now();
    switch (rng() % 6) {
      case 0:
        (void)store.clear([&](const kjit::cache::EntryInfo& info) { return info.key[17] < '8'; });
        break;
      case 1:
      case 2:
        (void)store.prune(uint64_t{1} << (18 + rng() % 5));
        break;
      default: {
        // A bad entry here is one a reader could have been served.
        auto report = store.verify(true);
        for (const auto& info : report.bad) {
          std::printf("VERIFY-BAD %s: %s\n", info.key.c_str(), info.problem.c_str());
          ++bad;
        }
        break;
      }
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
    slowest_ms = std::max<uint64_t>(slowest_ms, static_cast<uint64_t>(ms));
    ++ops;
  }
  std::printf("maintain: %llu ops, slowest %llu ms, %llu bad found by verify\n", static_cast<unsigned long long>(ops),
              static_cast<unsigned long long>(slowest_ms), static_cast<unsigned long long>(bad));
  return 0;
}

// Files of each kind left in the root: temp files, stamps and locks without an entry.
int final_report(const std::string& root) {
  Store store = open_store(root);
  auto pruned = store.prune(uint64_t{1} << 40);
  uint64_t temps = 0, orphan_used = 0, orphan_lock = 0, entries = 0;
  namespace fs = std::filesystem;
  for (const auto& file : fs::recursive_directory_iterator(root)) {
    std::string name = file.path().filename().string();
    auto sibling = [&](const char* suffix) {
      return fs::exists(file.path().parent_path() / (name.substr(0, name.rfind('.')) + suffix));
    };
    if (name.find(".tmp-") != std::string::npos) ++temps;
    if (name.ends_with(".used") && !sibling(".kjit")) ++orphan_used;
    if (name.ends_with(".lock") && !sibling(".kjit")) ++orphan_lock;
    if (name.ends_with(".kjit")) ++entries;
  }
  auto report = store.verify(false);
  std::printf("after one prune (%llu temp files swept, %zu failures): %llu entries, %zu bad, %llu temp files, "
              "%llu orphan .used, %llu orphan .lock\n",
              static_cast<unsigned long long>(pruned ? pruned->removed_temp_files : 0),
              pruned ? pruned->failures.size() : 0, static_cast<unsigned long long>(entries), report.bad.size(),
              static_cast<unsigned long long>(temps), static_cast<unsigned long long>(orphan_used),
              static_cast<unsigned long long>(orphan_lock));
  for (int k = 0; k < kKeys; ++k) {
    uint64_t served = 0;
    if (!check_load(store, k, served)) return 3;
  }
  return report.bad.empty() && temps == 0 && orphan_used == 0 && orphan_lock == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto number = [&](std::size_t i) { return i < args.size() ? std::strtod(args[i].c_str(), nullptr) : 0.0; };
  if (args.size() >= 3 && args[0] == "writer") return writer(args[1], number(2), static_cast<uint64_t>(number(3)));
  if (args.size() >= 3 && args[0] == "reader") return reader(args[1], number(2));
  if (args.size() >= 3 && args[0] == "maintain") return maintain(args[1], number(2), static_cast<uint64_t>(number(3)));
  if (args.size() == 2 && args[0] == "final") return final_report(args[1]);
  std::fprintf(stderr, "usage: cache_stress writer|reader|maintain ROOT SECONDS [SEED] | final ROOT\n");
  return 2;
}
