// The CPU reference of NVFP4, MXFP4 and MXFP8 (kjit/reference/fp4_mx.hpp)
// against values computed by hand from the format definitions and
// ../shared/FORMATS.md's scale layouts: these pin what the GPU kernels of
// issue 17 must reproduce bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "kjit/reference/fp4_mx.hpp"

using namespace kjit::reference;

namespace {

// Packs e2m1 codes two per byte, the even element in the low nibble, written
// out here rather than through the reference so that the tests check it.
std::vector<uint8_t> pack(const std::vector<uint8_t>& codes) {
  std::vector<uint8_t> packed(codes.size() / 2);
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<uint8_t>(codes[2 * i] | codes[2 * i + 1] << 4);
  return packed;
}

// fp32 values exact in bf16 (what a bf16 checkpoint or activation holds): a
// magnitude drawn per block over 2^-20 .. 2^20 times [-1, 1], a few exact zeros,
// and one block in eight spanning 2^12 within itself (tiny elements beside big ones).
std::vector<float> random_bf16_values(size_t count, size_t block, unsigned seed, int min_exponent = -20,
                                      int max_exponent = 20) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> block_exponent(min_exponent, max_exponent);
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> spread(0, 12);
  std::vector<float> values(count);
  for (size_t b = 0; b < count / block; ++b) {
    const int e = block_exponent(rng);
    const bool wide = b % 8 == 7;
    for (size_t i = 0; i < block; ++i) {
      const float x = i % 11 == 5 ? 0.0f : std::ldexp(unit(rng), wide ? e - spread(rng) : e);
      values[b * block + i] = bf16_to_float(bf16_bits_rne(x));
    }
  }
  return values;
}

}  // namespace

// ------------------------------------------------------------------ decoders

TEST_CASE("the sixteen e2m1 codes are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, 0x8 being -0") {
  const std::array<float, 16> want = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    CAPTURE(int{code});
    CHECK(float_bits(decode_e2m1(code)) == float_bits(want[code]));  // bits: tells -0 from +0
  }
  CHECK(std::signbit(decode_e2m1(0x8)));
  CHECK(!std::signbit(decode_e2m1(0x0)));
}

TEST_CASE("packed e2m1 pairs hold the even element in the low nibble") {
  const std::vector<uint8_t> packed = {0x2F, 0x71};  // elements 0xF, 0x2, 0x1, 0x7
  CHECK(e2m1_code_at(packed, 0) == 0xF);
  CHECK(e2m1_code_at(packed, 1) == 0x2);
  CHECK(e2m1_code_at(packed, 2) == 0x1);
  CHECK(e2m1_code_at(packed, 3) == 0x7);
  // The same bytes through a dequant: -6, 1, 0.5, 6 (scale 1 = 0x7F, 32 elements).
  std::vector<uint8_t> row(16, 0x00);
  row[0] = 0x2F;
  row[1] = 0x71;
  std::vector<float> out(32);
  dequant_mxfp4(row, std::vector<uint8_t>{0x7F}, 1, 32, out);
  CHECK(out[0] == -6.0f);
  CHECK(out[1] == 1.0f);
  CHECK(out[2] == 0.5f);
  CHECK(out[3] == 6.0f);
}

TEST_CASE("UE8M0 byte e is 2^(e - 127): 0x00 is 2^-127 exactly (not zero), 0xFE is 2^127, 0xFF is NaN") {
  CHECK(decode_ue8m0(0x00) == std::ldexp(1.0f, -127));
  CHECK(float_bits(decode_ue8m0(0x00)) == 0x00400000u);  // the fp32 subnormal 2^-127: mantissa bit 22 alone
  CHECK(decode_ue8m0(0x00) > 0.0f);
  CHECK(decode_ue8m0(0x01) == std::ldexp(1.0f, -126));
  CHECK(decode_ue8m0(0x7F) == 1.0f);
  CHECK(decode_ue8m0(0x80) == 2.0f);
  CHECK(decode_ue8m0(0x7C) == 0.125f);
  CHECK(float_bits(decode_ue8m0(0xFE)) == 0x7F000000u);  // 2^127: biased exponent 254, mantissa 0
  CHECK(std::isnan(decode_ue8m0(0xFF)));
}

// ------------------------------------------------------------------ dequant

TEST_CASE("an NVFP4 block is e2m1 times its e4m3 scale, then one IEEE multiply or divide by the global scale") {
  // Block 0 (elements 0..15): codes -6, 1, 0.5, 6, +0, -0, 1.5, -2, then zeros; scale 0x44 = 1.5 * 2^(8-7) = 3.
  // Block 1 (elements 16..31): code 0x5 (3) at element 16, scale 0x7E = 448.
  std::vector<uint8_t> codes(32, 0x0);
  const std::array<uint8_t, 8> head = {0xF, 0x2, 0x1, 0x7, 0x0, 0x8, 0x3, 0xC};
  std::copy(head.begin(), head.end(), codes.begin());
  codes[16] = 0x5;
  const auto packed = pack(codes);
  const std::vector<uint8_t> scales = {0x44, 0x7E};
  std::vector<float> out(32);

  // Global 0.5 as a multiplier: e2m1 * 3 * 0.5.
  dequant_nvfp4(packed, scales, 1, 32, 0.5f, KJIT_SCALE_MULTIPLY, out);
  const std::array<float, 8> multiplied = {-9.0f, 1.5f, 0.75f, 9.0f, 0.0f, -0.0f, 2.25f, -3.0f};
  for (size_t i = 0; i < multiplied.size(); ++i) CHECK(float_bits(out[i]) == float_bits(multiplied[i]));
  CHECK(out[16] == 672.0f);  // 3 * 448 * 0.5

  // Global 0.5 as a divisor (compressed-tensors): e2m1 * 3 / 0.5.
  dequant_nvfp4(packed, scales, 1, 32, 0.5f, KJIT_SCALE_DIVIDE, out);
  const std::array<float, 8> divided = {-36.0f, 6.0f, 3.0f, 36.0f, 0.0f, -0.0f, 9.0f, -12.0f};
  for (size_t i = 0; i < divided.size(); ++i) CHECK(float_bits(out[i]) == float_bits(divided[i]));

  // Global 0.1f: 3 * 448 = 1344 exactly, then ONE rounding of 1344 * 0.1f
  // (= 134.40000200..., fp32 134.400009). Folding the global into the block
  // scale first rounds twice: fp32(448 * 0.1f) = 44.7999992, * 3 -> 134.399994.
  dequant_nvfp4(packed, scales, 1, 32, 0.1f, KJIT_SCALE_MULTIPLY, out);
  CHECK(float_bits(out[16]) == float_bits(static_cast<float>(1344.0 * static_cast<double>(0.1f))));
  volatile float folded_scale = 448.0f * 0.1f;  // volatile: one fp32 rounding here, whatever the optimiser
  CHECK(out[16] != folded_scale * 3.0f);
}

TEST_CASE("an NVFP4 scale of NaN, or a global-scale convention left unset, dequantises to NaN") {
  const std::vector<uint8_t> packed(8, 0x00);  // all +0: NaN still comes out
  std::vector<float> out(16);
  dequant_nvfp4(packed, std::vector<uint8_t>{0x7F}, 1, 16, 1.0f, KJIT_SCALE_MULTIPLY, out);
  for (float v : out) CHECK(std::isnan(v));
  dequant_nvfp4(packed, std::vector<uint8_t>{0x38}, 1, 16, 1.0f, KJIT_SCALE_CONVENTION_UNSET, out);
  for (float v : out) CHECK(std::isnan(v));
}

TEST_CASE("an MXFP4 element is e2m1 times 2^(scale - 127), exact down to 2^-128 and infinite past fp32's range") {
  CHECK(mx_value(decode_e2m1(0x7), 0x81) == 24.0f);                   // 6 * 2^2
  CHECK(mx_value(decode_e2m1(0xB), 0x7C) == -0.1875f);                // -1.5 * 2^-3
  CHECK(mx_value(decode_e2m1(0x1), 0x00) == std::ldexp(1.0f, -128));  // 0.5 * 2^-127: a subnormal, not 0
  CHECK(mx_value(decode_e2m1(0x1), 0x00) > 0.0f);
  CHECK(mx_value(decode_e2m1(0x2), 0xFE) == std::ldexp(1.0f, 127));  // 1 * 2^127
  CHECK(float_bits(mx_value(decode_e2m1(0x3), 0xFE)) == 0x7F400000u);  // 1.5 * 2^127, still finite
  CHECK(mx_value(decode_e2m1(0x4), 0xFE) == INFINITY);                 // 2 * 2^127 = 2^128 > FLT_MAX
  CHECK(mx_value(decode_e2m1(0xF), 0xFE) == -INFINITY);
  CHECK(mx_value(decode_e2m1(0x0), 0xFE) == 0.0f);
  for (uint8_t code = 0; code < 16; ++code) CHECK(std::isnan(mx_value(decode_e2m1(code), 0xFF)));
}

TEST_CASE("an MXFP8 element is its e4m3fn or e5m2 value times 2^(scale - 127)") {
  std::vector<float> out(32);
  std::vector<uint8_t> codes(32, 0x00);
  codes[0] = 0x7E;  // e4m3fn 448
  codes[1] = 0x01;  // e4m3fn 2^-9
  codes[2] = 0xBC;  // e4m3fn -1.5
  dequant_mxfp8(KJIT_DTYPE_F8_E4M3FN, codes, std::vector<uint8_t>{0x80}, 1, 32, out);
  CHECK(out[0] == 896.0f);
  CHECK(out[1] == 0x1p-8f);
  CHECK(out[2] == -3.0f);
  dequant_mxfp8(KJIT_DTYPE_F8_E4M3FN, codes, std::vector<uint8_t>{0x00}, 1, 32, out);
  CHECK(out[1] == std::ldexp(1.0f, -136));  // 2^-9 * 2^-127, exact
  codes[0] = 0x7B;                          // e5m2 57344
  codes[1] = 0x7C;                          // e5m2 +inf
  codes[2] = 0x01;                          // e5m2 2^-16
  dequant_mxfp8(KJIT_DTYPE_F8_E5M2, codes, std::vector<uint8_t>{0x7F}, 1, 32, out);
  CHECK(out[0] == 57344.0f);
  CHECK(out[1] == INFINITY);
  CHECK(out[2] == 0x1p-16f);
  dequant_mxfp8(KJIT_DTYPE_F8_E5M2, codes, std::vector<uint8_t>{0xFF}, 1, 32, out);
  for (float v : out) CHECK(std::isnan(v));
}

// ----------------------------------------------------------------- encoders

TEST_CASE("the e2m1 encoder rounds to nearest even, keeps the sign of zero and saturates to 6") {
  CHECK(encode_e2m1_satfinite(0.25f) == 0x0);  // ties: to the even code
  CHECK(encode_e2m1_satfinite(0.75f) == 0x2);
  CHECK(encode_e2m1_satfinite(1.25f) == 0x2);
  CHECK(encode_e2m1_satfinite(1.75f) == 0x4);
  CHECK(encode_e2m1_satfinite(2.5f) == 0x4);
  CHECK(encode_e2m1_satfinite(3.5f) == 0x6);
  CHECK(encode_e2m1_satfinite(5.0f) == 0x6);
  CHECK(encode_e2m1_satfinite(-5.0f) == 0xE);
  CHECK(encode_e2m1_satfinite(0.26f) == 0x1);
  CHECK(encode_e2m1_satfinite(5.01f) == 0x7);
  CHECK(encode_e2m1_satfinite(6.5f) == 0x7);
  CHECK(encode_e2m1_satfinite(1e30f) == 0x7);
  CHECK(encode_e2m1_satfinite(-INFINITY) == 0xF);
  CHECK(encode_e2m1_satfinite(-0.0f) == 0x8);
  CHECK(encode_e2m1_satfinite(-0.1f) == 0x8);
  for (uint8_t code = 0; code < 16; ++code) CHECK(encode_e2m1_satfinite(decode_e2m1(code)) == code);
  // Every multiple of 1/64 in [-8, 8]: the code is a nearest one (an even one on a tie), 6 beyond.
  for (int i = -512; i <= 512; ++i) {
    const float x = static_cast<float>(i) / 64.0f;
    const uint8_t code = encode_e2m1_satfinite(x);
    const float err = std::fabs(decode_e2m1(code) - std::clamp(x, -6.0f, 6.0f));
    CAPTURE(x);
    for (uint8_t other = 0; other < 16; ++other) {
      const float other_err = std::fabs(decode_e2m1(other) - std::clamp(x, -6.0f, 6.0f));
      CHECK(err <= other_err);
      if (err == other_err && decode_e2m1(other) != decode_e2m1(code)) CHECK((code & 1) == 0);
    }
  }
}

TEST_CASE("the e5m2 encoder rounds to nearest even and saturates finite values and infinities to 57344") {
  CHECK(encode_e5m2_satfinite(57344.0f) == 0x7B);
  CHECK(encode_e5m2_satfinite(61440.0f) == 0x7B);  // halfway to 65536: saturates, never inf
  CHECK(encode_e5m2_satfinite(-INFINITY) == 0xFB);
  CHECK(encode_e5m2_satfinite(NAN) == 0x7F);
  CHECK(encode_e5m2_satfinite(1.125f) == 0x3C);    // halfway between 1 and 1.25: the even one
  CHECK(encode_e5m2_satfinite(1.375f) == 0x3E);    // halfway between 1.25 and 1.5: the even one
  CHECK(encode_e5m2_satfinite(0x1p-17f) == 0x00);  // halfway between 0 and 2^-16
  CHECK(encode_e5m2_satfinite(0x3p-17f) == 0x02);  // halfway between 1 and 2 x 2^-16
  CHECK(encode_e5m2_satfinite(0x0.fp-14f) == 0x04);  // rounds up across the subnormal/normal boundary
  for (int code = 0; code < 256; ++code)             // every finite code round-trips
    if ((code & 0x7C) != 0x7C) CHECK(encode_e5m2_satfinite(decode_e5m2(static_cast<uint8_t>(code))) == code);
}

// ---------------------------------------------------------------- quantizers

TEST_CASE("an NVFP4 block's scale is e4m3(amax / 6 / global) and its codes the nearest-even e2m1 of x / scale") {
  // amax 12, global 1: scale 12 / 6 = 2 = e4m3 0x40; d = 2. x / d: 12 -> 6 (0x7), 3 -> 1.5 (0x3),
  // -5 -> -2.5, a tie: -2 (0xC); 1 -> 0.5 (0x1); 0.5 -> 0.25, a tie: 0 (0x0); 7 -> 3.5, a tie: 4 (0x6);
  // -0 -> 0x8; 2.5 -> 1.25, a tie: 1 (0x2). Bytes (odd element high): 0x37, 0x1C, 0x60, 0x28, then zeros.
  std::array<float, 16> block{};
  const std::array<float, 8> head = {12.0f, 3.0f, -5.0f, 1.0f, 0.5f, 7.0f, -0.0f, 2.5f};
  std::copy(head.begin(), head.end(), block.begin());
  std::array<uint8_t, 8> packed{};
  CHECK(quantize_nvfp4_block(block, 1.0f, KJIT_SCALE_MULTIPLY, packed) == 0x40);
  CHECK(packed == std::array<uint8_t, 8>{0x37, 0x1C, 0x60, 0x28, 0x00, 0x00, 0x00, 0x00});

  // amax 10, global 2 as a divisor: 10 / 6 = 1.6666666 (fp32), * 2 = 3.3333333 -> e4m3 1.625 * 2 = 3.25
  // (0x45: mantissa 5.33 eighths rounds to 5); d = 3.25 / 2 = 1.625. 10 / 1.625 = 6.15 saturates to 6 (0x7),
  // -4 / 1.625 = -2.46 -> -2 (0xC), 1 / 1.625 = 0.615 -> 0.5 (0x1).
  // Global 0.5 as a multiplier means the same: the same bytes.
  block = {};
  block[0] = 10.0f;
  block[1] = -4.0f;
  block[2] = 1.0f;
  CHECK(quantize_nvfp4_block(block, 2.0f, KJIT_SCALE_DIVIDE, packed) == 0x45);
  CHECK(packed == std::array<uint8_t, 8>{0xC7, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  CHECK(quantize_nvfp4_block(block, 0.5f, KJIT_SCALE_MULTIPLY, packed) == 0x45);
  CHECK(packed == std::array<uint8_t, 8>{0xC7, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});
  CHECK(nvfp4_value(0x7, 0x45, 2.0f, KJIT_SCALE_DIVIDE) == 9.75f);  // what the 10 comes back as
}

// The kernel's division-free RN(amax / 6) (templates/common/mx_encode.cuh,
// bf16_over_6): q0 = RN(a * RN(1/6)), corrected once by fma with the exact
// residual, equals the IEEE quotient for every finite non-negative bf16 a.
TEST_CASE("RN(a / 6) of every finite non-negative bf16 a is one multiply and two fmas (the quantizer's block scale)") {
  const float sixth = 1.0f / 6.0f;
  int differ = 0, checked = 0;
  for (uint32_t h = 0; h < 0x7F80u; ++h) {
    const float a = bf16_to_float(static_cast<uint16_t>(h));
    const float q0 = a * sixth;
    const float q1 = std::fma(std::fma(-q0, 6.0f, a), sixth, q0);
    differ += float_bits(q1) != float_bits(a / 6.0f);
    ++checked;
  }
  CHECK(checked == 32640);
  CHECK(differ == 0);
}

// The NVFP4 quantizer's e2m1 encoder (templates/common/mx_encode.cuh,
// e2m1_code_plus_2p23): the smallest of fma(y, 2, 2^23), y + (2^23 + 2) and
// fma(min(y, 6), 0.5, 2^23 + 4), as bits, is 0x4B000000 + the e2m1 code of y.
// All 2^31 - 2^23 finite y >= 0 were checked once on the CPU (20 s); here a
// stride through all of them, and every float within 4096 ulps of each
// rounding boundary, of each code's value and of the saturation point.
TEST_CASE("the kernel's e2m1 encoder by three fp32 adds and a min equals encode_e2m1_satfinite") {
  auto kernel_code = [](float y) {
    const uint32_t below_two = float_bits(std::fma(y, 2.0f, 0x1p23f));
    const uint32_t two_to_four = float_bits(y + (0x1p23f + 2.0f));
    const uint32_t from_four = float_bits(std::fma(std::min(y, 6.0f), 0.5f, 0x1p23f + 4.0f));
    return std::min({below_two, two_to_four, from_four});
  };
  int64_t checked = 0, wrong = 0;
  auto check = [&](uint32_t bits) {
    const float y = std::bit_cast<float>(bits);
    const uint32_t got = kernel_code(y);
    wrong += (got & ~7u) != 0x4B000000u || (got & 7u) != encode_e2m1_satfinite(y);
    ++checked;
  };
  for (uint32_t bits = 0; bits < 0x7F800000u; bits += 997) check(bits);
  for (float point : {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f})
    for (int64_t ulps = -4096; ulps <= 4096; ++ulps) check(static_cast<uint32_t>(float_bits(point) + ulps));
  check(0x7F7FFFFFu);  // the largest float saturates
  CHECK(checked > 2000000);
  CHECK(wrong == 0);
}

// The NVFP4 quantizer's quotient (templates/common/mx_encode.cuh,
// quotient_from_reciprocal): for a bf16 a and r = RN(1 / d), q0 = RN(a r)
// corrected once, RN(q0 + (a - d q0) r), is the IEEE quotient RN(a / d). The
// computation scales exactly with a's and d's exponents (within the range the
// kernel guards), so significands decide: all 2^30 pairs of bf16's 128 and
// fp32's 2^23 were checked once on the CPU (10 s); here every bf16
// significand against a stride of d's and every d within 256 ulps of a / b
// for each e2m1 rounding boundary b (the quotients whose code one ulp decides).
TEST_CASE("RN(a / d) of a bf16 a from RN(1 / d) and one fma correction is the IEEE quotient") {
  int64_t checked = 0, wrong = 0, uncorrected_wrong = 0;
  auto check = [&](float a, float d) {
    const float r = 1.0f / d;
    const float q0 = a * r;
    const float q = std::fma(std::fma(-q0, d, a), r, q0);
    wrong += float_bits(q) != float_bits(a / d);
    uncorrected_wrong += float_bits(q0) != float_bits(a / d);
    ++checked;
  };
  for (int s = 0; s < 128; ++s) {
    const float a = 1.0f + static_cast<float>(s) / 128.0f;
    for (uint32_t d_significand = 0; d_significand < (1u << 23); d_significand += 61)
      check(a, std::bit_cast<float>(0x3F800000u | d_significand));
    for (float boundary : {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f})
      for (int64_t ulps = -256; ulps <= 256; ++ulps)
        check(a, std::bit_cast<float>(static_cast<uint32_t>(float_bits(a / boundary) + ulps)));
  }
  CHECK(checked > 17000000);
  CHECK(uncorrected_wrong > checked / 10);  // the correction is needed
  CHECK(wrong == 0);
}

TEST_CASE("an MXFP4 block's scale is 2^(floor(log2 amax) - 2) and values above 6 times it saturate") {
  // amax 13 = 1.625 * 2^3: E = 3 - 2 = 1, byte 128 (0x80), X = 2. x / 2: 13 -> 6.5 saturates (0x7),
  // 12 -> 6 (0x7), -3 -> -1.5 (0xB), 0.5 -> 0.25, a tie: 0 (0x0), 1.5 -> 0.75, a tie: 1 (0x2),
  // 7 -> 3.5, a tie: 4 (0x6), -0.25 -> -0.125: -0 (0x8), 5 -> 2.5, a tie: 2 (0x4).
  // Bytes: 0x77, 0x0B, 0x62, 0x48, then zeros; back: 12, 12, -3, 0, 2, 8, -0, 4.
  std::array<float, 32> block{};
  const std::array<float, 8> head = {13.0f, 12.0f, -3.0f, 0.5f, 1.5f, 7.0f, -0.25f, 5.0f};
  std::copy(head.begin(), head.end(), block.begin());
  std::array<uint8_t, 16> packed{};
  CHECK(quantize_mxfp4_block(block, packed) == 0x80);
  CHECK(packed == std::array<uint8_t, 16>{0x77, 0x0B, 0x62, 0x48});
  std::vector<float> out(32);
  dequant_mxfp4(packed, std::vector<uint8_t>{0x80}, 1, 32, out);
  const std::array<float, 8> back = {12.0f, 12.0f, -3.0f, 0.0f, 2.0f, 8.0f, -0.0f, 4.0f};
  for (size_t i = 0; i < back.size(); ++i) CHECK(float_bits(out[i]) == float_bits(back[i]));

  CHECK(mx_scale_byte(6.0f, kE2m1) == 0x7F);     // floor(log2 6) = 2: X = 1, 6 kept exactly
  CHECK(mx_scale_byte(8.0f, kE2m1) == 0x80);     // floor(log2 8) = 3: X = 2, 8 -> 4 exactly
  CHECK(mx_scale_byte(7.99f, kE2m1) == 0x7F);    // X = 1: 7.99 saturates to 6, as the OCP rule has it
  CHECK(mx_scale_byte(0x1p-140f, kE2m1) == 0x00);  // E = -142 clamps to -127
  CHECK(mx_scale_byte(0x1.fp127f, kE5m2) == 0xFE - 15);  // E = 127 - 15
}

TEST_CASE("an MXFP8 block's scale is 2^(floor(log2 amax) - 8) for e4m3fn and - 15 for e5m2, codes saturating") {
  // amax 1000 = 1.95 * 2^9. e4m3fn: E = 1 (0x80); 1000 / 2 = 500 saturates to 448 (0x7E); 3 / 2 = 1.5 (0x3C).
  // e5m2: E = -6 (0x79); 1000 * 64 = 64000 saturates to 57344 (0x7B); 3 * 64 = 192 = 1.5 * 2^7 (0x5A).
  std::array<float, 32> block{};
  block[0] = 1000.0f;
  block[1] = 3.0f;
  std::array<uint8_t, 32> codes{};
  CHECK(quantize_mxfp8_block(KJIT_DTYPE_F8_E4M3FN, block, codes) == 0x80);
  CHECK(codes[0] == 0x7E);
  CHECK(codes[1] == 0x3C);
  CHECK(codes[2] == 0x00);
  CHECK(quantize_mxfp8_block(KJIT_DTYPE_F8_E5M2, block, codes) == 0x79);
  CHECK(codes[0] == 0x7B);
  CHECK(codes[1] == 0x5A);
}

TEST_CASE("a block holding NaN or an infinity gets a NaN scale (0x7F e4m3, 0xFF UE8M0) and zero codes") {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    CAPTURE(bad);
    std::array<float, 32> block{};
    block.fill(1.0f);
    block[3] = bad;
    std::array<uint8_t, 16> packed{};
    packed.fill(0xAA);
    CHECK(quantize_nvfp4_block(std::span(block).first(16), 1.0f, KJIT_SCALE_MULTIPLY, packed) == 0x7F);
    for (size_t i = 0; i < 8; ++i) CHECK(packed[i] == 0x00);
    CHECK(quantize_mxfp4_block(block, packed) == 0xFF);
    for (uint8_t byte : packed) CHECK(byte == 0x00);
    std::array<uint8_t, 32> codes{};
    CHECK(quantize_mxfp8_block(KJIT_DTYPE_F8_E5M2, block, codes) == 0xFF);
    for (uint8_t code : codes) CHECK(code == 0x00);
  }
}

TEST_CASE("an all-zero block gets scale 0 (NVFP4) or 2^-127 (MX, byte 0x00) and zero codes") {
  std::array<float, 32> block{};
  std::array<uint8_t, 16> packed{};
  packed.fill(0xAA);
  CHECK(quantize_nvfp4_block(std::span(block).first(16), 1.0f, KJIT_SCALE_MULTIPLY, packed) == 0x00);
  for (size_t i = 0; i < 8; ++i) CHECK(packed[i] == 0x00);
  CHECK(quantize_mxfp4_block(block, packed) == 0x00);
  for (uint8_t byte : packed) CHECK(byte == 0x00);
}

TEST_CASE("the computed NVFP4 global scale is finite amax / 2688 (multiply) or 2688 / amax (divide), 1 when none") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> values{0.5f, -896.0f, 3.0f, -0.0f};
  CHECK(nvfp4_global_scale(values, KJIT_SCALE_MULTIPLY) == 896.0f / 2688.0f);
  CHECK(nvfp4_global_scale(values, KJIT_SCALE_DIVIDE) == 2688.0f / 896.0f);
  CHECK(nvfp4_global_scale(std::vector<float>{-3.0f}, KJIT_SCALE_MULTIPLY) == 3.0f / 2688.0f);
  // NaN and infinities are left out of the amax: only their own blocks are marked (NaN scales).
  const std::vector<float> with_non_finite{1.5f, nan, -inf, inf, -12.0f};
  CHECK(nvfp4_global_scale(with_non_finite, KJIT_SCALE_MULTIPLY) == 12.0f / 2688.0f);
  CHECK(nvfp4_global_scale(with_non_finite, KJIT_SCALE_DIVIDE) == 2688.0f / 12.0f);
  // Nothing finite and non-zero: 1.0.
  for (const auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
    CHECK(nvfp4_global_scale(std::vector<float>{0.0f, -0.0f}, convention) == 1.0f);
    CHECK(nvfp4_global_scale(std::vector<float>{nan, inf, 0.0f}, convention) == 1.0f);
    CHECK(nvfp4_global_scale(std::vector<float>{}, convention) == 1.0f);
  }
  // The recipe keeps every block scale at most 448: the expert's amax block gets exactly e4m3 448 (0x7E).
  std::array<uint8_t, 8> packed{};
  std::array<float, 16> block{};
  block[3] = -896.0f;
  for (const auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE})
    CHECK(quantize_nvfp4_block(block, nvfp4_global_scale(values, convention), convention, packed) == 0x7E);
  // A bf16 subnormal amax overflows the divisor to +inf (documented): scale 448, zero codes.
  const float tiny = std::ldexp(1.0f, -133);
  CHECK(std::isinf(nvfp4_global_scale(std::vector<float>{tiny}, KJIT_SCALE_DIVIDE)));
  CHECK(nvfp4_global_scale(std::vector<float>{tiny}, KJIT_SCALE_MULTIPLY) > 0.0f);
}

// ------------------------------------------------------------- round trips
//
// The bounds, from the formats: a value inside the element range is off by at
// most half a unit in the last place, |x| * 2^-(mantissa bits + 1), or half the
// subnormal step times the block's scale; one above it (the OCP rule lets the
// block's largest values reach 2^(emax + 1) * X) loses less than
// |x| * (1 - max / 2^(emax + 1)). So |x - dequant| <= max(|x| * relative, scale * floor):
//   e2m1: relative 1/4 (half ulp 1/4; saturation 1 - 6/8 = 1/4), floor 1/4;
//   e4m3fn: relative 1/8 (half ulp 1/16; saturation 1 - 448/512), floor 2^-10;
//   e5m2: relative 1/8 (half ulp 1/8; saturation 1 - 57344/65536), floor 2^-17.
// The scale is bounded from the block's amax, not read back from what the code
// under test wrote (a scale too large would widen its own bound):
//   MX: X = 2^(floor(log2 amax) - emax) <= amax * 2^-emax;
//   NVFP4 with the recipe's global scale: d = e4m3(amax / 6 / global) * global,
//     a normal e4m3 rounding by at most 2^-4: d <= amax / 6 * 17/16, and
//     amax / d <= 6.375 < 8 keeps the e2m1 saturation bound. Normal needs the
//     block's amax >= the tensor's * 2^-6 / 448; the test checks its data does.
// The fp32 roundings of d and x / d get a 2^-20 slack.

namespace {

// Checks every element against max(|x| * relative, amax of its block * floor_per_amax).
void check_within(const std::vector<float>& in, const std::vector<float>& out, int64_t block, double relative,
                  double floor_per_amax) {
  int failures = 0;
  for (size_t first = 0; first < in.size() && failures < 5; first += static_cast<size_t>(block)) {
    double amax = 0.0;
    for (size_t i = first; i < first + static_cast<size_t>(block); ++i) amax = std::max(amax, std::fabs(double{in[i]}));
    for (size_t i = first; i < first + static_cast<size_t>(block); ++i) {
      const double x = in[i];
      const double bound = std::max(std::fabs(x) * relative, amax * floor_per_amax) * (1.0 + 0x1p-20);
      if (std::fabs(x - static_cast<double>(out[i])) > bound) {
        ++failures;
        FAIL_CHECK("element " << i << ": " << x << " came back as " << out[i] << ", bound " << bound);
      }
    }
  }
}

}  // namespace

TEST_CASE("NVFP4 quantize -> dequant stays within max(|x|, d) / 4, d <= block amax / 6 * 17/16, either convention") {
  constexpr int64_t rows = 24, k = 256;
  // Blocks within 2^12 of each other, elements within 2^12 of their block's: every block scale normal.
  const auto in = random_bf16_values(static_cast<size_t>(rows * k), kNvfp4Block, 17, 0, 12);
  float amax = 0.0f;
  for (float x : in) amax = std::max(amax, std::fabs(x));
  for (const auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
    CAPTURE(convention);
    const float global = convention == KJIT_SCALE_MULTIPLY ? amax / 2688.0f : 2688.0f / amax;
    std::vector<uint8_t> packed(static_cast<size_t>(rows * k / 2)), scales(static_cast<size_t>(rows * k / 16));
    quantize_nvfp4(in, rows, k, global, convention, packed, scales);
    for (uint8_t scale : scales) {
      CHECK(scale >= 0x08);  // the bound's premise: normal e4m3 block scales ...
      CHECK(scale <= 0x7E);  // ... up to 448, which the recipe's global gives the tensor's amax block
    }
    std::vector<float> out(in.size());
    dequant_nvfp4(packed, scales, rows, k, global, convention, out);
    check_within(in, out, kNvfp4Block, 0.25, 17.0 / 16.0 / 6.0 / 4.0);
  }
}

TEST_CASE("MXFP4 quantize -> dequant stays within max(|x|, X) / 4, X <= block amax / 4") {
  constexpr int64_t rows = 32, k = 256;
  const auto in = random_bf16_values(static_cast<size_t>(rows * k), kMxBlock, 23);
  std::vector<uint8_t> packed(static_cast<size_t>(rows * k / 2)), scales(static_cast<size_t>(rows * k / 32));
  quantize_mxfp4(in, rows, k, packed, scales);
  std::vector<float> out(in.size());
  dequant_mxfp4(packed, scales, rows, k, out);
  check_within(in, out, kMxBlock, 0.25, 0x1p-2 / 4.0);
}

TEST_CASE("MXFP8 quantize -> dequant stays within max(|x| / 8, X * 2^-10) for e4m3fn and max(|x| / 8, X * 2^-17) for e5m2") {
  constexpr int64_t rows = 32, k = 256;
  const auto in = random_bf16_values(static_cast<size_t>(rows * k), kMxBlock, 29);
  for (const auto element : {KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E5M2}) {
    CAPTURE(element);
    std::vector<uint8_t> codes(in.size()), scales(static_cast<size_t>(rows * k / 32));
    quantize_mxfp8(element, in, rows, k, codes, scales);
    std::vector<float> out(in.size());
    dequant_mxfp8(element, codes, scales, rows, k, out);
    // X <= amax * 2^-8 (e4m3fn) or amax * 2^-15 (e5m2).
    check_within(in, out, kMxBlock, 0.125, element == KJIT_DTYPE_F8_E4M3FN ? 0x1p-8 * 0x1p-10 : 0x1p-15 * 0x1p-17);
  }
}

// ------------------------------------------------------------ scale layouts

TEST_CASE("the swizzled 128x4 offset of hand-picked (row, scale column) pairs, 6 scale columns (2 k-tiles)") {
  // offset = ((m / 128) * 2 + k / 4) * 512 + (m % 32) * 16 + ((m / 32) % 4) * 4 + k % 4
  CHECK(swizzled_scale_offset(0, 0, 6) == 0);
  CHECK(swizzled_scale_offset(0, 1, 6) == 1);
  CHECK(swizzled_scale_offset(1, 0, 6) == 16);
  CHECK(swizzled_scale_offset(32, 0, 6) == 4);
  CHECK(swizzled_scale_offset(0, 5, 6) == 513);      // tile (0, 1): 512, + 5 % 4
  CHECK(swizzled_scale_offset(97, 4, 6) == 540);     // 512 + 1 * 16 + 3 * 4 + 0
  CHECK(swizzled_scale_offset(127, 2, 6) == 510);    // 31 * 16 + 3 * 4 + 2: the last row of a tile
  CHECK(swizzled_scale_offset(130, 3, 6) == 1059);   // tile (1, 0): 2 * 512, + 2 * 16 + 0 * 4 + 3
  CHECK(swizzled_scale_bytes(200, 6) == 2048);       // 256 rows * 8 columns
  CHECK(swizzled_scale_bytes(0, 6) == 0);
}

TEST_CASE("the swizzled offsets of a padded 256 x 8 matrix are every byte of its 2048 exactly once") {
  std::set<int64_t> offsets;
  for (int64_t r = 0; r < 256; ++r)
    for (int64_t c = 0; c < 8; ++c) offsets.insert(swizzled_scale_offset(r, c, 8));
  CHECK(offsets.size() == 2048);
  CHECK(*offsets.begin() == 0);
  CHECK(*offsets.rbegin() == 2047);
}

TEST_CASE("linear -> swizzled -> linear is the identity over 200 rows, the padding filled with the byte asked for") {
  constexpr int64_t rows = 200, cols = 6;
  constexpr uint8_t pad = 0xA5;
  std::vector<uint8_t> linear(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < linear.size(); ++i) linear[i] = static_cast<uint8_t>(i % 0xA5);  // never the pad byte
  const std::vector<int64_t> expert_rows = {rows};
  std::vector<uint8_t> swizzled(static_cast<size_t>(swizzled_scale_bytes(rows, cols)), 0x00);
  scales_linear_to_swizzled(linear, expert_rows, cols, pad, swizzled);
  CHECK(std::count(swizzled.begin(), swizzled.end(), pad) == 2048 - rows * cols);
  CHECK(swizzled[static_cast<size_t>(swizzled_scale_offset(130, 3, cols))] == linear[130 * cols + 3]);
  CHECK(swizzled[static_cast<size_t>(swizzled_scale_offset(199, 5, cols))] == linear[199 * cols + 5]);
  CHECK(swizzled[static_cast<size_t>(swizzled_scale_offset(200, 0, cols))] == pad);  // a padded row
  CHECK(swizzled[static_cast<size_t>(swizzled_scale_offset(0, 6, cols))] == pad);    // a padded column
  std::vector<uint8_t> back(linear.size(), 0xFF);
  scales_swizzled_to_linear(swizzled, expert_rows, cols, back);
  CHECK(back == linear);
}

TEST_CASE("stacked experts are swizzled each on its own at its 128-row-padded offset, not as one concatenation") {
  // Experts of 200, 0 and 130 rows, 6 scale columns: blocks of 2048, 0 and 2048 bytes at 0, 2048, 2048.
  constexpr int64_t cols = 6;
  const std::vector<int64_t> expert_rows = {200, 0, 130};
  CHECK(swizzled_expert_base(expert_rows, 1, cols) == 2048);
  CHECK(swizzled_expert_base(expert_rows, 2, cols) == 2048);
  CHECK(swizzled_expert_base(expert_rows, 3, cols) == 4096);
  std::vector<uint8_t> linear(330 * cols);
  for (size_t i = 0; i < linear.size(); ++i) linear[i] = static_cast<uint8_t>(i % 251);
  std::vector<uint8_t> swizzled(4096, 0x00);
  scales_linear_to_swizzled(linear, expert_rows, cols, 0x00, swizzled);
  // Expert 2's row 0, column 0 (linear row 200) sits at its block's start, 2048; swizzling the
  // 330-row concatenation would have put it at row 200's offset, 1024 + 8 * 16 + 2 * 4 = 1160.
  CHECK(swizzled[2048] == linear[200 * cols]);
  CHECK(swizzled_scale_offset(200, 0, cols) == 1160);
  CHECK(swizzled[1160] != linear[200 * cols]);
  // Expert 2's row 129, column 5 (linear row 329): 2048 + (1 * 2 + 1) * 512 + 1 * 16 + 0 * 4 + 1 = 3601.
  CHECK(swizzled[3601] == linear[329 * cols + 5]);
  std::vector<uint8_t> back(linear.size(), 0xFF);
  scales_swizzled_to_linear(swizzled, expert_rows, cols, back);
  CHECK(back == linear);
}

TEST_CASE("gpt-oss's blocks [E, N, K/32, 16] and scales [E, N, K/32] are the linear layout of MXFP4 [E * N, K]") {
  // gpt-oss reads element k of row (e, n) as the LUT value of nibble k % 2 (low first) of
  // blocks[e][n][k / 32][(k % 32) / 2], times 2^(scales[e][n][k / 32] - 127). Written out here with
  // the checkpoint's own index arithmetic, against the reference fed the same bytes as [E * N, K].
  constexpr int64_t E = 2, N = 3, K = 64, KB = K / 32;
  std::vector<uint8_t> blocks(static_cast<size_t>(E * N * KB * 16)), scales(static_cast<size_t>(E * N * KB));
  std::mt19937 rng(31);
  for (auto& byte : blocks) byte = static_cast<uint8_t>(rng());
  for (auto& byte : scales) byte = static_cast<uint8_t>(120 + rng() % 16);
  const auto block_at = [&](int64_t e, int64_t n, int64_t b, int64_t j) {
    return blocks[static_cast<size_t>(((e * N + n) * KB + b) * 16 + j)];
  };
  const auto scale_at = [&](int64_t e, int64_t n, int64_t b) { return scales[static_cast<size_t>((e * N + n) * KB + b)]; };
  static constexpr std::array<float, 16> kLut = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

  // One element by hand: blocks[0][1][1][3] = 0x7A holds k = 38 (low: 0xA, -1) and k = 39 (high: 0x7, 6);
  // with scales[0][1][1] = 128 (2^1) they are -2 and 12 in row 1.
  blocks[static_cast<size_t>(((0 * N + 1) * KB + 1) * 16 + 3)] = 0x7A;
  scales[static_cast<size_t>((0 * N + 1) * KB + 1)] = 128;

  std::vector<float> out(static_cast<size_t>(E * N * K));
  dequant_mxfp4(blocks, scales, E * N, K, out);
  CHECK(out[static_cast<size_t>(1 * K + 38)] == -2.0f);
  CHECK(out[static_cast<size_t>(1 * K + 39)] == 12.0f);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t byte = block_at(e, n, k / 32, (k % 32) / 2);
        const float want =
            std::ldexp(kLut[k % 2 ? byte >> 4 : byte & 0xF], int{scale_at(e, n, k / 32)} - 127);
        CAPTURE(e);
        CAPTURE(n);
        CAPTURE(k);
        CHECK(float_bits(out[static_cast<size_t>((e * N + n) * K + k)]) == float_bits(want));
      }
  // And its scales swizzle per expert of N rows like any linear stack.
  const std::vector<int64_t> expert_rows(E, N);
  std::vector<uint8_t> swizzled(static_cast<size_t>(E * swizzled_scale_bytes(N, KB)));
  scales_linear_to_swizzled(scales, expert_rows, KB, 0x00, swizzled);
  CHECK(swizzled[static_cast<size_t>(swizzled_scale_bytes(N, KB) + swizzled_scale_offset(1, 1, KB))] ==
        scale_at(1, 1, 1));
}
