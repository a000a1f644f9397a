// The MX quantizer (NVFP4, MXFP4, MXFP8) on a real GPU against the CPU
// reference (kjit/reference/fp4_mx.hpp), bit for bit in codes, every scale
// byte (a swizzled layout's padding included) and NVFP4's computed global
// scales: every format and element, both scale layouts, given and computed
// global scales with either convention, odd shapes over several experts, wide
// dynamic range with planted rounding ties, NaN, inf, all-zero, huge and
// subnormal blocks, a padded input row stride, CUDA graph capture and replay
// of the computed-global-scale form, NVFP4 elements on and within a few ulps
// of every e2m1 boundary (the reciprocal fast path and its exact fallback),
// MXFP4 over every finite bf16 under every scale byte, and quantize ->
// dequant round trips within each format's bound, swizzled scales at
// unaligned addresses. Outputs start poisoned, so unwritten bytes fail.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp4_mx.hpp"

using namespace kjit::testing;
namespace reference = kjit::reference;

namespace {

// One quantize problem: the format's descriptor fields and its bf16 input.
struct Problem {
  kjit_block_format format = KJIT_BLOCK_FORMAT_UNSET;
  kjit_dtype element = KJIT_DTYPE_INVALID;
  kjit_scale_layout layout = KJIT_SCALE_LAYOUT_LINEAR;
  kjit_global_scale_mode mode = KJIT_GLOBAL_SCALE_UNSET;
  kjit_scale_convention convention = KJIT_SCALE_CONVENTION_UNSET;
  int64_t experts = 1, rows = 0, k = 0, stride = 0;  // stride 0: k
  std::vector<uint16_t> in;                          // bf16 [experts * rows, row_stride()]
  std::vector<float> given;                          // NVFP4 GIVEN: [experts]
  int64_t row_stride() const { return stride ? stride : k; }
  int64_t block() const { return format == KJIT_BLOCK_FORMAT_NVFP4 ? 16 : 32; }
  bool nvfp4() const { return format == KJIT_BLOCK_FORMAT_NVFP4; }
  int64_t out_bytes() const { return experts * rows * (format == KJIT_BLOCK_FORMAT_MXFP8 ? k : k / 2); }
  int64_t scale_bytes() const {
    return layout == KJIT_SCALE_LAYOUT_LINEAR ? experts * rows * (k / block())
                                              : experts * reference::swizzled_scale_bytes(rows, k / block());
  }
};

// The element formats' rounding ties and saturation at a block scale of 1
// (X = 1 for MX: the block's amax lies in [2^emax, 2^(emax+1)); NVFP4 with a
// global scale of 1 and amax 6: d = 1), and values that saturate.
std::vector<float> planted_ties(const Problem& p) {
  if (p.element == KJIT_DTYPE_F8_E4M3FN)  // amax 448 = 1.75 * 2^8: X = 1; e4m3's step is 1/8 at 1, 1/16 below
    return {448.0f, 1.0625f, 1.1875f, -1.0625f, 248.0f, 464.0f, 0.96875f, 0x3p-10f, 0x1p-10f, -0.0f, 449.0f, 3.0f};
  if (p.element == KJIT_DTYPE_F8_E5M2)  // amax 57344 = 1.75 * 2^15: X = 1; e5m2's step is 1/4 at 1
    return {57344.0f, 1.125f, 1.375f, -1.125f, 61440.0f, 0x3p-17f, 0x1p-17f, -0.0f, 65280.0f, 2.5f};
  // e2m1 (NVFP4 with amax 6 and global 1; MXFP4 with amax 6: floor(log2 6) = 2 = emax, X = 1)
  return {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f, -5.0f, -0.0f};
}

// Random values, normal(0, 1) times 2^e with e drawn per block from [-60, 60]
// (some blocks reach bf16 subnormals), then planted blocks along the first
// rows of every expert: all zero, the ties above, +inf, NaN, -inf, bf16's
// largest finite value with small neighbours, subnormals only. Padding past k
// holds a value that would change the block amax if it were read.
void fill(Problem& p) {
  const int64_t stride = p.row_stride(), block = p.block();
  p.in.assign(static_cast<size_t>(p.experts * p.rows * stride), reference::bf16_bits_rne(-30000.0f));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-60, 60);
  for (int64_t r = 0; r < p.experts * p.rows; ++r)
    for (int64_t b = 0; b < p.k / block; ++b) {
      const float magnitude = std::ldexp(1.0f, exponent(rng()));
      for (int64_t c = 0; c < block; ++c)
        p.in[static_cast<size_t>(r * stride + b * block + c)] = reference::bf16_bits_rne(normal(rng()) * magnitude);
    }
  const auto ties = planted_ties(p);
  const float inf = std::numeric_limits<float>::infinity();
  int64_t planted = 0;
  for (int64_t e = 0; e < p.experts; ++e)
    for (int64_t r = 0; r < std::min<int64_t>(p.rows, 7); ++r) {
      // One planted block per row, at a column that moves with the row.
      const int64_t b = (r * 5 + e) % (p.k / block);
      auto at = [&](int64_t c) -> uint16_t& { return p.in[static_cast<size_t>((e * p.rows + r) * stride + b * block + c)]; };
      for (int64_t c = 0; c < block; ++c) at(c) = reference::bf16_bits_rne(0.0f);
      switch ((r + e) % 7) {
        case 0: break;  // all zero
        case 1:
          for (size_t i = 0; i < ties.size() && static_cast<int64_t>(i) < block; ++i)
            at(static_cast<int64_t>(i)) = reference::bf16_bits_rne(ties[i]);
          break;
        case 2: at(block / 2) = reference::bf16_bits_rne(inf); at(0) = reference::bf16_bits_rne(1.0f); break;
        case 3: at(block - 1) = reference::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN()); break;
        case 4: at(1) = reference::bf16_bits_rne(-inf); break;
        case 5: at(2) = 0x7F7Fu; at(3) = reference::bf16_bits_rne(1e30f); at(4) = reference::bf16_bits_rne(-1.0f); break;
        case 6:
          for (int64_t c = 0; c < block; ++c) at(c) = static_cast<uint16_t>((c * 9 + 1) & 0x7F) | (c % 3 ? 0 : 0x8000);
          break;
      }
      ++planted;
    }
  CHECK(planted > 0);
  p.given.clear();
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  for (int64_t e = 0; e < p.experts; ++e)  // expert 0 gets 1: the planted NVFP4 ties land exactly (d = 1)
    p.given.push_back(e == 0 ? 1.0f : std::ldexp(unit(rng()), exponent(rng()) / 6));
}

struct Buffers {
  DeviceBuffer in, out, scales, global;
  explicit Buffers(const Problem& p)
      : in(0, std::max<size_t>(16, p.in.size() * 2)), out(0, static_cast<size_t>(std::max<int64_t>(16, p.out_bytes()))),
        scales(0, static_cast<size_t>(std::max<int64_t>(16, (p.scale_bytes() + 3) / 4 * 4))),
        global(0, static_cast<size_t>(std::max<int64_t>(4, p.experts * 4))) {
    upload(p);
  }
  void upload(const Problem& p) {
    if (!p.in.empty()) in.upload(p.in);
    out.poison();
    scales.poison();
    global.poison();
    if (p.mode == KJIT_GLOBAL_SCALE_GIVEN) global.upload(p.given);
  }
};

kjit_mx_quantize_desc describe(const Problem& p, const Buffers& b) {
  kjit_mx_quantize_desc d;
  kjit_mx_quantize_desc_init(&d);
  d.format = p.format;
  d.in_dtype = KJIT_DTYPE_BF16;
  d.element_dtype = p.element;
  d.experts = p.experts;
  d.rows = p.rows;
  d.k = p.k;
  d.in_row_stride = p.stride;
  d.scale_layout = p.layout;
  d.in = b.in.get();
  d.out = b.out.get();
  d.scales = static_cast<uint8_t*>(b.scales.get());
  if (p.nvfp4()) d.global_scales = static_cast<float*>(b.global.get());
  d.global_scale_mode = p.mode;
  d.global_scale_convention = p.convention;
  return d;
}

reference::MxQuantized expected(const Problem& p) {
  return reference::quantize_mx_stack(p.format, p.element, p.in, p.experts, p.rows, p.k, p.row_stride(), p.layout,
                                      p.mode, p.convention, p.given);
}

reference::MxQuantized downloaded(const Problem& p, const Buffers& b) {
  reference::MxQuantized got;
  got.out = b.out.download<uint8_t>(0, static_cast<size_t>(p.out_bytes()));
  got.scales = b.scales.download<uint8_t>(0, static_cast<size_t>(p.scale_bytes()));
  if (p.nvfp4()) got.global_scales = b.global.download<float>(0, static_cast<size_t>(p.experts));
  return got;
}

// The bytes (and global scales, by bits) that differ from the reference.
int64_t differences(const reference::MxQuantized& got, const reference::MxQuantized& want) {
  int64_t wrong = 0;
  for (size_t i = 0; i < want.out.size(); ++i) wrong += got.out[i] != want.out[i];
  for (size_t i = 0; i < want.scales.size(); ++i) wrong += got.scales[i] != want.scales[i];
  for (size_t i = 0; i < want.global_scales.size(); ++i)
    wrong += reference::float_bits(got.global_scales[i]) != reference::float_bits(want.global_scales[i]);
  return wrong;
}

// Runs `p` once on the default stream; returns what the device wrote.
reference::MxQuantized run(const Problem& p) {
  Buffers b(p);
  const auto d = describe(p, b);
  REQUIRE_MESSAGE(kjit_quantize_mx(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  return downloaded(p, b);
}

// Every format / element / global-scale form the op has.
std::vector<Problem> every_form() {
  std::vector<Problem> forms;
  for (auto mode : {KJIT_GLOBAL_SCALE_GIVEN, KJIT_GLOBAL_SCALE_COMPUTE})
    for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
      Problem p;
      p.format = KJIT_BLOCK_FORMAT_NVFP4;
      p.mode = mode;
      p.convention = convention;
      forms.push_back(p);
    }
  Problem mxfp4;
  mxfp4.format = KJIT_BLOCK_FORMAT_MXFP4;
  forms.push_back(mxfp4);
  for (auto element : {KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E5M2}) {
    Problem p;
    p.format = KJIT_BLOCK_FORMAT_MXFP8;
    p.element = element;
    forms.push_back(p);
  }
  return forms;
}

std::string name(const Problem& p) {
  return std::to_string(p.format) + "/" + std::to_string(p.element) + "/layout " + std::to_string(p.layout) +
         "/mode " + std::to_string(p.mode) + "/convention " + std::to_string(p.convention);
}

}  // namespace

TEST_SUITE_BEGIN("mx_quantize");

TEST_CASE("every format x layout x global-scale form is bit-exact on odd shapes (rows 1, 3, 129, 300 by k 32, 96, 2880)") {
  for (Problem form : every_form())
    for (auto layout : {KJIT_SCALE_LAYOUT_LINEAR, KJIT_SCALE_LAYOUT_SWIZZLED_128X4})
      for (int64_t rows : {1, 3, 129, 300})
        for (int64_t k : {32, 96, 2880}) {
          Problem p = form;
          p.layout = layout;
          p.rows = rows;
          p.k = k;
          p.experts = rows == 300 ? 1 : 3;
          p.stride = rows == 3 ? k + 24 : 0;  // a padded row stride: the padding must never be read
          fill(p);
          CAPTURE(name(p));
          CAPTURE(rows);
          CAPTURE(k);
          CHECK(differences(run(p), expected(p)) == 0);
        }
}

TEST_CASE("rounding ties go to the even code and values past the format's max saturate, checked by value") {
  // MXFP4, one row, K 32, amax 6 (X = 1): codes are the planted values' e2m1 codes themselves.
  Problem p;
  p.format = KJIT_BLOCK_FORMAT_MXFP4;
  p.rows = 1;
  p.k = 32;
  const std::vector<float> values{6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,  -0.25f, -0.75f, -1.25f,
                                  -1.75f, -2.5f, -3.5f, -5.0f, -0.0f, 5.5f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f};
  p.in.assign(32, reference::bf16_bits_rne(0.0f));
  for (size_t i = 0; i < values.size(); ++i) p.in[i] = reference::bf16_bits_rne(values[i]);
  const auto got = run(p);
  const std::vector<uint8_t> codes{0x7, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x8, 0xA, 0xA,
                                   0xC, 0xC, 0xE, 0xE, 0x8, 0x7, 0x1, 0x2, 0x3, 0x4, 0x5};
  for (size_t i = 0; i < codes.size(); ++i) {
    CAPTURE(i);
    CHECK(((got.out[i / 2] >> (4 * (i % 2))) & 0xF) == codes[i]);
  }
  CHECK(got.scales[0] == 127);  // X = 2^0
  CHECK(differences(got, expected(p)) == 0);

  // NVFP4 with global 1 (multiply): amax 6 gives scale e4m3(1.0) = 0x38, d = 1, the same codes.
  p.format = KJIT_BLOCK_FORMAT_NVFP4;
  p.mode = KJIT_GLOBAL_SCALE_GIVEN;
  p.convention = KJIT_SCALE_MULTIPLY;
  p.given = {1.0f};
  const auto nv = run(p);
  for (size_t i = 0; i < 16; ++i) CHECK(((nv.out[i / 2] >> (4 * (i % 2))) & 0xF) == codes[i]);
  CHECK(nv.scales[0] == 0x38);
  CHECK(differences(nv, expected(p)) == 0);
}

// NVFP4 codes come from x * (1 / d) corrected to RN(x / d) (nvfp4_codes); an
// uncorrected product errs exactly near e2m1 rounding boundaries, so here
// every element lands on or within a few fp32 ulps of a boundary of its
// block: expert e's global scale is g = 1 + (e - 24) * 2^-23, a block of row r
// holds amax 6 * 2^m and the boundaries +-{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}
// * 2^m (m = r - 6, all exact in bf16), so its scale decodes to 2^m and d =
// 2^m * g (MULTIPLY) or 2^m / g (DIVIDE): x / d is the boundary itself (e =
// 24) or |e - 24| * 1 to 2 of its ulps away, where one ulp decides the code.
// Two more experts: a global scale of 2^-130 (MULTIPLY: d an fp32 subnormal
// whose reciprocal overflows) and 1.5 * 2^127 (DIVIDE: d subnormal, its
// reciprocal normal but above 2^96), where every block divides, with the same
// boundaries times g or 1 / g.
TEST_CASE("NVFP4 is bit-exact on and within a few ulps of every e2m1 boundary (the reciprocal's exact path)") {
  const std::vector<float> boundaries{0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
    Problem p;
    p.format = KJIT_BLOCK_FORMAT_NVFP4;
    p.mode = KJIT_GLOBAL_SCALE_GIVEN;
    p.convention = convention;
    p.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    constexpr int64_t kNearExperts = 49;
    p.experts = kNearExperts + 1;
    p.rows = 15;
    p.k = 64;
    p.given.clear();
    for (int64_t e = 0; e < kNearExperts; ++e) p.given.push_back(1.0f + static_cast<float>(e - 24) * 0x1p-23f);
    const float extreme = convention == KJIT_SCALE_MULTIPLY ? 0x1p-130f : 0x1.8p127f;
    p.given.push_back(extreme);
    p.in.assign(static_cast<size_t>(p.experts * p.rows * p.k), 0);
    for (int64_t e = 0; e < p.experts; ++e) {
      const float unit = e < kNearExperts ? 1.0f : convention == KJIT_SCALE_MULTIPLY ? extreme : 1.0f / extreme;
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t b = 0; b < p.k / 16; ++b) {
          // amax first, the boundaries with both signs, then 5.5; rotated and negated per block so that the
          // amax and every boundary visit every lane position of the chunk.
          std::vector<float> block{6.0f};
          for (float v : boundaries) block.push_back(v);
          for (float v : boundaries) block.push_back(-v);
          block.push_back(5.5f);
          std::rotate(block.begin(), block.begin() + (r * 3 + b * 5) % 16, block.end());
          const float sign = (b + e) % 2 ? -1.0f : 1.0f;
          for (int64_t c = 0; c < 16; ++c)
            p.in[static_cast<size_t>((e * p.rows + r) * p.k + b * 16 + c)] = reference::bf16_bits_rne(
                sign * block[static_cast<size_t>(c)] * std::ldexp(1.0f, static_cast<int>(r) - 6) * unit);
        }
    }
    // What the data covers, from the reference's own d: elements on a boundary, within the kernel's margin
    // (1 to 15 ulps of x / d), and just past it (16 to 40).
    int64_t on = 0, inside = 0, past = 0;
    for (int64_t e = 0; e < kNearExperts; ++e)
      for (int64_t blk = 0; blk < p.rows * p.k / 16; ++blk) {
        const size_t first = static_cast<size_t>(e * p.rows * p.k + blk * 16);
        float amax = 0.0f;
        for (size_t i = first; i < first + 16; ++i) amax = std::max(amax, std::fabs(reference::bf16_to_float(p.in[i])));
        const float g = p.given[static_cast<size_t>(e)];
        const bool multiply = convention == KJIT_SCALE_MULTIPLY;
        const uint8_t scale = reference::encode_e4m3fn_satfinite(multiply ? amax / 6.0f / g : amax / 6.0f * g);
        const float d = multiply ? reference::decode_e4m3fn(scale) * g : reference::decode_e4m3fn(scale) / g;
        for (size_t i = first; i < first + 16; ++i) {
          const float z = std::fabs(reference::bf16_to_float(p.in[i]) / d);
          int64_t distance = INT64_MAX;
          for (float boundary : boundaries) {
            const int64_t apart = static_cast<int64_t>(reference::float_bits(z)) -
                                  static_cast<int64_t>(reference::float_bits(boundary));
            distance = std::min(distance, apart < 0 ? -apart : apart);
          }
          on += distance == 0;
          inside += distance > 0 && distance < 16;
          past += distance >= 16 && distance <= 40;
        }
      }
    CAPTURE(convention);
    CHECK(on > 100);
    CHECK(inside > 1000);
    CHECK(past > 500);
    CHECK(differences(run(p), expected(p)) == 0);
  }
}

// MXFP4's codes come from x * 2^(113 - s) rounded to f16 and rounded again in
// 16-bit lanes (e2m1x2_of_prescaled_f16x2): exact for every bf16 a block can
// hold. Every finite bf16 x here meets every scale byte s its block can have
// (0 to 252; x's exponent at most s - 125): blocks of 31 such values behind
// their amax 1.9921875 * 2^(s - 125), which pins the scale byte to s.
TEST_CASE("MXFP4 is bit-exact for every finite bf16 under every scale byte its block can have") {
  Problem p;
  p.format = KJIT_BLOCK_FORMAT_MXFP4;
  p.layout = KJIT_SCALE_LAYOUT_LINEAR;
  p.k = 32 * 64;
  std::vector<uint16_t> values;
  int64_t blocks = 0;
  for (int s = 0; s <= 252; ++s) {
    const int top = s - 125;  // the amax's exponent
    const uint16_t amax = static_cast<uint16_t>(((top + 127) << 7) | 0x7F);
    int in_block = 0;
    for (uint32_t h = 0; h < 0x10000u; ++h) {
      const float x = reference::bf16_to_float(static_cast<uint16_t>(h));
      if (!std::isfinite(x) || (x != 0.0f && std::ilogb(x) > top)) continue;
      if (in_block == 0) values.push_back(amax), ++in_block, ++blocks;
      values.push_back(static_cast<uint16_t>(h));
      if (++in_block == 32) in_block = 0;
    }
    while (in_block != 0) {  // fill the last block with zeros
      values.push_back(0);
      if (++in_block == 32) in_block = 0;
    }
  }
  while (values.size() % static_cast<size_t>(p.k) != 0) values.push_back(0);
  p.rows = static_cast<int64_t>(values.size()) / p.k;
  p.in = std::move(values);
  CHECK(blocks > 250000);
  const auto got = run(p), want = expected(p);
  CHECK(differences(got, want) == 0);
  int64_t scales_seen = 0;
  std::vector<bool> seen(256, false);
  for (uint8_t b : want.scales) seen[b] = true;
  for (bool b : seen) scales_seen += b;
  CHECK(scales_seen == 253);
}

TEST_CASE("NaN or inf blocks get a NaN scale and zero codes, all-zero blocks scale 0 / 2^-127, other blocks unaffected") {
  for (Problem form : every_form()) {
    Problem p = form;
    p.rows = 4;
    p.k = 64;
    p.in.assign(static_cast<size_t>(p.rows * p.k), reference::bf16_bits_rne(1.5f));
    p.given = {0.25f};
    const int64_t block = p.block(), cols = p.k / block;
    auto first = [&](int64_t row) { return p.in.begin() + row * p.k; };
    std::fill_n(first(0), block, reference::bf16_bits_rne(0.0f));
    first(1)[1] = reference::bf16_bits_rne(std::numeric_limits<float>::infinity());
    first(2)[2] = reference::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN());
    first(3)[3] = reference::bf16_bits_rne(-std::numeric_limits<float>::infinity());
    CAPTURE(name(p));
    const auto got = run(p);
    CHECK(differences(got, expected(p)) == 0);
    const uint8_t nan_scale = p.nvfp4() ? 0x7F : 0xFF;
    CHECK(got.scales[0] == 0x00);
    for (int64_t row = 1; row < 4; ++row) {
      CHECK(got.scales[static_cast<size_t>(row * cols)] == nan_scale);
      CHECK(got.scales[static_cast<size_t>(row * cols + 1)] != nan_scale);
      const int64_t out_row = p.format == KJIT_BLOCK_FORMAT_MXFP8 ? p.k : p.k / 2;
      const int64_t block_bytes = p.format == KJIT_BLOCK_FORMAT_MXFP8 ? block : block / 2;
      for (int64_t i = 0; i < block_bytes; ++i) CHECK(got.out[static_cast<size_t>(row * out_row + i)] == 0);
    }
    if (p.mode == KJIT_GLOBAL_SCALE_COMPUTE)  // the finite amax 1.5: inf and NaN are left out
      CHECK(got.global_scales[0] == (p.convention == KJIT_SCALE_MULTIPLY ? 1.5f / 2688.0f : 2688.0f / 1.5f));
  }
}

TEST_CASE("computed global scales: per expert, finite values only, 1.0 for an all-zero or all-NaN expert") {
  for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
    Problem p;
    p.format = KJIT_BLOCK_FORMAT_NVFP4;
    p.mode = KJIT_GLOBAL_SCALE_COMPUTE;
    p.convention = convention;
    p.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    p.experts = 4;
    p.rows = 130;
    p.k = 2880;
    fill(p);
    const int64_t per_expert = p.rows * p.k;
    std::fill_n(p.in.begin() + per_expert, per_expert, reference::bf16_bits_rne(0.0f));  // expert 1: all zero
    std::fill_n(p.in.begin() + 2 * per_expert, per_expert,
                reference::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN()));  // expert 2: NaN only
    p.in[static_cast<size_t>(3 * per_expert + 77)] = reference::bf16_bits_rne(1e20f);
    CAPTURE(convention);
    const auto got = run(p);
    const auto want = expected(p);
    CHECK(differences(got, want) == 0);
    CHECK(got.global_scales[1] == 1.0f);
    CHECK(got.global_scales[2] == 1.0f);
    // Expert 3's amax over its finite values, counted here from the data (fill plants huge values beside the 1e20).
    float amax = 0.0f;
    for (int64_t i = 0; i < per_expert; ++i) {
      const float x = reference::bf16_to_float(p.in[static_cast<size_t>(3 * per_expert + i)]);
      if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
    }
    CHECK(amax >= 1e20f);
    CHECK(got.global_scales[3] == (convention == KJIT_SCALE_MULTIPLY ? amax / 2688.0f : 2688.0f / amax));
  }
}

TEST_CASE("a swizzled layout writes every padding byte 0 and each expert at its 128-row-padded base") {
  for (Problem form : every_form()) {
    Problem p = form;
    p.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    p.experts = 3;
    p.rows = 5;
    p.k = p.block() * 3;  // 3 scale columns, padded to 4
    fill(p);
    CAPTURE(name(p));
    const auto got = run(p);
    CHECK(differences(got, expected(p)) == 0);
    // 3 experts x 128 x 4 bytes; only 5 x 3 per expert are real.
    REQUIRE(got.scales.size() == 3u * 128u * 4u);
    int64_t real = 0, zero_padding = 0;
    for (int64_t e = 0; e < 3; ++e)
      for (int64_t r = 0; r < 128; ++r)
        for (int64_t c = 0; c < 4; ++c) {
          const auto byte = got.scales[static_cast<size_t>(e * 512 + reference::swizzled_scale_offset(r, c, 3))];
          if (r < 5 && c < 3) ++real;
          else zero_padding += byte == 0;
        }
    CHECK(real == 15 * 3);
    CHECK(zero_padding == 3 * 512 - 15 * 3);
  }
}

// The swizzled layout's tiles go out as 16-byte stores when the scale pointer
// is 16-byte aligned and byte by byte otherwise (the op takes any address):
// here at offsets 1, 4 and 8 into a poisoned buffer, with two full 128-row
// bands plus a partial one and a padded last tile (6 scale columns of 8); the
// bytes around the layout keep their poison.
TEST_CASE("swizzled scales at an address that is not 16-byte aligned are bit-exact and stay in bounds") {
  for (Problem form : every_form())
    for (int64_t offset : {1, 4, 8}) {
      Problem p = form;
      p.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
      p.experts = 2;
      p.rows = 300;
      p.k = p.block() * 6;
      fill(p);
      CAPTURE(name(p));
      CAPTURE(offset);
      Buffers b(p);
      DeviceBuffer shifted(0, static_cast<size_t>((p.scale_bytes() + offset + 16 + 3) / 4 * 4));
      shifted.poison();
      auto d = describe(p, b);
      d.scales = static_cast<uint8_t*>(shifted.get()) + offset;
      REQUIRE_MESSAGE(kjit_quantize_mx(&d, nullptr) == KJIT_OK, kjit_last_error_message());
      REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
      auto got = downloaded(p, b);
      const auto all = shifted.download<uint8_t>(0, shifted.bytes);
      got.scales.assign(all.begin() + offset, all.begin() + offset + p.scale_bytes());
      CHECK(differences(got, expected(p)) == 0);
      auto poison_byte = [](size_t i) { return static_cast<uint8_t>(DeviceBuffer::kPoison >> (8 * (i % 4))); };
      int64_t clobbered = 0;
      for (size_t i = 0; i < all.size(); ++i)
        if (i < static_cast<size_t>(offset) || i >= static_cast<size_t>(offset + p.scale_bytes()))
          clobbered += all[i] != poison_byte(i);
      CHECK(clobbered == 0);
    }
}

TEST_CASE("no rows launches nothing: the outputs keep their poison") {
  Problem p;
  p.format = KJIT_BLOCK_FORMAT_NVFP4;
  p.mode = KJIT_GLOBAL_SCALE_COMPUTE;
  p.convention = KJIT_SCALE_MULTIPLY;
  p.experts = 2;
  p.k = 64;
  p.rows = 0;
  Buffers b(p);
  const auto d = describe(p, b);
  REQUIRE_MESSAGE(kjit_quantize_mx(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  CHECK(b.out.written_words() == 0);
  CHECK(b.scales.written_words() == 0);
  CHECK(b.global.written_words() == 0);
}

TEST_CASE("a prepared computed-global-scale quantize is captured into a CUDA graph and replays on new data") {
  for (auto layout : {KJIT_SCALE_LAYOUT_LINEAR, KJIT_SCALE_LAYOUT_SWIZZLED_128X4}) {
    Problem p;
    p.format = KJIT_BLOCK_FORMAT_NVFP4;
    p.mode = KJIT_GLOBAL_SCALE_COMPUTE;
    p.convention = KJIT_SCALE_DIVIDE;
    p.layout = layout;
    p.experts = 3;
    p.rows = 211;
    p.k = 2048;
    fill(p);
    Buffers b(p);
    const auto d = describe(p, b);
    REQUIRE_MESSAGE(kjit_quantize_mx_prepare(&d, 0) == KJIT_OK, kjit_last_error_message());
    auto unprepared = d;  // a kernel never prepared: capturing it must fail, not compile
    unprepared.k = 1024 + 16 * 7;

    GraphCapture capture;
    const kjit_status captured = kjit_quantize_mx(&d, capture.stream());
    const kjit_status refused = kjit_quantize_mx(&unprepared, capture.stream());
    capture.end();
    REQUIRE_MESSAGE(captured == KJIT_OK, kjit_last_error_message());
    CHECK(refused == KJIT_ERROR_CAPTURING);
    capture.instantiate();
    for (int replay = 0; replay < 3; ++replay) {
      fill(p);  // fresh data; the global scales must be recomputed from it on every replay
      b.upload(p);
      capture.replay();
      CAPTURE(replay);
      CHECK(differences(downloaded(p, b), expected(p)) == 0);
    }
  }
}

TEST_CASE("quantize -> reference dequant stays within each format's error bound") {
  // Bounds (test_fp4_mx_reference.cpp's round trips): |x - y| <= max(|x| * relative, block amax * floor).
  for (Problem form : every_form()) {
    Problem p = form;
    p.rows = 64;
    p.k = 512;
    p.experts = 2;
    p.layout = KJIT_SCALE_LAYOUT_LINEAR;
    // Blocks within 2^8 of each other, elements within 2^4 of their block's amax: NVFP4 scales stay normal.
    p.in.resize(static_cast<size_t>(p.experts * p.rows * p.k));
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(0, 8);
    for (size_t b = 0; b < p.in.size(); b += static_cast<size_t>(p.block())) {
      const float magnitude = std::ldexp(1.0f, exponent(rng()));
      for (size_t i = b; i < b + static_cast<size_t>(p.block()); ++i)
        p.in[i] = reference::bf16_bits_rne(unit(rng()) * magnitude);
    }
    // The recipe's global scale for this data's amax (< 256); computed forms find their own.
    const float global = p.convention == KJIT_SCALE_DIVIDE ? 2688.0f / 256.0f : 256.0f / 2688.0f;
    p.given = {global, global};
    CAPTURE(name(p));
    const auto got = run(p);
    CHECK(differences(got, expected(p)) == 0);
    double relative = 0.25, floor = 17.0 / 16.0 / 6.0 / 4.0;        // NVFP4: d <= amax / 6 * 17/16
    if (p.format == KJIT_BLOCK_FORMAT_MXFP4) floor = 0x1p-2 / 4.0;  // X <= amax / 4
    if (p.element == KJIT_DTYPE_F8_E4M3FN) relative = 0.125, floor = 0x1p-8 * 0x1p-10;
    if (p.element == KJIT_DTYPE_F8_E5M2) relative = 0.125, floor = 0x1p-15 * 0x1p-17;
    int failures = 0;
    for (int64_t e = 0; e < p.experts; ++e) {
      const int64_t n = p.rows * p.k, scale_cols = p.k / p.block();
      std::vector<float> out(static_cast<size_t>(n));
      const auto scales = std::span(got.scales).subspan(static_cast<size_t>(e * p.rows * scale_cols));
      if (p.nvfp4()) {
        const auto packed = std::span(got.out).subspan(static_cast<size_t>(e * n / 2));
        reference::dequant_nvfp4(packed, scales, p.rows, p.k, got.global_scales[static_cast<size_t>(e)], p.convention,
                                 out);
      } else if (p.format == KJIT_BLOCK_FORMAT_MXFP4) {
        reference::dequant_mxfp4(std::span(got.out).subspan(static_cast<size_t>(e * n / 2)), scales, p.rows, p.k, out);
      } else {
        reference::dequant_mxfp8(p.element, std::span(got.out).subspan(static_cast<size_t>(e * n)), scales, p.rows,
                                 p.k, out);
      }
      for (int64_t first = 0; first < n && failures < 5; first += p.block()) {
        double amax = 0.0;
        for (int64_t i = first; i < first + p.block(); ++i)
          amax = std::max(amax, std::fabs(double{reference::bf16_to_float(p.in[static_cast<size_t>(e * n + i)])}));
        for (int64_t i = first; i < first + p.block(); ++i) {
          const double x = reference::bf16_to_float(p.in[static_cast<size_t>(e * n + i)]);
          const double bound = std::max(std::fabs(x) * relative, amax * floor) * (1.0 + 0x1p-20);
          if (std::fabs(x - out[static_cast<size_t>(i)]) > bound) {
            ++failures;
            FAIL_CHECK("expert " << e << " element " << i << ": " << x << " came back as " << out[static_cast<size_t>(i)]);
          }
        }
      }
    }
  }
}

TEST_SUITE_END();
