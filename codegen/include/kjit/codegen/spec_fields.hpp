// A kernel spec's fields, declared once. Each family lists its spec's fields in
// Family<Spec>::fields, a constexpr tuple in the order of the canonical text,
// and every serialised form of the spec is derived from that table
// (codegen/src/spec_forms.hpp): the canonical text (the op, then one piece per
// field, " name=value" unless the field says otherwise), the JSON written and
// read (each field's type checked, errors naming it; a field the spec has no use
// for refused), the schema manifests check entries by, and the registry's hash.
// The canonical text heads the rendered source, so it is part of every cache
// key: an existing spec's text must never change (tests/unit/test_spec_forms.cpp
// pins one spec per family and conditional field).
//
// Entries:
//   field("n", &Spec::n)                  one JSON field: an enum (by name), an integer, a boolean, or a
//                                          std::optional enum (written when it holds a value)
//   field("tile", &Spec::tile_m, &Spec::tile_n)
//                                          integers as one JSON list, "64x128" in the text
//   fixed_text(" a=bf16")                 text every spec of the family has (no JSON)
//   configuration(fields...)              a grouped GEMM configuration's fields: written where the spec's
//                                          configured() holds, " config=per-arch" in a problem's text; read when
//                                          the first of them is in the JSON, and the others refused without it
// A field's modifiers, each returning the changed field:
//   reading   .optional()                 may be absent: the default spec's value, or .fallback's
//             .optional_if(test)          may be absent where `test` holds over the fields before it
//             .fallback(f)                the value where the field is not read (absent, or outside .when)
//   presence  .when(test)                 exists only where `test` holds over the fields before it: elsewhere
//                                          neither written nor read (the reader refuses it)
//             .written_when(test)         optional, written only where `test` holds
//             .omit_default()             optional, written only where it differs from the default spec's
//             .present_if(&Spec::flag)    optional, its presence the flag (set on reading)
//   text      .key("scale")               its name in the text (default: the JSON name)
//             .prefix(":")                what the text writes before its value (default: " key=")
//             .spelled("all", "selected") a boolean's value in the text (default: false, true)
//             .text(f)                    its whole piece of text (possibly empty), whatever its presence
//   schema    .only(values...)            the enum values a manifest may name (default: every value)
//             .range(min, max)            an integer's (each list element's) bounds
//             .shape("[m, n]")            a list's name in messages
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace kjit::codegen {

template <class Spec>
using SpecTest = bool (*)(const Spec&);
template <class Spec>
using SpecText = std::string (*)(const Spec&);

// A member's value type, and whether the member is a std::optional of it.
template <class T>
struct FieldValue {
  using type = T;
  static constexpr bool optional = false;
};
template <class T>
struct FieldValue<std::optional<T>> {
  using type = T;
  static constexpr bool optional = true;
};

// One JSON field of a spec and its piece of canonical text: one member, or N integers written as a list.
template <class Spec, class Value, size_t N>
struct Field {
  using Element = typename FieldValue<Value>::type;
  static constexpr size_t kMaxValues = 8;

  std::string_view name;
  std::array<Value Spec::*, N> members{};
  SpecTest<Spec> optional_where = nullptr;
  Value (*fallback_value)(const Spec&) = nullptr;
  SpecTest<Spec> exists_where = nullptr;
  SpecTest<Spec> written_where = nullptr;
  bool omitted_when_default = false;
  bool Spec::*presence_flag = nullptr;
  std::string_view text_key = {};
  std::string_view text_prefix = {};
  std::array<std::string_view, 2> bool_spellings = {};  // a boolean's value in the text: false, true
  SpecText<Spec> text_piece = nullptr;
  std::array<Element, kMaxValues> allowed{};
  size_t allowed_count = 0;
  int64_t min = 0, max = 0;
  std::string_view list_shape = {};

  static constexpr bool always(const Spec&) { return true; }

  constexpr Field optional() const { return optional_if(&always); }
  constexpr Field optional_if(SpecTest<Spec> test) const { return with<&Field::optional_where>(test); }
  constexpr Field fallback(Value (*value)(const Spec&)) const { return with<&Field::fallback_value>(value); }
  constexpr Field when(SpecTest<Spec> test) const { return with<&Field::exists_where>(test); }
  constexpr Field written_when(SpecTest<Spec> test) const { return with<&Field::written_where>(test); }
  constexpr Field omit_default() const { return with<&Field::omitted_when_default>(true); }
  constexpr Field present_if(bool Spec::*flag) const { return with<&Field::presence_flag>(flag); }
  constexpr Field key(std::string_view text) const { return with<&Field::text_key>(text); }
  constexpr Field prefix(std::string_view text) const { return with<&Field::text_prefix>(text); }
  constexpr Field spelled(std::string_view if_false, std::string_view if_true) const
    requires std::is_same_v<Value, bool>
  {
    return with<&Field::bool_spellings>(std::array{if_false, if_true});
  }
  constexpr Field text(SpecText<Spec> piece) const { return with<&Field::text_piece>(piece); }
  template <class... Values>
    requires(sizeof...(Values) <= kMaxValues && (std::is_same_v<Values, Element> && ...))
  constexpr Field only(Values... values) const {
    return with<&Field::allowed>(std::array<Element, kMaxValues>{values...})
        .template with<&Field::allowed_count>(sizeof...(Values));
  }
  constexpr Field range(int64_t low, int64_t high) const {
    return with<&Field::min>(low).template with<&Field::max>(high);
  }
  constexpr Field shape(std::string_view text) const { return with<&Field::list_shape>(text); }

  // A copy with one member changed.
  template <auto Member, class Changed>
  constexpr Field with(Changed value) const {
    Field f = *this;
    f.*Member = value;
    return f;
  }
};

template <class Spec, class Value, class... More>
  requires(std::is_same_v<More, Value Spec::*> && ...)
constexpr Field<Spec, Value, 1 + sizeof...(More)> field(std::string_view name, Value Spec::*member, More... more) {
  return {.name = name, .members = {member, more...}};
}

struct FixedText {
  std::string_view text;
};
constexpr FixedText fixed_text(std::string_view text) { return {text}; }

template <class... Fields>
struct Configuration {
  std::tuple<Fields...> fields;
};
template <class... Fields>
constexpr Configuration<Fields...> configuration(Fields... fields) {
  return {std::tuple{fields...}};
}

// "128x256x64": a tile's sides as the canonical text writes them (for .text functions).
inline std::string sides_text(std::initializer_list<int64_t> sides) {
  std::string text;
  for (int64_t side : sides) {
    if (!text.empty()) text += 'x';
    text += std::to_string(side);
  }
  return text;
}

}  // namespace kjit::codegen
