// Manifests: the bundled ones parse, list fields expand, bad input is named by
// file, JSON path and what was expected, every limit holds, and a bounded
// mutation fuzz of the parser never crashes.
#include <doctest/doctest.h>

#include "why.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "manifest.hpp"

using kjit::tools::ManifestLimits;
using kjit::tools::parse_manifest;
using kjit::tools::read_manifest;

namespace {

const std::filesystem::path kBundled = std::filesystem::path(KJIT_SOURCE_DIR) / "tools" / "manifests";

// The error message of a manifest that must fail ("" if it parsed).
std::string error_of(std::string_view text, const ManifestLimits& limits = {}) {
  auto m = parse_manifest(text, limits);
  return m ? std::string() : m.error().message;
}

std::string with_kernel(std::string_view entry) {
  return std::string(R"({"kjit_manifest": 1, "kernels": [)") + std::string(entry) + "]}";
}

constexpr std::string_view kDequant =
    R"("op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "scale": "per_tensor", "convention": "multiply")";

// A scratch directory removed at the end of a test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kjit-manifest-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string write(const std::string& name, std::string_view text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return (path / name).string();
  }
};

}  // namespace

TEST_CASE("every bundled manifest parses, and the default one includes them all") {
  size_t union_size = 0;
  for (const auto& file : std::filesystem::directory_iterator(kBundled)) {
    if (file.path().extension() != ".json" || file.path().filename() == "default.json") continue;
    auto m = read_manifest(file.path().string());
    REQUIRE_MESSAGE(m.has_value(), kjit::testing::why(m));
    CHECK_FALSE(m->name.empty());
    union_size += m->kernels.size();
  }
  auto all = read_manifest((kBundled / "default.json").string());
  REQUIRE_MESSAGE(all.has_value(), kjit::testing::why(all));
  CHECK(all->kernels.size() == 195);  // 58 before the manifest checks, 12 fp8 quantize, 18 FP8, 18 W8A16 and 4 W4A16 GEMM
                                     // specs, 7 mx_quantize, 4 MX dequant (NVFP4 K 2048 shared by Qwen3-30B and DeepSeek-V3),
                                     // 6 moe_activation (Qwen3-30B 2, DeepSeek-V3 3, gpt-oss 1), 7 gate_up GEMMs with the
                                     // fused SiLU-and-mul (bf16: 5 models, DeepSeek-V3's 2 expert counts; Qwen3-30B NVFP4)
                                     // and 4 with it over W8A16 128 x 128 block scales (DeepSeek-V3 x 2, Qwen3-30B,
                                     // Qwen3-235B), and 26 gate_up GEMMs gathering their rows (the bf16-activation gate_up
                                     // entries again with the gather: DeepSeek-V3 8, GLM 4, gpt-oss 2, Mixtral 2, Qwen3-235B 4,
                                     // Qwen3-30B 6), and 16 grouped_gemm_wgrad (fp32 and bf16 out: Qwen3-30B 4,
                                     // DeepSeek-V3 EP8 4, gpt-oss 128 and 32 experts 8), and 10 DeepSeek-V3 TP8 problems of the
                                     // decode kernel (E 256, gate_up N 512 K 7168, down N 7168 K 256: bf16 6, W8A16 4),
                                     // and 5 dispatch kernels (hidden and top k: Qwen3-235B's and GLM's the same)
  CHECK(all->kernels.size() <= union_size);  // duplicates across models merged
}

TEST_CASE("the bundled manifests are compiled in, found by name, and equal to their files") {
  std::vector<std::string> files;
  for (const auto& file : std::filesystem::directory_iterator(kBundled))
    if (file.path().extension() == ".json") files.push_back(file.path().stem().string());
  std::sort(files.begin(), files.end());
  CHECK(kjit::tools::bundled_manifest_names() == files);
  for (const auto& name : files) {
    auto bundled = kjit::tools::read_bundled_manifest(name);
    REQUIRE_MESSAGE(bundled.has_value(), kjit::testing::why(bundled));
    auto file = read_manifest((kBundled / (name + ".json")).string());
    REQUIRE_MESSAGE(file.has_value(), kjit::testing::why(file));
    CHECK(bundled->name == file->name);
    CHECK(bundled->kernels.size() == file->kernels.size());  // default's includes resolve among the bundled ones
  }
  auto with_suffix = kjit::tools::read_bundled_manifest("deepseek-v3.json");
  CHECK_MESSAGE(with_suffix.has_value(), kjit::testing::why(with_suffix));
  // load_manifest: a path is a file, a bare name the bundled manifest.
  auto by_name = kjit::tools::load_manifest("default");
  REQUIRE_MESSAGE(by_name.has_value(), kjit::testing::why(by_name));
  CHECK(by_name->kernels.size() == 195);
  auto by_path = kjit::tools::load_manifest((kBundled / "mixtral-8x7b.json").string());
  CHECK_MESSAGE(by_path.has_value(), kjit::testing::why(by_path));
}

TEST_CASE("an unknown bundled manifest name lists the bundled ones, with the nearest") {
  for (const char* name : {"deepseek", "deepseek-v4", "nonesuch", "nonesuch.json"}) {
    auto m = kjit::tools::load_manifest(name);
    REQUIRE_FALSE(m.has_value());
    CHECK_MESSAGE(m.error().message.find("bundled: deepseek-v3, default, ") != std::string::npos, m.error().message);
  }
  CHECK(kjit::tools::load_manifest("deepseek").error().message.find("did you mean 'deepseek-v3'?") != std::string::npos);
  CHECK(kjit::tools::load_manifest("nonesuch").error().message.find("did you mean") == std::string::npos);
}

TEST_CASE("manifest list-valued fields expand into one spec per value") {
  auto m = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "fp8_dequant", "in": "f8_e4m3fn", "out": ["bf16", "f16"], "cols": [7168, 2048],
       "scale": "per_block", "block": [128, 128], "convention": "multiply"}]})");
  REQUIRE_MESSAGE(m.has_value(), kjit::testing::why(m));
  CHECK(m->kernels.size() == 4);
}

TEST_CASE("manifest errors name the JSON path and what was expected") {
  CHECK(error_of(R"({"kernels": []})").find("kjit_manifest") != std::string::npos);
  CHECK(error_of(with_kernel(R"({}, {"op": "fp8_dequant"})")).find("kernels[0].op: missing") != std::string::npos);
  CHECK(error_of(with_kernel(R"({"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": 64,
      "scale": "per_tile", "convention": "multiply"})"))
            .find("kernels[0].scale: got \"per_tile\", expected one of: per_tensor, per_row, per_block") !=
        std::string::npos);
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": [64, "wide"]})"))
            .find("kernels[0].cols[1]: got \"wide\", expected an integer from 1 to 1048576") != std::string::npos);
  // Invariants across fields are codegen's: the entry is named with the values it was expanded with.
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": [64, 100], "vec": 16})"))
            .find("kernels[0] with cols[1] = 100: vec 16 does not divide cols 100") != std::string::npos);
  CHECK(error_of(with_kernel(R"({"op": "fp8_dequant", "in": "f8_e4m3fn", "out": "bf16", "cols": 64,
      "scale": ["per_block", "per_row"], "block": [128, 128], "convention": "multiply"})"))
            .find("kernels[0].block with scale[1] = \"per_row\": only meaningful with scale per_block") !=
        std::string::npos);
  CHECK(error_of("{\n not json").find("not valid JSON: [json.exception.parse_error.101] parse error at line 2, column 3") !=
        std::string::npos);
}

TEST_CASE("manifest unknown fields are refused, at the top level and in a kernel entry") {
  const auto top = error_of(R"({"kjit_manifest": 1, "includes": ["a.json"], "kernels": []})");
  CHECK(top.find("includes: unknown field (known: kjit_manifest, name, source, include, kernels)") !=
        std::string::npos);
  const auto entry =
      error_of(with_kernel(R"({}, {}, {"op": "fp8_dequant", "selected_expert": true, "in": "f8_e4m3fn"})"));
  CHECK(entry.find("kernels[0].op: missing") != std::string::npos);  // the first offender is reported
  const auto selected = error_of(
      with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": 64, "selected_expert": true})"));
  CHECK(selected.find("kernels[0].selected_expert: unknown field (known: op, in, out, cols, scale, block, "
                      "convention, vec, selected_experts)") != std::string::npos);
  // A field of another family is unknown too.
  CHECK(error_of(with_kernel(R"({"op": "moe_routing", "experts": 8, "offsets": "cumulative_end", "top_k": 2})"))
            .find("kernels[0].top_k: unknown field") != std::string::npos);
  CHECK(error_of(with_kernel(R"({"op": "moe_gating", "experts": 8})"))
            .find("kernels[0].op: got \"moe_gating\", expected one of: fp8_dequant, grouped_gemm, moe_routing, "
                  "moe_combine") != std::string::npos);
}

TEST_CASE("a manifest field given twice in one object is refused, not silently the last") {
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": 64}, {)" + std::string(kDequant) +
                             R"(, "cols": [64, 128], "cols": 128})"))
            .find("kernels[1].cols: given twice in one object") != std::string::npos);
  CHECK(error_of(R"({"kjit_manifest": 1, "name": "a", "name": "b", "kernels": []})").find("name: given twice") !=
        std::string::npos);
}

TEST_CASE("manifest empty lists, lists of op and manifests that compile nothing are refused") {
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": []})"))
            .find("kernels[0].cols: an empty list expands to no kernel") != std::string::npos);
  CHECK(error_of(with_kernel(R"({"op": ["moe_routing"], "experts": 8, "offsets": "cumulative_end"})"))
            .find("kernels[0].op: got [\"moe_routing\"], expected one of") != std::string::npos);
  CHECK(error_of(R"({"kjit_manifest": 1, "kernels": []})").find("compiles nothing") != std::string::npos);
}

TEST_CASE("manifest sizes past what any model needs are refused, whatever their JSON number form") {
  const std::string huge_cols = error_of(
      with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": 4611686018427387904})"));  // 2^62
  CHECK(huge_cols.find("kernels[0].cols: got 4611686018427387904, expected an integer from 1 to 1048576") !=
        std::string::npos);
  CHECK(error_of(with_kernel(R"({"op": "moe_combine", "top_k": 8, "hidden": 1099511627776, "out": "bf16"})"))
            .find("kernels[0].hidden: got 1099511627776, expected an integer from 8 to 1048576") != std::string::npos);
  CHECK(error_of(with_kernel(R"({"op": "grouped_gemm", "out": "bf16", "weights": "e_n_k", "offsets":
      "cumulative_end", "experts": 18446744073709551615, "n": 4096, "k": 4096})"))
            .find("kernels[0].experts: got 18446744073709551615, expected an integer from 1 to 4096") !=
        std::string::npos);
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": 64.0})"))
            .find("kernels[0].cols: got 64.0, expected an integer") != std::string::npos);
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": -64})"))
            .find("kernels[0].cols: got -64") != std::string::npos);
  // A tile entry past int would wrap to a valid tile in codegen.
  CHECK(error_of(with_kernel(R"({"op": "grouped_gemm", "out": "bf16", "weights": "e_n_k", "offsets":
      "cumulative_end", "experts": 8, "n": 4096, "k": 4096, "kernel": "mma_sync", "tile": [4294967360, 128, 32]})"))
            .find("kernels[0].tile[0]: got 4294967360, expected an integer from 1 to 256") != std::string::npos);
  CHECK(error_of(with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": 64, "block": [128]})"))
            .find("kernels[0].block: got [128], expected [rows, cols]") != std::string::npos);
}

// Finding 3: this 1 KB manifest expanded 77 million specs before checking one (bad_alloc).
TEST_CASE("a manifest whose lists multiply past the kernel limit is refused before expanding, naming the product") {
  std::string cols = "[";
  for (int i = 1; i <= 80; ++i) cols += std::to_string(16 * i) + (i < 80 ? "," : "]");
  const auto repeat = [](std::string_view values, int times) {
    std::string list = "[";
    for (int i = 0; i < times; ++i) list += std::string(i ? "," : "") + std::string(values);
    return list + "]";
  };
  const std::string text = with_kernel(R"({"op": "fp8_dequant", "scale": "per_tensor", "cols": )" + cols +
                                       ", \"convention\": " + repeat(R"("multiply", "divide")", 10) +
                                       ", \"in\": " + repeat(R"("f8_e4m3fn", "f8_e5m2")", 5) +
                                       ", \"out\": " + repeat(R"("bf16", "f16", "f32", "f16")", 5) +
                                       ", \"selected_experts\": " + repeat("false, true", 6) +
                                       ", \"vec\": " + repeat("1, 2, 4, 8, 16", 4) + "}");
  CHECK(error_of(text).find("kernels[0] expands to 80 x 20 x 10 x 20 x 12 x 20 (cols x convention x in x out x "
                            "selected_experts x vec) = 76800000 kernels, more than the limit 100000") !=
        std::string::npos);
  // Lists whose product overflows 64 bits are refused the same way.
  const std::string thousand = repeat(R"("multiply")", 1000);
  const auto overflow = error_of(with_kernel(R"({"op": "fp8_dequant", "convention": )" + thousand + ", \"vec\": " + repeat("16", 1000) +
                                             ", \"selected_experts\": " + repeat("true", 1000) +
                                             ", \"in\": " + repeat(R"("f8_e5m2")", 1000) +
                                             ", \"out\": " + repeat(R"("f32")", 1000) +
                                             ", \"scale\": " + repeat(R"("per_row")", 1000) +
                                             ", \"cols\": " + repeat("64", 1000) + "}"));
  CHECK(overflow.find("(cols x convention x in x out x scale x selected_experts x vec) = more than 2^64 kernels, "
                      "more than the limit 100000") != std::string::npos);
  // The limit counts the whole manifest, not each entry.
  const std::string twice = with_kernel(std::string("{") + std::string(kDequant) + ", \"cols\": " + cols + "}, {" +
                                        std::string(kDequant) + ", \"cols\": " + cols + "}");
  CHECK(error_of(twice, ManifestLimits{.max_kernels = 100})
            .find("kernels[1] expands to 80 (cols) = 80 kernels, 160 with the entries before it, more than the "
                  "limit 100") != std::string::npos);
}

// Finding 3: 100k specs took 19 s to de-duplicate (quadratic); hashed, well under a second in release.
TEST_CASE("a manifest at the kernel limit expands and de-duplicates in bounded time") {
  std::string cols = "[";
  for (int i = 1; i <= 6250; ++i) cols += std::to_string(16 * i) + (i < 6250 ? "," : "]");
  const std::string text = with_kernel(R"({"op": "fp8_dequant", "in": ["f8_e4m3fn", "f8_e5m2"], "out": ["bf16", "f16"],
      "scale": "per_tensor", "convention": ["multiply", "divide"], "selected_experts": [false, true], "cols": )" +
                                       cols + "}");
  // Processor time, not wall time: the machine may be busy.
  const std::clock_t start = std::clock();
  auto m = parse_manifest(text);
  const double seconds = static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC;
  REQUIRE_MESSAGE(m.has_value(), kjit::testing::why(m));
  CHECK(m->kernels.size() == 100'000);
  MESSAGE("100000 specs parsed, expanded and de-duplicated in " << seconds << " s of processor time");
  // The quadratic version took 19 s in release; this one 0.3 s, 8 s in the sanitizer build (-O0).
#if defined(__SANITIZE_ADDRESS__)
  CHECK(seconds < 60.0);
#else
  CHECK(seconds < 5.0);
#endif
}

// Finding 3: a value nested 200k deep crashed the parser's caller (recursive copy).
TEST_CASE("a manifest nested deeper than the limit is refused before it is parsed") {
  const std::string deep = std::string(200'000, '[') + std::string(200'000, ']');
  const auto message = error_of(with_kernel(std::string("{") + std::string(kDequant) + ", \"cols\": " + deep + "}"));
  CHECK(message.find("nested deeper than 32 levels") != std::string::npos);
  CHECK(message.find("line 1, column 176 (byte 175): arrays and objects nested") != std::string::npos);
  // Brackets inside strings are text, not nesting.
  CHECK(error_of(R"({"kjit_manifest": 1, "name": ")" + std::string(100, '[') + R"(", "kernels": []})")
            .find("nested") == std::string::npos);
}

// Finding 3: --manifest /dev/zero read until memory ran out.
TEST_CASE("a manifest is read only from a regular file, and only up to the size limit") {
  const auto zero = read_manifest("/dev/zero");
  REQUIRE_FALSE(zero.has_value());
  CHECK(zero.error().message.find("/dev/zero: not a regular file") != std::string::npos);
  TempDir dir;
  const auto directory = read_manifest(dir.path.string());
  REQUIRE_FALSE(directory.has_value());
  CHECK(directory.error().message.find("not a regular file") != std::string::npos);
  const auto big = dir.write("big.json", std::string(1000, ' '));
  const auto too_big = read_manifest(big, ManifestLimits{.max_bytes = 999});
  REQUIRE_FALSE(too_big.has_value());
  CHECK(too_big.error().message.find("big.json: 1000 bytes, more than the limit 999") != std::string::npos);
  const auto missing = read_manifest((dir.path / "missing.json").string());
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().message.find("missing.json: cannot open: No such file or directory") != std::string::npos);
}

TEST_CASE("manifest errors in an included file name that file, and include cycles are refused") {
  TempDir dir;
  dir.write("bad.json", with_kernel(std::string("{") + std::string(kDequant) + R"(, "cols": []})"));
  const auto top = dir.write("top.json", R"({"kjit_manifest": 1, "include": ["bad.json"], "kernels": []})");
  const auto bad = read_manifest(top);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message.find("bad.json: kernels[0].cols: an empty list") != std::string::npos);
  CHECK(bad.error().message.find("included from " + top) != std::string::npos);

  const auto cycle = dir.write("cycle.json", R"({"kjit_manifest": 1, "include": ["cycle.json"], "kernels": []})");
  const auto loop = read_manifest(cycle);
  REQUIRE_FALSE(loop.has_value());
  CHECK(loop.error().message.find("includes itself") != std::string::npos);
}

// --- The mutation fuzz -------------------------------------------------------

namespace {

using nlohmann::json;

// Every node of `doc` (pre-order), to pick one to mutate.
void collect(json& node, std::vector<json*>& nodes) {
  nodes.push_back(&node);
  if (node.is_structured())
    for (auto& child : node) collect(child, nodes);
}

json random_scalar(std::mt19937_64& rng) {
  static const std::vector<json> scalars{nullptr, true, false, 0, -1, 1, 7, 8, 16, 100, 128, 4096, 7168,
                                         1 << 20, (1 << 20) + 8, int64_t{1} << 40, int64_t{1} << 62,
                                         INT64_MIN, UINT64_MAX, 1.5, -0.0, 1e308, "", "bf16", "f8_e5m2",
                                         "per_block", "divide", "e_k_n", "with_leading_zero", "wgmma_sm90",
                                         "moe_combine", "grouped_gemm", "\u00e9\u0001", std::string(300, 'x')};
  return scalars[rng() % scalars.size()];
}

std::string random_key(std::mt19937_64& rng) {
  static const std::vector<std::string> keys{
      "op", "in", "out", "cols", "scale", "block", "convention", "vec", "selected_experts", "n", "k", "experts",
      "weights", "offsets", "row_scale", "kernel", "tile", "stages", "cluster", "cluster_axis", "top_k", "hidden",
      "kjit_manifest", "name", "source", "include", "kernels", "includes", "selected_expert", ""};
  return keys[rng() % keys.size()];
}

// One structural mutation of `doc`: delete, duplicate, nest, retype, enlarge or re-key a random node.
void mutate(json& doc, std::mt19937_64& rng) {
  std::vector<json*> nodes;
  collect(doc, nodes);
  json& node = *nodes[rng() % nodes.size()];
  switch (rng() % 8) {
    case 0:  // delete a child
      if (node.is_object() && !node.empty()) {
        auto it = node.begin();
        std::advance(it, static_cast<long>(rng() % node.size()));
        node.erase(it);
      } else if (node.is_array() && !node.empty()) {
        node.erase(rng() % node.size());
      }
      break;
    case 1:  // duplicate a child
      if (node.is_array() && !node.empty()) node.push_back(json(node[rng() % node.size()]));
      else if (node.is_object()) node[random_key(rng)] = json(node);
      break;
    case 2: node = json::array({json(node)}); break;  // nest
    case 3: node = json::object({{random_key(rng), json(node)}}); break;
    case 4: node = random_scalar(rng); break;  // swap type or value
    case 5: {  // a long list
      json list = json::array();
      const size_t length = 1 + rng() % 512;
      for (size_t i = 0; i < length; ++i) list.push_back(rng() % 2 ? json(16 * (1 + rng() % 4096)) : random_scalar(rng));
      node = std::move(list);
      break;
    }
    case 6:  // add a field
      if (node.is_object()) node[random_key(rng)] = random_scalar(rng);
      break;
    default:  // an empty container of either kind
      node = rng() % 2 ? json::array() : json::object();
      break;
  }
}

// A few byte edits, for what the structure cannot express (broken syntax, stray brackets).
void mutate_bytes(std::string& text, std::mt19937_64& rng) {
  static const std::string alphabet = "{}[]\":,0123456789-e.abcdefghijklmnopqrstuvwxyz_ \n\\";
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !text.empty(); ++e) {
    const size_t pos = rng() % text.size();
    switch (rng() % 4) {
      case 0: text[pos] = alphabet[rng() % alphabet.size()]; break;
      case 1: text.erase(pos, 1 + rng() % 8); break;
      case 2: text.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      default: text.insert(pos, std::string(1 + rng() % 64, rng() % 2 ? '[' : '{')); break;
    }
  }
}

}  // namespace

// Scope 7: seeded from the bundled manifests; the crashing inputs of finding 3 are the cases above.
TEST_CASE("the manifest parser survives a seeded mutation fuzz of the bundled manifests") {
  std::vector<json> seeds;
  for (const auto& file : std::filesystem::directory_iterator(kBundled))
    if (file.path().extension() == ".json") seeds.push_back(json::parse(std::ifstream(file.path())));
  REQUIRE(seeds.size() >= 7);
  const char* override_count = std::getenv("KJIT_MANIFEST_FUZZ_ITERATIONS");
  const long iterations = override_count ? std::atol(override_count) : 20'000;
  // A smaller kernel limit keeps every iteration cheap; the limit itself is tested above.
  const ManifestLimits limits{.max_kernels = 256};
  std::mt19937_64 rng(20261123);
  long accepted = 0;
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t start_processor = std::clock();
  for (long i = 0; i < iterations; ++i) {
    json doc = seeds[rng() % seeds.size()];
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) mutate(doc, rng);
    std::string text = doc.dump(-1, ' ', false, json::error_handler_t::replace);
    if (rng() % 4 == 0) mutate_bytes(text, rng);
    auto m = parse_manifest(text, limits);
    if (m) {
      ++accepted;
      CHECK(m->kernels.size() <= limits.max_kernels);
      for (const auto& spec : m->kernels) CHECK(kjit::codegen::validate(spec).has_value());
    } else {
      CHECK_FALSE(m.error().message.empty());
      CHECK(m.error().message.size() < 2000);  // quoted values are cut short
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double processor = static_cast<double>(std::clock() - start_processor) / CLOCKS_PER_SEC;
  MESSAGE(iterations << " mutated manifests in " << seconds << " s (" << processor << " s of processor time), "
                     << accepted << " accepted");
}

namespace {

// One value for `rule`: mostly in its range or list, sometimes just outside it.
json value_for(const kjit::codegen::FieldRule& rule, std::mt19937_64& rng) {
  using Kind = kjit::codegen::FieldRule::Kind;
  auto integer = [&] {
    switch (rng() % 8) {
      case 0: return rule.min;
      case 1: return rule.max;
      case 2: return rule.min - 1;
      case 3: return rule.max + 1;
      case 4: {
        const int64_t span = std::max<int64_t>(1, std::min<int64_t>(rule.max - rule.min, 1 << 16));
        return rule.min + static_cast<int64_t>(rng() % static_cast<uint64_t>(span)) / 16 * 16;
      }
      default: {  // a size models use, where the range allows one
        static const int64_t common[] = {1, 2, 8, 16, 32, 64, 128, 256, 1024, 2048, 4096, 7168};
        const int64_t value = common[rng() % std::size(common)];
        return value >= rule.min && value <= rule.max ? value : rule.min;
      }
    }
  };
  switch (rule.kind) {
    case Kind::text:
      if (rule.values.empty() || rng() % 10 == 0) return "unknown\u00ff";
      return std::string(rule.values[rng() % rule.values.size()]);
    case Kind::integer: return integer();
    case Kind::boolean: return rng() % 2 == 0;
    case Kind::integers: {
      json list = json::array();
      const size_t count = rule.count > 0 ? rule.count : 1 + rng() % 3;
      for (size_t i = 0; i < count; ++i) list.push_back(integer());
      return list;
    }
  }
  return nullptr;
}

// A kernel entry of `op` from its family's schema: required fields always, optional ones half the time, a list
// of values for some (the manifest's expansion), now and then a field of another family.
// Half the time it starts from one of the bundled manifests' entries of `op` (`seeds`) and changes a field or two.
json random_entry(std::string_view op, const std::vector<json>& seeds, std::mt19937_64& rng) {
  const auto& rules = *kjit::codegen::spec_schema(op);
  if (!seeds.empty() && rng() % 2 == 0) {
    json entry = seeds[rng() % seeds.size()];
    for (int edits = static_cast<int>(rng() % 3); edits > 0; --edits) {
      const auto& rule = rules[rng() % rules.size()];
      entry[std::string(rule.name)] = value_for(rule, rng);
    }
    return entry;
  }
  json entry = {{"op", std::string(op)}};
  for (const auto& rule : rules) {
    if (!rule.required && rng() % 4 != 0) continue;
    if (rule.kind != kjit::codegen::FieldRule::Kind::integers && rng() % 4 == 0)
      entry[std::string(rule.name)] = json::array({value_for(rule, rng), value_for(rule, rng)});
    else
      entry[std::string(rule.name)] = value_for(rule, rng);
  }
  if (rng() % 20 == 0) entry[random_key(rng)] = random_scalar(rng);
  return entry;
}

}  // namespace

TEST_CASE("the manifest parser survives a seeded schema-driven fuzz of every family, non-UTF-8 bytes included") {
  const auto ops = kjit::codegen::spec_ops();
  REQUIRE(ops.size() >= 12);
  const char* override_count = std::getenv("KJIT_MANIFEST_FUZZ_ITERATIONS");
  const long iterations = override_count ? std::atol(override_count) / 4 : 4'000;
  const ManifestLimits limits{.max_kernels = 256};
  std::map<std::string, std::vector<json>, std::less<>> bundled;  // kernel entries by op
  for (const auto& file : std::filesystem::directory_iterator(kBundled))
    if (file.path().extension() == ".json")
      for (const auto& entry : json::parse(std::ifstream(file.path())).value("kernels", json::array()))
        bundled[entry.value("op", "")].push_back(entry);
  std::mt19937_64 rng(20260141);
  std::vector<long> accepted(ops.size(), 0);
  for (long i = 0; i < iterations; ++i) {
    const size_t family = static_cast<size_t>(i) % ops.size();
    json doc = {{"kjit_manifest", 1}, {"name", "fuzz"}, {"kernels", json::array()}};
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) doc["kernels"].push_back(random_entry(ops[family], bundled[std::string(ops[family])], rng));
    if (rng() % 3 == 0) mutate(doc, rng);
    std::string text = doc.dump();
    if (rng() % 8 == 0) text.insert(rng() % text.size(), rng() % 2 ? "\xff\xfe" : "\xc3");  // not UTF-8
    auto m = parse_manifest(text, limits);
    if (m) {
      ++accepted[family];
      CHECK(m->kernels.size() <= limits.max_kernels);
      for (const auto& spec : m->kernels) CHECK(kjit::codegen::validate(spec).has_value());
    } else {
      CHECK_FALSE(m.error().message.empty());
      CHECK(m.error().message.size() < 2000);
    }
  }
  for (size_t f = 0; f < ops.size(); ++f)
    CHECK_MESSAGE(accepted[f] > 0, "no valid manifest of " << ops[f] << " was generated: the fuzz misses its parser");
}

TEST_CASE("an fp8_quantize entry expands over scale formats and gather, and its fields are checked") {
  auto m = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "fp8_quantize", "k": [7168, 2048], "scale_format": ["fp32", "ue8m0"], "gather": [false, true]}]})");
  REQUIRE_MESSAGE(m.has_value(), kjit::testing::why(m));
  CHECK(m->kernels.size() == 8);
  auto bad = parse_manifest(R"({"kjit_manifest": 1, "kernels": [{"op": "fp8_quantize", "k": 7168, "scale_format": "e8m0"}]})");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message.find("kernels[0].scale_format: got \"e8m0\", expected one of: fp32, ue8m0") != std::string::npos);
  auto small = parse_manifest(R"({"kjit_manifest": 1, "kernels": [{"op": "fp8_quantize", "k": 64}]})");
  REQUIRE_FALSE(small.has_value());
  CHECK(small.error().message.find("kernels[0].k: got 64, expected an integer from 128 to") != std::string::npos);
  auto odd = parse_manifest(R"({"kjit_manifest": 1, "kernels": [{"op": "fp8_quantize", "k": 200}]})");
  REQUIRE_FALSE(odd.has_value());
  CHECK(odd.error().message.find("K must be a positive multiple of 128") != std::string::npos);
}

TEST_CASE("a moe_activation entry expands over outputs and scale formats, and its fields and invariants are checked") {
  auto m = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "moe_activation", "activation": ["silu_mul", "swiglu_oai"], "layout": "halves", "intermediate": 2048,
       "out": "f8_e4m3fn", "scale_format": ["fp32", "ue8m0"]},
      {"op": "moe_activation", "activation": "swiglu_oai", "layout": "alternating", "intermediate": 2880, "out": "bf16"}]})");
  REQUIRE_MESSAGE(m.has_value(), kjit::testing::why(m));
  CHECK(m->kernels.size() == 5);
  auto bad = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "moe_activation", "activation": "silu", "layout": "halves", "intermediate": 768, "out": "bf16"}]})");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().message.find("kernels[0].activation: got \"silu\", expected one of: silu_mul, swiglu_oai") !=
        std::string::npos);
  auto fp8_odd = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "moe_activation", "activation": "swiglu_oai", "layout": "alternating", "intermediate": 2880, "out": "f8_e4m3fn"}]})");
  REQUIRE_FALSE(fp8_odd.has_value());
  CHECK(fp8_odd.error().message.find("a positive multiple of 128") != std::string::npos);
  auto bf16_scales = parse_manifest(R"({"kjit_manifest": 1, "kernels": [
      {"op": "moe_activation", "activation": "silu_mul", "layout": "halves", "intermediate": 768, "out": "bf16",
       "scale_format": "ue8m0"}]})");
  REQUIRE_FALSE(bf16_scales.has_value());
  CHECK(bf16_scales.error().message.find("scale_format is for f8_e4m3fn output") != std::string::npos);
}
