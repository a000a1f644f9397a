// Dispatch over the KernelSpec variant to each family's Family<Spec>, and the
// names of the shared vocabulary.
#include "kjit/codegen/kernel_spec.hpp"

#include <array>

#include <fmt/format.h>

#include "spec_reader.hpp"

namespace kjit::codegen {
namespace {

// Every alternative is a complete family: a missing member fails here, at compile time.
template <class... Specs>
constexpr bool all_families(std::variant<Specs...>*) {
  return (KernelFamilyTraits<Specs> && ...);
}
static_assert(all_families(static_cast<KernelSpec*>(nullptr)), "every KernelSpec alternative needs a Family<Spec>");

constexpr std::array kDTypeNames{"f8_e4m3fn", "f8_e5m2", "bf16", "f16", "f32"};
constexpr std::array kGranularityNames{"per_tensor", "per_row", "per_block"};
constexpr std::array kConventionNames{"multiply", "divide"};
constexpr std::array kLayoutNames{"e_n_k", "e_k_n"};
constexpr std::array kOffsetsNames{"cumulative_end", "with_leading_zero"};
constexpr std::array kActivationNames{"none", "silu_mul", "swiglu_oai"};
constexpr std::array kGateUpNames{"halves", "alternating", "groups_of_8"};
constexpr std::array kAddendNames{"none", "bf16", "f32"};

// Parses the alternative whose family's op is `op`, if any.
template <size_t I = 0>
std::optional<Expected<KernelSpec>> parse_family(std::string_view op, SpecReader& reader) {
  if constexpr (I == std::variant_size_v<KernelSpec>) {
    return std::nullopt;
  } else {
    using Spec = std::variant_alternative_t<I, KernelSpec>;
    if (op != Family<Spec>::op) return parse_family<I + 1>(op, reader);
    auto spec = Family<Spec>::from_json(reader);
    if (!spec) return Expected<KernelSpec>(std::unexpected(spec.error()));
    return Expected<KernelSpec>(KernelSpec{std::move(*spec)});
  }
}

template <size_t... I>
std::vector<std::string_view> ops(std::index_sequence<I...>) {
  return {Family<std::variant_alternative_t<I, KernelSpec>>::op...};
}

template <size_t... I>
const std::vector<FieldRule>* schema_of(std::string_view op, std::index_sequence<I...>) {
  const std::vector<FieldRule>* found = nullptr;
  ((op == Family<std::variant_alternative_t<I, KernelSpec>>::op
        ? (found = &Family<std::variant_alternative_t<I, KernelSpec>>::schema(), 0)
        : 0),
   ...);
  return found;
}

constexpr auto kFamilies = std::make_index_sequence<std::variant_size_v<KernelSpec>>();

}  // namespace

std::string_view name(DType t) { return kDTypeNames[static_cast<size_t>(t)]; }
std::string_view name(ScaleGranularity g) { return kGranularityNames[static_cast<size_t>(g)]; }
std::string_view name(ScaleConvention c) { return kConventionNames[static_cast<size_t>(c)]; }
std::string_view name(WeightLayout l) { return kLayoutNames[static_cast<size_t>(l)]; }
std::string_view name(OffsetsConvention c) { return kOffsetsNames[static_cast<size_t>(c)]; }
std::string_view name(Activation a) { return kActivationNames[static_cast<size_t>(a)]; }
std::string_view name(GateUpLayout l) { return kGateUpNames[static_cast<size_t>(l)]; }
std::string_view name(Addend a) { return kAddendNames[static_cast<size_t>(a)]; }

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

int widest_vector(int64_t cols, std::initializer_list<int64_t> alignments, int max_vec) {
  for (int vec : {16, 8, 4, 2}) {
    bool fits = vec <= max_vec && cols % vec == 0;
    for (int64_t a : alignments) fits = fits && a % vec == 0;
    if (fits) return vec;
  }
  return 1;
}

std::string_view op_name(const KernelSpec& spec) {
  return std::visit([](const auto& s) { return Family<std::decay_t<decltype(s)>>::op; }, spec);
}

std::vector<std::string_view> spec_ops() { return ops(kFamilies); }

const std::vector<FieldRule>* spec_schema(std::string_view op) { return schema_of(op, kFamilies); }

std::string canonical(const KernelSpec& spec) {
  return std::visit([](const auto& s) { return Family<std::decay_t<decltype(s)>>::canonical(s); }, spec);
}

nlohmann::json to_json(const KernelSpec& spec) {
  return std::visit([](const auto& s) { return Family<std::decay_t<decltype(s)>>::to_json(s); }, spec);
}

Expected<KernelSpec> spec_from_json(const nlohmann::json& j) {
  if (!j.is_object()) return fail(KJIT_ERROR_INVALID_ARGUMENT, "a kernel spec must be a JSON object");
  if (!j.contains("op") || !j["op"].is_string())
    return fail(KJIT_ERROR_INVALID_ARGUMENT, "spec field 'op' must be a string");
  const auto op = j["op"].get<std::string>();
  SpecReader reader(j);
  auto parsed = parse_family(op, reader);
  if (!parsed)
    return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("unknown op '{}' (known: {})", op, fmt::join(spec_ops(), ", ")));
  const auto spec = KJIT_TRY(std::move(*parsed));
  KJIT_TRY(reader.finish(op));
  KJIT_TRY(validate(spec));
  return spec;
}

Expected<void> validate(const KernelSpec& spec) {
  return std::visit([](const auto& s) { return Family<std::decay_t<decltype(s)>>::validate(s); }, spec);
}

Expected<void> validate_for_target(const KernelSpec& spec, const ArchInfo& arch) {
  KJIT_TRY(validate(spec));
  return std::visit([&](const auto& s) { return Family<std::decay_t<decltype(s)>>::supported_on(s, arch); }, spec);
}

KernelSpec kernel_identity(const KernelSpec& spec) {
  return std::visit(
      [](auto s) -> KernelSpec {
        if constexpr (requires { s.experts; s.configured(); })
          if (s.configured()) s.experts = 0;
        return s;
      },
      spec);
}

RenderedKernel render(const KernelSpec& spec) {
  return std::visit([](const auto& s) { return Family<std::decay_t<decltype(s)>>::render(s); },
                    kernel_identity(spec));
}

std::vector<KernelSpec> kernels_for_target(const KernelSpec& spec, const ArchInfo& arch) {
  return std::visit(
      [&](const auto& s) {
        std::vector<KernelSpec> out;
        for (auto& one : Family<std::decay_t<decltype(s)>>::kernels_for_target(s, arch)) out.emplace_back(one);
        return out;
      },
      spec);
}

size_t SpecHash::operator()(const KernelSpec& spec) const noexcept {
  HashMixer h{spec.index()};
  std::visit([&](const auto& s) { Family<std::decay_t<decltype(s)>>::hash(s, h); }, spec);
  return h.value;
}

}  // namespace kjit::codegen
