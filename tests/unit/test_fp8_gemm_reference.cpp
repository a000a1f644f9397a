// The CPU reference of the FP8 (W8A8) grouped GEMM against values computed by
// hand from kjit.h's statement of the arithmetic: these pin the recipe (each
// 128-column block scaled on its own, the weight scale of a column's block or
// channel, the row scale) the GPU kernels are compared with.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "kjit/reference/fp8_gemm.hpp"

using namespace kjit::reference;

namespace {

constexpr uint8_t kOne = 0x38, kTwo = 0x40, kHalf = 0x30, kMinusOne = 0xB8, kMinusHalf = 0xB0;

// A row of `blocks` 128-column blocks, block b holding codes[b] everywhere.
std::vector<uint8_t> blocks_of(std::initializer_list<uint8_t> codes) {
  std::vector<uint8_t> row;
  for (uint8_t c : codes) row.insert(row.end(), 128, c);
  return row;
}

std::vector<double> row_of(const std::vector<uint8_t>& a, const std::vector<float>& a_scales,
                           const std::vector<uint8_t>& w, const std::vector<float>& w_scales,
                           kjit_scale_granularity granularity, int64_t n, double row_scale = 1.0) {
  std::vector<double> out(static_cast<size_t>(n), -1.0);
  fp8_gemm_row(a, a_scales, {w, w_scales, granularity}, n, static_cast<int64_t>(a.size()), row_scale, out);
  return out;
}

}  // namespace

TEST_CASE("each 128-column block's sum is multiplied by its own scales of A and of the weights") {
  // Block 0: 128 * 1 * 0.5 = 64, times 0.25 * 2 = 32. Block 1: 128 * 2 * -1 = -256, times 3 * 0.125 = -96.
  const auto out = row_of(blocks_of({kOne, kTwo}), {0.25f, 3.0f}, blocks_of({kHalf, kMinusOne}), {2.0f, 0.125f},
                          KJIT_SCALE_PER_BLOCK, 1);
  CHECK(out[0] == -64.0);
}

TEST_CASE("a column takes the weight scales of its 128-row block of N, the last block partial") {
  // N = 130: columns 0..127 are weight block 0 (scale 0.5), 128 and 129 block 1 (scale 4); each sum is 128.
  std::vector<uint8_t> w(130 * 128, kOne);
  const auto out = row_of(blocks_of({kOne}), {1.0f}, w, {0.5f, 4.0f}, KJIT_SCALE_PER_BLOCK, 130);
  CHECK(out[0] == 64.0);
  CHECK(out[127] == 64.0);
  CHECK(out[128] == 512.0);
  CHECK(out[129] == 512.0);
}

TEST_CASE("with per-channel weight scales each column's block sums times A's scales are multiplied by its channel's scale") {
  // Column 0: (128 * 1 * 1 + 128 * 1 * 0.5) * 3 = 576. Column 1: (128 * 2 * 1 + 128 * -0.5 * 0.5) * 0.25 = 56.
  std::vector<uint8_t> w = blocks_of({kOne, kOne});
  const auto second = blocks_of({kTwo, kMinusHalf});
  w.insert(w.end(), second.begin(), second.end());
  const auto out = row_of(blocks_of({kOne, kOne}), {1.0f, 0.5f}, w, {3.0f, 0.25f}, KJIT_SCALE_PER_ROW, 2);
  CHECK(out[0] == 576.0);
  CHECK(out[1] == 56.0);
}

TEST_CASE("the row scale multiplies the whole row") {
  const auto out = row_of(blocks_of({kOne, kTwo}), {0.25f, 3.0f}, blocks_of({kHalf, kMinusOne}), {2.0f, 0.125f},
                          KJIT_SCALE_PER_BLOCK, 1, 0.5);
  CHECK(out[0] == -32.0);
  const auto channel = row_of(blocks_of({kOne}), {1.0f}, blocks_of({kTwo}), {0.5f}, KJIT_SCALE_PER_ROW, 1, 0.125);
  CHECK(channel[0] == 16.0);  // 128 * 2 * 0.5 * 0.125
}

TEST_CASE("codes decode exactly: the largest, normals of both signs, subnormals and negative zero") {
  std::vector<uint8_t> a(256, 0x00), w(256, 0x00);
  a[3] = 0x7E, w[3] = 0x01;      // 448 * 2^-9 = 0.875
  a[50] = 0x07, w[50] = kTwo;    // 7 * 2^-9 * 2 = 0.02734375 (the largest subnormal)
  a[100] = 0x80, w[100] = 0x7E;  // -0 * 448
  a[200] = 0x09, w[200] = 0xF8;  // 1.125 * 2^-6 * -256 = -4.5
  const auto out = row_of(a, {1.0f, 1.0f}, w, {1.0f, 1.0f}, KJIT_SCALE_PER_BLOCK, 1);
  CHECK(out[0] == 0.875 + 0.02734375 - 4.5);
}

TEST_CASE("products and sums are exact in fp64 where fp32 would round") {
  // 128 * 448 * 448 = 25690112 (exact in fp32 too); adding the subnormal product 2^-18 is not.
  std::vector<uint8_t> a(128, 0x7E), w(128, 0x7E);
  a[127] = 0x01, w[127] = 0x01;
  const auto out = row_of(a, {1.0f}, w, {1.0f}, KJIT_SCALE_PER_BLOCK, 1);
  CHECK(out[0] == 127.0 * 448 * 448 + 0x1p-18);
}
