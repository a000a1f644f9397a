// KernelSpec names, canonical text, JSON form and invariants.
#include "kjit/codegen/kernel_spec.hpp"

#include <array>
#include <functional>

#include <fmt/format.h>

namespace kjit::codegen {
namespace {

constexpr std::array kDTypeNames{"f8_e4m3fn", "f8_e5m2", "bf16", "f16", "f32"};
constexpr std::array kGranularityNames{"per_tensor", "per_row", "per_block"};
constexpr std::array kConventionNames{"multiply", "divide"};

template <class Enum, size_t N>
Expected<Enum> parse_enum(const nlohmann::json& j, const char* field,
                          const std::array<const char*, N>& names) {
  if (!j.contains(field) || !j[field].is_string())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be a string", field));
  const auto text = j[field].get<std::string>();
  for (size_t i = 0; i < N; ++i)
    if (text == names[i]) return static_cast<Enum>(i);
  return fail(KJIT_ERROR_INVALID_ARGUMENT,
              fmt::format("spec field '{}' has unknown value '{}' (expected one of: {})", field, text,
                          fmt::join(names, ", ")));
}

Expected<int64_t> parse_int(const nlohmann::json& j, const char* field, int64_t fallback, bool required) {
  if (!j.contains(field)) {
    if (required) return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' is missing", field));
    return fallback;
  }
  if (!j[field].is_number_integer())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be an integer", field));
  return j[field].get<int64_t>();
}

bool is_fp8(DType t) { return t == DType::f8_e4m3fn || t == DType::f8_e5m2; }

Expected<void> validate_dequant(const DequantSpec& s) {
  auto invalid = [](std::string message) { return fail(KJIT_ERROR_INVALID_ARGUMENT, std::move(message)); };
  if (!is_fp8(s.in)) return invalid(fmt::format("fp8_dequant input must be f8_e4m3fn or f8_e5m2, not {}", name(s.in)));
  if (is_fp8(s.out)) return invalid(fmt::format("fp8_dequant output must be bf16, f16 or f32, not {}", name(s.out)));
  if (s.cols <= 0) return invalid(fmt::format("cols must be positive, got {}", s.cols));
  if (s.vec != 1 && s.vec != 2 && s.vec != 4 && s.vec != 8 && s.vec != 16)
    return invalid(fmt::format("vec must be 1, 2, 4, 8 or 16, got {}", s.vec));
  if (s.cols % s.vec != 0) return invalid(fmt::format("vec {} does not divide cols {}", s.vec, s.cols));
  const bool blocked = s.granularity == ScaleGranularity::per_block;
  if (blocked && (s.block_rows <= 0 || s.block_cols <= 0))
    return invalid(fmt::format("per_block scales need block sizes >= 1, got {}x{}", s.block_rows, s.block_cols));
  if (!blocked && (s.block_rows != 0 || s.block_cols != 0))
    return invalid(fmt::format("block sizes are only meaningful for per_block scales, got {}x{} with {}",
                               s.block_rows, s.block_cols, name(s.granularity)));
  return {};
}

}  // namespace

std::string_view name(DType t) { return kDTypeNames[static_cast<size_t>(t)]; }
std::string_view name(ScaleGranularity g) { return kGranularityNames[static_cast<size_t>(g)]; }
std::string_view name(ScaleConvention c) { return kConventionNames[static_cast<size_t>(c)]; }

int size_bytes(DType t) {
  switch (t) {
    case DType::f8_e4m3fn:
    case DType::f8_e5m2: return 1;
    case DType::bf16:
    case DType::f16: return 2;
    case DType::f32: return 4;
  }
  return 0;
}

std::string_view op_name(const KernelSpec& spec) {
  return std::visit([](const DequantSpec&) { return std::string_view("fp8_dequant"); }, spec);
}

std::string canonical(const KernelSpec& spec) {
  const auto& s = std::get<DequantSpec>(spec);
  std::string scale(name(s.granularity));
  if (s.granularity == ScaleGranularity::per_block) scale += fmt::format(":{}x{}", s.block_rows, s.block_cols);
  return fmt::format("fp8_dequant in={} out={} cols={} scale={} convention={} vec={} experts={}", name(s.in),
                     name(s.out), s.cols, scale, name(s.convention), s.vec,
                     s.selected_experts ? "selected" : "all");
}

nlohmann::json to_json(const KernelSpec& spec) {
  const auto& s = std::get<DequantSpec>(spec);
  nlohmann::json j = {{"op", "fp8_dequant"},
                      {"in", name(s.in)},
                      {"out", name(s.out)},
                      {"cols", s.cols},
                      {"scale", name(s.granularity)},
                      {"convention", name(s.convention)},
                      {"vec", s.vec},
                      {"selected_experts", s.selected_experts}};
  if (s.granularity == ScaleGranularity::per_block) j["block"] = {s.block_rows, s.block_cols};
  return j;
}

Expected<KernelSpec> spec_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return fail(KJIT_ERROR_INVALID_ARGUMENT, "a kernel spec must be a JSON object");
  if (!j.contains("op") || !j["op"].is_string())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'op' must be a string");
  const auto op = j["op"].get<std::string>();
  if (op != "fp8_dequant")
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("unknown op '{}' (known: fp8_dequant)", op));

  DequantSpec s;
  auto in = parse_enum<DType>(j, "in", kDTypeNames);
  if (!in) return std::unexpected(in.error());
  auto out = parse_enum<DType>(j, "out", kDTypeNames);
  if (!out) return std::unexpected(out.error());
  auto cols = parse_int(j, "cols", 0, true);
  if (!cols) return std::unexpected(cols.error());
  auto granularity = parse_enum<ScaleGranularity>(j, "scale", kGranularityNames);
  if (!granularity) return std::unexpected(granularity.error());
  auto convention = parse_enum<ScaleConvention>(j, "convention", kConventionNames);
  if (!convention) return std::unexpected(convention.error());
  s.in = *in;
  s.out = *out;
  s.cols = *cols;
  s.granularity = *granularity;
  s.convention = *convention;
  if (s.granularity == ScaleGranularity::per_block) {
    const auto& block = j.contains("block") ? j["block"] : nlohmann::json();
    if (!block.is_array() || block.size() != 2 || !block[0].is_number_integer() || !block[1].is_number_integer())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'block' must be [block_rows, block_cols] for per_block scales");
    s.block_rows = block[0].get<int64_t>();
    s.block_cols = block[1].get<int64_t>();
  }
  auto vec = parse_int(j, "vec", dequant_vector(s.out, s.cols), false);
  if (!vec) return std::unexpected(vec.error());
  s.vec = static_cast<int>(*vec);
  if (j.contains("selected_experts")) {
    if (!j["selected_experts"].is_boolean())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'selected_experts' must be true or false");
    s.selected_experts = j["selected_experts"].get<bool>();
  }
  KernelSpec spec = s;
  if (auto ok = validate(spec); !ok) return std::unexpected(ok.error());
  return spec;
}

Expected<void> validate(const KernelSpec& spec) {
  return std::visit([](const DequantSpec& s) { return validate_dequant(s); }, spec);
}

int widest_vector(int64_t cols, std::initializer_list<int64_t> alignments, int max_vec) {
  for (int vec : {16, 8, 4, 2}) {
    bool fits = vec <= max_vec && cols % vec == 0;
    for (int64_t a : alignments) fits = fits && a % vec == 0;
    if (fits) return vec;
  }
  return 1;
}

int dequant_vector(DType out, int64_t cols, std::initializer_list<int64_t> alignments) {
  return widest_vector(cols, alignments, 16 / size_bytes(out));
}

size_t SpecHash::operator()(const KernelSpec& spec) const noexcept {
  const auto& s = std::get<DequantSpec>(spec);
  size_t h = std::hash<int64_t>{}(s.cols);
  auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
  mix(static_cast<uint64_t>(s.in) | static_cast<uint64_t>(s.out) << 8 | static_cast<uint64_t>(s.granularity) << 16 |
      static_cast<uint64_t>(s.convention) << 24 | static_cast<uint64_t>(s.vec) << 32 |
      static_cast<uint64_t>(s.selected_experts) << 40);
  mix(static_cast<uint64_t>(s.block_rows));
  mix(static_cast<uint64_t>(s.block_cols));
  return h;
}

}  // namespace kjit::codegen
