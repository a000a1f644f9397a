// The CPU reference of the W8A16 grouped GEMM against values computed by hand
// from kjit.h's statement of the arithmetic: these pin the conversion (fp32
// scale, the reciprocal for DIVIDE, nearest-even bf16), both readings of the
// stored tensor, the three scale layouts over it, and the expert segments the
// GPU kernels are compared with.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <vector>

#include "kjit/reference/mixed_gemm.hpp"

using namespace kjit::reference;

namespace {

// e4m3fn codes of 1, 2, 3, 1.125, 0.5, -1 and 256.
constexpr uint8_t kOne = 0x38, kTwo = 0x40, kThree = 0x44, kNineEighths = 0x39, kHalf = 0x30, kMinusOne = 0xB8,
                  k256 = 0x78;

std::vector<uint16_t> bf16_row(std::initializer_list<float> values) {
  std::vector<uint16_t> bits;
  for (float v : values) bits.push_back(bf16_bits_rne(v));
  return bits;
}

MixedWeights weights(const std::vector<uint8_t>& codes, const std::vector<float>& scales, kjit_weight_layout layout,
                     kjit_scale_granularity granularity, int64_t experts, int64_t n, int64_t k) {
  return {codes, scales, KJIT_DTYPE_F8_E4M3FN, layout, granularity, KJIT_SCALE_MULTIPLY, experts, n, k};
}

// One expert's row `a` through the reference.
std::vector<double> row_of(const std::vector<uint16_t>& a, const MixedWeights& w, int64_t e = 0, double row_scale = 1.0) {
  std::vector<double> out(static_cast<size_t>(w.n), -1.0);
  mixed_gemm_row(a, dequantize_mixed_expert(w, e), w, row_scale, out);
  return out;
}

}  // namespace

TEST_CASE("a weight is its code times the fp32 scale, rounded to nearest-even bf16") {
  // 1.125 * (1 + 2^-8) = 1.12939453125: bf16 steps by 2^-7 here, and the nearest is 1.1328125 (truncation: 1.125).
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E4M3FN, kNineEighths, 1.00390625f, KJIT_SCALE_MULTIPLY) == 1.1328125f);
  // 1 + 3 * 2^-8 lies halfway between 1.0078125 and 1.015625: the even mantissa wins.
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E4M3FN, kOne, 1.01171875f, KJIT_SCALE_MULTIPLY) == 1.015625f);
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E4M3FN, kMinusOne, 0.25f, KJIT_SCALE_MULTIPLY) == -0.25f);
}

TEST_CASE("e5m2 weights decode as e5m2: its largest normal, a subnormal, 3") {
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E5M2, 0x7B, 2.0f, KJIT_SCALE_MULTIPLY) == 114688.0f);  // 57344 * 2
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E5M2, 0x01, 1.0f, KJIT_SCALE_MULTIPLY) == 0x1p-16f);
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E5M2, 0x42, 0.5f, KJIT_SCALE_MULTIPLY) == 1.5f);
  // The same byte as e4m3fn is another number: 0x42 is 2.5 there.
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E4M3FN, 0x42, 0.5f, KJIT_SCALE_MULTIPLY) == 1.25f);
}

TEST_CASE("DIVIDE multiplies by the fp32 reciprocal of the scale, which may round otherwise than a division") {
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E4M3FN, kTwo, 4.0f, KJIT_SCALE_DIVIDE) == 0.5f);
  // 3 / s = 2.96093738... (fp32) rounds to bf16 2.953125; 3 * fp32(1 / s) = 2.9609375 rounds up to 2.96875.
  const float s = std::bit_cast<float>(0x3F81B04Cu);  // 1.01319265
  CHECK(mixed_weight_value(KJIT_DTYPE_F8_E4M3FN, kThree, s, KJIT_SCALE_DIVIDE) == 2.96875f);
  CHECK(dequant_value(KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_BF16, kThree, s, KJIT_SCALE_DIVIDE).bits == 0x403D);  // 2.953125
}

TEST_CASE("E_N_K reads the stored [E, R, C] as [N, K] and E_K_N reads the same storage as [K, N]") {
  // The stored expert: [[1, 2, -1], [0.5, 3, 1]].
  const std::vector<uint8_t> stored{kOne, kTwo, kMinusOne, kHalf, kThree, kOne};
  // Forward: N 2, K 3. out[n] = sum_k a[k] * W[n, k] = [1 + 4 - 4, 0.5 + 6 + 4].
  const std::vector<float> scale{1.0f};
  const auto forward = weights(stored, scale, KJIT_WEIGHTS_E_N_K, KJIT_SCALE_PER_TENSOR, 1, 2, 3);
  CHECK(row_of(bf16_row({1, 2, 4}), forward) == std::vector<double>{1.0, 10.5});
  // Backward: K 2, N 3. out[n] = sum_k a[k] * W[k, n] = [1 + 1, 2 + 6, -1 + 2].
  const auto backward = weights(stored, scale, KJIT_WEIGHTS_E_K_N, KJIT_SCALE_PER_TENSOR, 1, 3, 2);
  CHECK(row_of(bf16_row({1, 2}), backward) == std::vector<double>{2.0, 8.0, 1.0});
}

TEST_CASE("block scales cover 128 x 128 tiles of the stored tensor, partial last blocks included, expert after expert") {
  // Two experts of stored [130, 257]: 2 x 3 blocks each, every code 1, so each weight is its block's scale.
  const std::vector<uint8_t> codes(2 * 130 * 257, kOne);
  const std::vector<float> scales{1, 2, 4, 8, 16, 32, 0.5f, 0.25f, 0.125f, 64, 128, 256};
  for (auto layout : {KJIT_WEIGHTS_E_N_K, KJIT_WEIGHTS_E_K_N}) {
    CAPTURE(layout);
    // The blocks lie over the storage whichever way it is read: N 130, K 257 forward; N 257, K 130 backward.
    const auto w = layout == KJIT_WEIGHTS_E_N_K ? weights(codes, scales, layout, KJIT_SCALE_PER_BLOCK, 2, 130, 257)
                                                : weights(codes, scales, layout, KJIT_SCALE_PER_BLOCK, 2, 257, 130);
    const auto at = [](const std::vector<float>& expert, int64_t r, int64_t c) { return expert[static_cast<size_t>(r * 257 + c)]; };
    const auto first = dequantize_mixed_expert(w, 0), second = dequantize_mixed_expert(w, 1);
    CHECK(at(first, 0, 0) == 1.0f);
    CHECK(at(first, 127, 127) == 1.0f);
    CHECK(at(first, 0, 255) == 2.0f);
    CHECK(at(first, 0, 256) == 4.0f);
    CHECK(at(first, 128, 0) == 8.0f);
    CHECK(at(first, 129, 128) == 16.0f);
    CHECK(at(first, 129, 256) == 32.0f);
    CHECK(at(second, 5, 100) == 0.5f);
    CHECK(at(second, 127, 256) == 0.125f);
    CHECK(at(second, 128, 128) == 128.0f);
    CHECK(at(second, 129, 256) == 256.0f);
  }
}

TEST_CASE("row scales are one per stored row: per output channel forward, per k backward") {
  const std::vector<uint8_t> stored(4, kOne);  // [2, 2] of ones
  const std::vector<float> scales{2.0f, 3.0f};
  // Forward: stored row n is output channel n: out = [1 * 2 + 1 * 2, 1 * 3 + 1 * 3].
  const auto forward = weights(stored, scales, KJIT_WEIGHTS_E_N_K, KJIT_SCALE_PER_ROW, 1, 2, 2);
  CHECK(row_of(bf16_row({1, 1}), forward) == std::vector<double>{4.0, 6.0});
  // Backward: stored row k scales A's column k in every output: out[n] = 1 * 2 + 0.5 * 3.
  const auto backward = weights(stored, scales, KJIT_WEIGHTS_E_K_N, KJIT_SCALE_PER_ROW, 1, 2, 2);
  CHECK(row_of(bf16_row({1, 0.5f}), backward) == std::vector<double>{3.5, 3.5});
}

TEST_CASE("each expert's rows use its own weights and tensor scale, in either offsets convention, with row scales") {
  // Experts of one weight each (N = K = 1): 1, 2 and 3, scales 1, 1 and 0.5; rows {2, 0, 1}, then a row past them.
  const std::vector<uint8_t> codes{kOne, kTwo, kThree};
  const std::vector<float> scales{1.0f, 1.0f, 0.5f};
  const auto w = weights(codes, scales, KJIT_WEIGHTS_E_N_K, KJIT_SCALE_PER_TENSOR, 3, 1, 1);
  const auto a = bf16_row({1, 2, 4, 8});
  const std::vector<float> row_scale{1.0f, 0.5f, 2.0f, 9.0f};
  const std::vector<int32_t> ends{2, 2, 3}, with_zero{0, 2, 2, 3};
  // Row 0: 1 * 1; row 1: 2 * 1 * 0.5; row 2 (expert 2): 4 * 1.5 * 2; row 3 belongs to no expert.
  CHECK(mixed_grouped_gemm(a, w, ends, KJIT_OFFSETS_CUMULATIVE_END, row_scale) == std::vector<double>{1.0, 1.0, 12.0});
  CHECK(mixed_grouped_gemm(a, w, with_zero, KJIT_OFFSETS_WITH_LEADING_ZERO, row_scale) ==
        std::vector<double>{1.0, 1.0, 12.0});
  CHECK(mixed_grouped_gemm(a, w, ends, KJIT_OFFSETS_CUMULATIVE_END, {}) == std::vector<double>{1.0, 2.0, 6.0});
  // Every second row: rows 0 and 2.
  CHECK(mixed_grouped_gemm(a, w, ends, KJIT_OFFSETS_CUMULATIVE_END, row_scale, 2) == std::vector<double>{1.0, 12.0});
}

TEST_CASE("W8A16 products and sums are exact in fp64 where fp32 would round") {
  // 4096 * (256 * 16) + (1/16) * (1 * 16) = 2^24 + 1, which fp32 cannot hold.
  const std::vector<uint8_t> codes{k256, kOne};
  const std::vector<float> scale{16.0f};
  const auto w = weights(codes, scale, KJIT_WEIGHTS_E_N_K, KJIT_SCALE_PER_TENSOR, 1, 1, 2);
  CHECK(row_of(bf16_row({4096, 0.0625f}), w) == std::vector<double>{16777217.0});
}

TEST_CASE("the row scale multiplies the whole W8A16 row") {
  const std::vector<uint8_t> codes{kOne, kTwo, kHalf, kMinusOne};
  const std::vector<float> scale{1.0f};
  const auto w = weights(codes, scale, KJIT_WEIGHTS_E_N_K, KJIT_SCALE_PER_TENSOR, 1, 2, 2);
  CHECK(row_of(bf16_row({1, 1}), w, 0, 0.25) == std::vector<double>{0.75, -0.125});
}
