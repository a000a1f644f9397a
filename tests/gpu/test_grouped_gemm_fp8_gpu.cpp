// The FP8 (W8A8) grouped GEMM on a real GPU against the fp64 CPU reference
// (kjit/reference/fp8_gemm.hpp) on fresh random codes and scales, to 5e-3
// relative error: uneven routing with empty experts, one expert owning every
// row, a single row, row counts that are no multiple of any tile, 1, 8 and
// 256 experts, block and per-channel weight scales (a partial last block of
// N included), row scales, bf16 and fp32 output, both offset conventions,
// rows past the last offset untouched, bad offsets rejected on the device,
// graph replay with per-expert counts changing in between, and the portable
// kernel forced on the same GPU agreeing with the default. On Hopper every
// case also runs through both SM90 kernels (swap AB, the default, and rows
// on M), their tiles (and swap AB's clusters). Last, the
// shared harness (jitctl selftest's check) on every configuration this arch
// builds, DeepSeek-V3's 256 experts of 4096 x 7168 included.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gpu_support.hpp"
#include "harness.hpp"
#include "kjit/codegen/families/grouped_gemm_fp8.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8_gemm.hpp"
#include "kjit/reference/fp8_quantize.hpp"
#include "why.hpp"

using namespace kjit::testing;
namespace codegen = kjit::codegen;

namespace {

constexpr double kTolerance = 5e-3;

struct Fp8Case {
  int64_t n = 256, k = 512;
  std::vector<int32_t> counts;  // rows per expert
  int64_t extra_rows = 0;       // rows of A past the last offset (must stay untouched)
  kjit_scale_granularity weight_scale = KJIT_SCALE_PER_BLOCK;
  kjit_expert_offsets convention = KJIT_OFFSETS_CUMULATIVE_END;
  bool row_scale = false;
  kjit_dtype out = KJIT_DTYPE_BF16;
  bool decode_paths_only = false;  // the decode kernel's paths alone (its cases, also run under the sanitizers)

  int64_t experts() const { return static_cast<int64_t>(counts.size()); }
  int64_t k_blocks() const { return k / 128; }
  int64_t b_scales_per_expert() const { return weight_scale == KJIT_SCALE_PER_BLOCK ? (n + 127) / 128 * k_blocks() : n; }
  int64_t out_bytes() const { return out == KJIT_DTYPE_F32 ? 4 : 2; }
};

// One way of running the FP8 grouped GEMM.
struct KernelPath {
  const char* name;
  kjit_gemm_kernel kernel;
  int32_t tile_m, tile_n;
  int32_t cluster;
  int64_t n_multiple = 8;  // the path runs only where N is a multiple of this (pairs of blocks never pass N)
  bool block_scales_only = false;  // 128 x 256 rows on M: per-channel weight scales are refused
};

// FP8 tensor cores arrived with sm_89; older GPUs get KJIT_ERROR_UNSUPPORTED (the argument tests check that).
bool has_fp8() {
  if (compute_capability() >= 89) return true;
  MESSAGE("no FP8 tensor cores on this GPU (sm_89 and newer have them)");
  return false;
}

std::vector<KernelPath> kernel_paths() {
  std::vector<KernelPath> paths{{"the arch's default", KJIT_GEMM_KERNEL_AUTO, 0, 0, 0},
                                {"portable, its default tile", KJIT_GEMM_KERNEL_PORTABLE, 0, 0, 0},
                                {"portable 32 x 32 tiles", KJIT_GEMM_KERNEL_PORTABLE, 32, 32, 0},
                                {"portable 128 x 64 tiles", KJIT_GEMM_KERNEL_PORTABLE, 128, 64, 0}};
  if (is_hopper()) {
    paths.push_back({"sm90 swap AB rows up to 96", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 96, 128, 1});
    paths.push_back({"sm90 swap AB rows up to 32", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 32, 128, 1});
    paths.push_back({"sm90 swap AB rows up to 128, pairs along N sharing the rows", KJIT_GEMM_KERNEL_SM90_SWAP_AB,
                     128, 128, 2, 256});
    // A tile with KJIT_GEMM_KERNEL_SM90 names the rows-on-M kernel (tokens on wgmma's M).
    paths.push_back({"sm90 rows on M 128 x 128", KJIT_GEMM_KERNEL_SM90, 128, 128, 1});
    paths.push_back({"sm90 rows on M 128 x 256 (two weight halves)", KJIT_GEMM_KERNEL_SM90, 128, 256, 1, 8, true});
  }
  if (is_hopper()) {  // the wgmma decode kernel: chunks of 8 (its default), 16 or 32 rows; warpgroups along N and K
    paths.push_back({"wgmma decode, the heuristic's chunks (8 rows) and tile", KJIT_GEMM_KERNEL_DECODE, 0, 0, 0});
    paths.push_back({"wgmma decode, chunks of 16 rows x 128 weight rows (2 warpgroups along N)",
                     KJIT_GEMM_KERNEL_DECODE, 16, 128, 0});
    paths.push_back({"wgmma decode, chunks of 32 rows x 64 weight rows", KJIT_GEMM_KERNEL_DECODE, 32, 64, 0});
    paths.push_back({"wgmma decode, chunks of 8 rows x 256 weight rows (4 warpgroups along N)",
                     KJIT_GEMM_KERNEL_DECODE, 8, 256, 0});
  } else if (compute_capability() >= 90) {  // the mma.sync decode kernel's bulk copies
    paths.push_back({"decode, the heuristic's chunks (8 rows) and weight tile", KJIT_GEMM_KERNEL_DECODE, 0, 0, 0});
    paths.push_back({"decode, chunks of 16 rows x 16 weight rows (8 k-warps)", KJIT_GEMM_KERNEL_DECODE, 16, 16, 0});
    paths.push_back({"decode, chunks of 16 rows x 128 weight rows (1 k-warp)", KJIT_GEMM_KERNEL_DECODE, 16, 128, 0});
  }
  return paths;
}

struct Fp8Data {
  std::vector<uint8_t> a, w;  // e4m3fn codes [rows, K], [E, N, K]
  std::vector<float> a_scales, b_scales, row_scale;
};

// Quantized normals (codes over the whole e4m3fn range, 448 included) and
// positive scales from 1/4 to 4, so that a scale applied to the wrong block
// shows in the error.
Fp8Data fp8_inputs(const Fp8Case& c, int64_t rows) {
  Fp8Data d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto code = [&] { return kjit::reference::encode_e4m3fn_satfinite(normal(rng()) * 100.0f); };
  d.a.resize(static_cast<size_t>(rows * c.k));
  for (auto& v : d.a) v = code();
  d.w.resize(static_cast<size_t>(c.experts() * c.n * c.k));
  for (auto& v : d.w) v = code();
  std::uniform_real_distribution<float> log2_scale(-2.0f, 2.0f);
  d.a_scales.resize(static_cast<size_t>(rows * c.k_blocks()));
  for (auto& s : d.a_scales) s = std::exp2(log2_scale(rng()));
  d.b_scales.resize(static_cast<size_t>(c.experts() * c.b_scales_per_expert()));
  for (auto& s : d.b_scales) s = std::exp2(log2_scale(rng()));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  d.row_scale.resize(static_cast<size_t>(rows));
  for (auto& v : d.row_scale) v = weight(rng());
  return d;
}

// The fp64 reference of every `row_step`-th routed row, [sampled rows][N].
std::vector<double> reference(const Fp8Case& c, const Fp8Data& d, int64_t row_step = 1) {
  std::vector<double> ref;
  std::vector<double> row_out(static_cast<size_t>(c.n));
  const size_t expert_codes = static_cast<size_t>(c.n * c.k), expert_scales = static_cast<size_t>(c.b_scales_per_expert());
  int64_t row = 0;
  for (size_t e = 0; e < c.counts.size(); ++e)
    for (int32_t i = 0; i < c.counts[e]; ++i, ++row) {
      if (row % row_step != 0) continue;
      const kjit::reference::Fp8ExpertWeights w{std::span(d.w).subspan(e * expert_codes, expert_codes),
                                                std::span(d.b_scales).subspan(e * expert_scales, expert_scales),
                                                c.weight_scale};
      kjit::reference::fp8_gemm_row(
          std::span(d.a).subspan(static_cast<size_t>(row * c.k), static_cast<size_t>(c.k)),
          std::span(d.a_scales).subspan(static_cast<size_t>(row * c.k_blocks()), static_cast<size_t>(c.k_blocks())), w,
          c.n, c.k, c.row_scale ? double(d.row_scale[static_cast<size_t>(row)]) : 1.0, row_out);
      ref.insert(ref.end(), row_out.begin(), row_out.end());
    }
  return ref;
}

struct Fp8Buffers {
  DeviceBuffer a, w, a_scales, b_scales, row_scale, out, offsets;
  Fp8Buffers(const Fp8Case& c, int64_t rows, const Fp8Data& d)
      : a(0, std::max<size_t>(16, d.a.size())), w(0, d.w.size()), a_scales(0, std::max<size_t>(16, d.a_scales.size() * 4)),
        b_scales(0, d.b_scales.size() * 4), row_scale(0, std::max<size_t>(16, d.row_scale.size() * 4)),
        out(0, static_cast<size_t>(std::max<int64_t>(16, rows * c.n * c.out_bytes()))),
        offsets(0, (c.counts.size() + 1) * 4) {
    upload(c, d);
  }
  void upload(const Fp8Case& c, const Fp8Data& d) {
    if (!d.a.empty()) a.upload(d.a);
    w.upload(d.w);
    if (!d.a_scales.empty()) a_scales.upload(d.a_scales);
    b_scales.upload(d.b_scales);
    if (!d.row_scale.empty()) row_scale.upload(d.row_scale);
    offsets.upload(offsets_for(c.counts, c.convention));
    out.poison();
  }
  kjit_grouped_gemm_desc desc(const Fp8Case& c, int64_t rows) const {
    kjit_grouped_gemm_desc g;
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = g.b_dtype = KJIT_DTYPE_F8_E4M3FN;
    g.out_dtype = c.out;
    g.rows = rows;
    g.n = c.n;
    g.k = c.k;
    g.experts = c.experts();
    g.weights = KJIT_WEIGHTS_E_N_K;
    g.offsets_convention = c.convention;
    g.a = a.get();
    g.b = w.get();
    g.out = out.get();
    g.offsets = static_cast<const int32_t*>(offsets.get());
    g.row_scale = c.row_scale ? static_cast<const float*>(row_scale.get()) : nullptr;
    g.a_scales = static_cast<const float*>(a_scales.get());
    g.b_scales = static_cast<const float*>(b_scales.get());
    g.b_scale_granularity = c.weight_scale;
    g.b_block_rows = g.b_block_cols = c.weight_scale == KJIT_SCALE_PER_BLOCK ? 128 : 0;
    return g;
  }
};

void use_path(kjit_grouped_gemm_desc& g, const KernelPath& path) {
  g.kernel = path.kernel;
  g.tile_m = path.tile_m;
  g.tile_n = path.tile_n;
  g.cluster = path.cluster;
  g.cluster_axis = path.cluster > 1 ? KJIT_GEMM_CLUSTER_ALONG_N : KJIT_GEMM_CLUSTER_ALONG_M;
}

// Runs one case through every kernel path; checks the error bound and that
// rows past the last offset keep their poison.
void run_fp8_gemm(const Fp8Case& c) {
  const int64_t routed = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
  const int64_t rows = routed + c.extra_rows;
  const auto d = fp8_inputs(c, rows);
  const auto ref = reference(c, d);
  Fp8Buffers b(c, rows, d);
  for (const auto& path : kernel_paths()) {
    if (c.n % path.n_multiple != 0 || (path.block_scales_only && c.weight_scale != KJIT_SCALE_PER_BLOCK)) continue;
    if (c.decode_paths_only && path.kernel != KJIT_GEMM_KERNEL_DECODE) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    auto g = b.desc(c, rows);
    use_path(g, path);
    const auto out = grouped_gemm_output(g, b.out);
    const double err = relative_error(c.out, c.n, ref, out, routed);
    CHECK_MESSAGE(err <= kTolerance, "relative error ", err);
    const auto row_bytes = static_cast<size_t>(c.n * c.out_bytes());
    CHECK(touched_bytes(out, static_cast<size_t>(routed) * row_bytes, static_cast<size_t>(rows) * row_bytes) == 0);
  }
}

// run_fp8_gemm with block and with per-channel weight scales.
void run_fp8_gemm_both_scalings(Fp8Case c) {
  for (auto weight_scale : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW}) {
    c.weight_scale = weight_scale;
    run_fp8_gemm(c);
  }
}

}  // namespace

TEST_SUITE_BEGIN("grouped_gemm_fp8");

TEST_CASE("uneven routing with empty experts, both weight scalings, conventions, row scales and output types") {
  if (!has_fp8()) return;
  for (auto weight_scale : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW})
    for (auto convention : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO})
      for (bool row_scale : {false, true})
        for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
          Fp8Case c;
          c.counts = {0, 37, 1, 0, 200, 64, 3, 130};
          c.extra_rows = 11;
          c.weight_scale = weight_scale;
          c.convention = convention;
          c.row_scale = row_scale;
          c.out = out;
          CAPTURE(weight_scale);
          CAPTURE(convention);
          CAPTURE(row_scale);
          CAPTURE(out);
          run_fp8_gemm(c);
        }
}

TEST_CASE("one expert owning every row (333, no multiple of any tile), and a single expert") {
  if (!has_fp8()) return;
  Fp8Case c;
  c.counts.assign(16, 0);
  c.counts[5] = 333;
  c.extra_rows = 3;
  run_fp8_gemm(c);
  Fp8Case single;
  single.counts = {77};
  single.n = 136;  // two weight blocks along N, the second 8 rows
  single.k = 128;  // one k-block
  run_fp8_gemm_both_scalings(single);
}

TEST_CASE("an expert taller than several raster bands (16 row tiles each), the last band partial") {
  if (!has_fp8()) return;
  Fp8Case c;
  c.counts = {5, 4500, 0, 300};  // 36 tiles of 128 rows: bands of 16, 16 and 4
  c.n = 384;
  c.k = 256;
  c.extra_rows = 2;
  run_fp8_gemm(c);
}

TEST_CASE("one row in total, with rows past it untouched") {
  if (!has_fp8()) return;
  Fp8Case c;
  c.counts = {0, 1, 0};
  c.extra_rows = 5;
  c.n = 320;  // a partial last weight block of N
  c.row_scale = true;
  run_fp8_gemm_both_scalings(c);
}

TEST_CASE("256 experts with random counts, both weight scalings") {
  if (!has_fp8()) return;
  for (auto weight_scale : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW}) {
    Fp8Case c;
    c.n = 256;
    c.k = 256;
    c.weight_scale = weight_scale;
    std::uniform_int_distribution<int> count(0, 12);
    for (int e = 0; e < 256; ++e) c.counts.push_back(count(rng()));
    c.extra_rows = 7;
    run_fp8_gemm(c);
  }
}

TEST_CASE("decode sizes: one token's 8 rows on 8 experts or on one, 256 experts with one row, K of 3 and 57 k-blocks") {
  if (compute_capability() < 90) return;  // the decode kernel's bulk copies (the other paths: the cases above)
  for (auto weight_scale : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW}) {
    CAPTURE(weight_scale);
    Fp8Case distinct;  // K 384: one whole 256-k chunk and a half one (wgmma: three k-blocks on one warpgroup)
    distinct.counts = {1, 0, 1, 1, 1, 0, 1, 1, 1, 1};
    distinct.k = 384;
    distinct.n = 200;  // a partial last warp of 16 weight rows (wgmma: a partial 64-row weight box)
    distinct.weight_scale = weight_scale;
    distinct.extra_rows = 3;
    distinct.decode_paths_only = true;
    run_fp8_gemm(distinct);
    Fp8Case one_expert;  // K 7296: DeepSeek-V3's 7168 and one more block, over several k-warps (wgmma: 4 warpgroups)
    one_expert.counts = {0, 8, 0};
    one_expert.k = 7296;
    one_expert.weight_scale = weight_scale;
    one_expert.row_scale = true;
    one_expert.decode_paths_only = true;
    run_fp8_gemm(one_expert);
    Fp8Case streamed;  // 4 rows on each of 128 experts, K 256: the wgmma kernel's blocks stream several sub-tiles
    streamed.counts.assign(128, 4);
    streamed.counts[5] = 0;
    streamed.counts[77] = 9;  // two chunks of 8 rows, the second of 1
    streamed.n = 1000;        // a partial last sub-tile
    streamed.k = 256;
    streamed.weight_scale = weight_scale;
    streamed.row_scale = true;
    streamed.extra_rows = 2;
    streamed.decode_paths_only = true;
    run_fp8_gemm(streamed);
    Fp8Case lone;
    lone.counts.assign(256, 0);
    lone.counts[255] = 1;
    lone.weight_scale = weight_scale;
    lone.out = KJIT_DTYPE_F32;
    lone.decode_paths_only = true;
    run_fp8_gemm(lone);
  }
}

TEST_CASE("decreasing or out-of-range offsets write nothing and are reported") {
  if (!has_fp8()) return;
  Fp8Case c;
  c.counts = {10, 20, 30};
  const auto d = fp8_inputs(c, 60);
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{10, 5, 60}, std::vector<int32_t>{10, 30, 61}}) {
    Fp8Buffers b(c, 60, d);
    b.offsets.upload(bad);
    check_bad_offsets_refused(b.desc(c, 60), b.out);
  }
}

namespace {

// Captures case c's GEMM of `rows` rows once (prepared first: no compile while capturing), then replays it
// with each routing's counts and fresh inputs, checking each replay against the fp64 reference.
void check_captured_replays(Fp8Case c, int64_t rows, const std::vector<std::vector<int32_t>>& routings) {
  auto d = fp8_inputs(c, rows);
  Fp8Buffers b(c, rows, d);
  const auto g = b.desc(c, rows);
  REQUIRE_MESSAGE(kjit_grouped_gemm_prepare(&g, 0) == KJIT_OK, std::string(kjit_last_error_message()));
  GraphCapture capture;
  const kjit_status captured = kjit_grouped_gemm(&g, capture.stream());
  capture.end();
  REQUIRE_MESSAGE(captured == KJIT_OK, std::string(kjit_last_error_message()));
  capture.instantiate();
  for (const auto& counts : routings) {
    c.counts = counts;
    d = fp8_inputs(c, rows);
    b.upload(c, d);
    capture.replay();
    const double err = relative_error(c.out, c.n, reference(c, d), b.out.download<uint8_t>(0, b.out.bytes), rows);
    CHECK_MESSAGE(err <= kTolerance, "relative error ", err);
  }
  CHECK(kjit_device_errors(0) == KJIT_OK);
}

}  // namespace

TEST_CASE("a captured FP8 grouped GEMM replays with per-expert counts changing between replays") {
  if (!has_fp8()) return;
  for (auto weight_scale : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW}) {
    CAPTURE(weight_scale);
    Fp8Case c;
    c.counts = {50, 50, 50, 50};
    c.weight_scale = weight_scale;
    check_captured_replays(c, 200, {{0, 200, 0, 0}, {13, 77, 0, 110}, {199, 0, 1, 0}});
  }
}

TEST_CASE("a captured decode-sized FP8 grouped GEMM (8 rows over 64 experts: the decode bucket) replays with new "
          "routing") {
  if (!has_fp8()) return;
  // 8 rows over 64 experts, on 1, 4 and 8 of them.
  auto routing = [](std::initializer_list<std::pair<int, int32_t>> rows_of) {
    std::vector<int32_t> counts(64, 0);
    for (auto [expert, rows] : rows_of) counts[static_cast<size_t>(expert)] = rows;
    return counts;
  };
  Fp8Case c;
  c.counts = routing({{0, 2}, {21, 2}, {42, 2}, {63, 2}});
  if (is_hopper()) {  // the heuristic's decode bucket: the replays run the wgmma decode kernel
    auto device = kjit::Runtime::global().device(0);
    REQUIRE_MESSAGE(device.has_value(), why(device));
    const codegen::GroupedGemmFp8Spec problem{.n = c.n, .k = c.k, .experts = c.experts()};
    const auto chosen = codegen::choose_grouped_gemm_fp8_config(problem, *(*device)->arch, 8);
    REQUIRE_MESSAGE(chosen.has_value(), why(chosen));
    CHECK(chosen->kernel == codegen::Fp8GemmKernel::wgmma_decode);
  }
  check_captured_replays(c, 8, {routing({{7, 8}}), routing({{1, 1}, {2, 3}, {40, 4}}),
                                routing({{0, 1}, {9, 1}, {18, 1}, {27, 1}, {36, 1}, {45, 1}, {54, 1}, {63, 1}})});
}

TEST_CASE("the portable kernel forced on the same GPU agrees with the default kernel on a multi-wave problem") {
  if (!has_fp8()) return;
  // ~3200 rows over 16 experts, N 2048, K 1024: several hundred tiles (the
  // persistent walk wraps on Hopper) and 8 k-blocks, each with its own scales.
  for (auto weight_scale : {KJIT_SCALE_PER_BLOCK, KJIT_SCALE_PER_ROW}) {
    CAPTURE(weight_scale);
    Fp8Case c;
    c.n = 2048;
    c.k = 1024;
    c.weight_scale = weight_scale;
    c.row_scale = true;
    std::uniform_int_distribution<int> count(0, 400);
    for (int e = 0; e < 16; ++e) c.counts.push_back(count(rng()));
    c.counts[3] = 0;
    const int64_t rows = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
    const auto d = fp8_inputs(c, rows);
    Fp8Buffers b(c, rows, d);
    auto g = b.desc(c, rows);
    std::vector<std::vector<uint8_t>> outputs;
    for (auto kernel : {KJIT_GEMM_KERNEL_AUTO, KJIT_GEMM_KERNEL_PORTABLE}) {
      g.kernel = kernel;
      outputs.push_back(grouped_gemm_output(g, b.out));
    }
    // Every output element: the kernels differ only in summation order and final rounding.
    const double apart = disagreement(c.out, outputs[0], outputs[1], rows * c.n);
    CHECK_MESSAGE(apart <= kTolerance, "default vs portable ", apart);
    if (is_hopper()) {
      // The rows-on-M kernel (a tile with KJIT_GEMM_KERNEL_SM90) against the portable one.
      use_path(g, {"sm90 rows on M", KJIT_GEMM_KERNEL_SM90, 128, 128, 1});
      outputs.push_back(grouped_gemm_output(g, b.out));
      const double rows_on_m_apart = disagreement(c.out, outputs.back(), outputs[1], rows * c.n);
      CHECK_MESSAGE(rows_on_m_apart <= kTolerance, "rows on M vs portable ", rows_on_m_apart);
    }
    // And each against fp64 on every 17th row.
    const auto ref = reference(c, d, 17);
    for (const auto& out : outputs) {
      const double err = relative_error(c.out, c.n, ref, out, rows, 17);
      CHECK_MESSAGE(err <= kTolerance, "relative error ", err);
    }
  }
}

TEST_CASE("the shared harness finds every FP8 configuration of this arch, and the portable kernel, within 5e-3") {
  if (!has_fp8()) return;
  kjit::Runtime& runtime = kjit::Runtime::global();
  auto device = runtime.device(0);
  REQUIRE_MESSAGE(device.has_value(), why(device));
  const codegen::ArchInfo& arch = *(*device)->arch;
  const codegen::GroupedGemmFp8Spec deepseek{.n = 4096, .k = 7168, .experts = 256};
  const codegen::GroupedGemmFp8Spec channel{.out = codegen::DType::f32,
                                            .n = 384,
                                            .k = 512,
                                            .experts = 4,
                                            .weight_scale = codegen::Fp8WeightScale::channel,
                                            .offsets = codegen::OffsetsConvention::with_leading_zero,
                                            .row_scale = true};
  for (const auto& problem : {deepseek, channel}) {
    auto specs = codegen::grouped_gemm_fp8_configs(problem, arch);
    const auto portable =
        codegen::grouped_gemm_fp8_candidates(problem, arch, {.kernel = codegen::GemmRequest::Kernel::portable});
    REQUIRE_MESSAGE(portable.has_value(), why(portable));
    for (const auto& spec : *portable)
      if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
    if (arch.wgmma_tma) {  // the rows-on-M kernel (single blocks only: validate refuses its clusters)
      const auto rows_on_m = codegen::choose_grouped_gemm_fp8_config(
          problem, arch, 1 << 20, {.kernel = codegen::GemmRequest::Kernel::sm90, .tile_m = 128, .tile_n = 128});
      REQUIRE_MESSAGE(rows_on_m.has_value(), why(rows_on_m));
      REQUIRE(rows_on_m->kernel == codegen::Fp8GemmKernel::wgmma_sm90_rows_on_m);
      specs.push_back(*rows_on_m);
    }
    for (const auto& spec : specs) {
      const std::string name = codegen::Family<codegen::GroupedGemmFp8Spec>::canonical(spec);
      CAPTURE(name);
      const auto error = kjit::harness::check_grouped_gemm_fp8(runtime, **device, spec, rng());
      REQUIRE_MESSAGE(error.has_value(), why(error));
      CHECK_MESSAGE(*error <= kTolerance, "relative error ", *error);
    }
  }
}

TEST_SUITE_END();
