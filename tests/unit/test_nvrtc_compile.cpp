// Every kernel family compiles with NVRTC for sm_90a, sm_100a and sm_120a on
// a machine with no GPU, through the Builder into a private cache; a miss
// renders once; the same key gives the same bytes from any working directory.
#include <doctest/doctest.h>

#include "why.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "kjit/builder/builder.hpp"
#include "kjit/builder/nvrtc.hpp"

using namespace kjit::codegen;

namespace {

const ArchInfo& arch_of(std::string_view target) { return **arch_for_target(target); }

// A Builder over a private cache root that removes itself.
struct PrivateBuilder {
  std::filesystem::path dir;
  kjit::cache::Store store;
  kjit::Builder builder;
  explicit PrivateBuilder(const std::string& name, bool lineinfo = false)
      : dir(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))),
        store(kjit::cache::StoreConfig{dir.string(), {}, 0}),
        builder(store, lineinfo) {}
  ~PrivateBuilder() { std::filesystem::remove_all(dir); }
};

// Each dimension's every value appears, and every template branch (scale per
// vector or per element, each vector width, selected experts) is reached.
std::vector<DequantSpec> variants() {
  std::vector<DequantSpec> out;
  const int vecs[] = {16, 8, 4, 2, 1};
  int n = 0;
  for (auto in : {DType::f8_e4m3fn, DType::f8_e5m2})
    for (auto o : {DType::bf16, DType::f16, DType::f32})
      for (int g = 0; g < 4; ++g, ++n) {
        DequantSpec s;
        s.in = in;
        s.out = o;
        s.vec = vecs[n % 5];
        s.cols = 7168 + (s.vec == 16 ? 0 : s.vec);  // a column count that only the narrower vector divides
        s.granularity = g == 0 ? ScaleGranularity::per_tensor : g == 1 ? ScaleGranularity::per_row
                                                                       : ScaleGranularity::per_block;
        if (g == 2) s.block_rows = s.block_cols = 128;
        if (g == 3) s.block_rows = 3, s.block_cols = 5;  // blocks split vectors: per-element scales
        s.convention = n % 2 ? ScaleConvention::divide : ScaleConvention::multiply;
        s.selected_experts = n % 3 == 0;
        out.push_back(s);
      }
  return out;
}

}  // namespace

TEST_CASE("every dequant variant compiles with NVRTC for sm_90a, sm_100a and sm_120a") {
  auto nvrtc = kjit::Nvrtc::load();
  REQUIRE_MESSAGE(nvrtc.has_value(), kjit::testing::why(nvrtc));
  PrivateBuilder b("kjit-nvrtc");
  size_t compiled = 0;
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"}) {
    for (const auto& spec : variants()) {
      auto cubin = b.builder.build(spec, arch_of(arch));
      REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
      CHECK(cubin->cubin.size() > 1000);
      CHECK(std::memcmp(cubin->cubin.data(), "\x7f" "ELF", 4) == 0);
      CHECK(cubin->stored);
      ++compiled;
    }
  }
  MESSAGE("compiled " << compiled << " kernels");
  // The same specs again are all cache hits.
  for (const auto& spec : variants()) {
    auto again = b.builder.build(spec, arch_of("sm_90a"));
    REQUIRE(again.has_value());
    CHECK(again->origin == kjit::CubinOrigin::disk_cache);
  }
}

TEST_CASE("a cache miss renders the spec once, and a hit once too") {
  PrivateBuilder b("kjit-renders");
  DequantSpec s;
  s.cols = 4096;
  s.granularity = ScaleGranularity::per_tensor;
  s.vec = 8;
  REQUIRE(b.builder.build(s, arch_of("sm_90a")).has_value());
  CHECK(b.builder.counters().renders == 1);
  CHECK(b.builder.counters().compiles == 1);
  auto hit = b.builder.build(s, arch_of("sm_90a"));
  REQUIRE(hit.has_value());
  CHECK(hit->origin == kjit::CubinOrigin::disk_cache);
  CHECK(hit->rendered.entry_point == "kjit_fp8_dequant");
  CHECK(b.builder.counters().renders == 2);
  CHECK(b.builder.counters().compiles == 1);
  CHECK(b.builder.counters().disk_hits == 1);
}

TEST_CASE("one spec compiles to the same cubin bytes from two working directories, with line information too") {
  // -lineinfo records names; with relative ones NVRTC adds the working directory.
  auto compile_in = [](const std::filesystem::path& cwd) {
    const auto before = std::filesystem::current_path();
    std::filesystem::create_directories(cwd);
    std::filesystem::current_path(cwd);
    PrivateBuilder b("kjit-repro-" + cwd.filename().string(), /*lineinfo=*/true);
    GroupedGemmSpec g;
    g.n = 256;
    g.k = 128;
    g.experts = 2;
    auto built = b.builder.build(kernels_for_target(g, arch_of("sm_90a"))[1], arch_of("sm_90a"));
    std::filesystem::current_path(before);
    REQUIRE_MESSAGE(built.has_value(), kjit::testing::why(built));
    CHECK(built->origin == kjit::CubinOrigin::compiled);
    return built->cubin;
  };
  const auto root = std::filesystem::temp_directory_path() / ("kjit-cwd-" + std::to_string(::getpid()));
  const auto first = compile_in(root / "first");
  const auto second = compile_in(root / "second" / "deeper");
  std::filesystem::remove_all(root);
  CHECK(first.size() == second.size());
  CHECK(first == second);
}

TEST_CASE("line information is asked for: KJIT_LINEINFO=1 adds -lineinfo, which enters the key and triples the cubin") {
  CHECK(kjit::compile_options("sm_90a") == std::vector<std::string>{"--gpu-architecture=sm_90a", "--std=c++17"});
  CHECK(kjit::compile_options("sm_90a", true).back() == "-lineinfo");
  ::setenv("KJIT_LINEINFO", "1", 1);
  CHECK(kjit::lineinfo_from_environment());
  ::setenv("KJIT_LINEINFO", "0", 1);
  CHECK_FALSE(kjit::lineinfo_from_environment());
  ::unsetenv("KJIT_LINEINFO");
  CHECK_FALSE(kjit::lineinfo_from_environment());

  PrivateBuilder plain("kjit-lineinfo"), lined("kjit-lineinfo-on", /*lineinfo=*/true);
  GroupedGemmSpec g;
  g.n = 256;
  g.k = 128;
  const auto spec = kernels_for_target(g, arch_of("sm_90a"))[1];
  auto without = plain.builder.build(spec, arch_of("sm_90a"));
  auto with = lined.builder.build(spec, arch_of("sm_90a"));
  REQUIRE_MESSAGE(without.has_value(), kjit::testing::why(without));
  REQUIRE_MESSAGE(with.has_value(), kjit::testing::why(with));
  CHECK(without->key != with->key);
  CHECK(2 * without->cubin.size() < with->cubin.size());
}

TEST_CASE("a compile error carries NVRTC's log") {
  auto nvrtc = kjit::Nvrtc::load();
  REQUIRE(nvrtc.has_value());
  auto r = (*nvrtc)->compile("__global__ void k() { undefined_thing(); }", "broken.cu", "sm_90a",
                             kjit::compile_options("sm_90a"));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == KJIT_ERROR_COMPILE);
  CHECK(r.error().message.find("undefined_thing") != std::string::npos);
}

TEST_CASE("unknown arch names are rejected, naming the known ones") {
  auto r = arch_for_target("sm_91z");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().message.find("unknown arch 'sm_91z'") != std::string::npos);
  CHECK(r.error().message.find("sm_90a") != std::string::npos);
}

TEST_CASE("fp8 dequant is refused for archs without fp8 conversion, before compiling") {
  PrivateBuilder b("kjit-gate");
  DequantSpec s;
  s.cols = 128;
  s.granularity = ScaleGranularity::per_tensor;
  auto r = b.builder.build(s, arch_of("sm_80"));
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == KJIT_ERROR_UNSUPPORTED);
  CHECK(r.error().message.find("compute capability 8.9 or newer") != std::string::npos);
  CHECK(b.builder.counters().renders == 0);
}

namespace {

// Every value of every grouped GEMM dimension appears (problems: each arch
// expands them into its configurations).
std::vector<GroupedGemmSpec> gemm_problems() {
  std::vector<GroupedGemmSpec> out;
  for (int v = 0; v < 4; ++v) {
    GroupedGemmSpec s;
    s.out = v % 2 ? DType::f32 : DType::bf16;
    s.weights = v / 2 ? WeightLayout::e_k_n : WeightLayout::e_n_k;
    s.offsets = v % 3 ? OffsetsConvention::with_leading_zero : OffsetsConvention::cumulative_end;
    s.row_scale = v == 1 || v == 2;
    s.n = 4096;
    s.k = 7168;
    s.experts = 32;
    out.push_back(s);
  }
  return out;
}

}  // namespace

static std::vector<KernelSpec> routing_variants() {
  return {MoeRoutingSpec{256, OffsetsConvention::cumulative_end}, MoeRoutingSpec{4096, OffsetsConvention::with_leading_zero},
          MoeCombineSpec{8, 7168, DType::bf16}, MoeCombineSpec{1, 8, DType::f32},
          MoeCombineSpec{8, 2880, DType::f32, true}, MoeCombineSpec{.top_k = 8, .hidden = 2048, .dispatch = true},
          MoeCombineSpec{.top_k = 8, .hidden = 7168, .dispatch = true},
          MoeCombineSpec{.top_k = 1, .hidden = 8, .dispatch = true}};
}

TEST_CASE("the MoE routing helpers compile with NVRTC for sm_90a, sm_100a and sm_120a") {
  PrivateBuilder b("kjit-nvrtc-routing");
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
    for (const auto& spec : routing_variants()) {
      auto cubin = b.builder.build(spec, arch_of(arch));
      REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
    }
}

TEST_CASE("every grouped GEMM variant compiles with NVRTC for sm_90a, sm_100a and sm_120a") {
  PrivateBuilder b("kjit-nvrtc-gemm");
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
    for (const auto& problem : gemm_problems()) {
      const auto kernels = kernels_for_target(problem, arch_of(arch));
      const bool decode = problem.weights == WeightLayout::e_n_k;
      CHECK(kernels.size() == (std::string_view(arch) == "sm_90a" ? (decode ? 4u : 3u) : 1u));
      for (const auto& spec : kernels) {
        const auto& config = std::get<GroupedGemmSpec>(spec);
        CHECK((is_sm90(config.kernel) || config.kernel == GemmKernel::mma_decode) == (std::string_view(arch) == "sm_90a"));
        auto cubin = b.builder.build(spec, arch_of(arch));
        REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
        CHECK(std::memcmp(cubin->cubin.data(), "\x7f" "ELF", 4) == 0);
      }
    }
  // The portable kernel compiles for sm_90a too (it is what KJIT_GEMM_KERNEL_PORTABLE runs there).
  for (const auto& problem : gemm_problems()) {
    auto portable =
        choose_grouped_gemm_config(problem, arch_of("sm_90a"), 4096, {.kernel = GemmRequest::Kernel::portable});
    REQUIRE(portable.has_value());
    auto cubin = b.builder.build(*portable, arch_of("sm_90a"));
    REQUIRE_MESSAGE(cubin.has_value(), kjit::testing::why(cubin));
  }
  // Hopper's kernel is refused for every other arch, before compiling.
  KernelSpec sm90;
  for (const auto& spec : kernels_for_target(gemm_problems().front(), arch_of("sm_90a")))
    if (is_sm90(std::get<GroupedGemmSpec>(spec).kernel)) sm90 = spec;  // not the decode bucket's mma.sync kernel
  auto refused = b.builder.build(sm90, arch_of("sm_100a"));
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().message.find("only for sm_90a") != std::string::npos);
}

TEST_CASE("ptxas reports no local-memory spills in the grouped GEMM and dequant kernels on sm_90a") {
  auto nvrtc = kjit::Nvrtc::load();
  REQUIRE(nvrtc.has_value());
  auto options = kjit::compile_options("sm_90a");
  options.push_back("--ptxas-options=-v");
  std::vector<KernelSpec> specs;
  // Every SM90 flag combination in both buckets (register pressure differs
  // with the output type, the layout's copies and the row scale), and the
  // portable kernel.
  for (int v = 0; v < 16; ++v) {
    GroupedGemmSpec g;
    g.out = v & 1 ? DType::f32 : DType::bf16;
    g.weights = v & 2 ? WeightLayout::e_k_n : WeightLayout::e_n_k;
    g.offsets = v & 4 ? OffsetsConvention::with_leading_zero : OffsetsConvention::cumulative_end;
    g.row_scale = (v & 8) != 0;
    g.n = 4096;
    g.k = 7168;
    g.experts = 32;
    for (auto& k : kernels_for_target(g, arch_of("sm_90a"))) specs.push_back(std::move(k));
    // Pairs along N (the producer's A half and the masked columns of a lone n-tile).
    for (int tile_n : {192, 256})
      specs.push_back(*choose_grouped_gemm_config(
          g, arch_of("sm_90a"), 1 << 20, {.tile_m = 128, .tile_n = tile_n, .cluster = 2, .cluster_axis = ClusterAxis::n}));
    // Swap AB, alone and in pairs along N (every tile height is in each).
    specs.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 1 << 20, {.kernel = GemmRequest::Kernel::sm90_swap_ab}));
    specs.push_back(*choose_grouped_gemm_config(
        g, arch_of("sm_90a"), 1 << 20,
        {.kernel = GemmRequest::Kernel::sm90_swap_ab, .tile_m = 256, .tile_n = 128, .cluster = 2,
         .cluster_axis = ClusterAxis::n}));
    if (v < 4) specs.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 0, {.kernel = GemmRequest::Kernel::portable}));
  }
  for (const auto& d : variants()) specs.push_back(d);
  for (const auto& r : routing_variants()) specs.push_back(r);
  for (const auto& spec : specs) {
    auto r = (*nvrtc)->compile(render(spec).source, "spill_check.cu", "sm_90a", options);
    REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
    CAPTURE(canonical(spec));
    CHECK_MESSAGE(r->log.find("0 bytes spill stores, 0 bytes spill loads") != std::string::npos, r->log);
    CHECK(r->log.find("bytes stack frame") != std::string::npos);  // the report is there at all
    CHECK_MESSAGE(r->log.find("warning") == std::string::npos, r->log);
    // ptxas's note when it serialises wgmma (accumulators touched mid-pipeline).
    CHECK_MESSAGE(r->log.find("Performance Loss") == std::string::npos, r->log);
  }
}

// ptxas's report (-v) of every spec's kernel on sm_90a: no spill stores or
// loads, no stack frame, no warning.
template <class Specs>
void check_no_spills_on_sm90a(const Specs& specs) {
  auto nvrtc = kjit::Nvrtc::load();
  REQUIRE(nvrtc.has_value());
  auto options = kjit::compile_options("sm_90a");
  options.push_back("--ptxas-options=-v");
  for (const auto& spec : specs) {
    auto r = (*nvrtc)->compile(render(spec).source, "spill_check.cu", "sm_90a", options);
    REQUIRE_MESSAGE(r.has_value(), kjit::testing::why(r));
    CAPTURE(canonical(spec));
    CHECK_MESSAGE(r->log.find("0 bytes spill stores, 0 bytes spill loads") != std::string::npos, r->log);
    CHECK_MESSAGE(r->log.find("0 bytes stack frame") != std::string::npos, r->log);
    CHECK_MESSAGE(r->log.find("warning") == std::string::npos, r->log);
    // ptxas's note when it serialises wgmma (C7510-C7520: "Performance Loss ... wgmma pipeline").
    CHECK_MESSAGE(r->log.find("Performance Loss") == std::string::npos, r->log);
  }
}

TEST_CASE("the grouped GEMM with an addend (LoRA's K = 16 and a model's K) compiles for every kernel on sm_90a "
          "(no spills) and for sm_100a and sm_120a") {
  PrivateBuilder b("kjit-nvrtc-gemm-addend");
  std::vector<KernelSpec> checked;
  for (auto addend : {Addend::bf16, Addend::f32})
    for (int v = 0; v < 8; ++v) {
      const bool k_n = v & 2, rank_k = v & 4;
      GroupedGemmSpec g{.out = v & 1 ? DType::f32 : DType::bf16, .n = 1536, .k = rank_k ? 16 : 2048, .experts = 128,
                        .weights = k_n ? WeightLayout::e_k_n : WeightLayout::e_n_k, .row_scale = (v & 1) == 0,
                        .addend = addend};
      // At K 16 the heuristic's short-K kernel; the rows-on-M SM90 kernel and the portable one where forced (swap
      // AB, forced there, has its wgmma serialised by ptxas: nothing to overlap in one k-block).
      auto kernels = kernels_for_target(g, arch_of("sm_90a"));
      kernels.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 0, {.kernel = GemmRequest::Kernel::portable}));
      if (rank_k)
        kernels.push_back(
            *choose_grouped_gemm_config(g, arch_of("sm_90a"), 1 << 20,
                                        {.kernel = GemmRequest::Kernel::sm90, .tile_m = 64, .tile_n = 256}));
      for (auto& k : kernels) checked.push_back(std::move(k));
      for (const char* arch : {"sm_100a", "sm_120a"})
        for (const auto& spec : kernels_for_target(g, arch_of(arch))) {
          auto cubin = b.builder.build(spec, arch_of(arch));
          REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
        }
    }
  check_no_spills_on_sm90a(checked);
}

TEST_CASE("the short-K kernel compiles for every K up to 32, layout, output, row scale, addend, gather and tile on "
          "sm_90a (no spills), and for sm_80, sm_100a and sm_120a") {
  PrivateBuilder b("kjit-nvrtc-gemm-short-k");
  std::vector<KernelSpec> sm90;
  for (int64_t k : {8, 16, 24, 32})
    for (int v = 0; v < 8; ++v) {
      GroupedGemmSpec g{.out = v & 1 ? DType::f32 : DType::bf16, .n = k == 32 ? 2048 : 1536, .k = k,
                        .experts = 128, .weights = v & 2 ? WeightLayout::e_k_n : WeightLayout::e_n_k,
                        .row_scale = (v & 4) != 0, .gather = k == 24,
                        .addend = v % 3 == 0 ? Addend::none : v % 3 == 1 ? Addend::bf16 : Addend::f32};
      const auto kernels = kernels_for_target(g, arch_of("sm_90a"));
      REQUIRE(kernels.size() == 1u);
      const auto& short_k = std::get<GroupedGemmSpec>(kernels.front());
      CHECK((short_k.kernel == GemmKernel::mma_short_k && short_k.tile_m == 64 && short_k.tile_n == 256));
      sm90.push_back(short_k);
    }
  for (int tile_n : {64, 128}) {
    GroupedGemmSpec g{.n = 96, .k = 16, .experts = 8, .addend = Addend::f32};
    sm90.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 64, {.tile_n = tile_n}));
  }
  check_no_spills_on_sm90a(sm90);
  for (const char* arch : {"sm_80", "sm_100a", "sm_120a"}) {
    GroupedGemmSpec g{.n = 1536, .k = 16, .experts = 128, .weights = WeightLayout::e_k_n, .row_scale = true,
                      .addend = Addend::bf16};
    const auto kernels = kernels_for_target(g, arch_of(arch));
    REQUIRE(kernels.size() == 1u);
    CHECK(std::get<GroupedGemmSpec>(kernels.front()).kernel == GemmKernel::mma_short_k);
    auto cubin = b.builder.build(kernels.front(), arch_of(arch));
    REQUIRE_MESSAGE(cubin.has_value(), arch, ": ", kjit::testing::why(cubin));
  }
}

TEST_CASE("the grouped GEMM's fused activations compile for sm_90a, sm_100a and sm_120a, with no spills on sm_90a") {
  PrivateBuilder b("kjit-nvrtc-gemm-activation");
  std::vector<GroupedGemmSpec> sm90;
  for (auto activation : {Activation::silu_mul, Activation::swiglu_oai})
    for (int v = 0; v < 4; ++v) {
      GroupedGemmSpec g;
      g.activation = activation;
      g.out = v & 1 ? DType::f32 : DType::bf16;
      g.row_scale = (v & 2) != 0;
      g.n = 1536;  // Qwen3-30B-A3B's gate_up
      g.k = 2048;
      g.experts = 128;
      for (const char* arch : {"sm_100a", "sm_120a"})
        for (const auto& spec : kernels_for_target(g, arch_of(arch))) {
          auto cubin = b.builder.build(spec, arch_of(arch));
          REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
        }
      for (const auto& spec : kernels_for_target(g, arch_of("sm_90a"))) sm90.push_back(std::get<GroupedGemmSpec>(spec));
      // Half tiles of 64 columns (32-column activated halves), pairs along N, and swap AB with one consumer.
      sm90.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 1 << 20, {.tile_m = 128, .tile_n = 64}));
      sm90.push_back(*choose_grouped_gemm_config(
          g, arch_of("sm_90a"), 1 << 20, {.tile_m = 128, .tile_n = 192, .cluster = 2, .cluster_axis = ClusterAxis::n}));
      sm90.push_back(*choose_grouped_gemm_config(
          g, arch_of("sm_90a"), 1 << 20, {.kernel = GemmRequest::Kernel::sm90_swap_ab, .tile_m = 96, .tile_n = 64}));
      sm90.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 0, {.kernel = GemmRequest::Kernel::portable}));
    }
  CHECK(canonical(KernelSpec{sm90.front()}).find(" activation=") != std::string::npos);
  check_no_spills_on_sm90a(sm90);
  // The mixed-input GEMMs whose scales follow the rows: FP4 and fp8 per row, both kernels.
  std::vector<GroupedGemmMixedSpec> mixed;
  for (auto weight : {MixedWeight::nvfp4, MixedWeight::mxfp4, MixedWeight::f8_e4m3fn}) {
    GroupedGemmMixedSpec m;
    m.activation = Activation::swiglu_oai;
    m.weight = weight;
    m.weight_scale = weight == MixedWeight::f8_e4m3fn ? ScaleGranularity::per_row : ScaleGranularity::per_block;
    m.n = 5760;  // gpt-oss's gate_up
    m.k = 2880;
    m.experts = 32;
    for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
      for (const auto& spec : kernels_for_target(m, arch_of(arch))) {
        auto cubin = b.builder.build(spec, arch_of(arch));
        REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
        if (std::string_view(arch) == "sm_90a") mixed.push_back(std::get<GroupedGemmMixedSpec>(spec));
      }
  }
  // fp8 128 x 128 block scales left in the checkpoint's row order, found through its gate/up layout: DeepSeek-V3's
  // gate_up (halves) and gpt-oss-sized alternating rows with partial blocks along N and K.
  for (auto layout : {GateUpLayout::halves, GateUpLayout::alternating}) {
    GroupedGemmMixedSpec m;
    m.activation = layout == GateUpLayout::halves ? Activation::silu_mul : Activation::swiglu_oai;
    m.gate_up_layout = layout;
    m.n = layout == GateUpLayout::halves ? 4096 : 5760;
    m.k = layout == GateUpLayout::halves ? 7168 : 2880;
    m.experts = 32;
    for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
      for (const auto& spec : kernels_for_target(m, arch_of(arch))) {
        auto cubin = b.builder.build(spec, arch_of(arch));
        REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
        if (std::string_view(arch) == "sm_90a") mixed.push_back(std::get<GroupedGemmMixedSpec>(spec));
      }
    mixed.push_back(*choose_grouped_gemm_mixed_config(m, arch_of("sm_90a"), 0, {.kernel = GemmRequest::Kernel::portable}));
  }
  // The gate_up GEMMs gathering their rows, as kjit.torch.MoEExperts runs them: the converter kernel's two
  // converter warps beside the gather loader. DeepSeek-V3's (halves: a multiplier per row; the converter's units
  // once spilled here) and gpt-oss-sized alternating rows (a multiplier per row once spilled 21 instructions).
  for (auto layout : {GateUpLayout::halves, GateUpLayout::alternating}) {
    GroupedGemmMixedSpec m;
    m.activation = layout == GateUpLayout::halves ? Activation::silu_mul : Activation::swiglu_oai;
    m.gate_up_layout = layout;
    m.gather = true;
    m.n = layout == GateUpLayout::halves ? 4096 : 5760;
    m.k = layout == GateUpLayout::halves ? 7168 : 2880;
    m.experts = 32;
    for (const auto& spec : kernels_for_target(m, arch_of("sm_90a"))) mixed.push_back(std::get<GroupedGemmMixedSpec>(spec));
  }
  check_no_spills_on_sm90a(mixed);
  GroupedGemmMixedSpec blocks;  // 128 x 128 fp8 scales without their row order: refused
  blocks.activation = Activation::silu_mul;
  blocks.n = 4096;
  blocks.k = 7168;
  blocks.experts = 32;
  CHECK_FALSE(validate(KernelSpec{blocks}).has_value());
  // Whole gate/up groups only.
  GroupedGemmSpec odd;
  odd.activation = Activation::silu_mul;
  odd.n = 1544;
  odd.k = 2048;
  odd.experts = 4;
  CHECK_FALSE(validate(KernelSpec{odd}).has_value());
}

// The FP8 (W8A8) GEMM's SM90 kernels, both orientations (the heuristic's
// swap AB and rows on M), alone and in pairs along N, over what changes
// register pressure: block or channel weight scales, bf16 or f32 output, the
// row scale.
static std::vector<GroupedGemmFp8Spec> fp8_gemm_sm90_variants() {
  std::vector<GroupedGemmFp8Spec> out;
  for (int v = 0; v < 8; ++v) {
    GroupedGemmFp8Spec g{.out = v & 1 ? DType::f32 : DType::bf16,
                         .n = 4096,
                         .k = 7168,
                         .experts = 32,
                         .weight_scale = v & 2 ? Fp8WeightScale::channel : Fp8WeightScale::block_128,
                         .row_scale = (v & 4) != 0};
    // Swap AB alone and in pairs along N; rows on M (single blocks) 128 and, with block scales, 256 wide.
    auto add = [&](GemmRequest request) {
      const auto config = choose_grouped_gemm_fp8_config(g, arch_of("sm_90a"), 1 << 20, request);
      REQUIRE_MESSAGE(config.has_value(), kjit::testing::why(config));
      out.push_back(*config);
    };
    for (int cluster : {1, 2})
      add({.kernel = GemmRequest::Kernel::sm90_swap_ab, .tile_m = 128, .tile_n = 128, .cluster = cluster,
           .cluster_axis = ClusterAxis::n});
    add({.kernel = GemmRequest::Kernel::sm90, .tile_m = 128, .tile_n = 128});
    if (g.weight_scale == Fp8WeightScale::block_128)
      add({.kernel = GemmRequest::Kernel::sm90, .tile_m = 128, .tile_n = 256});
  }
  return out;
}

TEST_CASE("ptxas compiles the FP8 GEMM's SM90 kernels, both orientations, with no spills and no serialised wgmma") {
  const auto specs = fp8_gemm_sm90_variants();
  int rows_on_m = 0;
  for (const auto& s : specs) rows_on_m += s.kernel == Fp8GemmKernel::wgmma_sm90_rows_on_m;
  CHECK(rows_on_m == 12);
  check_no_spills_on_sm90a(specs);
}

// The W8A16 / W4A16 converter kernel's two mechanisms: fp8 weights converted
// by converter warps, FP4 (NVFP4, MXFP4) by the consumers, their own rows
// between their wgmmas; each read [E, K, N] too (dX: the converted tile in
// MN-major chunks, FP4 each consumer its own output columns), with the row
// tile gathered (a loader warp beside the converters) or not, and fp8 per row,
// which holds a multiplier per unit ([E, K, N]: per k).
TEST_CASE("ptxas compiles the converter kernel, converter warps and own rows, with no spills and no serialised wgmma") {
  std::vector<GroupedGemmMixedSpec> specs;
  for (auto weight : {MixedWeight::f8_e4m3fn, MixedWeight::nvfp4, MixedWeight::mxfp4})
    for (int variant = 0; variant < (weight == MixedWeight::f8_e4m3fn ? 4 : 3); ++variant) {
      const bool gather = variant == 1 || variant == 3;
      GroupedGemmMixedSpec m;
      m.weights = variant >= 2 ? WeightLayout::e_k_n : WeightLayout::e_n_k;
      m.weight = weight;
      const bool per_row = weight == MixedWeight::f8_e4m3fn && gather;
      m.weight_scale = per_row ? ScaleGranularity::per_row : ScaleGranularity::per_block;
      m.scale_convention = weight == MixedWeight::nvfp4 ? ScaleConvention::divide : ScaleConvention::multiply;
      m.gather = gather;
      m.n = 2880;
      m.k = 2880;
      m.experts = 32;
      const auto spec = choose_grouped_gemm_mixed_config(m, arch_of("sm_90a"), 1 << 20,
                                                         {.kernel = GemmRequest::Kernel::sm90_converter});
      REQUIRE_MESSAGE(spec.has_value(), kjit::testing::why(spec));
      REQUIRE(spec->kernel == MixedGemmKernel::wgmma_sm90_converter);
      specs.push_back(*spec);
    }
  check_no_spills_on_sm90a(specs);
}

// DeepSeek-V3's down projection under TP8 (K 256): four bf16 k-blocks, each
// k-loop unrolled whole, where ptxas came closest to serialising the wgmmas
// (the bf16 swap-AB kernel was serialised before the stage ring; a form of the
// swizzle offsets tipped the converter kernel over).
TEST_CASE("a K of four k-blocks (DeepSeek-V3 TP8's down) compiles the swap-AB and converter kernels unserialised") {
  std::vector<KernelSpec> specs;
  for (bool row_scale : {false, true}) {
    GroupedGemmSpec g;
    g.n = 7168;
    g.k = 256;
    g.experts = 256;
    g.row_scale = row_scale;
    for (int cluster : {1, 2}) {
      auto bf16 = choose_grouped_gemm_config(g, arch_of("sm_90a"), 1 << 20,
                                             {.kernel = GemmRequest::Kernel::sm90_swap_ab, .tile_m = 256,
                                              .tile_n = 128, .cluster = cluster, .cluster_axis = ClusterAxis::n});
      REQUIRE_MESSAGE(bf16.has_value(), kjit::testing::why(bf16));
      specs.push_back(*bf16);
    }
    GroupedGemmMixedSpec m;
    m.n = 7168;
    m.k = 256;
    m.experts = 256;
    m.row_scale = row_scale;
    auto converter = choose_grouped_gemm_mixed_config(m, arch_of("sm_90a"), 1 << 20,
                                                      {.kernel = GemmRequest::Kernel::sm90_converter});
    REQUIRE_MESSAGE(converter.has_value(), kjit::testing::why(converter));
    specs.push_back(*converter);
  }
  check_no_spills_on_sm90a(specs);
}

static std::vector<Fp8QuantizeSpec> quantize_variants() {
  std::vector<Fp8QuantizeSpec> out;
  for (auto format : {QuantScaleFormat::fp32, QuantScaleFormat::ue8m0})
    for (bool gather : {false, true}) out.push_back({.k = gather ? 2048 : 7168, .scale_format = format, .gather = gather});
  return out;
}

TEST_CASE("the decode kernels, bf16, W8A16, W4A16 and W8A8 (wgmma on sm_90a), every tile and the MoE shapes of issue 39, "
          "compile for sm_90a with no spills, and for sm_100a and sm_120a, not for sm_80 or sm_89") {
  PrivateBuilder b("kjit-nvrtc-gemm-decode");
  std::vector<KernelSpec> sm90;
  // (N, K, E) of Qwen3-30B-A3B, DeepSeek-V3 TP8 and an EP8 rank: gate_up, down.
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1536, 2048, 128}, {2048, 768, 128}, {512, 7168, 256},
                                                          {7168, 256, 256},  {4096, 7168, 32}, {7168, 2048, 32}};
  for (const auto& [n, k, e] : shapes) {
    GroupedGemmSpec g{.n = n, .k = k, .experts = e, .row_scale = true, .gather = true};
    GroupedGemmMixedSpec m{.n = n, .k = k, .experts = e, .weights = WeightLayout::e_n_k, .weight = MixedWeight::f8_e4m3fn};
    m.gather = true;
    sm90.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 8));
    sm90.push_back(*choose_grouped_gemm_mixed_config(m, arch_of("sm_90a"), 8));
    const GroupedGemmFp8Spec f{.n = n, .k = k, .experts = e};
    sm90.push_back(*choose_grouped_gemm_fp8_config(f, arch_of("sm_90a"), 8));
  }
  // Every tile, the fused activations (fp8 block scales through the checkpoint's layout), fp32 output.
  for (int rows : {8, 16, 32})
    for (int tile_n : {16, 32, 64, 128}) {
      const GemmRequest decode{.kernel = GemmRequest::Kernel::decode, .tile_m = rows, .tile_n = tile_n};
      GroupedGemmSpec g{.out = rows == 8 ? DType::f32 : DType::bf16, .n = 2048, .k = 1024, .experts = 64};
      g.activation = tile_n == 32 ? Activation::swiglu_oai : Activation::silu_mul;
      sm90.push_back(*choose_grouped_gemm_config(g, arch_of("sm_90a"), 8, decode));
      GroupedGemmMixedSpec m{.n = 2048, .k = 1024, .experts = 64, .weights = WeightLayout::e_n_k,
                             .weight = rows == 32 ? MixedWeight::f8_e5m2 : MixedWeight::f8_e4m3fn};
      m.weight_scale = tile_n == 64 ? ScaleGranularity::per_row : ScaleGranularity::per_block;
      m.scale_convention = tile_n == 16 ? ScaleConvention::divide : ScaleConvention::multiply;
      if (tile_n == 128) {
        m.activation = Activation::silu_mul;
        m.gate_up_layout = rows == 16 ? GateUpLayout::halves : GateUpLayout::alternating;
      }
      sm90.push_back(*choose_grouped_gemm_mixed_config(m, arch_of("sm_90a"), 8, decode));
      // W8A8 on sm_90a, the wgmma decode kernel (64, 128 and 256 weight rows a block, every chunk height):
      // channel scales, fp32 output, the row scale, K of an odd count of 128-k blocks, 1 to 4 warpgroups.
      if (tile_n == 128) continue;
      GroupedGemmFp8Spec f{.out = rows == 8 ? DType::f32 : DType::bf16, .n = 2048,
                           .k = tile_n == 16 ? 1152 : tile_n == 32 ? 2048 : 4096, .experts = 64,
                           .row_scale = tile_n == 32};
      if (tile_n == 64) f.weight_scale = Fp8WeightScale::channel;
      const auto w8a8 = choose_grouped_gemm_fp8_config(
          f, arch_of("sm_90a"), 8, {.kernel = GemmRequest::Kernel::decode, .tile_m = rows, .tile_n = 4 * tile_n});
      REQUIRE_MESSAGE(w8a8.has_value(), kjit::testing::why(w8a8));
      CHECK(w8a8->kernel == Fp8GemmKernel::wgmma_decode);
      sm90.push_back(*w8a8);
    }
  // W4A16 (one block an SM, so no 128-register cap): gpt-oss's K (a partial last chunk), both formats, every
  // tile, the fused activation, fp32 output, NVFP4's DIVIDE convention.
  for (int rows : {8, 16, 32})
    for (int tile_n : {16, 32, 64, 128}) {
      GroupedGemmMixedSpec m{.out = rows == 16 ? DType::f32 : DType::bf16, .n = 5760, .k = 2880, .experts = 128,
                             .weights = WeightLayout::e_n_k,
                             .weight = tile_n == 32 ? MixedWeight::nvfp4 : MixedWeight::mxfp4};
      m.weight_scale = ScaleGranularity::per_block;
      if (m.weight == MixedWeight::nvfp4) m.scale_convention = ScaleConvention::divide;
      if (tile_n == 64) m.activation = Activation::swiglu_oai;
      const auto w4a16 = choose_grouped_gemm_mixed_config(
          m, arch_of("sm_90a"), 8, {.kernel = GemmRequest::Kernel::decode, .tile_m = rows, .tile_n = tile_n});
      REQUIRE_MESSAGE(w4a16.has_value(), kjit::testing::why(w4a16));
      sm90.push_back(*w4a16);
    }
  // ... and the heuristic's tile on the other shapes above, both formats (NVFP4 both conventions).
  for (const auto& [n, k, e] : shapes)
    for (auto weight : {MixedWeight::nvfp4, MixedWeight::mxfp4})
      for (auto convention : {ScaleConvention::multiply, ScaleConvention::divide}) {
        if (weight == MixedWeight::mxfp4 && convention == ScaleConvention::divide) continue;
        GroupedGemmMixedSpec m{.n = n, .k = k, .experts = e, .weights = WeightLayout::e_n_k, .weight = weight};
        m.weight_scale = ScaleGranularity::per_block;
        m.scale_convention = convention;
        m.gather = n > k;
        sm90.push_back(*choose_grouped_gemm_mixed_config(m, arch_of("sm_90a"), 8));
        CHECK(std::get<GroupedGemmMixedSpec>(sm90.back()).kernel == MixedGemmKernel::mma_decode);
      }
  check_no_spills_on_sm90a(sm90);
  // Off Hopper: the bf16 and W8A16 decode kernels of the first two shapes, and W8A8's mma.sync one (a forced
  // decode request there; Hopper's is wgmma).
  for (const char* arch : {"sm_100a", "sm_120a"}) {
    std::vector<KernelSpec> off_hopper{sm90[0], sm90[1], sm90[3], sm90[4]};
    for (int rows : {8, 16})
      off_hopper.push_back(*choose_grouped_gemm_fp8_config({.n = 2048, .k = 1152, .experts = 64}, arch_of(arch), 8,
                                                           {.kernel = GemmRequest::Kernel::decode, .tile_m = rows}));
    CHECK(std::get<GroupedGemmFp8Spec>(off_hopper.back()).kernel == Fp8GemmKernel::mma_decode);
    for (const auto& spec : off_hopper) {
      auto cubin = b.builder.build(spec, arch_of(arch));
      REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
    }
  }
  // Its bulk copies are sm_90's: refused before a compile on sm_80 and sm_89.
  for (const char* arch : {"sm_80", "sm_89"}) {
    auto refused = b.builder.build(sm90[0], arch_of(arch));
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == KJIT_ERROR_UNSUPPORTED);
  }
}

TEST_CASE("every fp8 quantize variant compiles with NVRTC for sm_90a, sm_100a and sm_120a, and not for sm_80") {
  PrivateBuilder b("kjit-nvrtc-quantize");
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
    for (const auto& spec : quantize_variants()) {
      auto cubin = b.builder.build(spec, arch_of(arch));
      REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
      CHECK(std::memcmp(cubin->cubin.data(), "\x7f" "ELF", 4) == 0);
    }
  auto refused = b.builder.build(quantize_variants().front(), arch_of("sm_80"));
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == KJIT_ERROR_UNSUPPORTED);
  CHECK(refused.error().message.find("fp8 quantize needs compute capability 8.9 or newer") != std::string::npos);
}

TEST_CASE("ptxas reports no local-memory spills in the fp8 quantize kernels on sm_90a") {
  check_no_spills_on_sm90a(quantize_variants());
}

// Every activation, layout and output (FP8 in both scale formats), and the gradient.
static std::vector<MoeActivationSpec> moe_activation_variants() {
  std::vector<MoeActivationSpec> out;
  for (auto activation : {Activation::silu_mul, Activation::swiglu_oai})
    for (auto layout : {GateUpLayout::halves, GateUpLayout::alternating, GateUpLayout::groups_of_8}) {
      out.push_back({.intermediate = 2880, .activation = activation, .layout = layout, .out = DType::bf16});
      out.push_back(
          {.intermediate = 768, .activation = activation, .layout = layout, .out = DType::bf16, .gradient = true});
      for (auto format : {QuantScaleFormat::fp32, QuantScaleFormat::ue8m0})
        out.push_back({.intermediate = 2048, .activation = activation, .layout = layout, .out = DType::f8_e4m3fn,
                       .scale_format = format});
    }
  return out;
}

TEST_CASE("every moe activation variant compiles with NVRTC for sm_90a, sm_100a, sm_120a, on sm_80 only bf16 out") {
  PrivateBuilder b("kjit-nvrtc-moe-activation");
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a", "sm_80"})
    for (const auto& spec : moe_activation_variants()) {
      CAPTURE(arch);
      CAPTURE(canonical(spec));
      auto cubin = b.builder.build(spec, arch_of(arch));
      if (std::string_view(arch) == "sm_80" && spec.out != DType::bf16) {
        REQUIRE_FALSE(cubin.has_value());
        CHECK(cubin.error().code == KJIT_ERROR_UNSUPPORTED);
        CHECK(cubin.error().message.find("fp8 output needs compute capability 8.9 or newer") != std::string::npos);
        continue;
      }
      REQUIRE_MESSAGE(cubin.has_value(), kjit::testing::why(cubin));
      CHECK(std::memcmp(cubin->cubin.data(), "\x7f" "ELF", 4) == 0);
    }
}

TEST_CASE("ptxas reports no local-memory spills in the moe activation kernels on sm_90a") {
  check_no_spills_on_sm90a(moe_activation_variants());
}

static std::vector<MxQuantizeSpec> mx_quantize_variants() {
  std::vector<MxQuantizeSpec> out;
  for (auto layout : {MxScaleLayout::linear, MxScaleLayout::swizzled_128x4}) {
    for (auto global : {GlobalScaleMode::given, GlobalScaleMode::compute})
      out.push_back({.format = MxFormat::nvfp4, .k = 7168, .scale_layout = layout, .global_scale = global,
                     .convention = global == GlobalScaleMode::given ? ScaleConvention::multiply
                                                                    : ScaleConvention::divide});
    out.push_back({.format = MxFormat::mxfp4, .k = 2880, .scale_layout = layout,
                   .global_scale = GlobalScaleMode::none});
    for (auto element : {MxElement::f8_e4m3fn, MxElement::f8_e5m2})
      out.push_back({.format = MxFormat::mxfp8, .element = element, .k = 96, .scale_layout = layout,
                     .global_scale = GlobalScaleMode::none});
  }
  return out;
}

TEST_CASE("every mx quantize form compiles with NVRTC for sm_90a, sm_100a and sm_120a, on sm_80 only MXFP4") {
  PrivateBuilder b("kjit-nvrtc-mx-quantize");
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a", "sm_80"})
    for (const auto& spec : mx_quantize_variants()) {
      auto cubin = b.builder.build(spec, arch_of(arch));
      CAPTURE(arch);
      CAPTURE(canonical(spec));
      if (std::string(arch) == "sm_80" && spec.format != MxFormat::mxfp4) {
        REQUIRE_FALSE(cubin.has_value());
        CHECK(cubin.error().code == KJIT_ERROR_UNSUPPORTED);
        CHECK(cubin.error().message.find("quantize needs compute capability 8.9 or newer") != std::string::npos);
        continue;
      }
      REQUIRE_MESSAGE(cubin.has_value(), kjit::testing::why(cubin));
      CHECK(std::memcmp(cubin->cubin.data(), "\x7f" "ELF", 4) == 0);
    }
}

TEST_CASE("ptxas reports no local-memory spills in the mx quantize kernels on sm_90a") {
  check_no_spills_on_sm90a(mx_quantize_variants());
}

// Every MX template branch: each format (both MXFP8 elements, both NVFP4
// conventions), output, layout, the widest and narrow vectors (one and two
// scales per vector), selected experts; the scale-layout conversion both ways,
// uniform and with offsets of both conventions.
static std::vector<KernelSpec> mx_variants() {
  std::vector<KernelSpec> out;
  out.push_back(MxDequantSpec{.format = MxFormat::nvfp4, .out = DType::bf16, .k = 7168,
                              .scale_layout = MxScaleLayout::swizzled_128x4, .vec = 32});
  out.push_back(MxDequantSpec{.format = MxFormat::nvfp4, .out = DType::f32, .k = 48, .convention = ScaleConvention::divide,
                              .vec = 16, .selected_experts = true});
  out.push_back(MxDequantSpec{.format = MxFormat::nvfp4, .out = DType::f16, .k = 2048,
                              .scale_layout = MxScaleLayout::swizzled_128x4, .convention = ScaleConvention::divide,
                              .vec = 32});
  out.push_back(MxDequantSpec{.format = MxFormat::mxfp4, .out = DType::bf16, .k = 2880, .vec = 32});
  out.push_back(MxDequantSpec{.format = MxFormat::mxfp4, .out = DType::f32, .k = 2880,
                              .scale_layout = MxScaleLayout::swizzled_128x4, .vec = 2, .selected_experts = true});
  out.push_back(MxDequantSpec{.format = MxFormat::mxfp8, .element = DType::f8_e4m3fn, .out = DType::bf16, .k = 2880,
                              .vec = 16});
  out.push_back(MxDequantSpec{.format = MxFormat::mxfp8, .element = DType::f8_e5m2, .out = DType::f16, .k = 96,
                              .scale_layout = MxScaleLayout::swizzled_128x4, .vec = 1});
  for (bool with_offsets : {false, true})
    for (auto to : {MxScaleLayout::linear, MxScaleLayout::swizzled_128x4})
      out.push_back(MxScaleLayoutSpec{.from = to == MxScaleLayout::linear ? MxScaleLayout::swizzled_128x4
                                                                           : MxScaleLayout::linear,
                                      .to = to, .scale_cols = with_offsets ? 90 : 7, .with_offsets = with_offsets,
                                      .offsets = with_offsets && to == MxScaleLayout::linear
                                                     ? OffsetsConvention::with_leading_zero
                                                     : OffsetsConvention::cumulative_end});
  return out;
}

TEST_CASE("every MX dequant and scale-layout variant compiles with NVRTC for sm_90a, sm_100a and sm_120a") {
  PrivateBuilder b("kjit-nvrtc-mx");
  for (const char* arch : {"sm_90a", "sm_100a", "sm_120a"})
    for (const auto& spec : mx_variants()) {
      auto cubin = b.builder.build(spec, arch_of(arch));
      REQUIRE_MESSAGE(cubin.has_value(), arch, " ", canonical(spec), ": ", kjit::testing::why(cubin));
      CHECK(std::memcmp(cubin->cubin.data(), "\x7f" "ELF", 4) == 0);
    }
  auto refused = b.builder.build(mx_variants().front(), arch_of("sm_80"));
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == KJIT_ERROR_UNSUPPORTED);
  CHECK(refused.error().message.find("MX dequant needs compute capability 8.9 or newer") != std::string::npos);
}

TEST_CASE("ptxas reports no local-memory spills in the MX kernels on sm_90a") {
  check_no_spills_on_sm90a(mx_variants());
}

// Both kernels; the portable one's tiles (wide, and narrow for N <= 64); both outputs and offsets conventions;
// edges no multiple of a tile.
static std::vector<GroupedGemmWgradSpec> wgrad_variants(GemmRequest::Kernel kernel) {
  std::vector<GroupedGemmWgradSpec> out;
  for (int64_t n : {int64_t{16}, int64_t{1536}, int64_t{200}})
    for (auto o : {DType::f32, DType::bf16})
      for (auto offsets : {OffsetsConvention::cumulative_end, OffsetsConvention::with_leading_zero}) {
        auto config = grouped_gemm_wgrad_config(
            {.out = o, .n = n, .k = n == 200 ? 136 : 2048, .experts = 128, .offsets = offsets}, arch_of("sm_90a"),
            kernel);
        REQUIRE_MESSAGE(config.has_value(), kjit::testing::why(config));
        out.push_back(*config);
      }
  return out;
}

TEST_CASE("every grouped GEMM wgrad variant compiles for sm_80, sm_90a, sm_100a and sm_120a, with no spills on sm_90a") {
  PrivateBuilder b("kjit-nvrtc-wgrad");
  const auto portable = wgrad_variants(GemmRequest::Kernel::portable);
  const auto sm90 = wgrad_variants(GemmRequest::Kernel::sm90);
  for (const char* arch : {"sm_80", "sm_90a", "sm_100a", "sm_120a"})
    for (const auto& spec : portable) {
      CAPTURE(arch);
      CAPTURE(canonical(spec));
      auto cubin = b.builder.build(spec, arch_of(arch));
      REQUIRE_MESSAGE(cubin.has_value(), kjit::testing::why(cubin));
    }
  for (const auto& spec : sm90) {
    CAPTURE(canonical(spec));
    CHECK(spec.kernel == GemmKernel::wgmma_sm90);
    CHECK_FALSE(validate_for_target(KernelSpec{spec}, arch_of("sm_100a")).has_value());
  }
  // The arch's pick: wgmma on sm_90a once N and K reach 128, the portable kernel below and elsewhere.
  const GroupedGemmWgradSpec lora{.n = 16, .k = 2048, .experts = 128}, wide{.n = 1536, .k = 2048, .experts = 128};
  CHECK(grouped_gemm_wgrad_config(lora, arch_of("sm_90a"))->kernel == GemmKernel::mma_sync);
  CHECK(grouped_gemm_wgrad_config(wide, arch_of("sm_90a"))->kernel == GemmKernel::wgmma_sm90);
  CHECK(grouped_gemm_wgrad_config(wide, arch_of("sm_100a"))->kernel == GemmKernel::mma_sync);
  auto all = portable;
  all.insert(all.end(), sm90.begin(), sm90.end());
  check_no_spills_on_sm90a(all);
}

TEST_CASE("NVRTC compiles kjit's sources with no include path: a toolkit header cannot reach a cubin") {
  // The key holds no header digest because no header outside the rendered source is read: a template that
  // included one (here CCCL's, which the SM90 kernels once used) must fail to compile, not pick up whatever
  // toolkit the machine has.
  auto nvrtc = kjit::Nvrtc::load();
  REQUIRE(nvrtc.has_value());
  const auto options = kjit::compile_options("sm_90a");
  for (const auto& option : options) CHECK(option.rfind("-I", 0) != 0);
  const std::string kernel = "extern \"C\" __global__ void k(int* p) { *p = 1; }\n";
  CHECK((*nvrtc)->compile(kernel, "plain.cu", "sm_90a", options).has_value());
  for (const std::string header : {"<cuda/ptx>", "<cuda_runtime.h>"}) {
    INFO(header);
    const auto refused = (*nvrtc)->compile(std::string("#include ") + header + "\n" + kernel, "inc.cu", "sm_90a",
                                           options);
    REQUIRE_FALSE(refused.has_value());
    INFO(refused.error().message);
    CHECK(refused.error().message.find("could not open source file") != std::string::npos);
  }
}
