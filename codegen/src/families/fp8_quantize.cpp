// The fp8 quantize family: spec forms, invariants, recipe and grid.
#include "kjit/codegen/families/fp8_quantize.hpp"

#include <algorithm>
#include <array>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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

std::string Family<Fp8QuantizeSpec>::canonical(const Fp8QuantizeSpec& s) {
  return fmt::format("fp8_quantize in=bf16 out=f8_e4m3fn k={} group={} scale={} gather={}", s.k, s.group,
                     name(s.scale_format), s.gather);
}

nlohmann::json Family<Fp8QuantizeSpec>::to_json(const Fp8QuantizeSpec& s) {
  return {{"op", op}, {"k", s.k}, {"group", s.group}, {"scale_format", name(s.scale_format)}, {"gather", s.gather}};
}

Expected<Fp8QuantizeSpec> Family<Fp8QuantizeSpec>::from_json(SpecReader& reader) {
  Fp8QuantizeSpec s;
  s.k = KJIT_TRY(reader.integer("k"));
  s.group = KJIT_TRY(reader.integer_or("group", 128));
  s.scale_format = reader.has("scale_format") ? KJIT_TRY(reader.enumeration<QuantScaleFormat>("scale_format"))
                                              : QuantScaleFormat::fp32;
  s.gather = KJIT_TRY(reader.boolean_or("gather", false));
  return s;
}

const std::vector<FieldRule>& Family<Fp8QuantizeSpec>::schema() {
  static const std::vector<FieldRule> rules{integer_field("k", 128, kMaxDimension), integer_field("group", 128, 128, false),
                                            text_field("scale_format", {"fp32", "ue8m0"}, false),
                                            boolean_field("gather")};
  return rules;
}

void Family<Fp8QuantizeSpec>::hash(const Fp8QuantizeSpec& s, HashMixer& h) {
  h.mix(static_cast<uint64_t>(s.k) << 24 | static_cast<uint64_t>(s.group) << 2 |
        static_cast<uint64_t>(s.scale_format) << 1 | static_cast<uint64_t>(s.gather));
}

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
                                 .body = "kjit::fp8_quantize"});
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
