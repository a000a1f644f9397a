// The W4A16 grouped GEMM (bf16 activations, NVFP4 / MXFP4 weights converted
// in the kernel) on a real GPU:
// - against the fp64 CPU reference of the converted weights
//   (kjit/reference/mixed_gemm.hpp) on fresh random data, to 1e-2 relative
//   error: both formats, NVFP4's global scale multiplied and divided, uneven
//   routing with empty experts, every row-tile bucket, K no multiple of the
//   128-element k-block (gpt-oss's 2880: scale runs off word boundaries, a
//   short last k-block), N no multiple of the 128-column tile, both offset
//   conventions, row scales, bf16 and fp32 out, rows past the last offset
//   untouched, and the portable kernel forced on the same GPU;
// - the conversion itself, exactly: rows of A that are unit vectors make each
//   output the weight as the kernels accumulate it (fp32 out): MXFP4's
//   converted weight, NVFP4's e2m1 x scale times its global multiplier in
//   fp32 (the accumulator takes the global), compared bit for bit over every
//   e2m1 code and the scale bytes' whole finite range (UE8M0 0x00 = 2^-127
//   included: bf16 subnormal products);
// - on Hopper, the default kernel bit for bit the bf16 swap-AB kernel of the
//   same row tile on the converted weights (NVFP4: on e2m1 x scale, fp32 out,
//   the global multiplied on the host);
// - graph capture and replay.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/mixed_gemm.hpp"

using namespace kjit::testing;

namespace {

constexpr double kTolerance = 1e-2;

struct Fp4Case {
  int64_t n = 256, k = 512;
  std::vector<int32_t> counts;  // rows per expert
  int64_t extra_rows = 0;       // rows of A past the last offset (must stay untouched)
  kjit_block_format format = KJIT_BLOCK_FORMAT_NVFP4;
  kjit_scale_convention convention = KJIT_SCALE_MULTIPLY;  // NVFP4's global
  kjit_expert_offsets offsets = KJIT_OFFSETS_CUMULATIVE_END;
  bool row_scale = false;
  kjit_dtype out = KJIT_DTYPE_BF16;
  kjit_weight_layout layout = KJIT_WEIGHTS_E_N_K;  // E_K_N: the stored [E, N, K / 2] read for dX (GEMM n, k swapped)

  int64_t experts() const { return static_cast<int64_t>(counts.size()); }
  int64_t routed() const { return std::accumulate(counts.begin(), counts.end(), int64_t{0}); }
  int64_t rows() const { return routed() + extra_rows; }
  int64_t out_bytes() const { return out == KJIT_DTYPE_F32 ? 4 : 2; }
  int64_t group() const { return format == KJIT_BLOCK_FORMAT_NVFP4 ? 16 : 32; }
  bool nvfp4() const { return format == KJIT_BLOCK_FORMAT_NVFP4; }
  // The stored tensor [E, R, C / 2] and its scale bytes [E, R, C / group].
  int64_t stored_rows() const { return layout == KJIT_WEIGHTS_E_N_K ? n : k; }
  int64_t stored_cols() const { return layout == KJIT_WEIGHTS_E_N_K ? k : n; }
  // Where the GEMM's W_e(n, k) lies in the stored order [R, C].
  int64_t stored_index(int64_t col, int64_t kk) const {
    return layout == KJIT_WEIGHTS_E_N_K ? col * k + kk : kk * n + col;
  }
};

struct Fp4Data {
  std::vector<uint16_t> a;  // bf16 bits [rows, K]
  std::vector<uint8_t> w;   // pairs [E, R, C / 2] (Fp4Case::stored_rows, stored_cols)
  std::vector<uint8_t> block_scales;  // [E, R, C / group]
  std::vector<float> global_scales, row_scale;
};

kjit::reference::MixedWeights weights_of(const Fp4Case& c, const Fp4Data& d) {
  kjit::reference::MixedWeights w{d.w, {}, KJIT_DTYPE_F4_E2M1, c.layout, KJIT_SCALE_INVALID,
                                  c.convention, c.experts(), c.n, c.k};
  w.format = c.format;
  w.block_scales = d.block_scales;
  w.global_scales = d.global_scales;
  return w;
}

// Expert e's weights as the tensor cores multiply them, fp32 values in the
// stored order [R, C]: e2m1 x group scale, exact in bf16 (NVFP4's global is
// left to the accumulator).
std::vector<float> tensor_core_weights(const Fp4Case& c, const Fp4Data& d, int64_t e) {
  const int64_t rows = c.stored_rows(), cols = c.stored_cols();
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t col = 0; col < cols; ++col) {
      const uint8_t pair = d.w[static_cast<size_t>(((e * rows + r) * cols + col) / 2)];
      const uint8_t code = col % 2 == 0 ? pair & 0xF : pair >> 4;
      const uint8_t scale = d.block_scales[static_cast<size_t>((e * rows + r) * (cols / c.group()) + col / c.group())];
      out[static_cast<size_t>(r * cols + col)] =
          c.nvfp4() ? kjit::reference::decode_e2m1(code) * kjit::reference::decode_e4m3fn(scale)
                    : kjit::reference::fp4_weight_value(c.format, code, scale, 1.0f, c.convention);
    }
  return out;
}

// NVFP4's global multiplier of expert e, as the kernels apply it (DIVIDE: the fp32 reciprocal).
float global_multiplier(const Fp4Case& c, const Fp4Data& d, int64_t e) {
  const float g = d.global_scales[static_cast<size_t>(e)];
  return c.convention == KJIT_SCALE_DIVIDE ? 1.0f / g : g;
}

// Expert e's weights as a unit-vector row of A reads them back (fp32 out):
// tensor_core_weights, NVFP4's times its global multiplier (one fp32 rounding).
std::vector<float> accumulated_weights(const Fp4Case& c, const Fp4Data& d, int64_t e) {
  auto out = tensor_core_weights(c, d, e);
  if (c.nvfp4())
    for (auto& v : out) v *= global_multiplier(c, d, e);
  return out;
}

// An fp32 output [rows, N] of the bf16 GEMM on tensor_core_weights, times each
// routed row's expert's global multiplier, as the NVFP4 kernels' epilogues do.
void multiply_by_globals(const Fp4Case& c, const Fp4Data& d, std::vector<uint8_t>& out) {
  int64_t row = 0;
  for (int64_t e = 0; e < c.experts(); ++e)
    for (int32_t i = 0; i < c.counts[static_cast<size_t>(e)]; ++i, ++row)
      for (int64_t n = 0; n < c.n; ++n) {
        float v;
        std::memcpy(&v, &out[static_cast<size_t>((row * c.n + n) * 4)], 4);
        v *= global_multiplier(c, d, e);
        std::memcpy(&out[static_cast<size_t>((row * c.n + n) * 4)], &v, 4);
      }
}

// Scale bytes of moderate size for the tolerance checks (NVFP4: e4m3fn
// 2^-2 .. 2^2 with random mantissas; MXFP4: 2^-3 .. 2^3), either way no zeros.
uint8_t moderate_scale(const Fp4Case& c) {
  std::uniform_int_distribution<int> exponent(5, 9), mantissa(0, 7), ue8m0(124, 130);
  if (c.nvfp4()) return static_cast<uint8_t>(exponent(rng()) << 3 | mantissa(rng()));
  return static_cast<uint8_t>(ue8m0(rng()));
}

Fp4Data fp4_inputs(const Fp4Case& c) {
  Fp4Data d;
  const int64_t rows = c.rows();
  std::normal_distribution<float> normal(0.0f, 1.0f);
  d.a.resize(static_cast<size_t>(rows * c.k));
  for (auto& v : d.a) {
    const float x = normal(rng());
    v = kjit::reference::bf16_bits_rne(x == 0.0f ? 1.0f : x);
  }
  std::uniform_int_distribution<int> byte(0, 255);
  d.w.resize(static_cast<size_t>(c.experts() * c.n * c.k / 2));
  for (auto& v : d.w) v = static_cast<uint8_t>(byte(rng()));  // every e2m1 code, both nibbles
  d.block_scales.resize(static_cast<size_t>(c.experts() * c.stored_rows() * (c.stored_cols() / c.group())));
  for (auto& s : d.block_scales) s = moderate_scale(c);
  std::uniform_real_distribution<float> log2_global(-2.0f, 2.0f);
  if (c.nvfp4()) {
    d.global_scales.resize(static_cast<size_t>(c.experts()));
    for (auto& g : d.global_scales) g = std::exp2(log2_global(rng()));
  }
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  d.row_scale.resize(static_cast<size_t>(rows));
  for (auto& v : d.row_scale) v = weight(rng());
  return d;
}

struct Fp4Buffers {
  DeviceBuffer a, w, block_scales, global_scales, row_scale, out, offsets, workspace;
  Fp4Buffers(const Fp4Case& c, const Fp4Data& d)
      : a(0, std::max<size_t>(16, d.a.size() * 2)), w(0, d.w.size()), block_scales(0, d.block_scales.size()),
        global_scales(0, std::max<size_t>(16, d.global_scales.size() * 4)),
        row_scale(0, std::max<size_t>(16, d.row_scale.size() * 4)),
        out(0, static_cast<size_t>(std::max<int64_t>(16, c.rows() * c.n * c.out_bytes()))),
        offsets(0, (c.counts.size() + 1) * 4), workspace(0, kjit_grouped_gemm_workspace_bytes()) {
    if (!d.a.empty()) a.upload(d.a);
    w.upload(d.w);
    block_scales.upload(d.block_scales);
    if (!d.global_scales.empty()) global_scales.upload(d.global_scales);
    if (!d.row_scale.empty()) row_scale.upload(d.row_scale);
    offsets.upload(offsets_for(c.counts, c.offsets));
    workspace.poison();
    out.poison();
  }
  kjit_grouped_gemm_desc desc(const Fp4Case& c) const {
    kjit_grouped_gemm_desc g;
    kjit_grouped_gemm_desc_init(&g);
    g.a_dtype = KJIT_DTYPE_BF16;
    g.b_dtype = KJIT_DTYPE_F4_E2M1;
    g.out_dtype = c.out;
    g.rows = c.rows();
    g.n = c.n;
    g.k = c.k;
    g.experts = c.experts();
    g.weights = c.layout;
    g.offsets_convention = c.offsets;
    g.a = a.get();
    g.b = w.get();
    g.out = out.get();
    g.offsets = static_cast<const int32_t*>(offsets.get());
    g.row_scale = c.row_scale ? static_cast<const float*>(row_scale.get()) : nullptr;
    g.workspace = workspace.get();
    g.workspace_bytes = kjit_grouped_gemm_workspace_bytes();
    g.b_format = c.format;
    g.b_block_scales = static_cast<const uint8_t*>(block_scales.get());
    g.b_global_scales = c.nvfp4() ? static_cast<const float*>(global_scales.get()) : nullptr;
    g.b_scale_convention = c.nvfp4() ? c.convention : KJIT_SCALE_CONVENTION_UNSET;
    return g;
  }
};

// One case on every mixed_kernel_paths kernel, each against
// the reference; rows past the last offset keep their poison.
void run_fp4_gemm(const Fp4Case& c) {
  const auto d = fp4_inputs(c);
  const auto offsets = offsets_for(c.counts, c.offsets);
  const auto ref = kjit::reference::mixed_grouped_gemm(
      d.a, weights_of(c, d), offsets, c.offsets,
      c.row_scale ? std::span<const float>(d.row_scale) : std::span<const float>());
  Fp4Buffers b(c, d);
  const auto row_bytes = static_cast<size_t>(c.n * c.out_bytes());
  for (const auto& path : mixed_kernel_paths(is_hopper(), c.layout, true)) {
    CAPTURE(path.kernel);
    CAPTURE(path.tile_m);
    auto g = b.desc(c);
    g.kernel = path.kernel;
    g.tile_m = path.tile_m;
    const auto out = grouped_gemm_output(g, b.out);
    const double err = relative_error(c.out, c.n, ref, out, c.routed());
    CHECK_MESSAGE(err <= kTolerance, "relative error ", err);
    CHECK(touched_bytes(out, static_cast<size_t>(c.routed()) * row_bytes, static_cast<size_t>(c.rows()) * row_bytes) ==
          0);
  }
}

}  // namespace

TEST_SUITE_BEGIN("grouped_gemm_mixed");

TEST_CASE("W4A16: both formats, NVFP4's global multiplied and divided, uneven routing with empty experts") {
  for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4})
    for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
      if (format == KJIT_BLOCK_FORMAT_MXFP4 && convention == KJIT_SCALE_DIVIDE) continue;
      CAPTURE(format);
      CAPTURE(convention);
      Fp4Case c;
      c.counts = {0, 37, 1, 0, 200, 64, 3, 130};
      c.extra_rows = 11;
      c.format = format;
      c.convention = convention;
      run_fp4_gemm(c);
    }
}

TEST_CASE("W4A16 read [E, K, N] (the stored [E, N, K / 2] for the backward pass's dX): both formats, uneven "
          "routing with empty experts, N no multiple of the 128-column tile, K of the 64-row stage") {
  for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4}) {
    CAPTURE(format);
    Fp4Case c;
    c.layout = KJIT_WEIGHTS_E_K_N;
    c.format = format;
    c.convention = format == KJIT_BLOCK_FORMAT_NVFP4 ? KJIT_SCALE_DIVIDE : KJIT_SCALE_MULTIPLY;
    c.n = 160;  // the stored rows' length (pairs, scale groups): the checkpoint's K
    c.k = 208;  // the stored rows: the checkpoint's N
    c.counts = {70, 0, 300, 1, 129};
    c.extra_rows = 3;
    c.out = format == KJIT_BLOCK_FORMAT_NVFP4 ? KJIT_DTYPE_F32 : KJIT_DTYPE_BF16;
    run_fp4_gemm(c);
  }
}

TEST_CASE("W4A16 with a gathered A (sorted_to_flat): the bytes of the GEMM on the gathered copy, every row tile, "
          "the portable kernel, gpt-oss's K = 2880 (short last k-block)") {
  for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4}) {
    CAPTURE(format);
    Fp4Case c;
    c.k = 2880;
    c.counts = {0, 37, 1, 0, 200, 64, 3, 130};
    c.extra_rows = 11;
    c.format = format;
    const auto d = fp4_inputs(c);
    Fp4Buffers b(c, d);
    const GatheredA a(c.rows(), c.k, 4);
    check_gather_on_mixed_paths(b.desc(c), b.out, a, is_hopper());
  }
}

TEST_CASE("W4A16: every row-tile bucket, gpt-oss's K = N = 2880 (short last k-block, unaligned scale runs), "
          "both readings of the stored stack, row scales") {
  for (auto layout : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
    for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4})
      for (int per_expert : {3, 48, 150}) {
        CAPTURE(layout);
        CAPTURE(format);
        CAPTURE(per_expert);
        Fp4Case c;
        c.layout = layout;
        c.format = format;
        c.n = 2880;
        c.k = 2880;
        c.counts = {per_expert, 0, per_expert + 5, per_expert / 2, 0};
        c.extra_rows = 2;
        c.row_scale = per_expert == 48;
        run_fp4_gemm(c);
      }
}

TEST_CASE("W4A16: K of one k-block and of a short one (the converter kernel's consumers convert only a tile's "
          "first stage, none ahead)") {
  for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4})
    for (int64_t k : {64, 32}) {
      CAPTURE(format);
      CAPTURE(k);
      Fp4Case c;
      c.format = format;
      c.convention = format == KJIT_BLOCK_FORMAT_NVFP4 ? KJIT_SCALE_DIVIDE : KJIT_SCALE_MULTIPLY;
      c.n = 272;                        // two full 128-column tiles and a partial one
      c.k = k;
      c.counts = {70, 0, 300, 1, 129};  // row tiles of several heights
      c.extra_rows = 3;
      run_fp4_gemm(c);
    }
}

TEST_CASE("W4A16: both offset conventions, row scales, bf16 and fp32 out, one row alone") {
  for (auto offsets : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO})
    for (bool row_scale : {false, true})
      for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
        CAPTURE(offsets);
        CAPTURE(row_scale);
        CAPTURE(out);
        Fp4Case c;
        c.counts = {5, 0, 99, 17};
        c.extra_rows = 4;
        c.n = 144;  // one full 128-column tile and a partial one
        c.k = 352;  // two k-blocks and a short third
        c.offsets = offsets;
        c.row_scale = row_scale;
        c.out = out;
        c.format = row_scale ? KJIT_BLOCK_FORMAT_MXFP4 : KJIT_BLOCK_FORMAT_NVFP4;
        run_fp4_gemm(c);
      }
  Fp4Case single;
  single.counts = {0, 1, 0};
  single.extra_rows = 5;
  single.row_scale = true;
  run_fp4_gemm(single);
}

TEST_CASE("W4A16 conversion is exact: unit-vector rows read every converted weight back, bit for bit") {
  // Row r of A is the unit vector e_(r % K) and routes to expert r / K, so out[r, n] (fp32) = w_e(n, r % K)
  // exactly: one product by 1.0 and zeros (every weight finite).
  for (auto layout : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
    for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4})
      for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
        if (format == KJIT_BLOCK_FORMAT_MXFP4 && convention == KJIT_SCALE_DIVIDE) continue;
        for (const auto& path : mixed_kernel_paths(is_hopper(), layout, true)) {
          CAPTURE(layout);
          CAPTURE(format);
          CAPTURE(convention);
          CAPTURE(path.kernel);
          CAPTURE(path.tile_m);
          Fp4Case c;
          c.layout = layout;
          c.format = format;
          c.convention = convention;
          c.n = layout == KJIT_WEIGHTS_E_N_K ? 160 : 224;  // the stored rows 160 x 224 elements either way
          c.k = layout == KJIT_WEIGHTS_E_N_K ? 224 : 160;
          c.counts = {static_cast<int32_t>(c.k), static_cast<int32_t>(c.k)};
          c.out = KJIT_DTYPE_F32;
          auto d = fp4_inputs(c);
          std::fill(d.a.begin(), d.a.end(), uint16_t{0});
          for (int64_t r = 0; r < c.rows(); ++r) d.a[static_cast<size_t>(r * c.k + r % c.k)] = 0x3F80;  // 1.0
          // Scale bytes over the whole finite range: e4m3fn 0x00 .. 0x7E (subnormals, zero, 448), UE8M0 0x00 ..
          // 0xFC (2^-127 .. 2^125: 6 x 2^125 is still finite).
          std::uniform_int_distribution<int> nvfp4_byte(0, 0x7E), mx_byte(0, 0xFC);
          for (auto& s : d.block_scales) s = static_cast<uint8_t>(c.nvfp4() ? nvfp4_byte(rng()) : mx_byte(rng()));
          d.block_scales[0] = 0x00;
          d.block_scales[1] = c.nvfp4() ? 0x7E : 0xFC;
          Fp4Buffers b(c, d);
          auto g = b.desc(c);
          g.kernel = path.kernel;
          g.tile_m = path.tile_m;
          const auto out = grouped_gemm_output(g, b.out);
          int64_t mismatches = 0;
          for (int64_t e = 0; e < c.experts(); ++e) {
            const auto converted = accumulated_weights(c, d, e);
            for (int64_t kk = 0; kk < c.k; ++kk)
              for (int64_t n = 0; n < c.n; ++n) {
                float got;
                std::memcpy(&got, &out[static_cast<size_t>(((e * c.k + kk) * c.n + n) * 4)], 4);
                const float want = converted[static_cast<size_t>(c.stored_index(n, kk))];
                uint32_t got_bits, want_bits;
                std::memcpy(&got_bits, &got, 4);
                std::memcpy(&want_bits, &want, 4);
                // +0 and -0 sum to +0 in the accumulator: compare values for zeros, bits otherwise.
                if (want == 0.0f ? got != 0.0f : got_bits != want_bits) ++mismatches;
              }
          }
          CHECK(mismatches == 0);
        }
      }
}

TEST_CASE("W4A16 on Hopper: bit for bit the bf16 swap-AB kernel of the same row tile on the converted weights") {
  if (!is_hopper()) {
    MESSAGE("skipped: the SM90 kernels need a Hopper GPU");
    return;
  }
  for (auto layout : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N})
    for (auto format : {KJIT_BLOCK_FORMAT_NVFP4, KJIT_BLOCK_FORMAT_MXFP4})
      for (int per_expert : {6, 100}) {
        CAPTURE(layout);
        CAPTURE(format);
        CAPTURE(per_expert);
        Fp4Case c;
        c.layout = layout;
        c.format = format;
        c.n = 384;
        c.k = 1024;
        c.counts = {per_expert, 0, 2 * per_expert + 1, 7};
        // NVFP4: fp32 out, so that the global's multiply can be repeated on the host bit for bit.
        if (c.nvfp4()) c.out = KJIT_DTYPE_F32;
        const auto d = fp4_inputs(c);
        Fp4Buffers b(c, d);
        // The weights the tensor cores multiply, as bf16 in the stored order (exact: e2m1 x group scale).
        std::vector<uint16_t> bf16_weights;
        for (int64_t e = 0; e < c.experts(); ++e)
          for (float v : tensor_core_weights(c, d, e)) bf16_weights.push_back(kjit::reference::bf16_bits_rne(v));
        DeviceBuffer wb(0, bf16_weights.size() * 2);
        wb.upload(bf16_weights);
        auto g = b.desc(c);
        g.b_dtype = KJIT_DTYPE_BF16;
        g.b = wb.get();
        g.b_format = KJIT_BLOCK_FORMAT_UNSET;
        g.b_block_scales = nullptr;
        g.b_global_scales = nullptr;
        g.b_scale_convention = KJIT_SCALE_CONVENTION_UNSET;
        g.kernel = KJIT_GEMM_KERNEL_SM90_SWAP_AB;
        g.tile_n = 128;
        // The register-operand kernel ([E, N, K] only) at the tile its bucket picks (32 up to 32 rows per expert,
        // 64 to 64, else 128), and the converter kernel at 64 and 256 (the bf16 kernel reading [E, K, N] like it).
        const int64_t average = c.rows() / c.experts();
        const int32_t bucket_tile = average <= 32 ? 32 : average <= 64 ? 64 : 128;
        std::vector<MixedKernelPath> paths{{KJIT_GEMM_KERNEL_SM90_CONVERTER, 64},
                                           {KJIT_GEMM_KERNEL_SM90_CONVERTER, 256}};
        if (layout == KJIT_WEIGHTS_E_N_K) paths.push_back({KJIT_GEMM_KERNEL_SM90, bucket_tile});
        for (const auto& path : paths) {
          CAPTURE(path.kernel);
          CAPTURE(path.tile_m);
          auto f = b.desc(c);
          f.kernel = path.kernel;
          f.tile_m = path.tile_m;
          const auto fp4 = grouped_gemm_output(f, b.out);
          g.tile_m = path.tile_m;
          auto want = grouped_gemm_output(g, b.out);
          if (c.nvfp4()) multiply_by_globals(c, d, want);
          CHECK(fp4 == want);
        }
      }
}

TEST_CASE("W4A16 captured in a graph replays with new routing") {
  Fp4Case c;
  c.counts = {40, 0, 88};
  c.extra_rows = 8;
  auto d = fp4_inputs(c);
  Fp4Buffers b(c, d);
  auto g = b.desc(c);
  REQUIRE(kjit_grouped_gemm_prepare(&g, 0) == KJIT_OK);
  GraphCapture graph;
  REQUIRE(kjit_grouped_gemm(&g, graph.stream()) == KJIT_OK);
  graph.end();
  graph.instantiate();
  Fp4Case replayed = c;
  replayed.counts = {1, 120, 7};  // same total rows
  b.offsets.upload(offsets_for(replayed.counts, replayed.offsets));
  b.out.poison();
  graph.replay();
  const auto out = b.out.download<uint8_t>(0, static_cast<size_t>(c.rows() * c.n * c.out_bytes()));
  const auto ref = kjit::reference::mixed_grouped_gemm(d.a, weights_of(replayed, d),
                                                       offsets_for(replayed.counts, replayed.offsets),
                                                       replayed.offsets, std::span<const float>());
  const double err = relative_error(c.out, c.n, ref, out, replayed.routed());
  CHECK_MESSAGE(err <= kTolerance, "relative error ", err);
}

TEST_SUITE_END();
