// SpecForms<Spec>: the canonical text, the JSON written and read, the schema
// and the hash of a spec, each a walk over Family<Spec>::fields (the vocabulary
// is kjit/codegen/spec_fields.hpp's). A family's .cpp includes this header and
// instantiates them for its spec: `template struct SpecForms<DequantSpec>;`
// (its enums' kEnumCount must be visible there).
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kjit/codegen/family.hpp"
#include "kjit/codegen/spec_fields.hpp"
#include "spec_reader.hpp"

namespace kjit::codegen {
namespace spec_forms {

template <class Table, class Visit>
void for_each_entry(const Table& table, Visit&& visit) {
  std::apply([&](const auto&... entry) { (visit(entry), ...); }, table);
}

// Visits the entries in order until one returns an error, and returns that.
template <class Table, class Visit>
Expected<void> for_each_entry_until_error(const Table& table, Visit&& visit) {
  Expected<void> result;
  std::apply([&](const auto&... entry) { static_cast<void>(((result = visit(entry)).has_value() && ...)); }, table);
  return result;
}

template <class Value>
std::string value_text(const Value& v) {
  if constexpr (FieldValue<Value>::optional) return std::string(name(*v));
  else if constexpr (std::is_enum_v<Value>) return std::string(name(v));
  else if constexpr (std::is_same_v<Value, bool>) return v ? "true" : "false";
  else return std::to_string(v);
}

template <class Value>
nlohmann::json value_json(const Value& v) {
  if constexpr (FieldValue<Value>::optional) return name(*v);
  else if constexpr (std::is_enum_v<Value>) return name(v);
  else return v;
}

template <class Value>
uint64_t value_bits(const Value& v) {
  if constexpr (FieldValue<Value>::optional) return v ? uint64_t{1} + static_cast<uint64_t>(*v) : 0;
  else return static_cast<uint64_t>(v);
}

// Whether a field of `s` is in its JSON (and, unless it writes its own piece, its text).
template <class Spec, class Value, size_t N>
bool written(const Field<Spec, Value, N>& f, const Spec& s) {
  if (f.exists_where && !f.exists_where(s)) return false;
  if (f.written_where && !f.written_where(s)) return false;
  if (f.presence_flag && !(s.*f.presence_flag)) return false;
  if constexpr (FieldValue<Value>::optional)
    if (!(s.*f.members[0])) return false;
  if (f.omitted_when_default) {
    const Spec defaults{};
    for (auto member : f.members)
      if (s.*member != defaults.*member) return true;
    return false;
  }
  return true;
}

// Whether a field may be left out of the JSON of a spec whose earlier fields are `s`'s.
template <class Spec, class Value, size_t N>
bool may_be_absent(const Field<Spec, Value, N>& f, const Spec& s) {
  return (f.optional_where && f.optional_where(s)) || f.written_where || f.omitted_when_default || f.presence_flag ||
         FieldValue<Value>::optional;
}

// What a field holds, for messages and the schema.
template <class Spec, class Value, size_t N>
std::vector<std::string_view> allowed_names(const Field<Spec, Value, N>& f) {
  using Element = typename Field<Spec, Value, N>::Element;
  std::vector<std::string_view> names;
  if (f.allowed_count > 0)
    for (size_t i = 0; i < f.allowed_count; ++i) names.push_back(name(f.allowed[i]));
  else
    for (int i = 0; i < kEnumCount<Element>; ++i) names.push_back(name(static_cast<Element>(i)));
  return names;
}

template <class Spec, class Value, size_t N>
std::string expected_value(const Field<Spec, Value, N>& f) {
  using Element = typename Field<Spec, Value, N>::Element;
  if constexpr (N > 1) return fmt::format("{}, {} integers", f.list_shape, N);
  else if constexpr (std::is_enum_v<Element>) return fmt::format("one of: {}", fmt::join(allowed_names(f), ", "));
  else if constexpr (std::is_same_v<Element, bool>) return "true or false";
  else return "an integer";
}

template <class Spec>
void append_text(std::string& out, const FixedText& entry, const Spec&) {
  out += entry.text;
}

template <class Spec, class Value, size_t N>
void append_text(std::string& out, const Field<Spec, Value, N>& f, const Spec& s) {
  if (f.text_piece) {
    out += f.text_piece(s);
    return;
  }
  if (!written(f, s)) return;
  if (!f.text_prefix.empty()) out += f.text_prefix;
  else fmt::format_to(std::back_inserter(out), " {}=", f.text_key.empty() ? f.name : f.text_key);
  if constexpr (std::is_same_v<Value, bool>) {
    if (!f.bool_spellings[0].empty()) {
      out += f.bool_spellings[s.*f.members[0]];
      return;
    }
  }
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) out += 'x';
    out += value_text(s.*f.members[i]);
  }
}

template <class Spec, class... Fields>
void append_text(std::string& out, const Configuration<Fields...>& entry, const Spec& s) {
  if (!s.configured()) {
    out += " config=per-arch";
    return;
  }
  for_each_entry(entry.fields, [&](const auto& f) { append_text(out, f, s); });
}

template <class Spec>
void write_json(nlohmann::json&, const FixedText&, const Spec&) {}

template <class Spec, class Value, size_t N>
void write_json(nlohmann::json& j, const Field<Spec, Value, N>& f, const Spec& s) {
  if (!written(f, s)) return;
  auto& value = j[std::string(f.name)];
  if constexpr (N == 1) {
    value = value_json(s.*f.members[0]);
  } else {
    value = nlohmann::json::array();
    for (auto member : f.members) value.push_back(s.*member);
  }
}

template <class Spec, class... Fields>
void write_json(nlohmann::json& j, const Configuration<Fields...>& entry, const Spec& s) {
  if (s.configured()) for_each_entry(entry.fields, [&](const auto& f) { write_json(j, f, s); });
}

template <class Spec>
Expected<void> read_json(SpecReader&, const FixedText&, Spec&) {
  return {};
}

template <class Value>
Expected<Value> read_value(SpecReader& reader, std::string_view field) {
  if constexpr (FieldValue<Value>::optional) {
    return Value(KJIT_TRY(reader.enumeration<typename FieldValue<Value>::type>(field)));
  } else if constexpr (std::is_enum_v<Value>) {
    return reader.enumeration<Value>(field);
  } else if constexpr (std::is_same_v<Value, bool>) {
    return reader.boolean(field);
  } else {
    const int64_t value = KJIT_TRY(reader.integer(field));
    if (!std::in_range<Value>(value))
      return fail(KJIT_ERROR_INVALID_ARGUMENT, fmt::format("spec field '{}' is out of range, got {}", field, value));
    return static_cast<Value>(value);
  }
}

template <class Spec, class Value, size_t N>
Expected<void> read_json(SpecReader& reader, const Field<Spec, Value, N>& f, Spec& s) {
  const bool exists = !f.exists_where || f.exists_where(s);
  const bool present = exists && reader.has(f.name);
  if (f.presence_flag) s.*f.presence_flag = present;
  if (!present) {
    if (exists && !may_be_absent(f, s))
      return fail(KJIT_ERROR_INVALID_ARGUMENT,
                  fmt::format("spec field '{}' is missing, expected {}", f.name, expected_value(f)));
    if (f.fallback_value) s.*f.members[0] = f.fallback_value(s);
    return {};
  }
  if constexpr (N == 1) {
    s.*f.members[0] = KJIT_TRY(read_value<Value>(reader, f.name));
  } else {
    const auto values = KJIT_TRY(reader.small_integers(f.name, N, f.list_shape));
    for (size_t i = 0; i < N; ++i) s.*f.members[i] = values[i];
  }
  return {};
}

// 'a', 'b' and 'c'
template <class... Fields>
std::string quoted_names(const std::tuple<Fields...>& fields, size_t skip) {
  std::vector<std::string> names;
  for_each_entry(fields, [&](const auto& f) { names.push_back(fmt::format("'{}'", f.name)); });
  names.erase(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(skip));
  const auto last = names.back();
  names.pop_back();
  return names.empty() ? last : fmt::format("{} and {}", fmt::join(names, ", "), last);
}

template <class Spec, class... Fields>
Expected<void> read_json(SpecReader& reader, const Configuration<Fields...>& entry, Spec& s) {
  const auto& lead = std::get<0>(entry.fields);
  if (reader.has(lead.name))
    return for_each_entry_until_error(entry.fields, [&](const auto& f) { return read_json(reader, f, s); });
  // A problem (manifests) names none of a configuration's fields.
  bool stray = false;
  for_each_entry(entry.fields, [&](const auto& f) { stray = stray || reader.has(f.name); });
  if (stray)
    return fail(KJIT_ERROR_INVALID_ARGUMENT,
                fmt::format("{} spec fields {} need '{}' beside them", Family<Spec>::op, quoted_names(entry.fields, 1),
                            lead.name));
  return {};
}

inline void add_rules(std::vector<FieldRule>&, const FixedText&, bool) {}

template <class Spec, class Value, size_t N>
void add_rules(std::vector<FieldRule>& rules, const Field<Spec, Value, N>& f, bool configuration) {
  using Element = typename Field<Spec, Value, N>::Element;
  FieldRule rule{.name = f.name, .kind = FieldRule::Kind::integer, .min = f.min, .max = f.max};
  rule.required = !configuration && !f.optional_where && !f.exists_where && !f.written_where &&
                  !f.omitted_when_default && !f.presence_flag && !FieldValue<Value>::optional;
  if constexpr (N > 1) {
    rule.kind = FieldRule::Kind::integers;
    rule.required = false;
    rule.shape = f.list_shape;
    rule.count = N;
  } else if constexpr (std::is_enum_v<Element>) {
    rule.kind = FieldRule::Kind::text;
    rule.values = allowed_names(f);
  } else if constexpr (std::is_same_v<Element, bool>) {
    rule.kind = FieldRule::Kind::boolean;
  }
  rules.push_back(std::move(rule));
}

template <class... Fields>
void add_rules(std::vector<FieldRule>& rules, const Configuration<Fields...>& entry, bool) {
  for_each_entry(entry.fields, [&](const auto& f) { add_rules(rules, f, true); });
}

template <class Spec>
void mix(HashMixer&, const FixedText&, const Spec&) {}

template <class Spec, class Value, size_t N>
void mix(HashMixer& h, const Field<Spec, Value, N>& f, const Spec& s) {
  for (auto member : f.members) h.mix(value_bits(s.*member));
  if (f.presence_flag) h.mix(s.*f.presence_flag);
}

template <class Spec, class... Fields>
void mix(HashMixer& h, const Configuration<Fields...>& entry, const Spec& s) {
  for_each_entry(entry.fields, [&](const auto& f) { mix(h, f, s); });
}

}  // namespace spec_forms

template <class Spec>
std::string SpecForms<Spec>::canonical(const Spec& s) {
  std::string text(Family<Spec>::op);
  spec_forms::for_each_entry(Family<Spec>::fields, [&](const auto& entry) { spec_forms::append_text(text, entry, s); });
  return text;
}

template <class Spec>
nlohmann::json SpecForms<Spec>::to_json(const Spec& s) {
  nlohmann::json j = nlohmann::json::object();
  j["op"] = Family<Spec>::op;
  spec_forms::for_each_entry(Family<Spec>::fields, [&](const auto& entry) { spec_forms::write_json(j, entry, s); });
  return j;
}

template <class Spec>
Expected<Spec> SpecForms<Spec>::from_json(SpecReader& reader) {
  Spec s;
  KJIT_TRY(spec_forms::for_each_entry_until_error(
      Family<Spec>::fields, [&](const auto& entry) { return spec_forms::read_json(reader, entry, s); }));
  return s;
}

template <class Spec>
const std::vector<FieldRule>& SpecForms<Spec>::schema() {
  static const std::vector<FieldRule> rules = [] {
    std::vector<FieldRule> out;
    spec_forms::for_each_entry(Family<Spec>::fields,
                               [&](const auto& entry) { spec_forms::add_rules(out, entry, false); });
    return out;
  }();
  return rules;
}

template <class Spec>
void SpecForms<Spec>::hash(const Spec& s, HashMixer& h) {
  spec_forms::for_each_entry(Family<Spec>::fields, [&](const auto& entry) { spec_forms::mix(h, entry, s); });
}

}  // namespace kjit::codegen
