// The CPU reference of the MoE activation: kjit's e^x against the exact value
// over a sweep of fp32 inputs, the activations against fp64 evaluations of
// their definitions and against values stated by hand (clamps, overflow,
// NaN), the two gate/up layouts, valid_rows, and the FP8 output as the bf16
// output quantized. These pin what the GPU kernel must reproduce bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kjit/reference/moe_activation.hpp"

using namespace kjit::reference;

namespace {

// |got - exact| in units of the last place of the float nearest to `exact` (a normal float).
double ulp_error(float got, double exact) {
  return std::fabs(static_cast<double>(got) - exact) / std::ldexp(1.0, std::ilogb(static_cast<float>(exact)) - 23);
}

float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

TEST_CASE("kjit's e^x is within 0.92 ulp of the exact value wherever the result is a normal float") {
  double worst = 0;
  float worst_at = 0;
  int64_t checked = 0;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t bits = 0;; bits += 211) {  // every 211th float from 0 outwards: ~10 million inputs
      const float x = from_bits(bits | sign);
      if (std::fabs(x) > (sign ? 87.3f : 88.72f)) break;
      const double error = ulp_error(activation_exp(x), std::exp(static_cast<double>(x)));
      if (error > worst) worst = error, worst_at = x;
      ++checked;
    }
  CAPTURE(worst_at);
  CHECK(checked > 5'000'000);
  CHECK(worst < 0.92);
}

TEST_CASE("kjit's e^x at its edges: exact 1 at 0, inf past the overflow, 0 far below, NaN through") {
  CHECK(activation_exp(0.0f) == 1.0f);
  CHECK(activation_exp(-0.0f) == 1.0f);
  CHECK(std::isinf(activation_exp(88.73f)));
  CHECK(std::isinf(activation_exp(std::numeric_limits<float>::infinity())));
  CHECK(std::isfinite(activation_exp(88.72f)));
  CHECK(activation_exp(-104.0f) == 0.0f);
  CHECK(activation_exp(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(activation_exp(-100.0f) > 0.0f);  // a subnormal, rounded once
  CHECK(std::isnan(activation_exp(std::numeric_limits<float>::quiet_NaN())));
}

// A handful of fp32 roundings, plus the exponential's conditioning: e^a
// turns the half-ulp rounding of its argument a into |a| half-ulps.
TEST_CASE("silu_mul and swiglu_oai agree with fp64 evaluations of their definitions to a few fp32 ulps") {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  auto close = [](float got, double want, double exponent_argument) {
    return std::fabs(got - want) <= (6.0 + std::fabs(exponent_argument)) * 0x1p-23 * std::fabs(want) + 1e-37;
  };
  for (int i = 0; i < 100000; ++i) {
    const float g = normal(rng), u = normal(rng);
    const double silu = static_cast<double>(g) / (1.0 + std::exp(-static_cast<double>(g))) * u;
    CHECK(close(silu_mul(g, u), silu, g));
    const double gc = std::min<double>(g, 7.0), uc = std::clamp<double>(u, -7.0, 7.0);
    const double oai = gc / (1.0 + std::exp(-1.702 * gc)) * (uc + 1.0);
    CHECK(close(swiglu_oai(g, u, 1.702f, 7.0f), oai, 1.702 * gc));
  }
}

TEST_CASE("swiglu_oai clamps gate above and up on both sides, and lets NaN through") {
  const float at_limit = swiglu_oai(7.0f, 7.0f, 1.702f, 7.0f);
  CHECK(swiglu_oai(100.0f, 50.0f, 1.702f, 7.0f) == at_limit);  // both clamped to 7
  CHECK(at_limit == 7.0f * (1.0f / (1.0f + activation_exp(-(1.702f * 7.0f)))) * 8.0f);
  CHECK(swiglu_oai(3.0f, -50.0f, 1.702f, 7.0f) == swiglu_oai(3.0f, -7.0f, 1.702f, 7.0f));
  CHECK(swiglu_oai(-50.0f, 1.0f, 1.702f, 7.0f) != swiglu_oai(-7.0f, 1.0f, 1.702f, 7.0f));  // no lower clamp on gate
  CHECK(swiglu_oai(3.0f, -1.0f, 1.702f, 7.0f) == 0.0f);  // u + 1 = 0
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(swiglu_oai(3.0f, 1.0f, 1.702f, inf) == swiglu_oai(3.0f, 1.0f, 1.702f, 1e30f));  // limit inf: no clamp
  CHECK(std::isnan(swiglu_oai(std::nanf(""), 1.0f, 1.702f, 7.0f)));
  CHECK(std::isnan(swiglu_oai(1.0f, std::nanf(""), 1.702f, 7.0f)));
}

TEST_CASE("silu_mul at the edges: exact for large gates, -0 where e^-g overflows, NaN through") {
  CHECK(silu_mul(100.0f, 1.0f) == 100.0f);
  CHECK(silu_mul(0.0f, 5.0f) == 0.0f);
  const float tiny = silu_mul(-100.0f, 1.0f);  // e^100 overflows: -100 / inf
  CHECK(tiny == 0.0f);
  CHECK(std::signbit(tiny));
  CHECK(silu_mul(-80.0f, 1.0f) < 0.0f);  // still finite there
  CHECK(std::isnan(silu_mul(std::nanf(""), 1.0f)));
  CHECK(std::isnan(silu_mul(-std::numeric_limits<float>::infinity(), 1.0f)));  // -inf / inf
  CHECK(activation_bf16_bits(std::nanf("")) == 0x7FFF);
}

TEST_CASE("halves and alternating layouts of the same gate and up give the same output, valid_rows zeroes the rest") {
  const int64_t rows = 5, i_cols = 16, stride = 40;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<uint16_t> halves(rows * stride, bf16_bits_rne(-9.0f)), alternating(rows * stride, bf16_bits_rne(9.0f));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < i_cols; ++c) {
      const uint16_t g = bf16_bits_rne(normal(rng)), u = bf16_bits_rne(normal(rng));
      halves[r * stride + c] = g;
      halves[r * stride + i_cols + c] = u;
      alternating[r * stride + 2 * c] = g;
      alternating[r * stride + 2 * c + 1] = u;
    }
  for (auto activation : {Activation::silu_mul, Activation::swiglu_oai}) {
    MoeActivationProblem p{.rows = rows, .intermediate = i_cols, .in_row_stride = stride, .activation = activation};
    const auto from_halves = moe_activation_bf16(p, halves);
    p.layout = GateUp::alternating;
    const auto from_alternating = moe_activation_bf16(p, alternating);
    CHECK(from_halves == from_alternating);
    // Row 1, column 3 by hand.
    const float g = bf16_to_float(halves[stride + 3]), u = bf16_to_float(halves[stride + i_cols + 3]);
    const float v = activation == Activation::silu_mul ? silu_mul(g, u) : swiglu_oai(g, u, 1.702f, 7.0f);
    CHECK(from_halves[i_cols + 3] == bf16_bits_rne(v));
    p.valid_rows = 3;
    const auto cut = moe_activation_bf16(p, alternating);
    for (int64_t k = 0; k < rows * i_cols; ++k)
      CHECK(cut[static_cast<size_t>(k)] == (k < 3 * i_cols ? from_halves[static_cast<size_t>(k)] : uint16_t{0}));
  }
}

TEST_CASE("the FP8 output is the bf16 output quantized per 128 columns, zero codes and scale 0 past valid_rows") {
  const int64_t rows = 4, i_cols = 256, stride = 512;
  std::mt19937_64 rng(13);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  std::vector<uint16_t> h(rows * stride);
  for (auto& x : h) x = bf16_bits_rne(normal(rng));
  MoeActivationProblem p{.rows = rows, .intermediate = i_cols, .in_row_stride = stride, .valid_rows = 3};
  for (bool ue8m0 : {false, true}) {
    std::vector<uint8_t> codes(rows * i_cols, 0xA5);
    std::vector<float> scales(rows * 2, -1.0f);
    moe_activation_fp8(p, h, ue8m0, codes, scales);
    const auto act = moe_activation_bf16(p, h);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < 2; ++g) {
        std::vector<uint8_t> want(128);
        const float want_scale =
            r < 3 ? quantize_group(std::span(act).subspan(static_cast<size_t>(r * i_cols + g * 128), 128), want, ue8m0)
                  : 0.0f;
        if (r >= 3) std::fill(want.begin(), want.end(), uint8_t{0});
        CHECK(float_bits(scales[static_cast<size_t>(r * 2 + g)]) == float_bits(want_scale));
        CHECK(std::equal(want.begin(), want.end(), codes.begin() + r * i_cols + g * 128));
      }
  }
}

TEST_CASE("the gradients agree with fp64 derivatives of the definitions, to fp32 rounding of their terms") {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  // Within a few ulps of the size of the terms the derivative sums (it cancels near its zeros).
  auto close = [](float got, double want, double terms, double exponent_argument) {
    return std::fabs(got - want) <= (8.0 + 2 * std::fabs(exponent_argument)) * 0x1p-23 * terms + 1e-37;
  };
  for (int i = 0; i < 100000; ++i) {
    const float g = normal(rng), u = normal(rng), d = normal(rng);
    const double gd = g, s = 1.0 / (1.0 + std::exp(-gd));
    float d_gate, d_up;
    silu_mul_gradient(g, u, d, d_gate, d_up);
    CHECK(close(d_up, d * gd * s, std::fabs(d * gd * s), g));
    const double slope_terms = s * (1.0 + std::fabs(gd) * (1.0 - s));
    CHECK(close(d_gate, d * u * s * (1.0 + gd * (1.0 - s)), std::fabs(d * u) * slope_terms, g));
    const double gc = std::min<double>(g, 7.0), uc = std::clamp<double>(u, -7.0, 7.0), z = 1.702 * gc;
    const double sz = 1.0 / (1.0 + std::exp(-z));
    swiglu_oai_gradient(g, u, d, 1.702f, 7.0f, d_gate, d_up);
    CHECK(close(d_up, std::fabs(u) < 7.0 ? d * gc * sz : 0.0, std::fabs(d * gc * sz), z));
    const double want_gate = g < 7.0f ? d * (uc + 1.0) * sz * (1.0 + z * (1.0 - sz)) : 0.0;
    CHECK(close(d_gate, want_gate, std::fabs(d * (uc + 1.0)) * sz * (1.0 + std::fabs(z) * (1.0 - sz)), z));
  }
}

TEST_CASE("the clamps pass no gradient at or past their bounds, nor does NaN, the three layouts agree, valid_rows "
          "zeroes") {
  float d_gate, d_up;
  swiglu_oai_gradient(7.0f, 7.0f, 1.0f, 1.702f, 7.0f, d_gate, d_up);
  CHECK((d_gate == 0.0f && d_up == 0.0f));
  swiglu_oai_gradient(6.5f, -7.0f, 1.0f, 1.702f, 7.0f, d_gate, d_up);
  CHECK((d_gate != 0.0f && d_up == 0.0f));  // up at -limit: no gradient; gate below the limit: some
  swiglu_oai_gradient(-50.0f, 6.9f, 1.0f, 1.702f, 7.0f, d_gate, d_up);
  CHECK(d_up != 0.0f);  // no lower clamp on gate: its gradient passes (here ~0 through the sigmoid)
  swiglu_oai_gradient(std::nanf(""), std::nanf(""), 1.0f, 1.702f, 7.0f, d_gate, d_up);
  CHECK((d_gate == 0.0f && d_up == 0.0f));
  silu_mul_gradient(0.0f, 3.0f, 2.0f, d_gate, d_up);
  CHECK((d_gate == 3.0f && d_up == 0.0f));  // silu'(0) = 1/2, times u d = 6; silu(0) = 0

  MoeActivationProblem p{.rows = 3, .intermediate = 8, .in_row_stride = 16};
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  // I = 16: two groups of 8, so groups_of_8 differs from halves (gate 0-7 and 16-23, up 8-15 and 24-31).
  p.intermediate = 16;
  p.in_row_stride = 32;
  std::vector<uint16_t> halves(96), alternating(96), groups(96), grad(48);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 16; ++c) {
      const uint16_t g = bf16_bits_rne(normal(rng)), u = bf16_bits_rne(normal(rng));
      halves[static_cast<size_t>(r * 32 + c)] = g;
      halves[static_cast<size_t>(r * 32 + 16 + c)] = u;
      alternating[static_cast<size_t>(r * 32 + 2 * c)] = g;
      alternating[static_cast<size_t>(r * 32 + 2 * c + 1)] = u;
      groups[static_cast<size_t>(r * 32 + 16 * (c / 8) + c % 8)] = g;
      groups[static_cast<size_t>(r * 32 + 16 * (c / 8) + 8 + c % 8)] = u;
      grad[static_cast<size_t>(r * 16 + c)] = bf16_bits_rne(normal(rng));
    }
  p.valid_rows = 2;
  const auto act = moe_activation_bf16(p, halves);
  const auto from_halves = moe_activation_gradient(p, halves, grad);
  p.layout = GateUp::alternating;
  const auto from_alternating = moe_activation_gradient(p, alternating, grad);
  p.layout = GateUp::groups_of_8;
  const auto from_groups = moe_activation_gradient(p, groups, grad);
  CHECK(moe_activation_bf16(p, groups) == act);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 16; ++c) {
      const auto gate = from_halves[static_cast<size_t>(r * 32 + c)];
      const auto up = from_halves[static_cast<size_t>(r * 32 + 16 + c)];
      CHECK(gate == from_alternating[static_cast<size_t>(r * 32 + 2 * c)]);
      CHECK(up == from_alternating[static_cast<size_t>(r * 32 + 2 * c + 1)]);
      CHECK(gate == from_groups[static_cast<size_t>(r * 32 + 16 * (c / 8) + c % 8)]);
      CHECK(up == from_groups[static_cast<size_t>(r * 32 + 16 * (c / 8) + 8 + c % 8)]);
      if (r == 2) CHECK((gate == 0 && up == 0));
    }
}
