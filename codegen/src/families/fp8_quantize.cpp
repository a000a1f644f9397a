// The fp8 quantize family: invariants, recipe and grid.
#include "kjit/codegen/families/fp8_quantize.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "../recipe.hpp"
#include "fp8_spec_fields.hpp"

namespace kjit::codegen {

namespace {

constexpr std::array kScaleFormatNames{"fp32", "ue8m0"};

constexpr int kQuantizeThreads = 256;
constexpr int kThreadsPerGroup = 8;  // 16 columns each: two 16-byte loads, one 16-byte store
constexpr int kGroupsPerBlock = kQuantizeThreads / kThreadsPerGroup;
constexpr int64_t kMaxGridX = 0x7fffffff;

auto invalid(std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); }

}  // namespace

std::string_view name(QuantScaleFormat f) { return kScaleFormatNames[static_cast<size_t>(f)]; }

template struct SpecForms<Fp8QuantizeSpec>;

Expected<void> Family<Fp8QuantizeSpec>::validate(const Fp8QuantizeSpec& s) {
  if (s.group != 128)
    return invalid(fmt::format("fp8_quantize: group must be 128 (one scale per 128 columns), got {}", s.group));
  if (s.k < s.group || s.k % s.group != 0 || s.k > kMaxDimension)
    return invalid(fmt::format("fp8_quantize: K must be a positive multiple of {} up to {}, got {}", s.group, kMaxDimension,
                               s.k));
  return {};
}

Expected<void> Family<Fp8QuantizeSpec>::supported_on(const Fp8QuantizeSpec&, const ArchInfo& arch) {
  if (arch.fp8_conversion) return {};
  return fail(KJIT_ERROR_UNSUPPORTED,
              fmt::format("fp8 quantize needs compute capability 8.9 or newer; {} is {}.{} ({})", arch.target,
                          arch.major, arch.minor, arch.note));
}

RenderedKernel Family<Fp8QuantizeSpec>::render(const Fp8QuantizeSpec& s) {
  return assemble(canonical(s), {.entry_point = "kjit_fp8_quantize",
                                 .threads = kQuantizeThreads,
                                 .templates = {"quantize/fp8_quantize.cuh"},
                                 .config = fmt::format("kjit::QuantizeConfig<{}LL, {}, {}, {}, {}>", s.k, s.group,
                                                       s.scale_format == QuantScaleFormat::ue8m0, s.gather,
                                                       kQuantizeThreads),
                                 .params_type = "kjit_fp8_quantize_params",
                                 .body = "kjit::fp8_quantize",
                                 .signals_dependents_early = true});
}

LaunchGeometry fp8_quantize_geometry(const Fp8QuantizeSpec& spec, int64_t rows) {
  const int64_t groups = rows * (spec.k / spec.group);
  LaunchGeometry g;
  g.block_x = kQuantizeThreads;
  g.grid_x = static_cast<uint32_t>(std::clamp<int64_t>((groups + kGroupsPerBlock - 1) / kGroupsPerBlock, 1, kMaxGridX));
  return g;
}

int64_t fp8_quantize_max_rows(const Fp8QuantizeSpec& spec) {
  return kMaxGridX * kGroupsPerBlock / (spec.k / spec.group);
}

}  // namespace kjit::codegen
