// The grouped weight-gradient GEMM on a real GPU against the fp64 CPU
// reference (kjit/reference/grouped_gemm_wgrad.hpp), every element of every
// expert: random dy and x never zero (magnitudes in [0.5, 2), either sign),
// rows past the last offset holding NaN (never read), out poisoned with NaN
// before each launch (unwritten elements fail). Empty experts, one expert with
// every row, row counts that are no multiple of any tile, N and K no multiple
// of the tile, tiny N (8, 16: LoRA ranks), fp32 and bf16 out, both offsets
// conventions, zero rows; bad offsets are reported and write nothing; two
// runs give the same bits; a captured CUDA graph replays the eager bits.
// Each case runs the portable kernel and, on Hopper, the wgmma kernel (asked
// for, at any N and K) and the arch's default pick.
// Tolerance, per expert against fp64: fp32 out, relative Frobenius error
// <= 1e-5 (fp32 sums of exact bf16 products); bf16 out, each element within
// one bf16 rounding of the fp64 value (2^-8 relative, since the fp32 sum it
// rounds is itself off by ~1e-6) plus 1e-5 of the expert's rms value.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "harness.hpp"
#include "kjit/internal/runtime.hpp"
#include "kjit/kjit.h"
#include "kjit/reference/grouped_gemm_wgrad.hpp"
#include "why.hpp"

using namespace kjit::testing;
namespace reference = kjit::reference;

namespace {

constexpr uint16_t kBf16Nan = 0x7FC0;

struct Problem {
  int64_t n = 0, k = 0;
  std::vector<int32_t> counts;  // rows per expert
  kjit_expert_offsets convention = KJIT_OFFSETS_CUMULATIVE_END;
  kjit_dtype out = KJIT_DTYPE_F32;
  int64_t rows_past = 5;  // rows after the last offset (NaN)
  kjit_gemm_kernel kernel = KJIT_GEMM_KERNEL_AUTO;
};

// The kernels a case runs: the portable one everywhere; on Hopper the wgmma one and the default pick too.
std::vector<kjit_gemm_kernel> kernels_to_check() {
  if (!is_hopper()) return {KJIT_GEMM_KERNEL_PORTABLE, KJIT_GEMM_KERNEL_AUTO};
  return {KJIT_GEMM_KERNEL_PORTABLE, KJIT_GEMM_KERNEL_SM90, KJIT_GEMM_KERNEL_AUTO};
}

struct Data {
  Problem p;
  int64_t routed = 0, rows = 0;
  std::vector<int32_t> offsets;
  std::vector<uint16_t> dy, x;
  DeviceBuffer dy_buffer, x_buffer, offsets_buffer, out_buffer;

  explicit Data(const Problem& problem)
      : p(problem), routed(std::accumulate(problem.counts.begin(), problem.counts.end(), int64_t{0})),
        rows(routed + problem.rows_past), offsets(offsets_for(problem.counts, problem.convention)),
        dy(random_rows(rows, problem.n, routed)), x(random_rows(rows, problem.k, routed)),
        dy_buffer(0, std::max<size_t>(16, dy.size() * 2)), x_buffer(0, std::max<size_t>(16, x.size() * 2)),
        offsets_buffer(0, offsets.size() * 4), out_buffer(0, out_bytes()) {
    dy_buffer.upload(dy);
    x_buffer.upload(x);
    offsets_buffer.upload(offsets);
  }

  static std::vector<uint16_t> random_rows(int64_t rows, int64_t cols, int64_t routed) {
    std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
    std::bernoulli_distribution negative(0.5);
    std::vector<uint16_t> v(static_cast<size_t>(std::max<int64_t>(rows * cols, 8)));
    for (int64_t i = 0; i < rows * cols; ++i)
      v[static_cast<size_t>(i)] =
          i < routed * cols ? reference::bf16_bits_rne(negative(rng()) ? -magnitude(rng()) : magnitude(rng())) : kBf16Nan;
    return v;
  }
  int64_t experts() const { return static_cast<int64_t>(p.counts.size()); }
  size_t element_bytes() const { return p.out == KJIT_DTYPE_F32 ? 4 : 2; }
  size_t out_bytes() const { return static_cast<size_t>(experts() * p.n * p.k) * element_bytes(); }

  kjit_grouped_gemm_wgrad_desc desc() const {
    kjit_grouped_gemm_wgrad_desc d;
    kjit_grouped_gemm_wgrad_desc_init(&d);
    d.out_dtype = p.out;
    d.rows = rows;
    d.n = p.n;
    d.k = p.k;
    d.experts = experts();
    d.offsets_convention = p.convention;
    d.dy = dy_buffer.get();
    d.x = x_buffer.get();
    d.out = out_buffer.get();
    d.offsets = static_cast<const int32_t*>(offsets_buffer.get());
    d.kernel = p.kernel;
    return d;
  }

  // Out poisoned with NaN (fp32 0x7FC00000, bf16 0x7FC0 pairs).
  void poison() {
    api().cuCtxSetCurrent(out_buffer.ctx);
    must(api().cuMemsetD32(out_buffer.ptr, p.out == KJIT_DTYPE_F32 ? 0x7FC00000u : 0x7FC07FC0u, out_bytes() / 4),
         "cuMemsetD32");
    DeviceBuffer::settle();
  }
  std::vector<uint8_t> run(const kjit_grouped_gemm_wgrad_desc& d) {
    poison();
    REQUIRE_MESSAGE(kjit_grouped_gemm_wgrad(&d, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
    REQUIRE_MESSAGE(kjit_device_errors(0) == KJIT_OK, std::string(kjit_last_error_message()));
    return out_buffer.download<uint8_t>(0, out_bytes());
  }
  std::vector<uint8_t> run() { return run(desc()); }
};

double value(const std::vector<uint8_t>& bytes, kjit_dtype out, int64_t i) { return output_value(out, bytes, i); }

// Experts whose matrix is off the reference (see the header for the tolerance); every failure is reported.
int64_t wrong_experts(const Data& data, const std::vector<uint8_t>& out) {
  const auto& p = data.p;
  int64_t wrong = 0;
  for (int64_t e = 0; e < data.experts(); ++e) {
    const auto segment = reference::expert_segment(data.offsets, p.convention, e);
    const int64_t base = e * p.n * p.k;
    double diff = 0, norm = 0;
    int64_t off_elements = 0;
    std::vector<std::vector<double>> want(static_cast<size_t>(p.n));
    for (int64_t n = 0; n < p.n; ++n) {
      want[static_cast<size_t>(n)] = reference::grouped_gemm_wgrad_row(data.dy, data.x, p.n, p.k, segment, n);
      for (double w : want[static_cast<size_t>(n)]) norm += w * w;
    }
    const double rms = std::sqrt(norm / static_cast<double>(p.n * p.k));
    for (int64_t n = 0; n < p.n; ++n)
      for (int64_t c = 0; c < p.k; ++c) {
        const double got = value(out, p.out, base + n * p.k + c), w = want[static_cast<size_t>(n)][static_cast<size_t>(c)];
        diff += (got - w) * (got - w);
        if (!std::isfinite(got) || (p.out == KJIT_DTYPE_BF16 && std::abs(got - w) > std::ldexp(std::abs(w), -8) + 1e-5 * rms))
          ++off_elements;
        if (segment.end == segment.start && got != 0.0) ++off_elements;  // an empty expert: exact zeros
      }
    const double relative = norm > 0 ? std::sqrt(diff / norm) : 0.0;
    const bool ok = off_elements == 0 && (p.out == KJIT_DTYPE_BF16 || relative <= 1e-5);
    if (!ok)
      MESSAGE("expert ", e, " (rows ", segment.start, "..", segment.end, "): relative error ", relative, ", ",
              off_elements, " elements off or unwritten");
    wrong += ok ? 0 : 1;
  }
  return wrong;
}

void check_against_reference(const Problem& p) {
  Data data(p);
  CAPTURE(p.n);
  CAPTURE(p.k);
  CAPTURE(static_cast<int>(p.out));
  CAPTURE(static_cast<int>(p.convention));
  for (auto kernel : kernels_to_check()) {
    CAPTURE(static_cast<int>(kernel));
    auto d = data.desc();
    d.kernel = kernel;
    CHECK(wrong_experts(data, data.run(d)) == 0);
  }
}

}  // namespace

TEST_SUITE_BEGIN("grouped_gemm_wgrad");

TEST_CASE("uneven experts (empty ones, odd row counts) match fp64 in fp32 and bf16 out, both conventions") {
  for (auto out : {KJIT_DTYPE_F32, KJIT_DTYPE_BF16})
    for (auto convention : {KJIT_OFFSETS_CUMULATIVE_END, KJIT_OFFSETS_WITH_LEADING_ZERO})
      check_against_reference({.n = 256, .k = 384, .counts = {0, 37, 1, 0, 130, 65, 0}, .convention = convention,
                               .out = out});
}

TEST_CASE("N and K no multiple of the 128 x 128 tile, rows no multiple of 32") {
  check_against_reference({.n = 200, .k = 136, .counts = {45, 0, 97, 3}});
  check_against_reference({.n = 72, .k = 8, .counts = {33, 31}, .out = KJIT_DTYPE_BF16});
}

TEST_CASE("tiny N (LoRA ranks 8, 16, 40, 64) on the narrow tile, and tiny K") {
  for (int64_t n : {8, 16, 40, 64})
    check_against_reference({.n = n, .k = 264, .counts = {17, 0, 300, 64}, .out = n == 16 ? KJIT_DTYPE_BF16 : KJIT_DTYPE_F32});
  check_against_reference({.n = 1024, .k = 16, .counts = {50, 77}});  // dA [E, r, K]'s transpose shape
}

TEST_CASE("one expert holds every row (thousands), the others are empty") {
  check_against_reference({.n = 128, .k = 256, .counts = {0, 5000, 0, 0}});
  check_against_reference({.n = 32, .k = 128, .counts = {4099, 0}, .convention = KJIT_OFFSETS_WITH_LEADING_ZERO});
}

TEST_CASE("zero rows write zeros over all of out, with NULL dy and x") {
  Data data({.n = 128, .k = 128, .counts = {0, 0, 0}, .rows_past = 0});
  for (auto kernel : kernels_to_check()) {
    CAPTURE(static_cast<int>(kernel));
    auto d = data.desc();
    d.dy = nullptr;
    d.x = nullptr;
    d.kernel = kernel;
    const auto out = data.run(d);
    int64_t nonzero = 0;
    for (int64_t i = 0; i < 3 * 128 * 128; ++i) nonzero += value(out, KJIT_DTYPE_F32, i) != 0.0;
    CHECK(nonzero == 0);
  }
}

TEST_CASE("rows of the next expert that hold inf never reach an expert's sum (the chunk crossing its end)") {
  Data data({.n = 256, .k = 256, .counts = {70, 3, 200}});
  // Expert 1's three rows: inf in x and dy. Experts 0 and 2 must stay finite and match; expert 1 is inf/NaN.
  const uint16_t inf = 0x7F80;
  for (int64_t r = 70; r < 73; ++r) {
    for (int64_t c = 0; c < 256; ++c) data.x[static_cast<size_t>(r * 256 + c)] = inf;
    for (int64_t c = 0; c < 256; ++c) data.dy[static_cast<size_t>(r * 256 + c)] = inf;
  }
  data.x_buffer.upload(data.x);
  data.dy_buffer.upload(data.dy);
  for (auto kernel : kernels_to_check()) {
    CAPTURE(static_cast<int>(kernel));
    auto d = data.desc();
    d.kernel = kernel;
    const auto out = data.run(d);
    int64_t bad = 0;
    for (int64_t e : {0, 2})
      for (int64_t i = 0; i < 256 * 256; ++i) bad += !std::isfinite(value(out, KJIT_DTYPE_F32, e * 256 * 256 + i));
    CHECK(bad == 0);
  }
}

TEST_CASE("two runs give the same bits with each kernel") {
  Data data({.n = 384, .k = 512, .counts = {700, 0, 129, 1000}});
  for (auto kernel : kernels_to_check()) {
    CAPTURE(static_cast<int>(kernel));
    auto d = data.desc();
    d.kernel = kernel;
    const auto first = data.run(d);
    CHECK(wrong_experts(data, first) == 0);
    CHECK(data.run(d) == first);
  }
}

TEST_CASE("off Hopper the SM90 kernel asked for is refused, naming the arch") {
  if (is_hopper()) return;
  Data data({.n = 128, .k = 128, .counts = {10}});
  auto d = data.desc();
  d.kernel = KJIT_GEMM_KERNEL_SM90;
  CHECK(kjit_grouped_gemm_wgrad(&d, nullptr) == KJIT_ERROR_UNSUPPORTED);
  CHECK(std::string(kjit_last_error_message()).find("sm_90a") != std::string::npos);
}

TEST_CASE("bad offsets (decreasing, past rows, a leading entry not 0) are reported and write nothing") {
  Data data({.n = 64, .k = 128, .counts = {10, 20, 30}});
  const std::vector<std::vector<int32_t>> bad_ends{{10, 5, 60}, {10, 30, 66 + 1}};
  for (const auto& bad : bad_ends) {
    data.offsets_buffer.upload(bad);
    data.out_buffer.poison();
    const auto d = data.desc();
    REQUIRE_MESSAGE(kjit_grouped_gemm_wgrad(&d, nullptr) == KJIT_OK, std::string(kjit_last_error_message()));
    CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
    CHECK(std::string(kjit_last_error_message()).find("wrote nothing") != std::string::npos);
    CHECK(data.out_buffer.written_words() == 0);
  }
  Data leading({.n = 64, .k = 128, .counts = {10, 20}, .convention = KJIT_OFFSETS_WITH_LEADING_ZERO});
  leading.offsets_buffer.upload(std::vector<int32_t>{3, 10, 30});
  leading.out_buffer.poison();
  const auto d = leading.desc();
  REQUIRE(kjit_grouped_gemm_wgrad(&d, nullptr) == KJIT_OK);
  CHECK(kjit_device_errors(0) == KJIT_ERROR_DEVICE_REPORTED);
  CHECK(leading.out_buffer.written_words() == 0);
}

TEST_CASE("a prepared wgrad is captured into a CUDA graph and replays the eager bits on new data") {
  Data data({.n = 256, .k = 256, .counts = {100, 0, 333}, .out = KJIT_DTYPE_BF16});
  const auto d = data.desc();
  REQUIRE_MESSAGE(kjit_grouped_gemm_wgrad_prepare(&d, 0) == KJIT_OK, kjit_last_error_message());
  GraphCapture capture;
  const kjit_status captured = kjit_grouped_gemm_wgrad(&d, capture.stream());
  capture.end();
  REQUIRE_MESSAGE(captured == KJIT_OK, kjit_last_error_message());
  capture.instantiate();
  for (int replay = 0; replay < 2; ++replay) {
    data.dy = Data::random_rows(data.rows, data.p.n, data.routed);  // fresh data each replay
    data.dy_buffer.upload(data.dy);
    data.poison();
    capture.replay();
    const auto replayed = data.out_buffer.download<uint8_t>(0, data.out_bytes());
    CHECK(wrong_experts(data, replayed) == 0);
    CHECK(data.run() == replayed);
  }
}

TEST_CASE("the shared harness (jitctl selftest) finds the manifests' shapes within tolerance, both tiles and outputs") {
  namespace codegen = kjit::codegen;
  kjit::Runtime& runtime = kjit::Runtime::global();
  auto device = runtime.device(0);
  REQUIRE(device.has_value());
  using codegen::DType, codegen::OffsetsConvention;
  for (const auto& problem : {codegen::GroupedGemmWgradSpec{.out = DType::f32, .n = 1536, .k = 2048, .experts = 128},
                              codegen::GroupedGemmWgradSpec{.out = DType::bf16, .n = 7168, .k = 2048, .experts = 32},
                              codegen::GroupedGemmWgradSpec{.out = DType::bf16, .n = 16, .k = 2048, .experts = 128,
                                                            .offsets = OffsetsConvention::with_leading_zero}}) {
    const auto spec = codegen::grouped_gemm_wgrad_config(problem, *(*device)->arch);
    REQUIRE_MESSAGE(spec.has_value(), kjit::testing::why(spec));
    CAPTURE(codegen::canonical(*spec));
    const auto outcome = kjit::harness::check_spec(runtime, **device, *spec, rng());
    CHECK_MESSAGE(outcome.ok, outcome.text);
  }
}

TEST_SUITE_END();
