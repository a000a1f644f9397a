// The one error vocabulary of kjit's internals (runtime, codegen, cache):
// functions that can fail for a reason the caller should read return
// Expected<T>; the Error carries the C ABI status code and a message that names
// the argument, path or errno. Nothing internal throws across a room boundary.
#pragma once

#include <expected>
#include <string>
#include <utility>

#include "kjit/kjit.h"

namespace kjit {

struct Error {
  kjit_status code = KJIT_ERROR_INTERNAL;
  std::string message;
};

template <class T>
using Expected = std::expected<T, Error>;

// `return fail(KJIT_ERROR_INVALID_ARGUMENT, "...")` from any Expected<T> function.
inline std::unexpected<Error> fail(kjit_status code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

}  // namespace kjit
