// The CPU reference of the combine's weights' gradient (kjit.h: kjit_moe_combine_desc with grad): the dot
// product per pair in the stated order against an fp64 dot product, +0 for another rank's pair, and the order
// itself (a sum a different association would round differently). These pin what the GPU kernel must
// reproduce bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kjit/reference/moe_routing.hpp"

using namespace kjit::reference;

TEST_CASE("the combine's weights' gradient is each pair's dot product to fp32 rounding, +0 for other ranks") {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int64_t hidden : {8, 264, 2048, 7168}) {
    const int64_t tokens = 3, top_k = 2, rows = 4;
    std::vector<uint16_t> x(static_cast<size_t>(rows * hidden)), grad(static_cast<size_t>(tokens * hidden));
    for (auto& v : x) v = bf16_bits_rne(normal(rng));
    for (auto& v : grad) v = bf16_bits_rne(normal(rng));
    const std::vector<int32_t> map{0, 3, -1, 1, 2, -1};
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < top_k; ++j) {
        const float got = moe_combine_weight_gradient(x, grad, map, top_k, hidden, t, j);
        const int32_t row = map[static_cast<size_t>(t * top_k + j)];
        if (row < 0) {
          CHECK((got == 0.0f && !std::signbit(got)));
          continue;
        }
        double dot = 0, magnitude = 0;
        for (int64_t h = 0; h < hidden; ++h) {
          const double term = static_cast<double>(bf16_to_float(grad[static_cast<size_t>(t * hidden + h)])) *
                              bf16_to_float(x[static_cast<size_t>(row * hidden + h)]);
          dot += term;
          magnitude += std::fabs(term);
        }
        CHECK(std::fabs(got - dot) <= 2.0 * std::log2(static_cast<double>(hidden) + 32) * 0x1p-24 * magnitude);
      }
  }
}

TEST_CASE("the weights' gradient sums 32 lanes' chunk sums in a butterfly: lane 0's association") {
  // hidden 256: lane l's sum is the 8 products of chunk l alone. Terms 1 (lane 0) and 2^-24 (lanes 1..31): a
  // left-to-right fp32 sum from 1 loses every 2^-24 (each ties back to 1). In the butterfly lane 0 first meets
  // lane 16's 2^-24 (a tie: 1 again), then the other lanes' partial sums, already added in pairs: 2^-23 (lane 8),
  // 2^-22 (4), 2^-21 (2), 2^-20 (1), each exact: 1 + 15 * 2^-23.
  const int64_t hidden = 256;
  std::vector<uint16_t> x(hidden, bf16_bits_rne(0.0f)), grad(hidden, bf16_bits_rne(1.0f));
  x[0] = bf16_bits_rne(1.0f);
  for (int l = 1; l < 32; ++l) x[static_cast<size_t>(8 * l)] = bf16_bits_rne(0x1p-24f);
  const float got = moe_combine_weight_gradient(x, grad, {0}, 1, hidden, 0, 0);
  float left_to_right = 0.0f;
  for (int64_t h = 0; h < hidden; ++h) left_to_right += bf16_to_float(x[static_cast<size_t>(h)]);
  CHECK(left_to_right == 1.0f);
  CHECK(got > 1.0f);
  CHECK(got == 1.0f + 15 * 0x1p-23f);
}
