// The one error vocabulary of kjit's internals (runtime, codegen, cache):
// functions that can fail for a reason the caller should read return
// Expected<T>; the Error carries the C ABI status code and a message that names
// the argument, path or errno. Nothing internal throws across a room boundary.
//
// Expected is [[nodiscard]]: a dropped error is a compile warning (an error
// under -Werror). Propagation is one expression, KJIT_TRY:
//     auto plan = KJIT_TRY(plan_dequant(desc));   // the value, or return the error
//     KJIT_TRY(store.publish(key, meta, cubin));  // Expected<void> likewise
#pragma once

#include <expected>
#include <string>
#include <utility>

#include "kjit/status.h"

namespace kjit {

struct Error {
  kjit_status code = KJIT_ERROR_INTERNAL;
  std::string message;
};

template <class T>
class [[nodiscard]] Expected : public std::expected<T, Error> {
 public:
  using std::expected<T, Error>::expected;
};

// `return fail(KJIT_ERROR_INVALID_ARGUMENT, "...")` from any Expected<T> function.
inline std::unexpected<Error> fail(kjit_status code, std::string message) {
  return std::unexpected<Error>(Error{code, std::move(message)});
}

}  // namespace kjit

// Evaluates an Expected (or any std::expected): its value (nothing for a void
// one), or returns its error from the enclosing function, whose return type
// takes that error. A GNU statement expression, as in GCC and Clang;
// __extension__ keeps -Wpedantic quiet.
#define KJIT_TRY(...)                                                                     \
  __extension__({                                                                         \
    auto&& kjit_try_result_ = (__VA_ARGS__);                                               \
    if (!kjit_try_result_) return ::std::unexpected(std::move(kjit_try_result_.error()));     \
    *std::move(kjit_try_result_);                                                         \
  })
