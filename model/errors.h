// Error kinds of the cost-model library (see shared STYLE: "Errors").
//
//  - InputError: the user's bad input (CLI value, TOML card, JSON, config.json).
//    The message names the file, the key, the value and what would be valid.
//  - STEPCAST_ASSERT: a broken invariant, i.e. our own bug. Aborts with file
//    and line.
// Only main() catches InputError; a library never calls exit().
#pragma once

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace stepcast {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "stepcast internal error: assertion '%s' failed at %s:%d\n", expr, file,
               line);
  std::abort();
}

}  // namespace stepcast

#define STEPCAST_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::stepcast::assert_fail(#cond, __FILE__, __LINE__))
