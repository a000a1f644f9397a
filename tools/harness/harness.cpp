// check_spec: each spec to its family's check (harness.hpp).
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>

#include <fmt/format.h>

#include "harness.hpp"

namespace kjit::harness {
namespace {

Outcome counted(const Expected<int64_t>& wrong, std::string_view match) {
  if (!wrong) return {false, "error: " + wrong.error().message};
  if (*wrong == 0) return {true, std::string(match)};
  return {false, fmt::format("{} wrong elements", *wrong)};
}

Outcome relative(const Expected<double>& error) {
  if (!error) return {false, "error: " + error.error().message};
  return {*error <= 1e-2, fmt::format("relative error {:.1e}", *error)};  // NaN fails too
}

template <class>
constexpr bool kNoCheck = false;

// A cached grouped GEMM kernel is its identity, with no expert count (kernel_identity): launched over this many.
constexpr int64_t kIdentityExperts = 8;

}  // namespace

Outcome check_spec(Runtime& runtime, DeviceState& device, const codegen::KernelSpec& spec, std::mt19937_64& rng,
                   Depth depth) {
  return std::visit(
      [&](auto s) -> Outcome {
        using S = std::decay_t<decltype(s)>;
        if constexpr (requires { s.experts; s.configured(); })
          if (s.experts == 0) s.experts = kIdentityExperts;
        if constexpr (std::is_same_v<S, codegen::DequantSpec>) {
          return counted(check_dequant(runtime, device, s, rng), "bit-exact");
        } else if constexpr (std::is_same_v<S, codegen::GroupedGemmSpec>) {
          return relative(check_grouped_gemm(runtime, device, s, rng, depth));
        } else if constexpr (std::is_same_v<S, codegen::GroupedGemmFp8Spec>) {
          return relative(check_grouped_gemm_fp8(runtime, device, s, rng, depth));
        } else if constexpr (std::is_same_v<S, codegen::GroupedGemmMixedSpec>) {
          return relative(check_grouped_gemm_mixed(runtime, device, s, rng, depth));
        } else if constexpr (std::is_same_v<S, codegen::MoeRoutingSpec>) {
          return counted(check_moe_routing(runtime, device, s, rng), "exact");
        } else if constexpr (std::is_same_v<S, codegen::MoeCombineSpec>) {
          if (s.dispatch) return counted(check_moe_dispatch(runtime, device, s, rng), "bit-exact");
          return counted(check_moe_combine(runtime, device, s, rng),
                         s.gradient ? "bit-exact" : "within 1e-5 relative");
        } else if constexpr (std::is_same_v<S, codegen::Fp8QuantizeSpec>) {
          return counted(check_fp8_quantize(runtime, device, s, rng), "bit-exact");
        } else if constexpr (std::is_same_v<S, codegen::MxQuantizeSpec>) {
          return counted(check_mx_quantize(runtime, device, s, rng), "bit-exact");
        } else if constexpr (std::is_same_v<S, codegen::MxDequantSpec>) {
          return counted(check_mx_dequant(runtime, device, s, rng), "bit-exact");
        } else if constexpr (std::is_same_v<S, codegen::MxScaleLayoutSpec>) {
          return counted(check_mx_scale_layout(runtime, device, s, rng), "exact");
        } else if constexpr (std::is_same_v<S, codegen::MoeActivationSpec>) {
          return counted(check_moe_activation(runtime, device, s, rng), "bit-exact");
        } else if constexpr (std::is_same_v<S, codegen::GroupedGemmWgradSpec>) {
          return counted(check_grouped_gemm_wgrad(runtime, device, s, rng, depth), "within tolerance against fp64");
        } else {
          static_assert(kNoCheck<S>, "every kernel family needs a check in the harness");
        }
      },
      spec);
}

uint64_t device_bytes(const codegen::KernelSpec& spec) {
  constexpr uint64_t kSmall = uint64_t{256} << 20;  // every other buffer of any check, with room to spare
  return std::visit(
      [](const auto& s) -> uint64_t {
        // Weights (at most 2 bytes each) or a weight-gradient output (at most 4) of every expert.
        if constexpr (requires { s.experts + s.n + s.k; })
          return kSmall + 4 * static_cast<uint64_t>(s.experts) * static_cast<uint64_t>(s.n) *
                              static_cast<uint64_t>(s.k);
        return kSmall;
      },
      spec);
}

}  // namespace kjit::harness
