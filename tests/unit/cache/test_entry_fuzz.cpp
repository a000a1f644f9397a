// A seeded mutation fuzz of the entry decoder (no libFuzzer: the dev
// machine's clang cannot build C++23), run in CI in the sanitizer build too.
// Seeded from a real entry that a Store published, with a meta like the
// runtime's. Mutations: bit flips, byte overwrites, truncations, appends,
// length-field edits, and meta edits resealed with a valid hash (anyone who can
// write a root can compute one): nesting bombs, wrong types, absurd integers,
// random bytes. Invariants: the decoder never crashes or throws, never accepts
// unsealed changes, and what it accepts is bounded and typed. The inputs that
// crashed kjit before are kept as fixed cases. KJIT_FUZZ_ITERATIONS overrides
// the iteration count.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <random>

#include "cache_test_support.hpp"
#include "kjit/cache/entry_format.hpp"

namespace kjit::cache::test {
namespace {

const std::string kKey = key_of(4242);

// A published entry, as the store wrote it.
struct Seed {
  std::vector<char> file;
  std::string meta_text;
  std::vector<char> payload;
};

Seed seed_entry(const TempDir& dir) {
  Store store(config_at(dir.sub("seed")));
  nlohmann::json meta = {{"spec", {{"op", "dequant"}, {"shape", {7168, 2048}}, {"scales", {{"block", 128}}}}},
                         {"canonical", "dequant:fp8e4m3:bf16:7168x2048:b128"},
                         {"op", "dequant"},
                         {"arch", "sm_90a"},
                         {"nvrtc", "12.8"},
                         {"kjit", "0.1.0"},
                         {"options", {"-arch=sm_90a", "-lineinfo"}},
                         {"entry_point", "kjit_dequant"},
                         {"compile_seconds", 0.31},
                         {"source", "extern \"C\" __global__ void kjit_dequant() {}\n"},
                         {"log", ""}};
  Seed seed;
  seed.payload = payload_of(4242, 3000);
  REQUIRE(store.publish(kKey, meta, seed.payload).has_value());
  seed.file = read_file(store.entry_path(kKey));
  auto header = format::check_header(seed.file, seed.file.size());
  REQUIRE(header.verdict == format::Verdict::ok);
  seed.meta_text.assign(seed.file.data() + format::kHeaderBytes, header.header.meta_bytes);
  return seed;
}

// Meta texts that crashed or misled kjit before these fixes.
std::vector<std::string> regression_metas() {
  std::string book = R"("kjit_entry":{"format":1,"key":")" + kKey + R"(","payload_bytes":3000,"created_unix":)";
  return {
      "{" + book + "1},\"x\":" + std::string(200'000, '[') + std::string(200'000, ']') + "}",
      "{" + book + "1},\"x\":" + std::string(150'000, '{') + "}",  // unbalanced too
      "{" + book + "1},\"compile_seconds\":\"slow\"}",
      "{" + book + "-9223372036854775808}}",
      "{" + book + "1},\"options\":[1,2]}",
  };
}

uint64_t below(std::mt19937_64& rng, uint64_t n) { return n == 0 ? 0 : rng() % n; }

void put_u64(std::vector<char>& file, std::size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) file[at + i] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

// A mutation of the meta text, to be resealed with a valid hash.
std::string mutated_meta(const std::string& meta, std::mt19937_64& rng) {
  std::string text = meta;
  auto at = [&] { return static_cast<std::size_t>(below(rng, text.size())); };
  switch (rng() % 6) {
    case 0: {  // a nesting bomb around the depth limit, or far beyond it
      static const int depths[] = {format::kMaxMetaDepth - 2, format::kMaxMetaDepth - 1, format::kMaxMetaDepth,
                                   format::kMaxMetaDepth + 1, 5000, 300'000};
      int depth = depths[below(rng, 6)];
      bool objects = rng() % 2 == 0;
      std::string open = objects ? std::string() : std::string(static_cast<std::size_t>(depth), '[');
      std::string close = objects ? std::string() : std::string(static_cast<std::size_t>(depth), ']');
      if (objects) {
        for (int i = 0; i < depth; ++i) open += "{\"a\":";
        close = "0" + std::string(static_cast<std::size_t>(depth), '}');
      }
      return text.substr(0, text.size() - 1) + ",\"bomb\":" + open + close + "}";
    }
    case 1: {  // a known field with a value of another type
      static const char* fields[] = {"op", "arch", "canonical", "options", "compile_seconds", "source", "log",
                                     "created_unix", "payload_bytes", "format", "key", "kjit_entry"};
      static const char* values[] = {"null", "true", "-1", "1e308", "\"slow\"", "[]", "{}", "[1]",
                                     "-9223372036854775808", "18446744073709551615", "123456789012345678901234"};
      std::string field = std::string("\"") + fields[below(rng, 12)] + "\":";
      std::size_t found = text.find(field);
      if (found == std::string::npos) return text;
      std::size_t value = found + field.size();
      std::size_t end = value;
      int depth = 0;
      bool in_string = false;
      for (; end < text.size(); ++end) {  // the value's end: a comma or a closer at depth 0
        char c = text[end];
        if (in_string) {
          if (c == '\\') ++end;
          else if (c == '"') in_string = false;
        } else if (c == '"') {
          in_string = true;
        } else if (c == '[' || c == '{') {
          ++depth;
        } else if ((c == ']' || c == '}') && depth-- == 0) {
          break;
        } else if (c == ',' && depth == 0) {
          break;
        }
      }
      return text.substr(0, value) + values[below(rng, 11)] + text.substr(end);
    }
    case 2:  // a few random bytes
      for (uint64_t i = 0, n = 1 + below(rng, 4); i < n && !text.empty(); ++i) text[at()] = static_cast<char>(rng());
      return text;
    case 3:  // a control byte or a C1 control inside a string
      return text.substr(0, text.size() - 1) + ",\"op\":\"\\u001b[31m\xc2\x9b\"}";
    case 4:  // cut
      return text.substr(0, at());
    default:  // a repeated slice
      if (text.empty()) return text;
      {
        std::size_t from = at();
        std::size_t len = static_cast<std::size_t>(below(rng, 200));
        return text.substr(0, from) + text.substr(from, len) + text.substr(from);
      }
  }
}

// A mutation of the whole file, leaving the hash as it is.
std::vector<char> mutated_file(const std::vector<char>& original, std::mt19937_64& rng) {
  std::vector<char> file = original;
  auto at = [&] { return static_cast<std::size_t>(below(rng, file.size())); };
  switch (rng() % 5) {
    case 0:
      for (uint64_t i = 0, n = 1 + below(rng, 4); i < n; ++i) file[at()] ^= static_cast<char>(1 << below(rng, 8));
      break;
    case 1:
      file.resize(at());
      break;
    case 2:
      for (uint64_t i = 0, n = 1 + below(rng, 64); i < n; ++i) file.push_back(static_cast<char>(rng()));
      break;
    case 3: {  // a length field set to a boundary or a random value
      static const uint64_t values[] = {0, 1, 63, 64, format::kMaxMetaBytes, format::kMaxMetaBytes + 1,
                                        format::kMaxPayloadBytes, uint64_t{1} << 63, ~uint64_t{0}};
      uint64_t v = rng() % 2 ? values[below(rng, 9)] : rng();
      put_u64(file, rng() % 2 ? 16 : 24, v);
      break;
    }
    default:  // version or header size
      file[rng() % 2 ? 8 : 12] = static_cast<char>(rng());
      break;
  }
  return file;
}

// What the decoder accepted must be within every bound the readers rely on.
void check_accepted(const format::Decoded& decoded, std::span<const char> payload) {
  CHECK(std::equal(decoded.payload.begin(), decoded.payload.end(), payload.begin(), payload.end()));
  CHECK(decoded.meta.is_object());
  CHECK(decoded.fields.created_unix >= 0);
  CHECK(decoded.fields.created_unix < format::kMaxUnixSeconds);
  if (decoded.fields.compile_seconds) CHECK(*decoded.fields.compile_seconds >= 0.0);
  // A copy and a dump recurse: bounded depth keeps them safe.
  nlohmann::json copy = decoded.meta;
  CHECK(copy.dump().size() <= 2 * format::kMaxMetaBytes + 1'000'000);
}

int iterations() {
  const char* text = std::getenv("KJIT_FUZZ_ITERATIONS");
  return text ? std::atoi(text) : 20'000;
}

TEST_CASE("fuzz: the entry decoder survives seeded mutations of a real entry and accepts only sealed, bounded meta") {
  TempDir dir;
  Seed seed = seed_entry(dir);
  const int total = iterations();
  std::mt19937_64 rng(20261123);
  auto started = std::chrono::steady_clock::now();
  int accepted = 0;
  for (const std::string& meta : regression_metas()) {
    auto file = format::encode_meta_text(meta, seed.payload);
    REQUIRE(file.has_value());
    CHECK(format::decode(*file, kKey).verdict == format::Verdict::corrupt);
  }
  for (int iteration = 0; iteration < total; ++iteration) {
    CAPTURE(iteration);
    if (rng() % 2 == 0) {
      std::vector<char> bytes = mutated_file(seed.file, rng);
      format::Decoded decoded = format::decode(bytes, kKey);
      format::HeaderCheck header = format::check_header(bytes, bytes.size());
      if (decoded.verdict == format::Verdict::ok) {
        REQUIRE_MESSAGE(bytes == seed.file, "accepted a changed file without a new hash");
        check_accepted(decoded, seed.payload);
        ++accepted;
      } else {
        CHECK_FALSE(decoded.problem.empty());
      }
      if (header.verdict != format::Verdict::ok) CHECK(decoded.verdict == header.verdict);
    } else {
      std::string meta = mutated_meta(seed.meta_text, rng);
      auto file = format::encode_meta_text(meta, seed.payload);
      if (!file) continue;  // over the meta size limit: the writer refuses it
      format::Decoded decoded = format::decode(*file, kKey);
      if (decoded.verdict == format::Verdict::ok) {
        check_accepted(decoded, seed.payload);
        ++accepted;
      } else {
        CHECK(decoded.verdict == format::Verdict::corrupt);
        CHECK_FALSE(decoded.problem.empty());
      }
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  MESSAGE(total << " decoder iterations in " << seconds << " s; " << accepted << " accepted");
}

TEST_CASE("fuzz: load, list and verify survive resealed hostile entries in a root") {
  TempDir dir;
  Seed seed = seed_entry(dir);
  Store store(config_at(dir.sub("root")));
  std::string path = store.entry_path(kKey);
  fs::create_directories(fs::path(path).parent_path());
  fs::permissions(fs::path(path).parent_path(), fs::perms::owner_all);
  std::mt19937_64 rng(7);
  StderrCapture quiet;  // each corrupt load warns
  const int total = std::max(1, iterations() / 20);
  for (int iteration = 0; iteration < total; ++iteration) {
    CAPTURE(iteration);
    std::vector<char> bytes;
    if (auto file = format::encode_meta_text(mutated_meta(seed.meta_text, rng), seed.payload)) bytes = *file;
    if (rng() % 3 == 0 || bytes.empty()) bytes = mutated_file(seed.file, rng);
    write_file(path, bytes);
    std::vector<EntryInfo> listed = store.list();
    REQUIRE(listed.size() == 1);
    CHECK(listed[0].created_unix >= 0);
    CHECK(store.verify(false).checked == 1);
    // load_payload first (load removes a corrupt entry): it reads less of the meta, so it accepts at least
    // what load accepts, and only the bytes the seed wrote.
    std::optional<Entry> payload_only = store.load_payload(kKey);
    if (payload_only) CHECK(payload_only->payload == seed.payload);
    if (std::optional<Entry> entry = store.load(kKey)) {
      CHECK(entry->payload == seed.payload);
      CHECK(payload_only.has_value());
    }
  }
}

}  // namespace
}  // namespace kjit::cache::test
