// Grouped GEMM on a real GPU against a float64 CPU reference on fresh random
// data: uneven routing with empty experts, one expert owning every row, row
// counts that are no multiple of any tile, the smallest N and K, 1 to 256
// experts, both weight layouts and offset conventions, row scales, bf16 and
// fp32 output, rows past the last offset untouched, bad offsets rejected on
// the device, graph replay with per-expert counts changing in between, and A
// gathered through sorted_to_flat (bit for bit the GEMM on the gathered copy),
// and an addend summed before the rounding (bit for bit round(product + addend)).
// On Hopper every case runs through each kernel path: the SM90 kernel in both
// of its token-count buckets (64- and 128-row tiles), the decode kernel, the
// short-K kernel (K up to 32) and the portable kernel forced on the same GPU;
// elsewhere through the arch's default.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8.hpp"
#include "kjit/reference/moe_activation.hpp"

using namespace kjit::testing;

namespace {

uint16_t to_bf16(float f) { return kjit::reference::bf16_bits_rne(f); }
using kjit::reference::bf16_to_float;

struct GemmCase {
  int64_t n = 256, k = 512;
  std::vector<int32_t> counts;  // rows per expert
  int64_t extra_rows = 0;       // rows of A past the last offset (must stay untouched)
  kjit_weight_layout weights = KJIT_WEIGHTS_E_N_K;
  kjit_expert_offsets convention = KJIT_OFFSETS_CUMULATIVE_END;
  bool row_scale = false;
  kjit_dtype out = KJIT_DTYPE_BF16;
};

// One way of running a grouped GEMM.
struct KernelPath {
  const char* name;
  kjit_gemm_kernel kernel;
  int32_t tile_m, tile_n;
  int32_t cluster;
  kjit_gemm_cluster_axis cluster_axis = KJIT_GEMM_CLUSTER_ALONG_M;
  int64_t n_multiple = 8;  // the path runs only where N is a multiple of this (swap AB pairs never pass N)
  bool workspace = true;   // swap AB: tiles on demand from the workspace's counter, or a static round robin
  bool e_n_k_only = false; // the decode kernel reads [E, N, K] weights only
  int64_t max_k = int64_t{1} << 20;  // the short-K kernel serves K up to 32
};

std::vector<KernelPath> kernel_paths() {
  if (!is_hopper()) return {{"auto", KJIT_GEMM_KERNEL_AUTO, 0, 0, 0}};
  return {{"sm90 64x256 tiles", KJIT_GEMM_KERNEL_SM90, 64, 256, 1},
          {"sm90 64x64 tiles (rank-wide outputs)", KJIT_GEMM_KERNEL_SM90, 64, 64, 1},
          {"sm90 128x192 tiles", KJIT_GEMM_KERNEL_SM90, 128, 192, 1},
          {"sm90 128x256 tiles (half tiles for short remainders)", KJIT_GEMM_KERNEL_SM90, 128, 256, 1},
          {"sm90 128x256 tiles, clusters of 2 sharing B", KJIT_GEMM_KERNEL_SM90, 128, 256, 2},
          {"sm90 128x192 tiles, clusters of 2 along N sharing A", KJIT_GEMM_KERNEL_SM90, 128, 192, 2,
           KJIT_GEMM_CLUSTER_ALONG_N},
          {"sm90 64x256 tiles, clusters of 2 along N sharing A", KJIT_GEMM_KERNEL_SM90, 64, 256, 2,
           KJIT_GEMM_CLUSTER_ALONG_N},
          {"sm90 swap AB, rows up to 256 x 128 columns", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 256, 128, 1},
          {"sm90 swap AB 256 x 128 without a workspace (static tiles)", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 256, 128, 1,
           KJIT_GEMM_CLUSTER_ALONG_M, 8, false},
          {"sm90 swap AB, rows up to 96 x 64 columns (one consumer)", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 96, 64, 1},
          {"sm90 swap AB 256 x 128, clusters of 2 along N sharing the rows", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 256, 128, 2,
           KJIT_GEMM_CLUSTER_ALONG_N, 256},
          {"decode, the heuristic's chunks (8 rows) and weight tile", KJIT_GEMM_KERNEL_DECODE, 0, 0, 0, {}, 8, true, true},
          {"decode, chunks of 16 rows x 16 weight rows (8 k-warps)", KJIT_GEMM_KERNEL_DECODE, 16, 16, 0, {}, 8, true, true},
          {"decode, chunks of 32 rows x 128 weight rows (1 k-warp)", KJIT_GEMM_KERNEL_DECODE, 32, 128, 0, {}, 8, true,
           true},
          {"short K (K up to 32), the heuristic's column blocks", KJIT_GEMM_KERNEL_SHORT_K, 0, 0, 0, {}, 8, true, false,
           32},
          {"short K, 64-column blocks", KJIT_GEMM_KERNEL_SHORT_K, 0, 64, 0, {}, 8, true, false, 32},
          {"portable", KJIT_GEMM_KERNEL_PORTABLE, 0, 0, 0}};
}

// Whether `path` runs `c` (its N, layout and K).
bool runs(const KernelPath& path, const GemmCase& c) {
  return c.n % path.n_multiple == 0 && (!path.e_n_k_only || c.weights == KJIT_WEIGHTS_E_N_K) && c.k <= path.max_k;
}

struct GemmData {
  std::vector<uint16_t> a, w;
  std::vector<float> scale;
};

GemmData gemm_inputs(const GemmCase& c, int64_t rows) {
  GemmData d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  d.a.resize(static_cast<size_t>(rows * c.k));
  for (auto& v : d.a) v = to_bf16(normal(rng()));
  d.w.resize(static_cast<size_t>(c.counts.size() * c.n * c.k));
  for (auto& v : d.w) v = to_bf16(normal(rng()) / std::sqrt(static_cast<float>(c.k)));
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  d.scale.resize(static_cast<size_t>(rows));
  for (auto& v : d.scale) v = weight(rng());
  return d;
}

// The float64 reference of every `row_step`-th routed row, [sampled rows][N].
std::vector<double> reference(const GemmCase& c, const GemmData& d, int64_t row_step = 1) {
  std::vector<double> ref;
  int64_t row = 0;
  for (size_t e = 0; e < c.counts.size(); ++e)
    for (int32_t i = 0; i < c.counts[e]; ++i, ++row) {
      if (row % row_step != 0) continue;
      for (int64_t col = 0; col < c.n; ++col) {
        double sum = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const size_t wi = c.weights == KJIT_WEIGHTS_E_N_K ? static_cast<size_t>((e * c.n + col) * c.k + kk)
                                                            : static_cast<size_t>((e * c.k + kk) * c.n + col);
          sum += double(bf16_to_float(d.a[static_cast<size_t>(row * c.k + kk)])) * double(bf16_to_float(d.w[wi]));
        }
        ref.push_back(c.row_scale ? sum * d.scale[static_cast<size_t>(row)] : sum);
      }
    }
  return ref;
}

struct GemmBuffers {
  DeviceBuffer a, w, out, offsets, scale, workspace;
  GemmBuffers(const GemmCase& c, int64_t rows, const GemmData& d)
      : a(0, std::max<size_t>(16, d.a.size() * 2)), w(0, d.w.size() * 2),
        out(0, std::max<int64_t>(16, rows * c.n * (c.out == KJIT_DTYPE_F32 ? 4 : 2))),
        offsets(0, (c.counts.size() + 1) * 4), scale(0, std::max<size_t>(4, d.scale.size() * 4)),
        workspace(0, kjit_grouped_gemm_workspace_bytes()) {
    if (!d.a.empty()) a.upload(d.a);
    w.upload(d.w);
    offsets.upload(offsets_for(c.counts, c.convention));
    if (!d.scale.empty()) scale.upload(d.scale);
    out.poison();
    workspace.poison();  // kjit zeroes the tile counter before each launch
  }
  kjit_grouped_gemm_desc desc(const GemmCase& c, int64_t rows) const {
    kjit_grouped_gemm_desc g;
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = g.b_dtype = KJIT_DTYPE_BF16;
    g.out_dtype = c.out;
    g.rows = rows;
    g.n = c.n;
    g.k = c.k;
    g.experts = static_cast<int64_t>(c.counts.size());
    g.weights = c.weights;
    g.offsets_convention = c.convention;
    g.a = a.get();
    g.b = w.get();
    g.out = out.get();
    g.offsets = static_cast<const int32_t*>(offsets.get());
    g.row_scale = c.row_scale ? static_cast<const float*>(scale.get()) : nullptr;
    g.workspace = workspace.get();
    g.workspace_bytes = kjit_grouped_gemm_workspace_bytes();
    return g;
  }
};

// `g` run through `path`.
kjit_grouped_gemm_desc on_path(kjit_grouped_gemm_desc g, const KernelPath& path) {
  g.kernel = path.kernel;
  g.tile_m = path.tile_m;
  g.tile_n = path.tile_n;
  g.cluster = path.cluster;
  g.cluster_axis = path.cluster_axis;
  if (!path.workspace) {
    g.workspace = nullptr;
    g.workspace_bytes = 0;
  }
  return g;
}

// N 272 (17 gate/up groups: the last n-tile is partial in every path), uneven experts with empty ones and 11
// rows past the last offset.
GemmCase partial_tile_case(int64_t k, kjit_weight_layout weights, kjit_dtype out) {
  GemmCase c;
  c.n = 272;
  c.k = k;
  c.counts = {0, 37, 1, 0, 200, 64, 3, 130};
  c.extra_rows = 11;
  c.weights = weights;
  c.out = out;
  return c;
}

// Runs one case through every kernel path; checks the error bound and that
// rows past the last offset keep their poison.
void run_gemm(const GemmCase& c) {
  const int64_t routed = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
  const int64_t rows = routed + c.extra_rows;
  const auto d = gemm_inputs(c, rows);
  const auto ref = reference(c, d);
  GemmBuffers b(c, rows, d);
  for (const auto& path : kernel_paths()) {
    if (!runs(path, c)) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    const auto g = on_path(b.desc(c, rows), path);
    const auto out = grouped_gemm_output(g, b.out);
    const double err = relative_error(c.out, c.n, ref, out, routed);
    CHECK_MESSAGE(err <= 1e-2, "relative error ", err);
    const size_t row_bytes = static_cast<size_t>(c.n) * (c.out == KJIT_DTYPE_F32 ? 4 : 2);
    CHECK(touched_bytes(out, static_cast<size_t>(routed) * row_bytes, static_cast<size_t>(rows) * row_bytes) == 0);
  }
}

// The activation of one gate/up pair as kjit.h states it: the CPU reference's
// fp32 operations, which the device evaluates bit for bit.
float host_activation(kjit_activation activation, float gate, float up, float alpha, float limit) {
  return activation == KJIT_ACTIVATION_SILU_MUL ? kjit::reference::silu_mul(gate, up)
                                                : kjit::reference::swiglu_oai(gate, up, alpha, limit);
}

// The fused activation through every kernel path. The same path without it,
// fp32 out and no row scale, gives the exact accumulators h; the fused output
// must be activation(h[16g + i], h[16g + 8 + i]) * scale bit for bit (the CPU
// reference's fp32 operations, then one rounding to bf16), and within the GEMM
// bound of the float64 reference. Rows past the last offset keep their poison.
void run_activation(GemmCase c, kjit_activation activation, float alpha, float limit, float weight_gain) {
  const int64_t routed = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
  const int64_t rows = routed + c.extra_rows, out_n = c.n / 2;
  auto d = gemm_inputs(c, rows);
  for (auto& v : d.w) v = to_bf16(bf16_to_float(v) * weight_gain);  // products past the clamp's limit
  const auto ref = reference(c, d);  // float64, [routed][N], row scale included
  std::vector<double> ref_act;
  for (int64_t r = 0; r < routed; ++r)
    for (int64_t col = 0; col < out_n; ++col) {
      const int64_t gate = r * c.n + col / 8 * 16 + col % 8;
      const double s = c.row_scale ? d.scale[static_cast<size_t>(r)] : 1.0;
      ref_act.push_back(s * host_activation(activation, static_cast<float>(ref[gate] / s),
                                            static_cast<float>(ref[gate + 8] / s), alpha, limit));
    }
  GemmBuffers b(c, rows, d);
  const bool f32 = c.out == KJIT_DTYPE_F32;
  DeviceBuffer h(0, static_cast<size_t>(std::max<int64_t>(16, rows * c.n * 4)));
  for (const auto& path : kernel_paths()) {
    if (!runs(path, c)) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    auto g = on_path(b.desc(c, rows), path);
    auto plain = g;
    plain.out_dtype = KJIT_DTYPE_F32;
    plain.out = h.get();
    plain.row_scale = nullptr;
    const auto h_bytes = grouped_gemm_output(plain, h);
    g.activation = activation;
    g.activation_alpha = alpha;
    g.activation_limit = limit;
    const auto out = grouped_gemm_output(g, b.out);
    int64_t differ = 0;
    for (int64_t r = 0; r < routed; ++r)
      for (int64_t col = 0; col < out_n; ++col) {
        const int64_t gate = r * c.n + col / 8 * 16 + col % 8;
        const float s = c.row_scale ? d.scale[static_cast<size_t>(r)] : 1.0f;
        const float want = host_activation(activation, static_cast<float>(output_value(KJIT_DTYPE_F32, h_bytes, gate)),
                                           static_cast<float>(output_value(KJIT_DTYPE_F32, h_bytes, gate + 8)), alpha,
                                           limit) *
                           s;
        const double got = output_value(c.out, out, r * out_n + col);
        differ += f32 ? got != static_cast<double>(want) : to_bf16(static_cast<float>(got)) != to_bf16(want);
      }
    CHECK_MESSAGE(differ == 0, differ, " of ", routed * out_n,
                  " outputs differ from the activation of the unfused accumulators");
    const double err = relative_error(c.out, out_n, ref_act, out, routed);
    CHECK_MESSAGE(err <= 1e-2, "relative error against float64 ", err);
    const size_t row_bytes = static_cast<size_t>(out_n) * (f32 ? 4 : 2);
    CHECK(touched_bytes(out, static_cast<size_t>(routed) * row_bytes, b.out.bytes) == 0);
  }
}

// The addend through every kernel path. The same path without it, fp32 out,
// gives each product (times its row scale) in fp32, h; with a bf16 or fp32
// addend the output must be round(h + addend) (one fp32 add, then the one
// rounding to out's type) bit for bit, also where the addend is out itself.
// Rows past the last offset keep their poison (and the addend's are NaN:
// never read into a written row).
void run_addend(const GemmCase& c) {
  const int64_t routed = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
  const int64_t rows = routed + c.extra_rows;
  const auto d = gemm_inputs(c, rows);
  GemmBuffers b(c, rows, d);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::vector<float> addend(static_cast<size_t>(rows * c.n));
  std::vector<uint16_t> addend_bf16(addend.size());
  for (int64_t i = 0; i < rows * c.n; ++i) {
    addend[static_cast<size_t>(i)] = i < routed * c.n ? normal(rng()) : NAN;
    addend_bf16[static_cast<size_t>(i)] = to_bf16(addend[static_cast<size_t>(i)]);
  }
  const bool f32 = c.out == KJIT_DTYPE_F32;
  DeviceBuffer h(0, static_cast<size_t>(std::max<int64_t>(16, rows * c.n * 4)));
  DeviceBuffer addend_buffer(0, static_cast<size_t>(std::max<int64_t>(16, rows * c.n * 4)));
  for (const auto& path : kernel_paths()) {
    if (!runs(path, c)) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    const auto g = on_path(b.desc(c, rows), path);
    auto plain = g;
    plain.out_dtype = KJIT_DTYPE_F32;
    plain.out = h.get();
    const auto h_bytes = grouped_gemm_output(plain, h);
    for (const kjit_dtype addend_dtype : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32})
      for (const bool in_place : {false, true}) {
        if (in_place && addend_dtype != c.out) continue;
        const bool addend_f32 = addend_dtype == KJIT_DTYPE_F32;
        CAPTURE(addend_f32);
        CAPTURE(in_place);
        auto with = g;
        with.addend_dtype = addend_dtype;
        std::vector<uint8_t> out;
        DeviceBuffer& target = in_place ? b.out : addend_buffer;
        if (addend_f32) target.upload(addend); else target.upload(addend_bf16);
        with.addend = target.get();
        if (in_place) {
          REQUIRE_MESSAGE(kjit_grouped_gemm(&with, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
          REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, std::string(kjit_last_error_message()));
          out = b.out.download<uint8_t>(0, b.out.bytes);
        } else {
          out = grouped_gemm_output(with, b.out);
        }
        int64_t differ = 0;
        for (int64_t i = 0; i < routed * c.n; ++i) {
          const float add = addend_f32 ? addend[static_cast<size_t>(i)] : bf16_to_float(addend_bf16[static_cast<size_t>(i)]);
          const float want = static_cast<float>(output_value(KJIT_DTYPE_F32, h_bytes, i)) + add;
          const double got = output_value(c.out, out, i);
          differ += f32 ? got != static_cast<double>(want) : to_bf16(static_cast<float>(got)) != to_bf16(want);
        }
        CHECK_MESSAGE(differ == 0, differ, " of ", routed * c.n, " outputs differ from round(product + addend)");
        const size_t row_bytes = static_cast<size_t>(c.n) * (f32 ? 4 : 2);
        if (!in_place) CHECK(touched_bytes(out, static_cast<size_t>(routed) * row_bytes, b.out.bytes) == 0);
      }
  }
}

// The addend's cases at K `k`: both layouts and output types, a row scale with bf16 out.
void run_addend_cases(int64_t k) {
  for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
    for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
      GemmCase c = partial_tile_case(k, weights, out);
      c.row_scale = out == KJIT_DTYPE_BF16;
      CAPTURE(weights);
      CAPTURE(out);
      run_addend(c);
    }
}

// One fused activation's cases: both layouts and output types, a row scale on [E, N, K] weights. swiglu_oai with
// a limit of 2.5 and products of ~N(0, 9): many clamped gates and ups, both signs.
void run_activation_cases(kjit_activation activation) {
  for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
    for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
      GemmCase c = partial_tile_case(320, weights, out);
      c.row_scale = weights == KJIT_WEIGHTS_E_N_K;
      CAPTURE(weights);
      CAPTURE(out);
      if (activation == KJIT_ACTIVATION_SWIGLU_OAI)
        run_activation(c, activation, 1.702f, 2.5f, 3.0f);
      else
        run_activation(c, activation, 0.0f, 0.0f, 2.0f);
    }
}

// Uneven routing with empty experts on `weights`: both conventions, with and without a row scale, both outputs.
void run_uneven_cases(kjit_weight_layout weights) {
  for (auto convention : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO})
    for (bool scale : {false, true})
      for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
        GemmCase c;
        c.counts = {0, 37, 1, 0, 200, 64, 3, 130};
        c.extra_rows = 11;
        c.weights = weights;
        c.convention = convention;
        c.row_scale = scale;
        c.out = out;
        CAPTURE(convention);
        CAPTURE(scale);
        CAPTURE(out);
        run_gemm(c);
      }
}

}  // namespace

TEST_SUITE_BEGIN("grouped_gemm");

// The cases are split (by activation, by layout) so that a parallel run's longest case is about half as long.
TEST_CASE("fused SiLU-and-mul: every kernel path, layout, output type, row scale") {
  run_activation_cases(KJIT_ACTIVATION_SILU_MUL);
}

TEST_CASE("fused gpt-oss clamped SwiGLU: every kernel path, layout, output type, row scale") {
  run_activation_cases(KJIT_ACTIVATION_SWIGLU_OAI);
}

TEST_CASE("the fused activation with N a multiple of every tile and a tall expert (cluster paths)") {
  GemmCase c;
  c.n = 512;
  c.k = 256;
  c.counts = {300, 0, 17, 129};
  run_activation(c, KJIT_ACTIVATION_SILU_MUL, 0.0f, 0.0f, 2.0f);
}

TEST_CASE("an addend (bf16 or fp32, out itself or not): every kernel path, layout, output type and row scale") {
  run_addend_cases(320);
}

TEST_CASE("an addend at K a LoRA rank (16: the short-K kernel's), every kernel path, layout, output type and row "
          "scale") {
  run_addend_cases(16);
}


TEST_CASE("K a LoRA rank (8 to 32): every kernel path (the short-K kernel's among them), layout, convention, output "
          "type and row scale, a gathered A, bad offsets") {
  for (const int64_t k : {8, 16, 24, 32})
    for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
      for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
        GemmCase c = partial_tile_case(k, weights, out);
        c.n = k == 32 ? 1040 : 272;  // 1040: several column blocks of 256, the last partial
        c.row_scale = out == KJIT_DTYPE_BF16;
        c.convention = k == 24 ? KJIT_OFFSETS_WITH_LEADING_ZERO : KJIT_OFFSETS_CUMULATIVE_END;
        CAPTURE(k);
        CAPTURE(weights);
        CAPTURE(out);
        run_gemm(c);
      }
  GemmCase c = partial_tile_case(24, KJIT_WEIGHTS_E_K_N, KJIT_DTYPE_BF16);
  const int64_t rows = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0}) + c.extra_rows;
  const auto d = gemm_inputs(c, rows);
  GemmBuffers b(c, rows, d);
  const GatheredA a(rows, c.k, 8);
  for (const auto& path : kernel_paths()) {
    if (!runs(path, c)) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    check_gather_equals_copy(on_path(b.desc(c, rows), path), b.out, a);
    b.offsets.upload(std::vector<int32_t>{0, 37, 38, 38, 20, 302, 305, 435});  // decreasing at expert 4
    b.out.poison();
    check_bad_offsets_refused(on_path(b.desc(c, rows), path), b.out);
    b.offsets.upload(offsets_for(c.counts, c.convention));
  }
}

TEST_CASE("a fused activation is refused for 128 x 128 fp8 scales without their gate/up layout and for N not in "
          "whole gate/up groups") {
  GemmCase c;
  c.n = 264;  // 16.5 groups
  c.counts = {4};
  const auto d = gemm_inputs(c, 4);
  GemmBuffers b(c, 4, d);
  auto g = b.desc(c, 4);
  g.activation = KJIT_ACTIVATION_SILU_MUL;
  CHECK(kjit_grouped_gemm(&g, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("multiple of 16") != std::string::npos);
  g.n = 256;
  g.b_dtype = KJIT_DTYPE_F8_E4M3FN;  // W8A16 with DeepSeek's 128 x 128 blocks: they stay in the checkpoint's order,
  g.b_scale_granularity = KJIT_SCALE_PER_BLOCK;  // which the call must name
  g.b_block_rows = g.b_block_cols = 128;
  g.b_scale_convention = KJIT_SCALE_MULTIPLY;
  CHECK(kjit_grouped_gemm(&g, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("needs activation_gate_up_layout") != std::string::npos);
  g.b_dtype = KJIT_DTYPE_BF16;
  g.b_scale_granularity = KJIT_SCALE_INVALID;
  g.b_block_rows = g.b_block_cols = 0;
  g.b_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
  g.activation = KJIT_ACTIVATION_SWIGLU_OAI;
  g.activation_limit = NAN;
  CHECK(kjit_grouped_gemm(&g, nullptr) == KJIT_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("uneven routing with empty experts, [E, N, K] weights: every convention, scale and output type") {
  run_uneven_cases(KJIT_WEIGHTS_E_N_K);
}

TEST_CASE("uneven routing with empty experts, [E, K, N] weights: every convention, scale and output type") {
  run_uneven_cases(KJIT_WEIGHTS_E_K_N);
}

TEST_CASE("one expert owning every row, and a single expert") {
  GemmCase c;
  c.counts.assign(16, 0);
  c.counts[5] = 333;
  run_gemm(c);
  GemmCase single;
  single.counts = {77};
  single.n = 136;
  single.k = 72;
  run_gemm(single);
}

TEST_CASE("an expert taller than several raster bands (16 row tiles each), the last band partial") {
  GemmCase c;
  c.counts = {5, 4500, 0, 300};  // 36 tiles of 128 rows, 18 of 256: the last band partial either way
  c.n = 384;
  c.k = 128;
  run_gemm(c);
}

TEST_CASE("the smallest N and K, and row counts that are no multiple of any tile") {
  for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N}) {
    GemmCase c;
    c.n = 8;
    c.k = 8;
    c.counts = {5, 0, 12};
    c.weights = weights;
    run_gemm(c);
  }
}

TEST_CASE("256 experts with random counts") {
  GemmCase c;
  c.n = 64;
  c.k = 64;
  std::uniform_int_distribution<int> count(0, 12);
  for (int e = 0; e < 256; ++e) c.counts.push_back(count(rng()));
  run_gemm(c);
}

TEST_CASE("a gathered A (sorted_to_flat) gives the bytes of the GEMM on the gathered copy: every kernel path, K no "
          "multiple of the k-block, zero rows, a fused activation") {
  GemmCase c;
  c.k = 200;  // a last k-block of 8 columns: the gather zero-fills past K as TMA does
  c.counts = {37, 0, 130, 5, 64, 1, 0, 259};
  c.extra_rows = 5;
  const int64_t rows = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0}) + c.extra_rows;
  const auto d = gemm_inputs(c, rows);
  GemmBuffers b(c, rows, d);
  const GatheredA a(rows, c.k, 4);
  for (const auto& path : kernel_paths()) {
    if (!runs(path, c)) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    check_gather_equals_copy(on_path(b.desc(c, rows), path), b.out, a);
    auto fused = on_path(b.desc(c, rows), path);
    fused.activation = KJIT_ACTIVATION_SILU_MUL;
    check_gather_equals_copy(fused, b.out, a);
  }
}

TEST_CASE("a gather entry past tokens * top_k reads zeros and is reported") {
  GemmCase c;
  c.counts = {40, 0, 90};
  const int64_t rows = 130;
  const auto d = gemm_inputs(c, rows);
  GemmBuffers b(c, rows, d);
  GatheredA a(rows, c.k, 2);
  const int32_t bad = static_cast<int32_t>(a.tokens * a.top_k + 3);
  a.sorted_to_flat[77] = bad;
  std::fill_n(a.copy.begin() + 77 * c.k, c.k, uint16_t{0});
  a.upload();
  for (const auto& path : kernel_paths()) {
    if (!runs(path, c)) continue;
    const std::string path_name = path.name;
    CAPTURE(path_name);
    const auto g = on_path(b.desc(c, rows), path);
    const auto want = grouped_gemm_output(a.from_copy(g), b.out);
    b.out.poison();
    const auto gathering = a.gathering(g);
    REQUIRE_MESSAGE(kjit_grouped_gemm(&gathering, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
    CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
    CHECK(std::string(kjit_last_error_message()).find("flat index " + std::to_string(bad) + " past tokens * top_k") !=
          std::string::npos);
    CHECK(b.out.download<uint8_t>(0, b.out.bytes) == want);
  }
}

TEST_CASE("decreasing or out-of-range offsets write nothing and are reported") {
  GemmCase c;
  c.counts = {10, 20, 30};
  const auto d = gemm_inputs(c, 60);
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{10, 5, 60}, std::vector<int32_t>{10, 30, 61}}) {
    GemmBuffers b(c, 60, d);
    b.offsets.upload(bad);
    check_bad_offsets_refused(b.desc(c, 60), b.out);
  }
}

TEST_CASE("a captured grouped GEMM replays with per-expert counts changing between replays") {
  // The heuristic's kernel, and on Hopper swap AB, whose tile counter is
  // zeroed by a memset node captured before the kernel.
  std::vector<kjit_gemm_kernel> kernels{KJIT_GEMM_KERNEL_AUTO};
  if (is_hopper()) kernels.push_back(KJIT_GEMM_KERNEL_SM90_SWAP_AB);
  kernels.push_back(KJIT_GEMM_KERNEL_DECODE);  // the grid bounds the pairs by the captured row count
  for (const auto kernel : kernels) {
    CAPTURE(kernel);
    GemmCase c;
    c.counts = {50, 50, 50, 50};
    const int64_t rows = 200;
    auto d = gemm_inputs(c, rows);
    GemmBuffers b(c, rows, d);
    auto g = b.desc(c, rows);
    g.kernel = kernel;
    REQUIRE_MESSAGE(kjit_grouped_gemm_prepare(&g, 0) == KJIT_OK, std::string(kjit_last_error_message()));
    GraphCapture capture;
    const kjit_status captured = kjit_grouped_gemm(&g, capture.stream());
    capture.end();
    REQUIRE_MESSAGE(captured == KJIT_OK, std::string(kjit_last_error_message()));
    capture.instantiate();
    for (const std::vector<int32_t>& counts : {std::vector<int32_t>{0, 200, 0, 0}, {13, 77, 0, 110}, {199, 0, 1, 0}}) {
      c.counts = counts;
      d = gemm_inputs(c, rows);
      b.a.upload(d.a);
      b.w.upload(d.w);
      b.offsets.upload(offsets_for(c.counts, c.convention));
      b.out.poison();
      b.workspace.poison();
      capture.replay();
      const double err = relative_error(c.out, c.n, reference(c, d), b.out.download<uint8_t>(0, b.out.bytes), rows);
      CHECK_MESSAGE(err <= 1e-2, "relative error ", err);
    }
  }
}

TEST_CASE("the portable kernel forced on the same GPU agrees with the SM90 kernel on a multi-wave problem") {
  if (!is_hopper()) {
    MESSAGE("not a Hopper GPU: the SM90 kernel does not run here");
    return;
  }
  // ~3200 rows over 16 experts, N 2048, K 1024: several hundred tiles (more
  // than one per SM, so the persistent walk wraps), 16 k-blocks (the stage
  // ring wraps many times), in both layouts.
  for (auto weights : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N}) {
    GemmCase c;
    c.n = 2048;
    c.k = 1024;
    c.weights = weights;
    c.row_scale = true;
    std::uniform_int_distribution<int> count(0, 400);
    for (int e = 0; e < 16; ++e) c.counts.push_back(count(rng()));
    c.counts[3] = 0;
    const int64_t rows = std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0});
    const auto d = gemm_inputs(c, rows);
    GemmBuffers b(c, rows, d);
    auto g = b.desc(c, rows);
    // SM90 (the heuristic's), SM90 in clusters along M and along N, swap AB alone and in pairs, portable last.
    const KernelPath paths[] = {{"sm90, the heuristic's", KJIT_GEMM_KERNEL_AUTO, 0, 0, 0},
                                {"sm90 clusters along M", KJIT_GEMM_KERNEL_SM90, 128, 256, 2},
                                {"sm90 clusters along N", KJIT_GEMM_KERNEL_SM90, 128, 192, 2, KJIT_GEMM_CLUSTER_ALONG_N},
                                {"sm90 swap AB", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 256, 128, 1},
                                {"sm90 swap AB, pairs along N", KJIT_GEMM_KERNEL_SM90_SWAP_AB, 256, 128, 2,
                                 KJIT_GEMM_CLUSTER_ALONG_N},
                                {"portable", KJIT_GEMM_KERNEL_PORTABLE, 0, 0, 0}};
    std::vector<std::vector<uint8_t>> outputs;
    for (const auto& path : paths) {
      const std::string path_name = path.name;
      CAPTURE(path_name);
      g.kernel = path.kernel;
      g.tile_m = path.tile_m;
      g.tile_n = path.tile_n;
      g.cluster = path.cluster;
      g.cluster_axis = path.cluster_axis;
      outputs.push_back(grouped_gemm_output(g, b.out));
    }
    // Every output element: the kernels differ only in summation order and final rounding.
    const auto& portable = outputs.back();
    for (size_t sm90 = 0; sm90 + 1 < outputs.size(); ++sm90) {
      const double apart = disagreement(c.out, outputs[sm90], portable, rows * c.n);
      CHECK_MESSAGE(apart <= 1e-2, paths[sm90].name, " vs portable ", apart);
    }
    // And each against float64 on every 17th row.
    const auto ref = reference(c, d, 17);
    for (const auto& out : outputs) {
      const double err = relative_error(c.out, c.n, ref, out, rows, 17);
      CHECK_MESSAGE(err <= 1e-2, "relative error ", err);
    }
  }
}

TEST_SUITE_END();
