// The MoE activation on a real GPU against the CPU reference
// (kjit/reference/moe_activation.hpp), bit for bit: bf16 output (NaN as NaN),
// FP8 codes and scales in both scale formats; both activations and both
// gate/up layouts; fresh random data whose magnitudes reach past gpt-oss's
// clamp and past where e^-g overflows; odd row counts; a padded input row
// stride; valid_rows below, at and past the row count, 0 and negative; the
// edge values (inf, NaN, the clamp, other alpha and limit); the FP8 output
// against the bf16 output quantized by kjit_fp8_quantize on the GPU; CUDA
// graph capture with valid_rows changing between replays. Outputs start
// poisoned, so unwritten elements fail.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/moe_activation.hpp"

using namespace kjit::testing;
namespace reference = kjit::reference;

namespace {

struct Case {
  reference::MoeActivationProblem p;  // valid_rows given: passed to the kernel from device memory
  bool fp8 = false, ue8m0 = false;
  std::vector<uint16_t> in;  // bf16 h [rows, in_row_stride]
};

// Values normal(0, 1) times 2^e, e drawn per row from [-6, 6]: gates and ups
// of a few hundred, past the clamp at 7 and past -g = 88 where e^-g overflows.
std::vector<uint16_t> random_h(int64_t rows, int64_t stride) {
  std::vector<uint16_t> in(static_cast<size_t>(rows * stride));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-6, 6);
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, exponent(rng()));
    for (int64_t c = 0; c < stride; ++c)
      in[static_cast<size_t>(r * stride + c)] = reference::bf16_bits_rne(normal(rng()) * magnitude);
  }
  return in;
}

Case make_case(int64_t rows, int64_t i_cols, reference::GateUp layout, reference::Activation activation, bool fp8,
               bool ue8m0 = false, int64_t stride = 0) {
  Case c;
  c.p.rows = rows;
  c.p.intermediate = i_cols;
  c.p.in_row_stride = stride ? stride : 2 * i_cols;
  c.p.layout = layout;
  c.p.activation = activation;
  c.fp8 = fp8;
  c.ue8m0 = ue8m0;
  c.in = random_h(rows, c.p.in_row_stride);
  return c;
}

struct Output {
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> codes;
  std::vector<uint32_t> scale_bits;
};

Output expected(const Case& c) {
  Output want;
  if (!c.fp8) {
    want.bf16 = reference::moe_activation_bf16(c.p, c.in);
    return want;
  }
  want.codes.resize(static_cast<size_t>(c.p.rows * c.p.intermediate));
  std::vector<float> scales(static_cast<size_t>(c.p.rows * c.p.intermediate / 128));
  reference::moe_activation_fp8(c.p, c.in, c.ue8m0, want.codes, scales);
  for (float s : scales) want.scale_bits.push_back(reference::float_bits(s));
  return want;
}

struct Buffers {
  DeviceBuffer in, out, scales, valid;
  explicit Buffers(const Case& c)
      : in(0, c.in.size() * 2), out(0, static_cast<size_t>(std::max<int64_t>(16, c.p.rows * c.p.intermediate * 2))),
        scales(0, static_cast<size_t>(std::max<int64_t>(4, c.p.rows * c.p.intermediate / 128 * 4))), valid(0, 4) {
    upload(c);
  }
  void upload(const Case& c) {
    in.upload(c.in);
    valid.upload(std::vector<int32_t>{static_cast<int32_t>(c.p.valid_rows.value_or(0))});
    out.poison();
    scales.poison();
  }
  Output download(const Case& c) const {
    const auto count = static_cast<size_t>(c.p.rows * c.p.intermediate);
    if (!c.fp8) return {out.download<uint16_t>(0, count), {}, {}};
    return {{}, out.download<uint8_t>(0, count), scales.download<uint32_t>(0, count / 128)};
  }
};

kjit_moe_activation_desc describe(const Case& c, const Buffers& b) {
  kjit_moe_activation_desc d;
  kjit_moe_activation_desc_init(&d);
  d.out_dtype = c.fp8 ? KJIT_DTYPE_F8_E4M3FN : KJIT_DTYPE_BF16;
  d.activation = c.p.activation == reference::Activation::silu_mul ? KJIT_ACTIVATION_SILU_MUL
                                                                   : KJIT_ACTIVATION_SWIGLU_OAI;
  d.layout = c.p.layout == reference::GateUp::halves        ? KJIT_GATE_UP_HALVES
             : c.p.layout == reference::GateUp::alternating ? KJIT_GATE_UP_ALTERNATING
                                                            : KJIT_GATE_UP_GROUPS_OF_8;
  d.rows = c.p.rows;
  d.intermediate = c.p.intermediate;
  d.in_row_stride = c.p.in_row_stride;
  d.alpha = c.p.alpha;
  d.limit = c.p.limit;
  d.in = b.in.get();
  d.out = b.out.get();
  if (c.fp8) {
    d.scale_format = c.ue8m0 ? KJIT_QUANT_SCALE_UE8M0 : KJIT_QUANT_SCALE_FP32;
    d.scales = static_cast<float*>(b.scales.get());
  }
  if (c.p.valid_rows) d.valid_rows = static_cast<const int32_t*>(b.valid.get());
  return d;
}

// Elements (bf16 values, or codes and scales) off the reference; bf16 NaN matches NaN.
int64_t wrong(const Output& got, const Output& want) {
  int64_t n = 0;
  for (size_t i = 0; i < want.bf16.size(); ++i) {
    const bool both_nan =
        std::isnan(reference::bf16_to_float(got.bf16[i])) && std::isnan(reference::bf16_to_float(want.bf16[i]));
    n += got.bf16[i] == want.bf16[i] || both_nan ? 0 : 1;
  }
  for (size_t i = 0; i < want.codes.size(); ++i) n += got.codes[i] == want.codes[i] ? 0 : 1;
  for (size_t i = 0; i < want.scale_bits.size(); ++i) n += got.scale_bits[i] == want.scale_bits[i] ? 0 : 1;
  return n;
}

Output run(const Case& c) {
  Buffers b(c);
  const auto d = describe(c, b);
  REQUIRE_MESSAGE(kjit_moe_activation(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  return b.download(c);
}

int64_t wrong_after_run(const Case& c) { return wrong(run(c), expected(c)); }

constexpr reference::GateUp kLayouts[] = {reference::GateUp::halves, reference::GateUp::alternating,
                                          reference::GateUp::groups_of_8};
constexpr reference::Activation kActivations[] = {reference::Activation::silu_mul, reference::Activation::swiglu_oai};

}  // namespace

TEST_SUITE_BEGIN("moe_activation");

TEST_CASE("bf16 output is bit-exact for both activations and layouts, odd row counts, the models' I") {
  for (auto layout : kLayouts)
    for (auto activation : kActivations)
      for (auto [rows, i_cols] : {std::pair<int64_t, int64_t>{1, 768}, {37, 2048}, {4099, 2880}, {3, 8}, {257, 1408}}) {
        CAPTURE(static_cast<int>(layout));
        CAPTURE(static_cast<int>(activation));
        CAPTURE(rows);
        CAPTURE(i_cols);
        CHECK(wrong_after_run(make_case(rows, i_cols, layout, activation, false)) == 0);
      }
}

TEST_CASE("FP8 output is bit-exact in codes and scales, fp32 and UE8M0, both activations and layouts") {
  for (auto layout : kLayouts)
    for (auto activation : kActivations)
      for (bool ue8m0 : {false, true})
        for (auto [rows, i_cols] : {std::pair<int64_t, int64_t>{1, 768}, {37, 2048}, {4099, 768}, {5, 128}}) {
          CAPTURE(static_cast<int>(layout));
          CAPTURE(static_cast<int>(activation));
          CAPTURE(ue8m0);
          CAPTURE(rows);
          CAPTURE(i_cols);
          CHECK(wrong_after_run(make_case(rows, i_cols, layout, activation, true, ue8m0)) == 0);
        }
}

TEST_CASE("a padded input row stride is honoured and the padding never read") {
  for (bool fp8 : {false, true}) {
    Case c = make_case(45, 768, reference::GateUp::halves, reference::Activation::silu_mul, fp8, false, 2 * 768 + 72);
    for (int64_t r = 0; r < c.p.rows; ++r)  // NaN padding: read, it would show in the output
      for (int64_t k = 2 * 768; k < c.p.in_row_stride; ++k)
        c.in[static_cast<size_t>(r * c.p.in_row_stride + k)] = 0x7FC0;
    CAPTURE(fp8);
    CHECK(wrong_after_run(c) == 0);
  }
}

TEST_CASE("valid_rows: rows at or past it are zeros (FP8: codes 0, scale 0), read from the device, any value") {
  for (bool fp8 : {false, true})
    for (int64_t valid : {int64_t{0}, int64_t{1}, int64_t{290}, int64_t{291}, int64_t{300}, int64_t{-5}}) {
      Case c = make_case(291, 2048, reference::GateUp::alternating, reference::Activation::swiglu_oai, fp8, true);
      c.p.valid_rows = valid;
      // NaN in every row past valid_rows: read, it would show.
      for (int64_t r = std::max<int64_t>(valid, 0); r < c.p.rows; ++r)
        for (int64_t k = 0; k < c.p.in_row_stride; ++k) c.in[static_cast<size_t>(r * c.p.in_row_stride + k)] = 0x7FC0;
      const auto want = expected(c);
      const auto got = run(c);
      CAPTURE(fp8);
      CAPTURE(valid);
      CHECK(wrong(got, want) == 0);
      const int64_t live = std::clamp<int64_t>(valid, 0, c.p.rows);
      if (fp8) {
        for (size_t i = static_cast<size_t>(live * 2048); i < got.codes.size(); ++i) REQUIRE(got.codes[i] == 0);
        for (size_t i = static_cast<size_t>(live * 16); i < got.scale_bits.size(); ++i)
          REQUIRE(got.scale_bits[i] == 0u);
      } else {
        for (size_t i = static_cast<size_t>(live * 2048); i < got.bf16.size(); ++i) REQUIRE(got.bf16[i] == 0);
      }
    }
}

TEST_CASE("edge values: inf, -inf, NaN, gates and ups at and past the clamp, other alpha and limit") {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {inf, -inf, std::nanf(""), 7.0f, 7.03125f, -7.0f, -7.03125f, 88.0f, -88.0f, 90.0f, -90.0f,
                            -1.0f, 0.0f, -0.0f, 1e-30f, 3e38f};
  for (auto layout : kLayouts)
    for (auto activation : kActivations)
      for (bool fp8 : {false, true})
        for (auto [alpha, limit] : {std::pair<float, float>{1.702f, 7.0f}, {1.0f, inf}, {-0.5f, 3.5f}}) {
          Case c = make_case(32, 256, layout, activation, fp8);
          c.p.alpha = alpha;
          c.p.limit = limit;
          // Every pair of specials as (h[2k], h[2k + 1]) and as (h[k], h[256 + k]) in rows 0 to 15: gate and up
          // under either layout.
          int k = 0;
          for (float a : specials)
            for (float b : specials) {
              const int64_t row = k / 16, col = k % 16;
              uint16_t* h = c.in.data() + row * c.p.in_row_stride;
              h[2 * col] = reference::activation_bf16_bits(a);
              h[2 * col + 1] = reference::activation_bf16_bits(b);
              h[100 + col] = reference::activation_bf16_bits(a);
              h[256 + 100 + col] = reference::activation_bf16_bits(b);
              ++k;
            }
          CAPTURE(static_cast<int>(layout));
          CAPTURE(static_cast<int>(activation));
          CAPTURE(fp8);
          CAPTURE(alpha);
          CAPTURE(limit);
          CHECK(wrong_after_run(c) == 0);
        }
}

TEST_CASE("FP8 output equals the bf16 output quantized by kjit_fp8_quantize on the GPU, bit for bit") {
  for (bool ue8m0 : {false, true}) {
    Case bf16 = make_case(333, 2048, reference::GateUp::halves, reference::Activation::silu_mul, false);
    Case fp8 = bf16;
    fp8.fp8 = true;
    fp8.ue8m0 = ue8m0;
    const auto act = run(bf16);
    const auto fused = run(fp8);

    DeviceBuffer act_in(0, act.bf16.size() * 2), codes(0, act.bf16.size()), scales(0, act.bf16.size() / 128 * 4);
    act_in.upload(act.bf16);
    codes.poison();
    scales.poison();
    kjit_fp8_quantize_desc q;
    kjit_fp8_quantize_desc_init(&q);
    q.in_dtype = KJIT_DTYPE_BF16;
    q.out_dtype = KJIT_DTYPE_F8_E4M3FN;
    q.rows = 333;
    q.k = 2048;
    q.scale_format = ue8m0 ? KJIT_QUANT_SCALE_UE8M0 : KJIT_QUANT_SCALE_FP32;
    q.in = act_in.get();
    q.out = codes.get();
    q.scales = static_cast<float*>(scales.get());
    REQUIRE_MESSAGE(kjit_fp8_quantize(&q, nullptr) == KJIT_OK, kjit_last_error_message());
    CAPTURE(ue8m0);
    CHECK(codes.download<uint8_t>(0, act.bf16.size()) == fused.codes);
    CHECK(scales.download<uint32_t>(0, act.bf16.size() / 128) == fused.scale_bits);
  }
}

TEST_CASE("a prepared activation is captured into a CUDA graph and replays on new data and new valid_rows") {
  Case c = make_case(517, 768, reference::GateUp::halves, reference::Activation::silu_mul, true);
  c.p.valid_rows = 517;
  Buffers b(c);
  const auto d = describe(c, b);
  REQUIRE_MESSAGE(kjit_moe_activation_prepare(&d, 0) == KJIT_OK, kjit_last_error_message());
  auto other = d;  // a kernel kind never prepared
  other.layout = KJIT_GATE_UP_ALTERNATING;
  other.intermediate = 384;

  GraphCapture capture;
  const kjit_status captured = kjit_moe_activation(&d, capture.stream());
  const kjit_status refused = kjit_moe_activation(&other, capture.stream());
  const std::string refused_message = kjit_last_error_message();
  capture.end();
  REQUIRE(captured == KJIT_OK);
  CHECK(refused == KJIT_ERROR_CAPTURING);
  CHECK(refused_message.find("prepare") != std::string::npos);
  capture.instantiate();
  for (int64_t valid : {int64_t{517}, int64_t{200}, int64_t{0}, int64_t{333}}) {
    c.in = random_h(c.p.rows, c.p.in_row_stride);  // fresh data and a fresh count each replay
    c.p.valid_rows = valid;
    b.upload(c);
    capture.replay();
    CAPTURE(valid);
    CHECK(wrong(b.download(c), expected(c)) == 0);
  }
}

TEST_CASE("the gradient (grad given) is bit-exact for both activations and every layout, the models' I, valid_rows, "
          "a padded input stride and the edge values") {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto activation : kActivations)
    for (const auto layout : kLayouts)
      for (const auto& [rows, i_cols, stride, valid] :
           {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 8, 0, -1}, {37, 768, 0, -1}, {300, 2880, 0, 211},
            {5, 256, 528, 3}}) {
        CAPTURE(static_cast<int>(activation));
        CAPTURE(static_cast<int>(layout));
        CAPTURE(i_cols);
        Case c = make_case(rows, i_cols, layout, activation, false, false, stride);
        if (valid >= 0) c.p.valid_rows = valid;
        if (rows == 5) {  // the edges: inf, NaN, the clamp's bounds and both sides of them
          const float edges[] = {INFINITY, -INFINITY, NAN, 7.0f, -7.0f, 6.99f, 7.01f, -88.5f, 89.5f, 0.0f, -0.0f};
          for (size_t i = 0; i < c.in.size(); ++i)
            if (i % 3 == 0) c.in[i] = reference::bf16_bits_rne(edges[i / 3 % std::size(edges)]);
        }
        std::vector<uint16_t> grad(static_cast<size_t>(rows * i_cols));
        for (auto& g : grad) g = reference::bf16_bits_rne(normal(rng()));
        Buffers b(c);
        DeviceBuffer grad_buffer(0, grad.size() * 2), out(0, static_cast<size_t>(rows * 2 * i_cols * 2));
        grad_buffer.upload(grad);
        out.poison();
        auto d = describe(c, b);
        d.grad = grad_buffer.get();
        d.out = out.get();
        REQUIRE_MESSAGE(kjit_moe_activation(&d, nullptr) == KJIT_OK, kjit_last_error_message());
        REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
        Output got{out.download<uint16_t>(0, static_cast<size_t>(rows * 2 * i_cols)), {}, {}};
        const Output want{reference::moe_activation_gradient(c.p, c.in, grad), {}, {}};
        CHECK_MESSAGE(wrong(got, want) == 0, wrong(got, want), " of ", rows * 2 * i_cols, " gradients differ");
      }
}

TEST_SUITE_END();
