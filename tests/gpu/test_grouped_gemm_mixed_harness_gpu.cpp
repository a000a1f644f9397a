// The shared harness (jitctl selftest's check of the W8A16 family) on every
// configuration this arch builds and on the portable kernel, DeepSeek-V3's
// 256 experts of 4096 x 7168 forward and its backward reading included.
// Apart from test_grouped_gemm_mixed_gpu.cpp because it needs the family's
// codegen (codegen::GroupedGemmMixedSpec), which comes with the op.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "harness.hpp"
#include "kjit/codegen/families/grouped_gemm_mixed.hpp"
#include "kjit/internal/runtime.hpp"
#include "why.hpp"

using namespace kjit::testing;
namespace codegen = kjit::codegen;

TEST_SUITE_BEGIN("grouped_gemm_mixed");

TEST_CASE("the shared harness finds every W8A16 and W4A16 configuration of this arch, and the portable kernel, within "
          "1e-2") {
  kjit::Runtime& runtime = kjit::Runtime::global();
  auto device = runtime.device(0);
  REQUIRE_MESSAGE(device.has_value(), why(device));
  const codegen::ArchInfo& arch = *(*device)->arch;
  const codegen::GroupedGemmMixedSpec deepseek{.n = 4096, .k = 7168, .experts = 256};
  const codegen::GroupedGemmMixedSpec deepseek_backward{.n = 7168,
                                                        .k = 4096,
                                                        .experts = 256,
                                                        .weights = codegen::WeightLayout::e_k_n,
                                                        .scale_convention = codegen::ScaleConvention::divide};
  const codegen::GroupedGemmMixedSpec row_e5m2{.out = codegen::DType::f32,
                                               .n = 384,
                                               .k = 528,
                                               .experts = 4,
                                               .weight = codegen::MixedWeight::f8_e5m2,
                                               .weight_scale = codegen::ScaleGranularity::per_row,
                                               .offsets = codegen::OffsetsConvention::with_leading_zero,
                                               .row_scale = true};
  const codegen::GroupedGemmMixedSpec tensor_backward{.n = 256,
                                                      .k = 144,
                                                      .experts = 1,
                                                      .weights = codegen::WeightLayout::e_k_n,
                                                      .weight_scale = codegen::ScaleGranularity::per_tensor};
  const codegen::GroupedGemmMixedSpec nvfp4_divide{.n = 1536,
                                                   .k = 2048,
                                                   .experts = 128,
                                                   .weight = codegen::MixedWeight::nvfp4,
                                                   .scale_convention = codegen::ScaleConvention::divide};
  const codegen::GroupedGemmMixedSpec gpt_oss_mxfp4{.out = codegen::DType::f32,
                                                    .n = 2880,
                                                    .k = 2880,
                                                    .experts = 32,
                                                    .weight = codegen::MixedWeight::mxfp4,
                                                    .row_scale = true};
  for (const auto& problem : {deepseek, deepseek_backward, row_e5m2, tensor_backward, nvfp4_divide, gpt_oss_mxfp4}) {
    auto specs = codegen::grouped_gemm_mixed_configs(problem, arch);
    const auto portable =
        codegen::grouped_gemm_mixed_candidates(problem, arch, {.kernel = codegen::GemmRequest::Kernel::portable});
    REQUIRE_MESSAGE(portable.has_value(), why(portable));
    for (const auto& spec : *portable)
      if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
    for (const auto& spec : specs) {
      const std::string name = codegen::Family<codegen::GroupedGemmMixedSpec>::canonical(spec);
      CAPTURE(name);
      const auto error = kjit::harness::check_grouped_gemm_mixed(runtime, **device, spec, rng());
      REQUIRE_MESSAGE(error.has_value(), why(error));
      CHECK_MESSAGE(*error <= 1e-2, "relative error ", *error);
    }
  }
}

TEST_SUITE_END();
