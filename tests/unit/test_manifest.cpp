// Manifests: the bundled ones parse, list fields expand, bad input is named,
// and a bounded randomized fuzz of the parser never crashes.
#include <doctest/doctest.h>

#include "why.hpp"

#include <filesystem>
#include <random>
#include <string>

#include "manifest.hpp"

using kjit::tools::parse_manifest;
using kjit::tools::read_manifest;

TEST_CASE("every bundled manifest parses, and the default one includes them all") {
  const std::filesystem::path dir = std::filesystem::path(KJIT_SOURCE_DIR) / "tools" / "manifests";
  size_t union_size = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    if (file.path().extension() != ".json" || file.path().filename() == "default.json") continue;
    auto m = read_manifest(file.path().string());
    REQUIRE_MESSAGE(m.has_value(), kjit::testing::why(m));
    CHECK_FALSE(m->name.empty());
    union_size += m->kernels.size();
  }
  auto all = read_manifest((dir / "default.json").string());
  REQUIRE_MESSAGE(all.has_value(), kjit::testing::why(all));
  CHECK(all->kernels.size() > 20);
  CHECK(all->kernels.size() <= union_size);  // duplicates across models merged
}

TEST_CASE("list-valued fields expand into one spec per value") {
  auto m = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": ["bf16", "f16"], "cols": [7168, 2048],
       "scale": "per_block", "block": [128, 128], "convention": "multiply"}]})");
  REQUIRE(m.has_value());
  CHECK(m->kernels.size() == 4);
}

TEST_CASE("manifest errors name the kernel and the field") {
  auto no_version = parse_manifest(R"({"kernels": []})");
  REQUIRE_FALSE(no_version.has_value());
  CHECK(no_version.error().message.find("kjit_manifest") != std::string::npos);

  auto bad_field = parse_manifest(R"({"kjit_manifest": 1, "kernels": [{}, {"op": "fp8_dequant", "in": "f8_e4m3fn",
      "out": "bf16", "cols": 64, "scale": "per_tile", "convention": "multiply"}]})");
  REQUIRE_FALSE(bad_field.has_value());
  CHECK(bad_field.error().message.find("kernels[0]") != std::string::npos);

  auto bad_scale = parse_manifest(R"({"kjit_manifest": 1, "kernels": [{"op": "fp8_dequant", "in": "f8_e4m3fn",
      "out": "bf16", "cols": 64, "scale": "per_tile", "convention": "multiply"}]})");
  REQUIRE_FALSE(bad_scale.has_value());
  CHECK(bad_scale.error().message.find("kernels[0]: spec field 'scale' has unknown value 'per_tile'") !=
        std::string::npos);

  CHECK_FALSE(parse_manifest("{not json").has_value());
}

TEST_CASE("the manifest parser survives 3000 random mutations of a valid manifest") {
  const std::string valid = R"({"kjit_manifest": 1, "name": "x", "kernels": [{"op": "fp8_dequant",
      "in": "f8_e4m3fn", "out": ["bf16", "f32"], "cols": [7168, 96], "scale": "per_block", "block": [128, 128],
      "convention": "divide", "selected_experts": [false, true]}]})";
  std::mt19937 rng(12345);
  const std::string alphabet = "{}[]\":,0123456789-e.abcdefghijklmnopqrstuvwxyz_ \n";
  size_t accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string text = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t pos = rng() % text.size();
      switch (rng() % 3) {
        case 0: text[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: text.erase(pos, 1 + rng() % 8); break;
        default: text.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    auto m = parse_manifest(text);
    if (m) {
      ++accepted;
      for (const auto& spec : m->kernels) CHECK(kjit::codegen::validate(spec).has_value());
    } else {
      CHECK_FALSE(m.error().message.empty());
    }
  }
  MESSAGE("accepted " << accepted << " of 3000 mutated manifests");
}
