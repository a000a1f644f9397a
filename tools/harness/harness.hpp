// The correctness harness of every kernel family, shared by `jitctl selftest`
// and the GPU tests: a random problem of a spec's shape on fresh data, the
// spec launched exactly as given (no heuristic picks another kernel, vector
// width or tile), every output compared with kjit/reference: dequant bit for
// bit (partial blocks included), grouped GEMMs (bf16, FP8) to 1e-2 relative error on
// sampled rows (uneven routing, empty experts, rows past the last offset that
// must stay untouched), MoE routing exactly in every output (expert
// parallelism, a hot expert, one block and many), MoE combine to the GPU
// tests' tolerance (its weights' gradient and its dispatch bit for bit, the
// dispatch's rows past the routed ones zero or untouched), fp8 quantize bit
// for bit (codes and scales; kjit.h's edge groups, gather with -1 rows), MX
// quantize bit for bit (codes, every scale byte, the computed global scales),
// MoE activation bit for bit (bf16, or FP8 codes and scales; rows past
// valid_rows zero), the grouped weight-gradient GEMM per expert against fp64 (fp32 out 1e-5
// relative, bf16 one rounding; empty experts exactly zero). Outputs start poisoned, so unwritten elements
// fail. Depth::quick (jitctl selftest's default) makes the GEMM checks' host work small: two routed experts,
// sampled columns of the sampled rows (sampling.hpp); exhaustive (the default here, and the GPU tests') is the
// full check.
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "kjit/codegen/families/grouped_gemm_fp8.hpp"
#include "kjit/codegen/kernel_spec.hpp"
#include "kjit/internal/runtime.hpp"
#include "sampling.hpp"

namespace kjit::harness {

// What one check found: whether it passed, and its line ("bit-exact",
// "relative error 3.1e-03", "12 wrong elements", "error: ...").
struct Outcome {
  bool ok;
  std::string text;
};

// Launches exactly `spec` on `device` over a random problem of its shape and
// compares every output with the reference. Safe to run on several threads
// at once (their launches take turns: device_buffers.hpp).
Outcome check_spec(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec, std::mt19937_64& rng,
                   Depth depth = Depth::exhaustive);

// An upper bound of the device memory check_spec allocates for `spec` (its
// weight stacks or weight-gradient output dominate): how jitctl selftest keeps
// its parallel checks within the device's memory.
uint64_t device_bytes(const codegen::KernelSpec& spec);

// The families' checks check_spec runs: the number of wrong elements, or the
// grouped GEMM's relative error.
Expected<int64_t> check_dequant(Runtime& runtime, DeviceState& device, const codegen::DequantSpec& spec,
                                std::mt19937_64& rng);
Expected<double> check_grouped_gemm(Runtime& runtime, DeviceState& device, const codegen::GroupedGemmSpec& spec,
                                    std::mt19937_64& rng, Depth depth = Depth::exhaustive);
Expected<double> check_grouped_gemm_fp8(Runtime& runtime, DeviceState& device, const codegen::GroupedGemmFp8Spec& spec,
                                        std::mt19937_64& rng, Depth depth = Depth::exhaustive);
Expected<double> check_grouped_gemm_mixed(Runtime& runtime, DeviceState& device,
                                          const codegen::GroupedGemmMixedSpec& spec, std::mt19937_64& rng,
                                          Depth depth = Depth::exhaustive);
Expected<int64_t> check_moe_routing(Runtime& runtime, DeviceState& device, const codegen::MoeRoutingSpec& spec,
                                    std::mt19937_64& rng);
Expected<int64_t> check_moe_combine(Runtime& runtime, DeviceState& device, const codegen::MoeCombineSpec& spec,
                                    std::mt19937_64& rng);
// The combine family's dispatch (spec.dispatch), which check_moe_combine does not run.
Expected<int64_t> check_moe_dispatch(Runtime& runtime, DeviceState& device, const codegen::MoeCombineSpec& spec,
                                     std::mt19937_64& rng);
Expected<int64_t> check_mx_dequant(Runtime& runtime, DeviceState& device, const codegen::MxDequantSpec& spec,
                                   std::mt19937_64& rng);
Expected<int64_t> check_mx_scale_layout(Runtime& runtime, DeviceState& device, const codegen::MxScaleLayoutSpec& spec,
                                        std::mt19937_64& rng);
Expected<int64_t> check_fp8_quantize(Runtime& runtime, DeviceState& device, const codegen::Fp8QuantizeSpec& spec,
                                     std::mt19937_64& rng);
Expected<int64_t> check_moe_activation(Runtime& runtime, DeviceState& device, const codegen::MoeActivationSpec& spec,
                                       std::mt19937_64& rng);
// Returns the experts whose matrix is off (kjit.h's tolerance) or left unwritten.
Expected<int64_t> check_grouped_gemm_wgrad(Runtime& runtime, DeviceState& device,
                                           const codegen::GroupedGemmWgradSpec& spec, std::mt19937_64& rng,
                                           Depth depth = Depth::exhaustive);
Expected<int64_t> check_mx_quantize(Runtime& runtime, DeviceState& device, const codegen::MxQuantizeSpec& spec,
                                    std::mt19937_64& rng);

}  // namespace kjit::harness
