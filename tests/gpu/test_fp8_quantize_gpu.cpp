// The fp8 activation quantizer on a real GPU against the CPU reference
// (kjit/reference/fp8_quantize.hpp), bit for bit in codes and scales: random
// data over many magnitudes, odd row counts, both scale formats, the edge
// groups kjit.h defines (all zero, amax exactly 448, inf, NaN, below the eps
// clamp), a padded input row stride, the gather through a real routing's
// permutation with its -1 rows, a bad gather index reported, and CUDA graph
// capture and replay. Outputs start poisoned, so unwritten elements fail.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu_support.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/fp8_quantize.hpp"
#include "kjit/reference/moe_routing.hpp"

using namespace kjit::testing;
namespace reference = kjit::reference;

namespace {

struct Problem {
  int64_t rows = 0, k = 0, stride = 0;  // stride 0: k
  bool ue8m0 = false;
  std::vector<uint16_t> in;               // bf16 [input rows, stride]
  std::vector<int32_t> sorted_to_flat;    // gather when not empty
  int64_t tokens = 0, top_k = 0;
  int64_t row_stride() const { return stride ? stride : k; }
  int64_t input_rows() const { return sorted_to_flat.empty() ? rows : tokens; }
};

// Values normal(0, 1) times 2^e, e drawn per group from [-30, 30].
std::vector<uint16_t> random_rows(int64_t rows, int64_t stride, int64_t k) {
  std::vector<uint16_t> in(static_cast<size_t>(rows * stride), reference::bf16_bits_rne(-3.0f));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < k / 128; ++g) {
      const float magnitude = std::ldexp(1.0f, exponent(rng()));
      for (int64_t c = 0; c < 128; ++c)
        in[static_cast<size_t>(r * stride + g * 128 + c)] = reference::bf16_bits_rne(normal(rng()) * magnitude);
    }
  return in;
}

struct Result {
  std::vector<uint8_t> codes;
  std::vector<uint32_t> scale_bits;
};

kjit_fp8_quantize_desc describe(const Problem& p, const DeviceBuffer& in, const DeviceBuffer& map,
                                const DeviceBuffer& codes, const DeviceBuffer& scales) {
  kjit_fp8_quantize_desc d;
  kjit_fp8_quantize_desc_init(&d);
  d.in_dtype = KJIT_DTYPE_BF16;
  d.out_dtype = KJIT_DTYPE_F8_E4M3FN;
  d.rows = p.rows;
  d.k = p.k;
  d.in_row_stride = p.stride;
  d.scale_format = p.ue8m0 ? KJIT_QUANT_SCALE_UE8M0 : KJIT_QUANT_SCALE_FP32;
  d.in = in.get();
  d.out = codes.get();
  d.scales = static_cast<float*>(scales.get());
  if (!p.sorted_to_flat.empty()) {
    d.sorted_to_flat = static_cast<const int32_t*>(map.get());
    d.tokens = p.tokens;
    d.top_k = p.top_k;
  }
  return d;
}

Result expected(const Problem& p) {
  Result want;
  std::vector<float> scales(static_cast<size_t>(p.rows * p.k / 128));
  want.codes.resize(static_cast<size_t>(p.rows * p.k));
  reference::fp8_quantize(p.in, p.row_stride(), p.rows, p.k, p.ue8m0, p.sorted_to_flat, p.tokens, p.top_k, want.codes,
                          scales);
  for (float s : scales) want.scale_bits.push_back(reference::float_bits(s));
  return want;
}

struct Buffers {
  DeviceBuffer in, map, codes, scales;
  explicit Buffers(const Problem& p)
      : in(0, p.in.size() * 2), map(0, std::max<size_t>(4, p.sorted_to_flat.size() * 4)),
        codes(0, static_cast<size_t>(std::max<int64_t>(16, p.rows * p.k))),
        scales(0, static_cast<size_t>(std::max<int64_t>(4, p.rows * p.k / 128 * 4))) {
    upload(p);
  }
  void upload(const Problem& p) {
    in.upload(p.in);
    if (!p.sorted_to_flat.empty()) map.upload(p.sorted_to_flat);
    codes.poison();
    scales.poison();
  }
  Result download(const Problem& p) const {
    return {codes.download<uint8_t>(0, static_cast<size_t>(p.rows * p.k)),
            scales.download<uint32_t>(0, static_cast<size_t>(p.rows * p.k / 128))};
  }
};

// Runs `p` and returns the number of codes and scales off the reference.
int64_t wrong_after_run(const Problem& p) {
  Buffers b(p);
  const auto d = describe(p, b.in, b.map, b.codes, b.scales);
  REQUIRE_MESSAGE(kjit_fp8_quantize(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, kjit_last_error_message());
  const auto got = b.download(p);
  const auto want = expected(p);
  int64_t wrong = 0;
  for (size_t i = 0; i < got.codes.size(); ++i) wrong += got.codes[i] == want.codes[i] ? 0 : 1;
  for (size_t i = 0; i < got.scale_bits.size(); ++i) wrong += got.scale_bits[i] == want.scale_bits[i] ? 0 : 1;
  return wrong;
}

Problem plain(int64_t rows, int64_t k, bool ue8m0, int64_t stride = 0) {
  Problem p;
  p.rows = rows;
  p.k = k;
  p.stride = stride;
  p.ue8m0 = ue8m0;
  p.in = random_rows(rows, p.row_stride(), k);
  return p;
}

}  // namespace

TEST_SUITE_BEGIN("fp8_quantize");

TEST_CASE("random rows over many magnitudes are bit-exact in codes and scales, odd row counts, fp32 and UE8M0") {
  for (bool ue8m0 : {false, true})
    for (auto [rows, k] : {std::pair<int64_t, int64_t>{1, 7168}, {37, 2048}, {4099, 7168}, {3, 128}, {257, 1408}}) {
      CAPTURE(ue8m0);
      CAPTURE(rows);
      CAPTURE(k);
      CHECK(wrong_after_run(plain(rows, k, ue8m0)) == 0);
    }
}

TEST_CASE("a padded input row stride is honoured and the padding never read") {
  CHECK(wrong_after_run(plain(45, 2048, false, 2048 + 72)) == 0);
}

TEST_CASE("edge groups: all zero, amax exactly 448, all ones, inf, -inf, NaN, amax below the eps clamp") {
  for (bool ue8m0 : {false, true}) {
    Problem p = plain(8, 256, ue8m0);
    auto group = [&](int64_t row) { return p.in.begin() + row * p.k; };
    std::fill_n(group(0), 128, reference::bf16_bits_rne(0.0f));
    std::fill_n(group(1), 128, reference::bf16_bits_rne(0.0f));
    group(1)[3] = reference::bf16_bits_rne(448.0f);
    group(1)[4] = reference::bf16_bits_rne(-1.0625f);  // a rounding tie at scale 1
    group(1)[5] = reference::bf16_bits_rne(0x3p-10f);  // a subnormal tie
    std::fill_n(group(2), 128, reference::bf16_bits_rne(1.0f));
    group(3)[100] = reference::bf16_bits_rne(std::numeric_limits<float>::infinity());
    group(4)[0] = reference::bf16_bits_rne(-std::numeric_limits<float>::infinity());
    group(5)[127] = reference::bf16_bits_rne(std::numeric_limits<float>::quiet_NaN());
    for (int c = 0; c < 128; ++c) group(6)[c] = reference::bf16_bits_rne(static_cast<float>(c - 64) * 1e-13f);
    CAPTURE(ue8m0);
    CHECK(wrong_after_run(p) == 0);
    // The stated values themselves, beside the reference's agreement.
    Buffers b(p);
    const auto d = describe(p, b.in, b.map, b.codes, b.scales);
    REQUIRE_MESSAGE(kjit_fp8_quantize(&d, nullptr) == KJIT_OK, kjit_last_error_message());
    const auto got = b.download(p);
    CHECK(got.codes[0] == 0x00);
    CHECK(got.scale_bits[0] == reference::float_bits(ue8m0 ? 0x1p-42f : 1e-10f / 448.0f));
    CHECK(got.scale_bits[2] == reference::float_bits(1.0f));
    CHECK(got.codes[static_cast<size_t>(p.k + 3)] == 0x7E);
    CHECK(got.codes[static_cast<size_t>(p.k + 4)] == 0xB8);
    CHECK(got.codes[static_cast<size_t>(p.k + 5)] == 0x02);
    for (int64_t row : {3, 4, 5}) {
      CHECK(got.scale_bits[static_cast<size_t>(row * 2)] == 0x7FC00000u);
      CHECK(got.codes[static_cast<size_t>(row * p.k + 7)] == 0x7F);
      CHECK(got.scale_bits[static_cast<size_t>(row * 2 + 1)] != 0x7FC00000u);  // the row's other group is unaffected
    }
  }
}

TEST_CASE("gather through a real routing: row r quantizes token sorted_to_flat[r] / top_k, -1 rows are zero") {
  for (bool ue8m0 : {false, true}) {
    // Expert parallelism: this rank owns 16 of 64 experts, so most (t, j) route
    // elsewhere and sorted_to_flat ends in -1 rows.
    const int64_t tokens = 301, top_k = 8, k = 7168;
    std::vector<int32_t> ids(static_cast<size_t>(tokens * top_k));
    std::uniform_int_distribution<int32_t> any(0, 63);
    for (auto& id : ids) id = any(rng());
    DeviceBuffer dids(0, ids.size() * 4), counts(0, 16 * 4), offsets(0, 16 * 4), sorted(0, ids.size() * 4),
        inverse(0, ids.size() * 4);
    dids.upload(ids);
    kjit_moe_routing_desc r;
    kjit_moe_routing_desc_init(&r);
    r.tokens = tokens;
    r.top_k = top_k;
    r.experts_total = 64;
    r.expert_base = 16;
    r.experts_local = 16;
    r.offsets_convention = KJIT_OFFSETS_CUMULATIVE_END;
    r.topk_ids = static_cast<const int32_t*>(dids.get());
    r.counts = static_cast<int32_t*>(counts.get());
    r.offsets = static_cast<int32_t*>(offsets.get());
    r.sorted_to_flat = static_cast<int32_t*>(sorted.get());
    r.flat_to_sorted = static_cast<int32_t*>(inverse.get());
    REQUIRE_MESSAGE(kjit_moe_routing(&r, nullptr) == KJIT_OK, kjit_last_error_message());

    Problem p;
    p.rows = tokens * top_k;  // every row the routing may fill: the -1 tail included
    p.k = k;
    p.ue8m0 = ue8m0;
    p.tokens = tokens;
    p.top_k = top_k;
    p.in = random_rows(tokens, k, k);
    p.sorted_to_flat = sorted.download<int32_t>(0, ids.size());
    CHECK(p.sorted_to_flat.back() == -1);
    CHECK(p.sorted_to_flat.front() >= 0);
    CAPTURE(ue8m0);
    CHECK(wrong_after_run(p) == 0);
  }
}

TEST_CASE("a gather index past tokens * top_k is reported, and its row comes out zero") {
  Problem p = plain(4, 256, false);
  p.tokens = 4;
  p.top_k = 2;
  p.sorted_to_flat = {0, 9, 7, -1};  // 9 >= 4 * 2
  Buffers b(p);
  const auto d = describe(p, b.in, b.map, b.codes, b.scales);
  REQUIRE_MESSAGE(kjit_fp8_quantize(&d, nullptr) == KJIT_OK, kjit_last_error_message());
  CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
  CHECK(std::string(kjit_last_error_message()).find("flat index 9 past tokens * top_k") != std::string::npos);
  const auto got = b.download(p);
  const auto want = expected(p);
  CHECK(got.codes == want.codes);
  CHECK(got.scale_bits == want.scale_bits);
  CHECK(got.scale_bits[2] == 0u);
}

TEST_CASE("a prepared quantize is captured into a CUDA graph and replays on new data, and unprepared capture fails") {
  Problem p = plain(333, 2048, false);
  p.tokens = 333;
  p.top_k = 1;
  p.sorted_to_flat.resize(333);
  for (int32_t r = 0; r < 333; ++r) p.sorted_to_flat[static_cast<size_t>(r)] = r % 5 == 4 ? -1 : 332 - r;
  Buffers b(p);
  const auto d = describe(p, b.in, b.map, b.codes, b.scales);
  REQUIRE_MESSAGE(kjit_fp8_quantize_prepare(&d, 0) == KJIT_OK, kjit_last_error_message());
  auto other = d;  // a kernel kind never prepared
  other.scale_format = KJIT_QUANT_SCALE_UE8M0;
  other.k = 1024;

  CUstream stream;
  must(api().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  must(api().cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  const kjit_status captured = kjit_fp8_quantize(&d, reinterpret_cast<kjit_stream>(stream));
  const kjit_status refused = kjit_fp8_quantize(&other, reinterpret_cast<kjit_stream>(stream));
  const std::string refused_message = kjit_last_error_message();
  CUgraph graph;
  must(api().cuStreamEndCapture(stream, &graph), "cuStreamEndCapture");
  REQUIRE(captured == KJIT_OK);
  CHECK(refused == KJIT_ERROR_CAPTURING);
  CHECK(refused_message.find("prepare") != std::string::npos);
  CUgraphExec exec;
  must(api().cuGraphInstantiateWithFlags(&exec, graph, 0), "cuGraphInstantiateWithFlags");
  for (int replay = 0; replay < 3; ++replay) {
    p.in = random_rows(p.tokens, p.k, p.k);  // fresh data and a fresh permutation each replay
    std::shuffle(p.sorted_to_flat.begin(), p.sorted_to_flat.end(), rng());
    b.upload(p);
    must(api().cuGraphLaunch(exec, stream), "cuGraphLaunch");
    must(api().cuStreamSynchronize(stream), "cuStreamSynchronize");
    const auto got = b.download(p);
    const auto want = expected(p);
    CHECK(got.codes == want.codes);
    CHECK(got.scale_bits == want.scale_bits);
  }
  api().cuGraphExecDestroy(exec);
  api().cuGraphDestroy(graph);
  api().cuStreamDestroy(stream);
}

TEST_SUITE_END();
