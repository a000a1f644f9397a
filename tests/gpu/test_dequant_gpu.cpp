// FP8 dequant on a real GPU, bit-exact against the CPU reference on fresh
// random data: every variant, odd shapes and partial blocks, strides, selected
// experts, NaN/inf, a tensor over 2^31 elements, graph capture and replay, and
// (with two GPUs) launches on a device other than the current one.
#include <doctest/doctest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <memory>
#include <tuple>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/reference/fp8.hpp"
#include "kjit/kjit.h"

using namespace kjit::reference;

using namespace kjit::testing;

namespace {

struct Case {
  kjit_dtype in = KJIT_DTYPE_F8_E4M3FN, out = KJIT_DTYPE_BF16;
  kjit_scale_granularity granularity = KJIT_SCALE_PER_BLOCK;
  kjit_scale_convention convention = KJIT_SCALE_MULTIPLY;
  int64_t experts = 1, rows = 256, cols = 512, block_rows = 128, block_cols = 128;
  int64_t in_stride = 0, out_stride = 0;
  std::vector<int32_t> ids;  // empty: every expert
};

int out_size(kjit_dtype t) { return t == KJIT_DTYPE_F32 ? 4 : 2; }

int64_t scale_rows(const Case& c) {
  return c.granularity == KJIT_SCALE_PER_TENSOR ? 1
         : c.granularity == KJIT_SCALE_PER_ROW  ? c.rows
                                                : (c.rows + c.block_rows - 1) / c.block_rows;
}
int64_t scale_cols(const Case& c) {
  return c.granularity == KJIT_SCALE_PER_BLOCK ? (c.cols + c.block_cols - 1) / c.block_cols : 1;
}

struct Inputs {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

Inputs random_inputs(const Case& c) {
  const int64_t in_stride = c.in_stride ? c.in_stride : c.cols;
  Inputs x;
  x.codes.resize(static_cast<size_t>(c.experts * c.rows * in_stride));
  // Eight random bytes per draw: the 2^31-element case fills 2 GiB.
  for (size_t i = 0; i < x.codes.size(); i += 8) {
    const uint64_t bits = rng()();
    std::memcpy(&x.codes[i], &bits, std::min<size_t>(8, x.codes.size() - i));
  }
  x.scales.resize(static_cast<size_t>(c.experts * scale_rows(c) * scale_cols(c)));
  std::uniform_real_distribution<float> dist(0.01f, 8.0f);
  for (auto& s : x.scales) s = dist(rng());
  return x;
}

kjit_dequant_desc describe(const Case& c, const DeviceBuffer& in, const DeviceBuffer& scales, const DeviceBuffer& out,
                           const DeviceBuffer* ids) {
  kjit_dequant_desc d;
  kjit_dequant_desc_init(&d);
  d.in_dtype = c.in;
  d.out_dtype = c.out;
  d.experts = c.experts;
  d.rows = c.rows;
  d.cols = c.cols;
  d.in_row_stride = c.in_stride;
  d.out_row_stride = c.out_stride;
  d.scale_granularity = c.granularity;
  if (c.granularity == KJIT_SCALE_PER_BLOCK) {
    d.block_rows = c.block_rows;
    d.block_cols = c.block_cols;
  }
  d.scale_rows = scale_rows(c);
  d.scale_cols = scale_cols(c);
  d.scale_convention = c.convention;
  d.in = in.get();
  d.scales = static_cast<const float*>(scales.get());
  d.out = out.get();
  if (ids) {
    d.expert_ids = static_cast<const int32_t*>(ids->get());
    d.num_expert_ids = static_cast<int64_t>(c.ids.size());
  }
  return d;
}

// Compares the whole output with the reference; returns mismatches (first few reported).
int64_t compare(const Case& c, const Inputs& x, const std::vector<uint8_t>& out_bytes) {
  const int64_t in_stride = c.in_stride ? c.in_stride : c.cols;
  const int64_t out_stride = c.out_stride ? c.out_stride : c.cols;
  const int64_t slots = c.ids.empty() ? c.experts : static_cast<int64_t>(c.ids.size());
  const int64_t srows = scale_rows(c), scols = scale_cols(c);
  const int size = out_size(c.out);
  int64_t bad = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = c.ids.empty() ? s : c.ids[static_cast<size_t>(s)];
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t col = 0; col < c.cols; ++col) {
        const uint8_t code = x.codes[static_cast<size_t>((e * c.rows + r) * in_stride + col)];
        int64_t si = 0;
        if (c.granularity == KJIT_SCALE_PER_ROW) si = r;
        if (c.granularity == KJIT_SCALE_PER_BLOCK) si = (r / c.block_rows) * scols + col / c.block_cols;
        const float scale = x.scales[static_cast<size_t>(e * srows * scols + si)];
        const auto want = dequant_value(c.in, c.out, code, scale, c.convention);
        uint32_t got = 0;
        std::memcpy(&got, &out_bytes[static_cast<size_t>(((s * c.rows + r) * out_stride + col) * size)],
                    static_cast<size_t>(size));
        if (!matches(c.out, want, got) && ++bad <= 5)
          MESSAGE("slot " << s << " row " << r << " col " << col << " code 0x" << std::hex << int(code)
                          << " scale " << scale << ": got 0x" << got << ", want 0x" << want.bits << std::dec);
      }
  }
  return bad;
}

// Runs one case on `device` and checks it bit for bit.
void run_case(const Case& c, int device = 0) {
  const auto x = random_inputs(c);
  const int64_t out_stride = c.out_stride ? c.out_stride : c.cols;
  const int64_t slots = c.ids.empty() ? c.experts : static_cast<int64_t>(c.ids.size());
  DeviceBuffer in(device, x.codes.size()), scales(device, x.scales.size() * 4),
      out(device, static_cast<size_t>(slots * c.rows * out_stride * out_size(c.out)) + 4);
  in.upload(x.codes);
  scales.upload(x.scales);
  out.poison();
  std::unique_ptr<DeviceBuffer> ids;
  if (!c.ids.empty()) {
    ids = std::make_unique<DeviceBuffer>(device, c.ids.size() * 4);
    ids->upload(c.ids);
  }
  const auto desc = describe(c, in, scales, out, ids.get());
  const kjit_status status = kjit_dequant_fp8(&desc, nullptr);
  REQUIRE_MESSAGE(status == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(device) == KJIT_OK, kjit_last_error_message());
  const auto bytes = out.download<uint8_t>(0, out.bytes - 4);
  CHECK(compare(c, x, bytes) == 0);
}

}  // namespace

TEST_SUITE_BEGIN("dequant");

TEST_CASE("every dtype, granularity and convention is bit-exact on odd shapes with partial blocks") {
  for (auto in : {KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E5M2})
    for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F16, KJIT_DTYPE_F32})
      for (auto g : {KJIT_SCALE_PER_TENSOR, KJIT_SCALE_PER_ROW, KJIT_SCALE_PER_BLOCK})
        for (auto conv : {KJIT_SCALE_MULTIPLY, KJIT_SCALE_DIVIDE}) {
          Case c;
          c.in = in;
          c.out = out;
          c.granularity = g;
          c.convention = conv;
          c.experts = 3;
          c.rows = 333;   // partial last row block
          c.cols = 1000;  // partial last column block, vec 8
          CAPTURE(in);
          CAPTURE(out);
          CAPTURE(g);
          CAPTURE(conv);
          run_case(c);
        }
}

TEST_CASE("block shapes that split vectors, tiny blocks and odd column counts are bit-exact") {
  for (auto [br, bc, cols] : {std::tuple{3, 5, 97}, {1, 32, 7168}, {128, 128, 7169}, {64, 48, 2048}, {7, 1, 40}}) {
    Case c;
    c.block_rows = br;
    c.block_cols = bc;
    c.cols = cols;
    c.rows = 129;
    c.experts = 2;
    CAPTURE(br);
    CAPTURE(bc);
    CAPTURE(cols);
    run_case(c);
  }
}

TEST_CASE("padded row strides on input and output are honoured, padding untouched") {
  Case c;
  c.rows = 200;
  c.cols = 384;
  c.in_stride = 400;
  c.out_stride = 392;
  c.experts = 2;
  run_case(c);
}

TEST_CASE("DeepSeek shapes: [7168, 2048] and [2048, 7168] blocks of 128 are bit-exact") {
  for (auto [rows, cols] : {std::pair{7168, 2048}, {2048, 7168}}) {
    Case c;
    c.rows = rows;
    c.cols = cols;
    run_case(c);
  }
}

TEST_CASE("selected experts write a compact output in id order, repeats allowed") {
  Case c;
  c.experts = 5;
  c.rows = 130;
  c.cols = 256;
  c.ids = {4, 0, 4, 2};
  run_case(c);
}

TEST_CASE("an expert id out of range writes nothing and is reported by kjit_device_errors") {
  Case c;
  c.experts = 4;
  c.rows = 64;
  c.cols = 256;
  c.ids = {1, 7, 2};
  const auto x = random_inputs(c);
  DeviceBuffer in(0, x.codes.size()), scales(0, x.scales.size() * 4), out(0, 3 * 64 * 256 * 2);
  DeviceBuffer ids(0, 12);
  in.upload(x.codes);
  scales.upload(x.scales);
  ids.upload(c.ids);
  out.poison();
  const auto desc = describe(c, in, scales, out, &ids);
  REQUIRE(kjit_dequant_fp8(&desc, nullptr) == KJIT_OK);  // launch itself is fine: ids live on the device
  CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
  CHECK(std::string(kjit_last_error_message()).find("expert id 7") != std::string::npos);
  CHECK(out.written_words() == 0);
  CHECK(kjit_device_errors(0) == KJIT_OK);  // reading cleared it
}

TEST_CASE("e5m2 infinities stay infinite, NaN codes of both formats give NaN") {
  for (auto in : {KJIT_DTYPE_F8_E4M3FN, KJIT_DTYPE_F8_E5M2}) {
    const std::vector<uint8_t> codes = {0x7C, 0xFC, 0x7D, 0x7F, 0xFF, 0x7E, 0x00, 0x80, 0x01, 0x81, 0x3F, 0x7B,
                                        0x40, 0xC0, 0x77, 0xF7};
    DeviceBuffer din(0, 16), dscale(0, 4), dout(0, 16 * 4);
    din.upload(codes);
    dscale.upload(std::vector<float>{1.0f});
    for (auto out : {KJIT_DTYPE_BF16, KJIT_DTYPE_F32}) {
      dout.poison();
      Case c;
      c.in = in;
      c.out = out;
      c.granularity = KJIT_SCALE_PER_TENSOR;
      c.rows = 1;
      c.cols = 16;
      const auto desc = describe(c, din, dscale, dout, nullptr);
      REQUIRE_MESSAGE(kjit_dequant_fp8(&desc, nullptr) == KJIT_OK, kjit_last_error_message());
      const auto bytes = dout.download<uint8_t>(0, 16 * static_cast<size_t>(out_size(out)));
      CHECK(compare(c, Inputs{codes, {1.0f}}, bytes) == 0);
      if (in == KJIT_DTYPE_F8_E5M2 && out == KJIT_DTYPE_F32) {
        float v[3];
        std::memcpy(v, bytes.data(), sizeof v);
        CHECK(std::isinf(v[0]));
        CHECK(v[0] > 0);
        CHECK(std::isinf(v[1]));
        CHECK(v[1] < 0);
        CHECK(std::isnan(v[2]));
      }
    }
  }
}

TEST_CASE("a tensor over 2^31 elements is dequantised correctly at its start, across 2^31 and at its end") {
  Case c;
  c.cols = 4096;
  c.rows = (int64_t{1} << 31) / c.cols + 1024;  // 2^31 + 4M elements
  const size_t elements = static_cast<size_t>(c.rows * c.cols);
  size_t free_bytes = 0, total = 0;
  make_current(0);
  api().cuMemGetInfo(&free_bytes, &total);
  if (free_bytes < elements * 3 + (1u << 30)) {
    MESSAGE("skipped: needs " << elements * 3 / (1u << 30) << " GiB free");
    return;
  }
  Inputs x = random_inputs(c);
  DeviceBuffer in(0, elements), scales(0, x.scales.size() * 4), out(0, elements * 2);
  in.upload(x.codes);
  scales.upload(x.scales);
  out.poison();
  const auto desc = describe(c, in, scales, out, nullptr);
  REQUIRE_MESSAGE(kjit_dequant_fp8(&desc, nullptr) == KJIT_OK, kjit_last_error_message());
  const int64_t boundary_row = (int64_t{1} << 31) / c.cols;
  for (int64_t first_row : {int64_t{0}, boundary_row - 300, c.rows - 300}) {
    const auto bytes = out.download<uint8_t>(static_cast<size_t>(first_row * c.cols * 2), static_cast<size_t>(300 * c.cols * 2));
    // Block scales are indexed by the absolute row, so the window is checked in place.
    int64_t bad = 0;
    const int64_t scols = scale_cols(c);
    for (int64_t r = 0; r < 300; ++r)
      for (int64_t col = 0; col < c.cols; ++col) {
        const int64_t row = first_row + r;
        const float scale = x.scales[static_cast<size_t>((row / 128) * scols + col / 128)];
        const auto want =
            dequant_value(c.in, c.out, x.codes[static_cast<size_t>(row * c.cols + col)], scale, c.convention);
        uint16_t got;
        std::memcpy(&got, &bytes[static_cast<size_t>((r * c.cols + col) * 2)], 2);
        if (!matches(c.out, want, got)) ++bad;
      }
    CAPTURE(first_row);
    CHECK(bad == 0);
  }
}

TEST_CASE("a prepared dequant is captured into a CUDA graph and replays on new data, and unprepared capture fails") {
  Case c;
  c.rows = 512;
  c.cols = 1536;
  c.experts = 2;
  Inputs x = random_inputs(c);
  DeviceBuffer in(0, x.codes.size()), scales(0, x.scales.size() * 4), out(0, 2 * 512 * 1536 * 2);
  const auto desc = describe(c, in, scales, out, nullptr);
  REQUIRE_MESSAGE(kjit_dequant_fp8_prepare(&desc, 0) == KJIT_OK, kjit_last_error_message());

  // A kernel kind never prepared: it must be refused inside capture rather than compiled.
  Case other = c;
  other.cols = 1664;
  DeviceBuffer oin(0, 512 * 1664 * 2), oout(0, 2 * 512 * 1664 * 2), oscales(0, 2 * 4 * 13 * 4);
  const auto other_desc = describe(other, oin, oscales, oout, nullptr);
  CUstream stream;
  must(api().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  must(api().cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  // Each step must leave the capture active: a call that is illegal during
  // capture would invalidate it, and the failure would surface only at the end.
  auto capture_state = [&] {
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    api().cuStreamIsCapturing(stream, &st);
    return st;
  };
  const kjit_status captured = kjit_dequant_fp8(&desc, reinterpret_cast<kjit_stream>(stream));
  CHECK_MESSAGE(capture_state() == CU_STREAM_CAPTURE_STATUS_ACTIVE, "the captured launch invalidated the capture");
  const kjit_status refused = kjit_dequant_fp8(&other_desc, reinterpret_cast<kjit_stream>(stream));
  const std::string refused_message = kjit_last_error_message();
  CHECK_MESSAGE(capture_state() == CU_STREAM_CAPTURE_STATUS_ACTIVE, "the refused launch invalidated the capture: ",
                refused_message);
  CUgraph graph;
  must(api().cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  REQUIRE(captured == KJIT_OK);
  CHECK(refused == KJIT_ERROR_CAPTURING);
  CHECK(refused_message.find("prepare") != std::string::npos);
  CUgraphExec exec;
  must(api().cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
  for (int replay = 0; replay < 3; ++replay) {
    x = random_inputs(c);  // fresh data each replay
    in.upload(x.codes);
    scales.upload(x.scales);
    out.poison();
    must(api().cuGraphLaunch(exec, stream), "cuGraphLaunch");
    must(api().cuStreamSynchronize(stream), "cuStreamSynchronize");
    CHECK(compare(c, x, out.download<uint8_t>(0, out.bytes)) == 0);
  }
  api().cuGraphExecDestroy(exec);
  api().cuGraphDestroy(graph);
  api().cuStreamDestroy(stream);
}

TEST_CASE("after prepare, a launch on views one element off alignment is captured and is bit-exact") {
  Case c;
  c.rows = 256;
  c.cols = 1536;
  const Inputs x = random_inputs(c);
  // One element more than the tensors: the views start one element in (fp8: 1 byte, bf16: 2 bytes), so
  // the launch needs the narrowest vector, which only a prepare of every width has loaded.
  DeviceBuffer in(0, x.codes.size() + 1), scales(0, x.scales.size() * 4),
      out(0, static_cast<size_t>(c.rows * c.cols + 1) * 2);
  const auto desc = describe(c, in, scales, out, nullptr);
  REQUIRE_MESSAGE(kjit_dequant_fp8_prepare(&desc, 0) == KJIT_OK, kjit_last_error_message());
  in.upload(shifted(x.codes, 1));
  scales.upload(x.scales);
  out.poison();
  auto view = desc;
  view.in = static_cast<const uint8_t*>(in.get()) + 1;
  view.out = static_cast<uint8_t*>(out.get()) + 2;
  capture_and_replay_once([&](kjit_stream stream) { return kjit_dequant_fp8(&view, stream); });
  CHECK(compare(c, x, out.download<uint8_t>(2, static_cast<size_t>(c.rows * c.cols * 2))) == 0);
}

TEST_CASE("with device 0 current, dequant of tensors on device 1 equals the same work on device 0, run after run") {
  int count = 0;
  api().cuDeviceGetCount(&count);
  if (count < 2) {
    MESSAGE("skipped: needs two GPUs, found " << count);
    return;
  }
  Case c;
  c.rows = 4096;
  c.cols = 7168;
  c.experts = 2;
  const auto x = random_inputs(c);
  std::vector<uint8_t> reference;
  for (int run = 0; run < 5; ++run)
    for (int device : {0, 1}) {
      DeviceBuffer in(device, x.codes.size()), scales(device, x.scales.size() * 4),
          out(device, static_cast<size_t>(c.experts * c.rows * c.cols * 2));
      in.upload(x.codes);
      scales.upload(x.scales);
      out.poison();
      make_current(0);  // the calling thread's current device is 0, whatever the data
      const auto desc = describe(c, in, scales, out, nullptr);
      REQUIRE_MESSAGE(kjit_dequant_fp8(&desc, nullptr) == KJIT_OK, kjit_last_error_message());
      const auto bytes = out.download<uint8_t>(0, out.bytes);
      if (reference.empty()) {
        CHECK(compare(c, x, bytes) == 0);
        reference = bytes;
      }
      CAPTURE(run);
      CAPTURE(device);
      CHECK(bytes == reference);
    }
  // A stream of device 0 with data on device 1 is refused, not run on the wrong device.
  DeviceBuffer in(1, x.codes.size()), scales(1, x.scales.size() * 4), out(1, static_cast<size_t>(2 * 4096 * 7168 * 2));
  make_current(0);
  CUstream stream0;
  must(api().cuStreamCreate(&stream0, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  const auto desc = describe(c, in, scales, out, nullptr);
  CHECK(kjit_dequant_fp8(&desc, reinterpret_cast<kjit_stream>(stream0)) == KJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(kjit_last_error_message()).find("stream belongs to device 0") != std::string::npos);
  api().cuStreamDestroy(stream0);
}

TEST_SUITE_END();
