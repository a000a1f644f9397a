// The shared correctness harness (tools/harness, also what `jitctl selftest`
// runs) on this GPU, one case per family: each spec launched exactly as
// specified on a random problem of its shape, compared with kjit/reference.
// The grouped GEMM runs every configuration this arch builds for two
// problems, and the portable and swap AB kernels forced where they exist.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "harness.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;
namespace codegen = kjit::codegen;

namespace {

const codegen::ArchInfo& device_arch() {
  auto device = kjit::Runtime::global().device(0);
  REQUIRE_MESSAGE(device.has_value(), why(device));
  return *(*device)->arch;
}

// Checks each spec on device 0 through the harness; each must be one valid kernel of its arch.
void check_exactly(const std::vector<codegen::KernelSpec>& specs) {
  kjit::Runtime& runtime = kjit::Runtime::global();
  auto device = runtime.device(0);
  REQUIRE_MESSAGE(device.has_value(), why(device));
  const codegen::ArchInfo& arch = *(*device)->arch;
  for (const auto& spec : specs) {
    const std::string name = codegen::canonical(spec);
    CAPTURE(name);
    const auto valid = codegen::validate_for_target(spec, arch);
    REQUIRE_MESSAGE(valid.has_value(), why(valid));
    const auto outcome = kjit::harness::check_spec(runtime, **device, spec, rng());
    CHECK_MESSAGE(outcome.ok, outcome.text);
  }
}

codegen::DequantSpec dequant(codegen::DType in, codegen::DType out, int64_t cols, codegen::ScaleGranularity g,
                             int64_t block, codegen::ScaleConvention convention, bool selected) {
  codegen::DequantSpec s;
  s.in = in;
  s.out = out;
  s.cols = cols;
  s.granularity = g;
  s.block_rows = s.block_cols = g == codegen::ScaleGranularity::per_block ? block : 0;
  s.convention = convention;
  s.vec = codegen::dequant_vector(out, cols);
  s.selected_experts = selected;
  return s;
}

}  // namespace

TEST_SUITE_BEGIN("dequant");

TEST_CASE("the shared harness finds dequant variants, launched exactly as specified, bit-exact") {
  using codegen::DType, codegen::ScaleGranularity, codegen::ScaleConvention;
  check_exactly({dequant(DType::f8_e4m3fn, DType::bf16, 7168, ScaleGranularity::per_block, 128,
                         ScaleConvention::multiply, false),
                 dequant(DType::f8_e5m2, DType::f16, 2048, ScaleGranularity::per_row, 0, ScaleConvention::divide, false),
                 dequant(DType::f8_e4m3fn, DType::f32, 4096, ScaleGranularity::per_tensor, 0,
                         ScaleConvention::multiply, true),
                 dequant(DType::f8_e5m2, DType::bf16, 1000, ScaleGranularity::per_block, 64, ScaleConvention::divide,
                         true)});
}

TEST_SUITE_END();
TEST_SUITE_BEGIN("grouped_gemm");

TEST_CASE("the shared harness finds every grouped GEMM configuration of this arch, and the forced kernels, within 1e-2") {
  const codegen::ArchInfo& target = device_arch();
  codegen::GroupedGemmSpec decode;
  decode.n = 256;
  decode.k = 512;
  decode.experts = 8;
  codegen::GroupedGemmSpec prefill;
  prefill.out = codegen::DType::f32;
  prefill.n = 512;
  prefill.k = 256;
  prefill.experts = 4;
  prefill.weights = codegen::WeightLayout::e_k_n;
  prefill.offsets = codegen::OffsetsConvention::with_leading_zero;
  prefill.row_scale = true;
  std::vector<codegen::KernelSpec> specs;
  for (const auto& problem : {decode, prefill}) {
    for (const auto& config : codegen::kernels_for_target(problem, target)) specs.push_back(config);
    std::vector<codegen::GemmRequest::Kernel> forced = {codegen::GemmRequest::Kernel::portable};
    if (target.wgmma_tma) forced.push_back(codegen::GemmRequest::Kernel::sm90_swap_ab);
    for (auto kernel : forced)
      for (int64_t rows : {64, 4096}) {
        codegen::GemmRequest request;
        request.kernel = kernel;
        auto config = codegen::choose_grouped_gemm_config(problem, target, rows, request);
        REQUIRE_MESSAGE(config.has_value(), why(config));
        if (std::find(specs.begin(), specs.end(), codegen::KernelSpec(*config)) == specs.end()) specs.push_back(*config);
      }
  }
  check_exactly(specs);
}

TEST_SUITE_END();
TEST_SUITE_BEGIN("moe_routing");

TEST_CASE("the shared harness finds routing exact in one block and over many, with up to 1000 local experts") {
  codegen::MoeRoutingSpec few, many, more;
  few.experts = 64;
  many.experts = 256;
  many.offsets = codegen::OffsetsConvention::with_leading_zero;
  more.experts = 1000;  // past 256: warps take turns instead of per-warp counts
  check_exactly({few, many, more});
}

TEST_SUITE_END();
TEST_SUITE_BEGIN("moe_combine");

TEST_CASE("the shared harness finds combine within tolerance, bf16 and f32 output") {
  codegen::MoeCombineSpec wide, narrow;
  wide.top_k = 8;
  wide.hidden = 7168;
  narrow.top_k = 2;
  narrow.hidden = 4096;
  narrow.out = codegen::DType::f32;
  check_exactly({wide, narrow});
}

TEST_CASE("the shared harness finds the dispatch bit-exact: routed rows copied, the rest zero or left") {
  using codegen::MoeCombineSpec;
  check_exactly({MoeCombineSpec{.top_k = 8, .hidden = 7168, .dispatch = true},
                 MoeCombineSpec{.top_k = 4, .hidden = 2880, .dispatch = true},
                 MoeCombineSpec{.top_k = 1, .hidden = 8, .dispatch = true}});
}

TEST_SUITE_END();

TEST_SUITE_BEGIN("fp8_quantize");

TEST_CASE("the shared harness finds fp8 quantize bit-exact, both scale formats, with and without gather") {
  using codegen::Fp8QuantizeSpec, codegen::QuantScaleFormat;
  check_exactly({Fp8QuantizeSpec{.k = 7168}, Fp8QuantizeSpec{.k = 2048, .scale_format = QuantScaleFormat::ue8m0},
                 Fp8QuantizeSpec{.k = 7168, .gather = true},
                 Fp8QuantizeSpec{.k = 128, .scale_format = QuantScaleFormat::ue8m0, .gather = true}});
}

TEST_SUITE_END();
