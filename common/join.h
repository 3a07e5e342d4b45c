// The "valid: a, b, c" lists of error messages: the elements of a range, each as `name` gives it,
// joined by ", ".
#pragma once

#include <string>

namespace stepcast {

template <class Range, class Name>
std::string join_names(const Range& range, Name name) {
  std::string out;
  for (const auto& element : range) {
    if (!out.empty()) out += ", ";
    out += std::string(name(element));
  }
  return out;
}

template <class Range>
std::string join_names(const Range& range) {
  return join_names(range, [](const auto& element) { return element; });
}

}  // namespace stepcast
