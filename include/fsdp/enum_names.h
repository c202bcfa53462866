// fsdp/enum_names.h: an enum's values and the names a config file or a command line gives them,
// declared once per enum (a specialization of EnumNames beside the enum), from which reading a name,
// writing one, the "(expected a, b or c)" of an error and a flag's choices all follow.
//
//   template <> struct EnumNames<Color> {
//     static constexpr std::pair<Color, const char*> values[] = {{Color::Red, "red"}, ...};
//   };
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp {

template <class E>
struct EnumNames;

// Whether E has its names declared (config readers take such members as strings).
template <class E, class = void>
struct has_enum_names : std::false_type {};
template <class E>
struct has_enum_names<E, std::void_t<decltype(EnumNames<E>::values)>> : std::true_type {};

template <class E>
const char* enum_name(E value) {
  for (const auto& [v, name] : EnumNames<E>::values) {
    if (v == value) return name;
  }
  return "?";
}

// An optional value's name: "auto" when empty, a choice the program makes itself (train.attention).
inline constexpr const char* kAutomaticName = "auto";
template <class E>
const char* enum_name(const std::optional<E>& value) {
  return value ? enum_name(*value) : kAutomaticName;
}

template <class E>
std::vector<std::string> enum_names() {
  std::vector<std::string> names;
  for (const auto& entry : EnumNames<E>::values) names.emplace_back(entry.second);
  return names;
}

// "auto" then each name: the values an optional enum takes.
template <class E>
std::vector<std::string> enum_names_with_auto() {
  std::vector<std::string> names{kAutomaticName};
  for (std::string& name : enum_names<E>()) names.push_back(std::move(name));
  return names;
}

// "a, b or c" (for an error's "expected"), or with `separator` between every two ("a | b | c", for
// a help line).
inline std::string names_listed(const std::vector<std::string>& names, const char* separator = nullptr) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += separator ? separator : i + 1 == names.size() ? " or " : ", ";
    text += names[i];
  }
  return text;
}

template <class E>
std::string enum_names_listed(const char* separator = nullptr) {
  return names_listed(enum_names<E>(), separator);
}

// The value named `name`; std::invalid_argument "'NAME' (expected a, b or c)" for another name (a
// caller puts what was being read before it: "fsdp.strategy 'hsdp' (expected ...)").
template <class E>
E enum_from_name(const std::string& name) {
  for (const auto& [v, known] : EnumNames<E>::values) {
    if (name == known) return v;
  }
  throw std::invalid_argument("'" + name + "' (expected " + enum_names_listed<E>() + ")");
}

// The value named `name`, or empty for "auto"; std::invalid_argument "'NAME' (expected auto, a, b or c)"
// for another name.
template <class E>
std::optional<E> optional_enum_from_name(const std::string& name) {
  if (name == kAutomaticName) return std::nullopt;
  for (const auto& [v, known] : EnumNames<E>::values) {
    if (name == known) return v;
  }
  throw std::invalid_argument("'" + name + "' (expected " + names_listed(enum_names_with_auto<E>()) + ")");
}

}  // namespace fsdp
