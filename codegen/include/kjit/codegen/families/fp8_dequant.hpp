// The fp8 dequant family: fp8 codes (e4m3fn, e5m2) and fp32 scales (per
// tensor, per row, per 2-D block; multiplier or divisor) -> bf16/f16/f32.
// Home: this header and codegen/src/families/fp8_dequant.cpp; device code in
// templates/dequant/fp8_dequant.cuh; ABI block templates/abi/dequant_params.h.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/render.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// The shape key is the column count (the contiguous dimension, compiled in so
// that index division is by a constant) and the scale block; rows, experts
// and strides are run-time arguments, so one kernel serves every row count
// and expert count of a weight shape.
struct DequantSpec {
  DType in = DType::f8_e4m3fn;
  DType out = DType::bf16;
  int64_t cols = 0;
  ScaleGranularity granularity = ScaleGranularity::per_block;
  int64_t block_rows = 0;  // per_block only; 0 otherwise
  int64_t block_cols = 0;  // per_block only; 0 otherwise
  ScaleConvention convention = ScaleConvention::multiply;
  int vec = 16;                   // columns per thread access; divides cols
  bool selected_experts = false;  // the "only these experts" form

  bool operator==(const DequantSpec&) const = default;
};

// The access width a dequant to `out` uses: the widest whose output is one
// 16-byte store (8 columns for bf16/f16, 4 for f32): full-width coalesced
// stores beat wider accesses split into two stores (docs/decisions/0001). Used by
// ops and manifests alike, so a manifest precompiles what a launch picks.
int dequant_vector(DType out, int64_t cols, std::initializer_list<int64_t> alignments = {});

// The fields a dequant spec (fp8 and MX) ends with: the access width, which may be left out (then `widest`:
// what a launch on aligned contiguous tensors picks; manifests leave it out), and the selected-experts form.
template <class Spec>
constexpr auto dequant_access_fields(int (*widest)(const Spec&), int64_t max_vec) {
  return std::tuple{
      field("vec", &Spec::vec).optional().fallback(widest).range(1, max_vec),
      field("selected_experts", &Spec::selected_experts).optional().key("experts").spelled("all", "selected")};
}

template <>
struct Family<DequantSpec> : SpecForms<DequantSpec> {
  static constexpr std::string_view op = "fp8_dequant";
  static constexpr auto fields = std::tuple_cat(
      std::tuple{
          field("in", &DequantSpec::in).only(DType::f8_e4m3fn, DType::f8_e5m2),
          field("out", &DequantSpec::out).only(DType::bf16, DType::f16, DType::f32),
          field("cols", &DequantSpec::cols).range(1, kMaxDimension),
          field("scale", &DequantSpec::granularity),
          field("block", &DequantSpec::block_rows, &DequantSpec::block_cols)
              .when([](const DequantSpec& s) { return s.granularity == ScaleGranularity::per_block; })
              .prefix(":")
              .shape("[rows, cols]")
              .range(1, kMaxDimension),
          field("convention", &DequantSpec::convention)},
      dequant_access_fields<DequantSpec>(
          [](const DequantSpec& s) { return s.cols > 0 ? dequant_vector(s.out, s.cols) : 1; }, 16));
  static Expected<void> validate(const DequantSpec& s);
  static Expected<void> supported_on(const DequantSpec& s, const ArchInfo& arch);
  static RenderedKernel render(const DequantSpec& s);
  static std::vector<DequantSpec> kernels_for_target(const DequantSpec& s, const ArchInfo&) { return {s}; }
};

// Grid for a dequant of `rows` rows into `output_slots` experts.
LaunchGeometry dequant_geometry(const DequantSpec& spec, int64_t rows, int64_t output_slots);

}  // namespace kjit::codegen
