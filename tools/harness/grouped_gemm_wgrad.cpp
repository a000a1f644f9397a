// The grouped weight-gradient GEMM family's check (harness.hpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "device_buffers.hpp"
#include "grouped_gemm_check.hpp"
#include "harness.hpp"
#include "kjit/internal/ops/grouped_gemm_wgrad.hpp"
#include "kjit/reference/grouped_gemm_wgrad.hpp"

namespace kjit::harness {

namespace {

// Tolerance against fp64 (relative Frobenius error of one expert's matrix):
// fp32 sums of exact products, and for bf16 out one rounding more (2^-9
// relative each element, doubled for margin).
double wgrad_tolerance(codegen::DType out) { return out == codegen::DType::f32 ? 1e-5 : 1.0 / 256; }

// Whether every byte of `out` is zero; whether none of its elements (of `bytes` each) still holds the poison.
bool all_zero(const std::vector<uint8_t>& out) {
  return std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0; });
}
bool none_poisoned(const std::vector<uint8_t>& out, size_t bytes) {
  for (size_t i = 0; i < out.size(); i += bytes)
    if (std::all_of(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(i + bytes),
                    [](uint8_t b) { return b == Buffers::kPoison; }))
      return false;
  return true;
}

}  // namespace

// Uneven routing over the spec's experts (every 5th expert empty, one of
// 150 rows past the tile heights, the rest 1 to 70 rows), 5 rows past the
// last offset holding huge values that must not be read; dy and x uniform in
// +-[0.5, 2) (never zero). Empty experts must come out exactly zero in every
// element; the others within wgrad_tolerance on sampled rows of out (the
// first, the last and up to 6 more), and (the experts read whole) no element
// left with the poison. Quick: rows go to experts 0, 1 (the 150) and the last
// only, and the checked experts are those read whole and three more. Returns
// the experts that failed.
Expected<int64_t> check_grouped_gemm_wgrad(Runtime& runtime, DeviceState& device,
                                           const codegen::GroupedGemmWgradSpec& spec, std::mt19937_64& rng,
                                           Depth depth) {
  const DriverApi& api = **runtime.driver();
  const int64_t n = spec.n, k = spec.k, experts = spec.experts;
  std::vector<int32_t> counts(static_cast<size_t>(experts));
  std::uniform_int_distribution<int32_t> count(1, 70);
  const bool quick = depth == Depth::quick;
  for (int64_t e = 0; e < experts; ++e) {
    const bool routed = quick ? e == 0 || e == 1 || e == experts - 1 : e % 5 != 4;
    counts[static_cast<size_t>(e)] = !routed ? 0 : e == 1 ? 150 : count(rng);
  }
  const Routing routing(counts, spec.offsets);
  const std::vector<int32_t>& offsets = routing.offsets;
  const int64_t routed = routing.routed(), rows = routed + 5;

  std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
  std::bernoulli_distribution negative(0.5);
  auto random_bf16 = [&](int64_t count_values) {
    std::vector<uint16_t> v(static_cast<size_t>(count_values));
    fill_random(v, rng, [&](std::mt19937_64& r) {
      return reference::bf16_bits_rne(negative(r) ? -magnitude(r) : magnitude(r));
    });
    return v;
  };
  auto dy = random_bf16(rows * n), x = random_bf16(rows * k);
  for (int64_t i = routed * n; i < rows * n; ++i) dy[static_cast<size_t>(i)] = reference::bf16_bits_rne(3e38f);
  for (int64_t i = routed * k; i < rows * k; ++i) x[static_cast<size_t>(i)] = reference::bf16_bits_rne(3e38f);

  const bool f32 = spec.out == codegen::DType::f32;
  const int64_t out_elements = experts * n * k;
  Buffers buffers(api, device.context);
  auto ddy = buffers.upload(dy.data(), dy.size() * 2);
  auto dx = buffers.upload(x.data(), x.size() * 2);
  auto doffsets = buffers.upload(offsets.data(), offsets.size() * 4);
  auto dout = buffers.upload(nullptr, static_cast<size_t>(out_elements * (f32 ? 4 : 2)));  // poisoned
  for (auto* r : {&ddy, &dx, &doffsets, &dout})
    if (!*r) return std::unexpected(r->error());
  kjit_grouped_gemm_wgrad_desc d;
  kjit_grouped_gemm_wgrad_desc_init(&d);
  d.out_dtype = f32 ? KJIT_DTYPE_F32 : KJIT_DTYPE_BF16;
  d.rows = rows;
  d.n = n;
  d.k = k;
  d.experts = experts;
  d.offsets_convention = spec.offsets == codegen::OffsetsConvention::with_leading_zero
                             ? KJIT_OFFSETS_WITH_LEADING_ZERO
                             : KJIT_OFFSETS_CUMULATIVE_END;
  d.dy = reinterpret_cast<const void*>(*ddy);
  d.x = reinterpret_cast<const void*>(*dx);
  d.out = reinterpret_cast<void*>(*dout);
  d.offsets = reinterpret_cast<const int32_t*>(*doffsets);
  d.kernel = spec.kernel == codegen::GemmKernel::wgmma_sm90 ? KJIT_GEMM_KERNEL_SM90 : KJIT_GEMM_KERNEL_PORTABLE;
  const auto plan = KJIT_TRY(ops::plan_grouped_gemm_wgrad(d));
  const auto chosen = KJIT_TRY(codegen::grouped_gemm_wgrad_config(plan.problem, *device.arch, plan.request));
  if (!(chosen == spec)) return fail(KJIT_ERROR_INTERNAL, "the descriptor does not select the spec under check");
  KJIT_TRY(launch_and_take_errors(runtime, device, [&] { return ops::grouped_gemm_wgrad(runtime, d, nullptr); }));
  // Manifest shapes reach gigabytes of out: experts 0, 1, 4 (empty) and the
  // last are read whole, the others' sampled rows only.
  const size_t element_bytes = f32 ? 4 : 2;
  int64_t failed = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const auto segment = reference::expert_segment(offsets, d.offsets_convention, e);
    const bool whole = e < 2 || e == 4 || e == experts - 1;
    if (quick && !whole && e != 2 && e != 3 && e != experts / 2) continue;
    std::vector<int64_t> sampled;
    for (int64_t s = 0; s < 8; ++s) sampled.push_back(s == 7 ? n - 1 : std::min(n - 1, s * (n / 7 + 1)));
    std::vector<uint8_t> out(static_cast<size_t>(whole ? n * k : 8 * k) * element_bytes);
    const CUdeviceptr matrix = *dout + static_cast<CUdeviceptr>(e * n * k) * element_bytes;
    if (whole) KJIT_TRY(buffers.download(out.data(), matrix, out.size()));
    for (size_t s = 0; !whole && s < sampled.size(); ++s)
      KJIT_TRY(buffers.download(out.data() + s * k * element_bytes,
                                matrix + static_cast<CUdeviceptr>(sampled[s] * k) * element_bytes, k * element_bytes));
    bool ok = segment.end > segment.start ? !whole || none_poisoned(out, element_bytes) : all_zero(out);
    if (ok && segment.end > segment.start) {
      RelativeError error;
      for (size_t s = 0; s < sampled.size(); ++s)
        error.add_row(out, static_cast<int>(element_bytes), whole ? sampled[s] : static_cast<int64_t>(s),
                      reference::grouped_gemm_wgrad_row(dy, x, n, k, segment, sampled[s]));
      ok = error.value() <= wgrad_tolerance(spec.out);  // NaN fails too
    }
    failed += ok ? 0 : 1;
  }
  return failed;
}

}  // namespace kjit::harness
