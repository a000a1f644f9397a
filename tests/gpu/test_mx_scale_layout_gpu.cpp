// Scale-layout conversion (linear <-> swizzled 128x4) on a real GPU, byte for
// byte against kjit/reference/fp4_mx.hpp's scales_linear_to_swizzled /
// scales_swizzled_to_linear: uniform stacks of odd shapes, padding written
// with `pad`, round trips, device offsets of both conventions with empty
// experts (and 1024 experts), bad offsets (a device error, nothing written),
// a graph replayed on new offsets without any host synchronisation, and the
// shared harness.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "harness.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp4_mx.hpp"
#include "why.hpp"

using namespace kjit::reference;
using namespace kjit::testing;

namespace {

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> bytes(n);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng()());
  return bytes;
}

// A conversion of a stack whose experts have `expert_rows` rows (uniform, or
// given as offsets in `convention`; `extra_rows` linear rows follow the last
// offset and belong to no expert).
struct Stack {
  std::vector<int64_t> expert_rows;
  int64_t scale_cols = 90;
  kjit_expert_offsets convention = KJIT_OFFSETS_UNSET;  // UNSET: uniform rows
  int64_t extra_rows = 0;

  int64_t used_rows() const { return std::accumulate(expert_rows.begin(), expert_rows.end(), int64_t{0}); }
  int64_t total_rows() const { return used_rows() + extra_rows; }
  int64_t experts() const { return static_cast<int64_t>(expert_rows.size()); }
  size_t linear_bytes() const { return static_cast<size_t>(total_rows() * scale_cols); }
  size_t swizzled_bytes() const {
    return static_cast<size_t>(swizzled_expert_base(expert_rows, experts(), scale_cols));
  }
  // What out must hold: uniform the exact size, with offsets the worst case.
  size_t swizzled_capacity() const {
    return convention == KJIT_OFFSETS_UNSET ? swizzled_bytes()
                                            : static_cast<size_t>(kjit_swizzled_scale_bytes(total_rows(), scale_cols,
                                                                                            experts()));
  }
  std::vector<int32_t> offsets() const {
    std::vector<int32_t> counts(expert_rows.begin(), expert_rows.end());
    return offsets_for(counts, convention);
  }
};

kjit_scale_layout_desc describe(const Stack& s, bool to_swizzled, const DeviceBuffer& in, const DeviceBuffer& out,
                                const DeviceBuffer* offsets, uint8_t pad) {
  kjit_scale_layout_desc d;
  kjit_scale_layout_desc_init(&d);
  d.from = to_swizzled ? KJIT_SCALE_LAYOUT_LINEAR : KJIT_SCALE_LAYOUT_SWIZZLED_128X4;
  d.to = to_swizzled ? KJIT_SCALE_LAYOUT_SWIZZLED_128X4 : KJIT_SCALE_LAYOUT_LINEAR;
  d.experts = s.experts();
  d.rows = s.convention == KJIT_OFFSETS_UNSET ? s.expert_rows[0] : s.total_rows();
  d.scale_cols = s.scale_cols;
  d.pad = pad;
  d.in = static_cast<const uint8_t*>(in.get());
  d.out = static_cast<uint8_t*>(out.get());
  d.out_bytes = out.bytes;
  if (offsets) {
    d.offsets = static_cast<const int32_t*>(offsets->get());
    d.offsets_convention = s.convention;
  }
  return d;
}

// Bytes of `got` that differ from `want` over [0, want.size()), plus bytes
// past it (up to got.size()) that lost their poison; the first few reported.
int64_t mismatches(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got) {
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i] && ++bad <= 5)
      MESSAGE("byte " << i << ": got 0x" << std::hex << int(got[i]) << ", want 0x" << int(want[i]) << std::dec);
  const int64_t touched = touched_bytes(got, want.size(), got.size());
  if (touched) MESSAGE(touched << " bytes past the converted ones were written");
  return bad + touched;
}

// linear -> swizzled and swizzled -> linear of `s` on fresh data, both against the reference.
void check_both_ways(const Stack& s) {
  const auto linear = random_bytes(s.linear_bytes());
  const uint8_t pad = static_cast<uint8_t>(rng()());
  std::vector<uint8_t> swizzled(s.swizzled_bytes());
  scales_linear_to_swizzled(linear, s.expert_rows, s.scale_cols, pad, swizzled);
  std::unique_ptr<DeviceBuffer> offsets;
  if (s.convention != KJIT_OFFSETS_UNSET) {
    offsets = std::make_unique<DeviceBuffer>(0, (s.expert_rows.size() + 1) * 4);
    offsets->upload(s.offsets());
  }
  {
    DeviceBuffer in(0, std::max<size_t>(linear.size(), 1)), out(0, std::max<size_t>(s.swizzled_capacity(), 4));
    if (!linear.empty()) in.upload(linear);
    out.poison();
    const auto d = describe(s, true, in, out, offsets.get(), pad);
    REQUIRE_MESSAGE(kjit_convert_scale_layout(&d, nullptr) == KJIT_OK, kjit_last_error_message());
    REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
    CHECK(mismatches(swizzled, out.download<uint8_t>(0, out.bytes)) == 0);
  }
  {
    // Swizzled input with random padding (never read) -> linear; rows past the last offset keep their poison.
    auto noisy = random_bytes(s.swizzled_bytes());
    std::vector<uint8_t> want(static_cast<size_t>(s.used_rows() * s.scale_cols));
    scales_swizzled_to_linear(noisy, s.expert_rows, s.scale_cols, want);
    // Whole 32-bit words: poison() fills words, so a tail of 1-3 bytes would hold whatever the allocation did.
    DeviceBuffer in(0, std::max<size_t>(noisy.size(), 4)), out(0, (std::max<size_t>(s.linear_bytes(), 1) + 3) / 4 * 4);
    if (!noisy.empty()) in.upload(noisy);
    out.poison();
    const auto d = describe(s, false, in, out, offsets.get(), pad);
    REQUIRE_MESSAGE(kjit_convert_scale_layout(&d, nullptr) == KJIT_OK, kjit_last_error_message());
    REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
    CHECK(mismatches(want, out.download<uint8_t>(0, out.bytes)) == 0);
  }
}

}  // namespace

TEST_SUITE_BEGIN("mx_scale_layout");

TEST_CASE("uniform stacks of odd shapes convert both ways byte for byte, padding written with pad") {
  for (auto [experts, rows, cols] : {std::tuple{1, 1, 1}, {3, 129, 90}, {2, 300, 7}, {5, 128, 4}, {1, 1000, 448},
                                     {128, 17, 180}}) {
    Stack s;
    s.expert_rows.assign(static_cast<size_t>(experts), rows);
    s.scale_cols = cols;
    CAPTURE(experts);
    CAPTURE(rows);
    CAPTURE(cols);
    check_both_ways(s);
  }
}

TEST_CASE("linear -> swizzled -> linear gives back the scales") {
  Stack s;
  s.expert_rows = {129, 0, 1, 300};
  s.scale_cols = 45;
  s.convention = KJIT_OFFSETS_CUMULATIVE_END;
  const auto linear = random_bytes(s.linear_bytes());
  DeviceBuffer offsets(0, 16), a(0, linear.size()), b(0, s.swizzled_capacity()), c(0, linear.size());
  offsets.upload(s.offsets());
  a.upload(linear);
  b.poison();
  c.poison();
  const auto there = describe(s, true, a, b, &offsets, 0x00);
  REQUIRE_MESSAGE(kjit_convert_scale_layout(&there, nullptr) == KJIT_OK, kjit_last_error_message());
  const auto back = describe(s, false, b, c, &offsets, 0x00);
  REQUIRE_MESSAGE(kjit_convert_scale_layout(&back, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  CHECK(c.download<uint8_t>(0, linear.size()) == linear);
}

TEST_CASE("device offsets of both conventions, empty experts and rows past the last offset") {
  for (auto convention : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO})
    for (const std::vector<int64_t>& rows :
         {std::vector<int64_t>{0, 129, 1, 0, 300, 128}, {0}, {5}, {0, 0, 0, 257}, {127, 128, 129}}) {
      Stack s;
      s.expert_rows = rows;
      s.scale_cols = 7;
      s.convention = convention;
      s.extra_rows = 37;
      CAPTURE(convention);
      CAPTURE(rows.size());
      check_both_ways(s);
    }
}

TEST_CASE("1024 experts with random rows: every expert's block starts where the scan says") {
  Stack s;
  std::uniform_int_distribution<int64_t> count(0, 300);
  for (int e = 0; e < 1024; ++e) s.expert_rows.push_back(e % 7 == 0 ? 0 : count(rng()));
  s.scale_cols = 5;
  s.convention = KJIT_OFFSETS_WITH_LEADING_ZERO;
  check_both_ways(s);
}

TEST_CASE("bad offsets write nothing and are reported by kjit_device_errors") {
  struct Bad {
    std::vector<int32_t> offsets;
    kjit_expert_offsets convention;
    const char* says;
  };
  for (const auto& bad : {Bad{{10, 5, 20}, KJIT_OFFSETS_CUMULATIVE_END, "decrease at expert 1"},
                          Bad{{10, 20, 41}, KJIT_OFFSETS_CUMULATIVE_END, "offset for expert 2 outside [0, rows]"},
                          Bad{{-1, 5, 20}, KJIT_OFFSETS_CUMULATIVE_END, "offset for expert 0"},
                          Bad{{3, 5, 20, 30}, KJIT_OFFSETS_WITH_LEADING_ZERO, "first offset that is not 0"}}) {
    for (bool to_swizzled : {true, false}) {
      Stack s;
      s.expert_rows = {10, 10, 20};  // sizes only; the offsets below are what the device reads
      s.scale_cols = 9;
      s.convention = bad.convention;
      DeviceBuffer offsets(0, bad.offsets.size() * 4), in(0, 1 << 16), out(0, 1 << 16);
      offsets.upload(bad.offsets);
      in.upload(random_bytes(1 << 16));
      out.poison();
      auto d = describe(s, to_swizzled, in, out, &offsets, 0x00);
      CAPTURE(bad.says);
      REQUIRE_MESSAGE(kjit_convert_scale_layout(&d, nullptr) == KJIT_OK, kjit_last_error_message());
      CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
      const std::string message = kjit_last_error_message();
      CHECK_MESSAGE(message.find(bad.says) != std::string::npos, message);
      CHECK(message.find("wrote nothing") != std::string::npos);
      CHECK(out.written_words() == 0);
    }
  }
}

TEST_CASE("a prepared conversion with offsets is captured once and replays right on new offsets") {
  Stack s;
  s.expert_rows = {100, 0, 200, 3};
  s.scale_cols = 90;
  s.convention = KJIT_OFFSETS_CUMULATIVE_END;
  const int64_t total = s.total_rows();
  DeviceBuffer offsets(0, 16), in(0, s.linear_bytes()), out(0, s.swizzled_capacity());
  const auto d = describe(s, true, in, out, &offsets, 0xEE);
  REQUIRE_MESSAGE(kjit_convert_scale_layout_prepare(&d, 0) == KJIT_OK, kjit_last_error_message());
  GraphCapture capture;
  REQUIRE_MESSAGE(kjit_convert_scale_layout(&d, capture.stream()) == KJIT_OK, kjit_last_error_message());
  capture.end();
  capture.instantiate();
  for (const std::vector<int64_t>& rows : {std::vector<int64_t>{100, 0, 200, 3}, {0, 303, 0, 0}, {1, 1, 1, 300}}) {
    Stack now = s;
    now.expert_rows = rows;
    REQUIRE(now.total_rows() == total);
    const auto linear = random_bytes(now.linear_bytes());
    std::vector<uint8_t> want(now.swizzled_bytes());
    scales_linear_to_swizzled(linear, rows, s.scale_cols, 0xEE, want);
    offsets.upload(now.offsets());
    in.upload(linear);
    out.poison();
    capture.replay();
    REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
    CHECK(mismatches(want, out.download<uint8_t>(0, out.bytes)) == 0);
  }
}

TEST_CASE("the shared harness finds scale-layout conversions exact, uniform and with offsets") {
  kjit::Runtime& runtime = kjit::Runtime::global();
  auto device = runtime.device(0);
  REQUIRE_MESSAGE(device.has_value(), why(device));
  namespace codegen = kjit::codegen;
  const auto linear = codegen::MxScaleLayout::linear, swizzled = codegen::MxScaleLayout::swizzled_128x4;
  for (const auto& spec :
       {codegen::MxScaleLayoutSpec{.from = linear, .to = swizzled, .scale_cols = 90},
        codegen::MxScaleLayoutSpec{.from = swizzled, .to = linear, .scale_cols = 3},
        codegen::MxScaleLayoutSpec{.from = linear, .to = swizzled, .scale_cols = 448, .with_offsets = true},
        codegen::MxScaleLayoutSpec{.from = swizzled, .to = linear, .scale_cols = 7, .with_offsets = true,
                                   .offsets = codegen::OffsetsConvention::with_leading_zero}}) {
    const std::string name = codegen::canonical(spec);
    CAPTURE(name);
    const auto outcome = kjit::harness::check_spec(runtime, **device, spec, rng());
    CHECK_MESSAGE(outcome.ok, outcome.text);
  }
}

TEST_SUITE_END();
