// What every kernel family provides. A family's home is one file pair,
// codegen/include/kjit/codegen/families/<family>.hpp (its spec, its Family<Spec>
// with the spec's field table, and anything else of it the runtime needs:
// configurations, launch geometry) and codegen/src/families/<family>.cpp, which
// defines the rest of Family<Spec>:
//
//   static constexpr std::string_view op;            // "fp8_dequant": JSON "op", listings, file names
//   static constexpr auto fields = std::tuple{...};  // the spec's fields, once (spec_fields.hpp)
//   static Expected<void> validate(const Spec&);     // the ONLY place the family's invariants are checked
//   static Expected<void> supported_on(const Spec&, const ArchInfo&);  // can this one kernel build and run there
//   static RenderedKernel render(const Spec&);       // the translation unit and its launch constants
//   static std::vector<Spec> kernels_for_target(const Spec&, const ArchInfo&);
//                                                    // what a manifest entry stands for on an arch (itself, or a
//                                                    // problem's configurations)
//
// and derives the spec's forms from `fields` through its base SpecForms<Spec>
// (canonical text, JSON in and out, schema, hash), which its .cpp instantiates
// (`template struct SpecForms<Spec>;`).
//
// kernel_spec.cpp dispatches over the KernelSpec variant with std::visit and
// static_asserts that every alternative satisfies KernelFamilyTraits, so a
// family left half-done fails to compile instead of at run time.
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kjit/base/expected.hpp"
#include "kjit/codegen/arch.hpp"
#include "kjit/codegen/spec_fields.hpp"
#include "kjit/codegen/spec_schema.hpp"

namespace kjit::codegen {

struct RenderedKernel;
class SpecReader;

// Folds 64-bit fields into one size_t (boost's hash_combine mixing).
struct HashMixer {
  size_t value = 0;
  void mix(uint64_t v) { value ^= static_cast<size_t>(v) + 0x9e3779b97f4a7c15ULL + (value << 6) + (value >> 2); }
};

template <class Spec>
struct Family;  // specialised in each family's header, defined in its .cpp

// The spec's forms, each derived from Family<Spec>::fields (defined in codegen/src/spec_forms.hpp).
template <class Spec>
struct SpecForms {
  static std::string canonical(const Spec& s);     // one stable line naming every field
  static nlohmann::json to_json(const Spec& s);
  static Expected<Spec> from_json(SpecReader& reader);  // every field read through the reader (unknown ones refused)
  static const std::vector<FieldRule>& schema();   // what each JSON field may hold (manifests check entries by it)
  static void hash(const Spec& s, HashMixer& mixer);  // the registry's in-process hash
};

template <class Spec>
concept KernelFamilyTraits =
    std::derived_from<Family<Spec>, SpecForms<Spec>> &&
    requires(const Spec& s, const ArchInfo& arch) {
      { Family<Spec>::op } -> std::convertible_to<std::string_view>;
      Family<Spec>::fields;
      { Family<Spec>::validate(s) } -> std::same_as<Expected<void>>;
      { Family<Spec>::supported_on(s, arch) } -> std::same_as<Expected<void>>;
      { Family<Spec>::render(s) } -> std::same_as<RenderedKernel>;
      { Family<Spec>::kernels_for_target(s, arch) } -> std::same_as<std::vector<Spec>>;
    };

}  // namespace kjit::codegen
