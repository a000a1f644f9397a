// MX-format dequant (NVFP4, MXFP4, MXFP8) on a real GPU, bit-exact against
// kjit/reference/fp4_mx.hpp on fresh random data: every format, scale layout,
// output dtype and NVFP4 convention on odd shapes (every e2m1 code and the
// scale extremes planted in each), global-scale extremes, kept subnormals,
// padded strides, stacked and selected experts (a bad id: a device error and
// nothing written), a stack over 2^31 elements, graph capture after prepare,
// and the shared harness.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_support.hpp"
#include "harness.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp4_mx.hpp"
#include "kjit/reference/fp8.hpp"
#include "why.hpp"

using namespace kjit::reference;
using namespace kjit::testing;

namespace {

struct Case {
  kjit_block_format format = KJIT_BLOCK_FORMAT_NVFP4;
  kjit_dtype element = KJIT_DTYPE_INVALID;  // MXFP8: E4M3FN or E5M2
  kjit_dtype out = KJIT_DTYPE_BF16;
  kjit_scale_layout layout = KJIT_SCALE_LAYOUT_LINEAR;
  kjit_scale_convention convention = KJIT_SCALE_MULTIPLY;  // NVFP4 only
  int64_t experts = 2, rows = 129, k = 96;
  int64_t in_stride = 0, out_stride = 0;  // bytes / elements; 0: dense
  std::vector<int32_t> ids;               // empty: every expert
};

bool nvfp4(const Case& c) { return c.format == KJIT_BLOCK_FORMAT_NVFP4; }
bool fp4(const Case& c) { return c.format != KJIT_BLOCK_FORMAT_MXFP8; }
int64_t block(const Case& c) { return nvfp4(c) ? kNvfp4Block : kMxBlock; }
int64_t scale_cols(const Case& c) { return c.k / block(c); }
int64_t row_bytes(const Case& c) { return fp4(c) ? c.k / 2 : c.k; }
int64_t in_stride(const Case& c) { return c.in_stride ? c.in_stride : row_bytes(c); }
int64_t out_stride(const Case& c) { return c.out_stride ? c.out_stride : c.k; }
int64_t slots(const Case& c) { return c.ids.empty() ? c.experts : static_cast<int64_t>(c.ids.size()); }
int out_size(kjit_dtype t) { return t == KJIT_DTYPE_F32 ? 4 : 2; }

struct Inputs {
  std::vector<uint8_t> codes;          // [E, rows, in_stride] bytes
  std::vector<uint8_t> linear_scales;  // [E, rows, scale_cols]: what the reference reads
  std::vector<uint8_t> scales;         // what the kernel reads, in the case's layout
  std::vector<float> globals;          // NVFP4: [E]
};

void fill_random(std::vector<uint8_t>& bytes) {
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t bits = rng()();
    std::memcpy(&bytes[i], &bits, std::min<size_t>(8, bytes.size() - i));
  }
}

// A scale byte: mostly moderate (values stay finite and distinct), now and then anything at all.
uint8_t random_scale(const Case& c) {
  const uint64_t draw = rng()();
  if (draw % 16 == 0) return static_cast<uint8_t>(draw >> 8);
  if (nvfp4(c)) return static_cast<uint8_t>((0x18 + (draw >> 8) % 0x50) | ((draw & 0x100) ? 0x80 : 0));  // either sign
  return static_cast<uint8_t>(127 - 24 + (draw >> 8) % 49);
}

// The linear scales in the case's layout (swizzled: padding filled with a random byte, never read).
std::vector<uint8_t> in_layout(const Case& c, const std::vector<uint8_t>& linear) {
  if (c.layout == KJIT_SCALE_LAYOUT_LINEAR) return linear;
  const std::vector<int64_t> expert_rows(static_cast<size_t>(c.experts), c.rows);
  std::vector<uint8_t> swizzled(static_cast<size_t>(c.experts * swizzled_scale_bytes(c.rows, scale_cols(c))));
  scales_linear_to_swizzled(linear, expert_rows, scale_cols(c), static_cast<uint8_t>(rng()()), swizzled);
  return swizzled;
}

Inputs random_inputs(const Case& c) {
  Inputs x;
  x.codes.resize(static_cast<size_t>(c.experts * c.rows * in_stride(c)));
  fill_random(x.codes);
  // Every e2m1 code (0x0..0xF) at the start of the first row.
  if (fp4(c))
    for (size_t i = 0; i < 8 && i < static_cast<size_t>(row_bytes(c)); ++i)
      x.codes[i] = static_cast<uint8_t>((2 * i + 1) << 4 | 2 * i);
  x.linear_scales.resize(static_cast<size_t>(c.experts * c.rows * scale_cols(c)));
  for (auto& s : x.linear_scales) s = random_scale(c);
  // The scale extremes, spread over the scale bytes: NVFP4 e4m3 NaN (both signs), subnormals, 448, +-0;
  // UE8M0 2^-127, 2^127, NaN.
  const std::vector<uint8_t> edges = nvfp4(c) ? std::vector<uint8_t>{0x7F, 0xFF, 0x01, 0x07, 0x7E, 0x00, 0x80}
                                              : std::vector<uint8_t>{0x00, 0xFE, 0xFF, 0x01};
  const size_t stride = std::max<size_t>(1, x.linear_scales.size() / (2 * edges.size()));
  for (size_t i = 0; i < edges.size() && i * stride < x.linear_scales.size(); ++i)
    x.linear_scales[i * stride] = edges[i];
  x.scales = in_layout(c, x.linear_scales);
  std::uniform_real_distribution<float> dist(0.01f, 4.0f);
  x.globals.resize(static_cast<size_t>(c.experts));
  for (auto& g : x.globals) g = dist(rng());
  return x;
}

// The reference's fp32 value of element (e, r, col).
float reference_value(const Case& c, const Inputs& x, int64_t e, int64_t r, int64_t col) {
  const std::span<const uint8_t> row(&x.codes[static_cast<size_t>((e * c.rows + r) * in_stride(c))],
                                     static_cast<size_t>(row_bytes(c)));
  const uint8_t scale = x.linear_scales[static_cast<size_t>((e * c.rows + r) * scale_cols(c) + col / block(c))];
  if (nvfp4(c)) return nvfp4_value(e2m1_code_at(row, col), scale, x.globals[static_cast<size_t>(e)], c.convention);
  if (fp4(c)) return mx_value(decode_e2m1(e2m1_code_at(row, col)), scale);
  return mx_value(decode_fp8(c.element, row[static_cast<size_t>(col)]), scale);
}

ExpectedValue rounded(kjit_dtype out, float v) {
  if (out == KJIT_DTYPE_F32) return {float_bits(v), std::isnan(v)};
  if (out == KJIT_DTYPE_BF16) return {bf16_bits_rne(v), std::isnan(v)};
  return {f16_bits_rne(v), std::isnan(v)};
}

struct DeviceCase {
  DeviceBuffer in, scales, globals, out;
  std::unique_ptr<DeviceBuffer> ids;
  DeviceCase(const Case& c, const Inputs& x, int device = 0)
      : in(device, x.codes.size()),
        scales(device, x.scales.size()),
        globals(device, x.globals.size() * 4),
        out(device, static_cast<size_t>(slots(c) * c.rows * out_stride(c) * out_size(c.out)) + 4) {
    upload(x);
    if (!c.ids.empty()) {
      ids = std::make_unique<DeviceBuffer>(device, c.ids.size() * 4);
      ids->upload(c.ids);
    }
  }
  void upload(const Inputs& x) {
    in.upload(x.codes);
    scales.upload(x.scales);
    globals.upload(x.globals);
    out.poison();
  }
};

kjit_mx_dequant_desc describe(const Case& c, const DeviceCase& dev) {
  kjit_mx_dequant_desc d;
  kjit_mx_dequant_desc_init(&d);
  d.format = c.format;
  d.element_dtype = c.element;
  d.out_dtype = c.out;
  d.experts = c.experts;
  d.rows = c.rows;
  d.k = c.k;
  d.in_row_stride = c.in_stride;
  d.out_row_stride = c.out_stride;
  d.scale_layout = c.layout;
  d.in = dev.in.get();
  d.scales = static_cast<const uint8_t*>(dev.scales.get());
  if (nvfp4(c)) {
    d.global_scales = static_cast<const float*>(dev.globals.get());
    d.global_scale_convention = c.convention;
  }
  d.out = dev.out.get();
  if (dev.ids) {
    d.expert_ids = static_cast<const int32_t*>(dev.ids->get());
    d.num_expert_ids = static_cast<int64_t>(c.ids.size());
  }
  return d;
}

// Compares the output (every element, and the padding columns of a padded
// output: still poison) with the reference; returns mismatches, the first few reported.
int64_t compare(const Case& c, const Inputs& x, const std::vector<uint8_t>& out) {
  const int size = out_size(c.out);
  int64_t bad = 0;
  for (int64_t s = 0; s < slots(c); ++s) {
    const int64_t e = c.ids.empty() ? s : c.ids[static_cast<size_t>(s)];
    for (int64_t r = 0; r < c.rows; ++r) {
      const size_t row_start = static_cast<size_t>((s * c.rows + r) * out_stride(c) * size);
      for (int64_t col = 0; col < c.k; ++col) {
        const auto want = rounded(c.out, reference_value(c, x, e, r, col));
        uint32_t got = 0;
        std::memcpy(&got, &out[row_start + static_cast<size_t>(col * size)], static_cast<size_t>(size));
        if (!matches(c.out, want, got) && ++bad <= 5)
          MESSAGE("slot " << s << " row " << r << " col " << col << ": got 0x" << std::hex << got << ", want 0x"
                          << want.bits << std::dec);
      }
      const size_t padding_end = row_start + static_cast<size_t>(out_stride(c) * size);
      if (touched_bytes(out, row_start + static_cast<size_t>(c.k * size), padding_end) != 0 && ++bad <= 5)
        MESSAGE("slot " << s << " row " << r << ": the output row's padding was written");
    }
  }
  return bad;
}

// Runs one case on device 0 and checks it bit for bit.
void run_case(const Case& c) {
  const auto x = random_inputs(c);
  DeviceCase dev(c, x);
  const auto desc = describe(c, dev);
  REQUIRE_MESSAGE(kjit_dequant_mx(&desc, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  CHECK(compare(c, x, dev.out.download<uint8_t>(0, dev.out.bytes - 4)) == 0);
}

// The format variants: NVFP4 in both conventions, MXFP4, MXFP8 in both element types.
std::vector<Case> format_variants() {
  std::vector<Case> out;
  for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
    Case c;
    c.convention = convention;
    out.push_back(c);
  }
  Case mxfp4;
  mxfp4.format = KJIT_BLOCK_FORMAT_MXFP4;
  out.push_back(mxfp4);
  for (auto element : {KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E5M2}) {
    Case c;
    c.format = KJIT_BLOCK_FORMAT_MXFP8;
    c.element = element;
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST_SUITE_BEGIN("mx_dequant");

TEST_CASE("every format, scale layout, output dtype and convention is bit-exact on odd shapes") {
  // Rows 1, 3, 129 and 300 (partial 128-row swizzle tiles); K of 1, 3 (padded to 4 in the
  // swizzle), 90 and 7 scale columns; the K turns with the combination so that every kernel
  // shape is met without compiling every product.
  const int64_t rows[] = {1, 3, 129, 300};
  const int64_t mx_k[] = {32, 96, 2880, 224};
  const int64_t nvfp4_k[] = {16, 48, 2880, 112};
  int turn = 0;
  for (Case c : format_variants())
    for (auto layout : {KJIT_SCALE_LAYOUT_LINEAR, KJIT_SCALE_LAYOUT_SWIZZLED_128X4})
      for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F16, KJIT_DTYPE_F32}) {
        c.layout = layout;
        c.out = out;
        c.rows = rows[turn % 4];
        c.k = nvfp4(c) ? nvfp4_k[(turn / 4 + turn) % 4] : mx_k[(turn / 4 + turn) % 4];
        c.experts = 1 + turn % 3;
        ++turn;
        CAPTURE(c.format);
        CAPTURE(c.element);
        CAPTURE(c.convention);
        CAPTURE(layout);
        CAPTURE(out);
        CAPTURE(c.rows);
        CAPTURE(c.k);
        run_case(c);
      }
}

TEST_CASE("NVFP4 global scales at the extremes: zero, infinity, a subnormal, near FLT_MAX, in both conventions") {
  for (auto convention : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE})
    for (auto out : {KJIT_DTYPE_F32, KJIT_DTYPE_BF16}) {
      Case c;
      c.convention = convention;
      c.out = out;
      c.experts = 5;
      c.rows = 130;
      c.k = 64;
      c.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
      auto x = random_inputs(c);
      x.globals = {0.0f, std::numeric_limits<float>::infinity(), 1e-40f, 3e38f, 1.0f / 3.0f};
      DeviceCase dev(c, x);
      const auto desc = describe(c, dev);
      CAPTURE(convention);
      CAPTURE(out);
      REQUIRE_MESSAGE(kjit_dequant_mx(&desc, nullptr) == KJIT_OK, kjit_last_error_message());
      REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
      CHECK(compare(c, x, dev.out.download<uint8_t>(0, dev.out.bytes - 4)) == 0);
    }
}

TEST_CASE("MX scale 0x00 (2^-127) keeps fp32 subnormal products, 0xFF gives NaN, 0xFE overflows to infinity") {
  Case c;
  c.format = KJIT_BLOCK_FORMAT_MXFP4;
  c.out = KJIT_DTYPE_F32;
  c.experts = 1;
  c.rows = 3;
  c.k = 32;
  Inputs x;
  x.codes.assign(48, 0x71);  // e2m1 0.5 (low nibble, code 1) and 6 (high nibble, code 7)
  x.linear_scales = {0x00, 0xFF, 0xFE};
  x.scales = x.linear_scales;
  x.globals = {1.0f};
  DeviceCase dev(c, x);
  const auto desc = describe(c, dev);
  REQUIRE_MESSAGE(kjit_dequant_mx(&desc, nullptr) == KJIT_OK, kjit_last_error_message());
  const auto values = dev.out.download<float>(0, 96);
  CHECK(float_bits(values[0]) == 0x00200000u);  // 0.5 * 2^-127 = 2^-128: a subnormal, not flushed
  CHECK(values[1] == std::ldexp(6.0f, -127));
  CHECK(std::isnan(values[32]));
  CHECK(std::isinf(values[65]));  // 6 * 2^127
  CHECK(values[64] == std::ldexp(1.0f, 126));  // 0.5 * 2^127
  CHECK(compare(c, x, dev.out.download<uint8_t>(0, dev.out.bytes - 4)) == 0);
}

TEST_CASE("padded row strides on input and output are honoured, the padding untouched, narrower accesses exact") {
  for (Case c : format_variants()) {
    c.experts = 2;
    c.rows = 131;
    c.k = 2880;
    c.in_stride = row_bytes(c) + (fp4(c) ? 24 : 40);  // 8-byte multiples: not the widest access
    c.out_stride = 2888;
    c.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
    CAPTURE(c.format);
    run_case(c);
  }
}

TEST_CASE("DeepSeek-V3 and gpt-oss shapes are bit-exact: NVFP4 K 7168 / 2048 swizzled, MXFP4 K 2880 linear") {
  for (auto [format, k, rows, layout] :
       {std::tuple{KJIT_BLOCK_FORMAT_NVFP4, 7168, 4096, KJIT_SCALE_LAYOUT_SWIZZLED_128X4},
        {KJIT_BLOCK_FORMAT_NVFP4, 2048, 7168, KJIT_SCALE_LAYOUT_SWIZZLED_128X4},
        {KJIT_BLOCK_FORMAT_MXFP4, 2880, 5760, KJIT_SCALE_LAYOUT_LINEAR}}) {
    Case c;
    c.format = format;
    c.k = k;
    c.rows = rows;
    c.layout = layout;
    c.experts = 2;
    CAPTURE(k);
    run_case(c);
  }
}

TEST_CASE("selected experts write a compact output in id order, repeats allowed, each with its scales and global") {
  for (auto layout : {KJIT_SCALE_LAYOUT_LINEAR, KJIT_SCALE_LAYOUT_SWIZZLED_128X4}) {
    Case c;
    c.experts = 5;
    c.rows = 130;
    c.k = 256;
    c.layout = layout;
    c.ids = {4, 0, 4, 2};
    run_case(c);
    c.format = KJIT_BLOCK_FORMAT_MXFP8;
    c.element = KJIT_DTYPE_F8_E4M3FN;
    run_case(c);
  }
}

TEST_CASE("an expert id out of range writes nothing and is reported by kjit_device_errors") {
  Case c;
  c.experts = 4;
  c.rows = 64;
  c.k = 256;
  c.ids = {1, 7, 2};
  const auto x = random_inputs(c);
  DeviceCase dev(c, x);
  const auto desc = describe(c, dev);
  REQUIRE(kjit_dequant_mx(&desc, nullptr) == KJIT_OK);  // the ids live on the device
  CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
  CHECK(std::string(kjit_last_error_message()).find("expert id 7") != std::string::npos);
  CHECK(dev.out.written_words() == 0);
  CHECK(kjit_device_errors(0) == KJIT_OK);  // reading cleared it
}

TEST_CASE("a stack over 2^31 elements is dequantised correctly at its start, across 2^31 and at its end") {
  // Two NVFP4 experts of DeepSeek-V3's gate_up K, swizzled scales, bf16 out: about 1.1 GB in, 4.3 GB out.
  Case c;
  c.k = 7168;
  c.experts = 2;
  c.rows = (int64_t{1} << 31) / (c.experts * c.k) + 64;
  c.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  const size_t elements = static_cast<size_t>(c.experts * c.rows * c.k);
  REQUIRE(elements > (size_t{1} << 31));
  size_t free_bytes = 0, total = 0;
  make_current(0);
  api().cuMemGetInfo(&free_bytes, &total);
  if (free_bytes < elements / 2 + elements * 2 + (size_t{1} << 30)) {
    MESSAGE("skipped: needs " << (elements / 2 + elements * 2) / (size_t{1} << 30) + 1 << " GiB free");
    return;
  }
  const auto x = random_inputs(c);
  DeviceBuffer in(0, x.codes.size()), scales(0, x.scales.size()), globals(0, 8),
      out(0, elements * 2);
  in.upload(x.codes);
  scales.upload(x.scales);
  globals.upload(x.globals);
  out.poison();
  kjit_mx_dequant_desc d;
  kjit_mx_dequant_desc_init(&d);
  d.format = c.format;
  d.out_dtype = c.out;
  d.experts = c.experts;
  d.rows = c.rows;
  d.k = c.k;
  d.scale_layout = c.layout;
  d.global_scale_convention = c.convention;
  d.in = in.get();
  d.scales = static_cast<const uint8_t*>(scales.get());
  d.global_scales = static_cast<const float*>(globals.get());
  d.out = out.get();
  REQUIRE_MESSAGE(kjit_dequant_mx(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  // Rows counted over the stack: the first, those around element 2^31, the last.
  const int64_t boundary = (int64_t{1} << 31) / c.k;
  for (int64_t first : {int64_t{0}, boundary - 100, c.experts * c.rows - 200}) {
    const auto bytes = out.download<uint8_t>(static_cast<size_t>(first * c.k * 2), static_cast<size_t>(200 * c.k * 2));
    int64_t bad = 0;
    for (int64_t i = 0; i < 200; ++i) {
      const int64_t e = (first + i) / c.rows, r = (first + i) % c.rows;
      for (int64_t col = 0; col < c.k; ++col) {
        uint16_t got;
        std::memcpy(&got, &bytes[static_cast<size_t>((i * c.k + col) * 2)], 2);
        if (!matches(c.out, rounded(c.out, reference_value(c, x, e, r, col)), got)) ++bad;
      }
    }
    CAPTURE(first);
    CHECK(bad == 0);
  }
}

TEST_CASE("a prepared MX dequant is captured into a CUDA graph and replays on new data, unprepared capture fails") {
  Case c;
  c.experts = 3;
  c.rows = 300;
  c.k = 2048;
  c.layout = KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  c.convention = KJIT_SCALE_DIVIDE;
  Inputs x = random_inputs(c);
  DeviceCase dev(c, x);
  const auto desc = describe(c, dev);
  REQUIRE_MESSAGE(kjit_dequant_mx_prepare(&desc, 0) == KJIT_OK, kjit_last_error_message());
  Case other = c;
  other.k = 2064;  // never prepared
  const auto other_x = random_inputs(other);
  DeviceCase other_dev(other, other_x);
  const auto other_desc = describe(other, other_dev);

  GraphCapture capture;
  const kjit_status captured = kjit_dequant_mx(&desc, capture.stream());
  const kjit_status refused = kjit_dequant_mx(&other_desc, capture.stream());
  const std::string refused_message = kjit_last_error_message();
  capture.end();
  REQUIRE(captured == KJIT_OK);
  CHECK(refused == KJIT_ERROR_CAPTURING);
  CHECK(refused_message.find("prepare") != std::string::npos);
  capture.instantiate();
  for (int replay = 0; replay < 3; ++replay) {
    x = random_inputs(c);  // fresh data each replay
    dev.upload(x);
    capture.replay();
    CHECK(compare(c, x, dev.out.download<uint8_t>(0, dev.out.bytes - 4)) == 0);
  }
}

TEST_CASE("after prepare, an NVFP4 launch on views off alignment is captured and is bit-exact") {
  Case c;
  c.experts = 1;
  c.rows = 256;
  c.k = 2048;
  const Inputs x = random_inputs(c);
  DeviceCase dev(c, x);
  const auto desc = describe(c, dev);
  REQUIRE_MESSAGE(kjit_dequant_mx_prepare(&desc, 0) == KJIT_OK, kjit_last_error_message());
  // The same tensors one byte of codes and one bf16 pair in: the narrowest vector, loaded only by a prepare
  // of every width.
  DeviceBuffer in(0, x.codes.size() + 1), out(0, dev.out.bytes + 4);
  in.upload(shifted(x.codes, 1));
  out.poison();
  auto view = desc;
  view.in = static_cast<const uint8_t*>(in.get()) + 1;
  view.out = static_cast<uint8_t*>(out.get()) + 4;
  capture_and_replay_once([&](kjit_stream stream) { return kjit_dequant_mx(&view, stream); });
  CHECK(compare(c, x, out.download<uint8_t>(4, dev.out.bytes - 4)) == 0);
}

TEST_CASE("the shared harness finds the manifests' MX dequant kinds and narrower accesses bit-exact") {
  kjit::Runtime& runtime = kjit::Runtime::global();
  auto device = runtime.device(0);
  REQUIRE_MESSAGE(device.has_value(), why(device));
  namespace codegen = kjit::codegen;
  std::vector<codegen::MxDequantSpec> specs;
  specs.push_back({.format = codegen::MxFormat::mxfp4, .k = 2880, .vec = 32});
  specs.push_back({.format = codegen::MxFormat::nvfp4, .k = 7168,
                   .scale_layout = codegen::MxScaleLayout::swizzled_128x4, .vec = 32});
  specs.push_back({.format = codegen::MxFormat::nvfp4, .out = codegen::DType::f32, .k = 48,
                   .scale_layout = codegen::MxScaleLayout::swizzled_128x4,
                   .convention = codegen::ScaleConvention::divide, .vec = 16, .selected_experts = true});
  specs.push_back({.format = codegen::MxFormat::mxfp8, .element = codegen::DType::f8_e5m2, .out = codegen::DType::f16,
                   .k = 96, .vec = 1});
  specs.push_back({.format = codegen::MxFormat::mxfp4, .k = 64, .vec = 2});
  for (const auto& spec : specs) {
    const std::string name = codegen::canonical(spec);
    CAPTURE(name);
    const auto outcome = kjit::harness::check_spec(runtime, **device, spec, rng());
    CHECK_MESSAGE(outcome.ok, outcome.text);
  }
}

TEST_SUITE_END();
