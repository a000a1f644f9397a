// The fp8 quantize family: bf16 activations [rows, K] -> e4m3fn codes [rows, K]
// and one fp32 scale per row per 128 columns (DeepSeek / vLLM per-token-group
// quantisation, the A operand of a 1x128-scaled FP8 GEMM), optionally
// gathering the rows through the routing's permutation in the same pass.
// Home: this header and codegen/src/families/fp8_quantize.cpp; device code in
// templates/quantize/fp8_quantize.cuh; ABI block templates/abi/fp8_quantize_params.h.
// The exact arithmetic is stated in kjit.h (kjit_fp8_quantize_desc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// What a scale is: amax / 448 in fp32, or that rounded up to a power of two (UE8M0, stored as fp32).
enum class QuantScaleFormat : uint8_t { fp32, ue8m0 };
std::string_view name(QuantScaleFormat f);

// The shape key is K (compiled in, so row and group indices divide by a
// constant); rows, the input row stride and the gather's token count and
// top_k are run-time arguments.
struct Fp8QuantizeSpec {
  int64_t k = 0;
  int64_t group = 128;  // columns per scale
  QuantScaleFormat scale_format = QuantScaleFormat::fp32;
  bool gather = false;  // output row r reads input row sorted_to_flat[r] / top_k
  bool operator==(const Fp8QuantizeSpec&) const = default;
};

template <>
struct Family<Fp8QuantizeSpec> : SpecForms<Fp8QuantizeSpec> {
  static constexpr std::string_view op = "fp8_quantize";
  static constexpr auto fields = std::tuple{
      fixed_text(" in=bf16 out=f8_e4m3fn"), field("k", &Fp8QuantizeSpec::k).range(128, kMaxDimension),
      field("group", &Fp8QuantizeSpec::group).optional().range(128, 128),
      field("scale_format", &Fp8QuantizeSpec::scale_format).optional().key("scale"),
      field("gather", &Fp8QuantizeSpec::gather).optional()};
  static Expected<void> validate(const Fp8QuantizeSpec& s);
  static Expected<void> supported_on(const Fp8QuantizeSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const Fp8QuantizeSpec& s);
  static std::vector<Fp8QuantizeSpec> kernels_for_target(const Fp8QuantizeSpec& s, const ArchInfo&) { return {s}; }
};

// Eight threads per 128-column group (16 columns each), 32 groups per block.
LaunchGeometry fp8_quantize_geometry(const Fp8QuantizeSpec& spec, int64_t rows);
// The most output rows one launch takes for `spec` (the grid's x limit).
int64_t fp8_quantize_max_rows(const Fp8QuantizeSpec& spec);

}  // namespace kjit::codegen
