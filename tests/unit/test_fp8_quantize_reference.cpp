// The CPU reference of the fp8 activation quantizer against values computed
// by hand from kjit.h's statement of the arithmetic: these pin the recipe the
// GPU kernel must reproduce bit for bit.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kjit/reference/fp8_quantize.hpp"

using namespace kjit::reference;

namespace {

// One 128-value group from `head` values (exact in bf16), the rest `fill`.
std::vector<uint16_t> group_of(std::initializer_list<float> head, float fill = 0.0f) {
  std::vector<uint16_t> g(128, bf16_bits_rne(fill));
  size_t i = 0;
  for (float v : head) {
    REQUIRE((std::isnan(v) || bf16_to_float(bf16_bits_rne(v)) == v));
    g[i++] = bf16_bits_rne(v);
  }
  return g;
}

struct Quantized {
  std::array<uint8_t, 128> codes{};
  float scale = 0;
};

Quantized quantize(const std::vector<uint16_t>& group, bool ue8m0 = false) {
  Quantized q;
  q.scale = quantize_group(group, q.codes, ue8m0);
  return q;
}

}  // namespace

TEST_CASE("the e4m3fn encoder rounds to nearest even and saturates finite values and infinities to 448") {
  CHECK(encode_e4m3fn_satfinite(448.0f) == 0x7E);
  CHECK(encode_e4m3fn_satfinite(-448.0f) == 0xFE);
  CHECK(encode_e4m3fn_satfinite(463.0f) == 0x7E);
  CHECK(encode_e4m3fn_satfinite(1e30f) == 0x7E);
  CHECK(encode_e4m3fn_satfinite(-INFINITY) == 0xFE);
  CHECK(encode_e4m3fn_satfinite(NAN) == 0x7F);
  CHECK(encode_e4m3fn_satfinite(1.0f) == 0x38);
  CHECK(encode_e4m3fn_satfinite(1.0625f) == 0x38);   // halfway between 1 and 1.125: the even one
  CHECK(encode_e4m3fn_satfinite(1.1875f) == 0x3A);   // halfway between 1.125 and 1.25: the even one
  CHECK(encode_e4m3fn_satfinite(0x1p-9f) == 0x01);   // the smallest subnormal
  CHECK(encode_e4m3fn_satfinite(0x3p-10f) == 0x02);  // halfway between 1 and 2 x 2^-9: the even one
  CHECK(encode_e4m3fn_satfinite(0x1p-10f) == 0x00);  // halfway between 0 and 2^-9: the even one
  CHECK(encode_e4m3fn_satfinite(0x0.fp-6f) == 0x08);  // rounds up across the subnormal/normal boundary
  CHECK(encode_e4m3fn_satfinite(-0.0f) == 0x80);
  CHECK(encode_e4m3fn_satfinite(240.0f) == 0x77);
  CHECK(encode_e4m3fn_satfinite(232.0f) == 0x76);  // halfway between 224 and 240: the even one
  for (int code = 0; code < 256; ++code)            // every finite code round-trips
    if ((code & 0x7F) != 0x7F) CHECK(encode_e4m3fn_satfinite(decode_e4m3fn(static_cast<uint8_t>(code))) == code);
}

TEST_CASE("a group whose amax is 448 has scale 1 and the codes of its values") {
  const auto q = quantize(group_of({448.0f, -1.5f, 0.125f, 3.0f, 1.0625f, 0x1p-9f}));
  CHECK(q.scale == 1.0f);
  CHECK(q.codes[0] == 0x7E);
  CHECK(q.codes[1] == 0xBC);
  CHECK(q.codes[2] == 0x20);
  CHECK(q.codes[3] == 0x44);
  CHECK(q.codes[4] == 0x38);
  CHECK(q.codes[5] == 0x01);
  CHECK(q.codes[127] == 0x00);
  const auto negative = quantize(group_of({-448.0f, 2.0f}));
  CHECK(negative.scale == 1.0f);
  CHECK(negative.codes[0] == 0xFE);
  CHECK(negative.codes[1] == 0x40);
}

TEST_CASE("a group of ones has scale 1/448 in fp32 and every code 448 (0x7E)") {
  const auto q = quantize(group_of({}, 1.0f));
  CHECK(float_bits(q.scale) == float_bits(1.0f / 448.0f));
  for (uint8_t c : q.codes) CHECK(c == 0x7E);
}

TEST_CASE("values are divided by the fp32 scale, then rounded once") {
  // amax 7: scale = 7/448 = 1/64 exactly; 3.5 / (1/64) = 224 (0x76), -1 / (1/64) = -64 (0xE8).
  const auto q = quantize(group_of({7.0f, 3.5f, -1.0f}));
  CHECK(q.scale == 0.015625f);
  CHECK(q.codes[0] == 0x7E);
  CHECK(q.codes[1] == 0x76);
  CHECK(q.codes[2] == 0xE8);
}

TEST_CASE("an all-zero group gives zero codes and the eps-based scale, 2^-42 in UE8M0") {
  const auto q = quantize(group_of({}));
  CHECK(float_bits(q.scale) == float_bits(1e-10f / 448.0f));
  for (uint8_t c : q.codes) CHECK(c == 0x00);
  const auto u = quantize(group_of({}), true);
  CHECK(u.scale == 0x1p-42f);
  for (uint8_t c : u.codes) CHECK(c == 0x00);
  CHECK(quantize(group_of({-0.0f})).codes[0] == 0x80);  // the sign of zero is kept
}

TEST_CASE("UE8M0 rounds the scale up to a power of two and leaves powers of two alone") {
  CHECK(quantize(group_of({448.0f}), true).scale == 1.0f);
  CHECK(quantize(group_of({896.0f}), true).scale == 2.0f);
  // amax 450: 450/448 rounds up to 2; 450/2 = 225 -> 224 (0x76); 1/2 = 0.5 (0x30).
  const auto q = quantize(group_of({450.0f, 1.0f}), true);
  CHECK(q.scale == 2.0f);
  CHECK(q.codes[0] == 0x76);
  CHECK(q.codes[1] == 0x30);
  // amax 1: 1/448 = 2^-8.81 -> 2^-8; 1 * 256 = 256 (0x78).
  const auto ones = quantize(group_of({}, 1.0f), true);
  CHECK(ones.scale == 0x1p-8f);
  CHECK(ones.codes[0] == 0x78);
}

TEST_CASE("a group holding NaN or an infinity gets scale NaN and every code NaN") {
  for (float bad : {NAN, INFINITY, -INFINITY})
    for (bool ue8m0 : {false, true}) {
      const auto q = quantize(group_of({1.0f, bad, 448.0f}), ue8m0);
      CHECK(float_bits(q.scale) == 0x7FC00000u);
      for (uint8_t c : q.codes) CHECK(c == 0x7F);
    }
}

TEST_CASE("the gather reads input row sorted_to_flat[r] / top_k and writes zero rows for -1 and out-of-range entries") {
  constexpr int64_t k = 256, tokens = 3, top_k = 2;
  std::vector<uint16_t> in(static_cast<size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < k; ++c) in[static_cast<size_t>(t * k + c)] = bf16_bits_rne(static_cast<float>(t + 1) * (c % 2 ? 1 : -1));
  const std::vector<int32_t> sorted_to_flat = {5, 0, 3, -1, 6};  // tokens 2, 0, 1; no row; past tokens * top_k
  std::vector<uint8_t> codes(5 * k, 0xAA);
  std::vector<float> scales(5 * 2, -1.0f);
  fp8_quantize(in, k, 5, k, false, sorted_to_flat, tokens, top_k, codes, scales);
  CHECK(scales[0] == 3.0f / 448.0f);
  CHECK(scales[2] == 1.0f / 448.0f);
  CHECK(scales[4] == 2.0f / 448.0f);
  CHECK(codes[0] == 0xFE);
  CHECK(codes[1] == 0x7E);
  for (int64_t r : {3, 4}) {
    CHECK(scales[static_cast<size_t>(2 * r)] == 0.0f);
    CHECK(scales[static_cast<size_t>(2 * r + 1)] == 0.0f);
    for (int64_t c = 0; c < k; ++c) CHECK(codes[static_cast<size_t>(r * k + c)] == 0);
  }
}
