// Reading a spec's JSON object field by field (SpecForms<Spec>::from_json, in
// spec_forms.hpp, reads each field of the family's table): each read checks
// the field's type and names it in the error; finish() refuses any field no
// read asked for, so a misspelt field ("selected_expert") is an error, never a
// default.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kjit/base/expected.hpp"
#include "kjit/codegen/types.hpp"

namespace kjit::codegen {

// How many values an enum has (names are name(Enum(i)) for i below it).
template <class Enum>
inline constexpr int kEnumCount = 0;
template <>
inline constexpr int kEnumCount<DType> = 5;
template <>
inline constexpr int kEnumCount<ScaleGranularity> = 3;
template <>
inline constexpr int kEnumCount<ScaleConvention> = 2;
template <>
inline constexpr int kEnumCount<WeightLayout> = 2;
template <>
inline constexpr int kEnumCount<OffsetsConvention> = 2;
template <>
inline constexpr int kEnumCount<Activation> = 3;
template <>
inline constexpr int kEnumCount<GateUpLayout> = 3;
template <>
inline constexpr int kEnumCount<Addend> = 3;

class SpecReader {
 public:
  // `object` must be a JSON object that outlives the reader; "op" counts as read.
  explicit SpecReader(const nlohmann::json& object) : object_(object) { read_.insert("op"); }

  bool has(std::string_view field) const { return object_.contains(field); }

  // Each reads a field that is there (has()), checking its type.
  template <class Enum>
  Expected<Enum> enumeration(std::string_view field) {
    static_assert(kEnumCount<Enum> > 0, "kEnumCount must name this enum's size");
    const auto& value = find(field);
    if (!value.is_string())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be a string", field));
    const auto text = value.template get<std::string>();
    std::string known;
    for (int i = 0; i < kEnumCount<Enum>; ++i) {
      const auto candidate = name(static_cast<Enum>(i));
      if (text == candidate) return static_cast<Enum>(i);
      known += fmt::format("{}{}", i ? ", " : "", candidate);
    }
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("spec field '{}' has unknown value '{}' (expected one of: {})", field, text, known));
  }

  Expected<int64_t> integer(std::string_view field) {
    const auto& value = find(field);
    if (!value.is_number_integer())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be an integer", field));
    if (value.is_number_unsigned() && value.template get<uint64_t>() > uint64_t{INT64_MAX})
      return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' is out of range", field));
    return value.template get<int64_t>();
  }

  Expected<bool> boolean(std::string_view field) {
    const auto& value = find(field);
    if (!value.is_boolean())
      return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' must be true or false", field));
    return value.template get<bool>();
  }

  // An array of exactly `count` integers that fit in int (a block, a tile); `shape` names it in errors.
  Expected<std::vector<int>> small_integers(std::string_view field, size_t count, std::string_view shape) {
    const auto& value = find(field);
    auto bad = [&] {
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("spec field '{}' must be {}, {} integers", field, shape, count));
    };
    if (!value.is_array() || value.size() != count) return bad();
    std::vector<int> out;
    for (const auto& v : value) {
      if (!v.is_number_integer() || v.template get<int64_t>() < INT32_MIN || v.template get<int64_t>() > INT32_MAX)
        return bad();
      out.push_back(static_cast<int>(v.template get<int64_t>()));
    }
    return out;
  }

  // Every field of the object was read (asked for), or an error naming the first that was not.
  Expected<void> finish(std::string_view op) const {
    for (const auto& [field, value] : object_.items())
      if (!read_.contains(field))
        return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' is not a field of {}", field, op));
    return {};
  }

 private:
  const nlohmann::json& find(std::string_view field) {
    read_.emplace(field);
    return object_.at(std::string(field));
  }

  const nlohmann::json& object_;
  std::set<std::string, std::less<>> read_;
};

}  // namespace kjit::codegen
