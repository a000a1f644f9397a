// why(result): the error message of a failed Expected, "" on success, for
// doctest failure messages.
#pragma once

#include <string>

namespace kjit::testing {

template <class Result>
std::string why(const Result& result) {
  return result ? std::string() : result.error().message;
}

}  // namespace kjit::testing
