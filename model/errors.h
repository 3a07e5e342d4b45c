// Error kinds of the cost-model library (see shared STYLE: "Errors").
//
//  - InputError: the user's bad input (CLI value, TOML card, JSON, config.json).
//    The message names the file, the key, the value and what would be valid.
//  - STEPCAST_ASSERT: a broken invariant, i.e. our own bug. Throws InternalError
//    naming the expression, file and line (as c10's internal asserts do).
// Only main() catches these and ends the process; the library never does.
#pragma once

#include <stdexcept>
#include <string>

namespace stepcast {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line) {
  throw InternalError(std::string("stepcast internal error: assertion '") + expr + "' failed at " + file + ":" +
                      std::to_string(line));
}

}  // namespace stepcast

#define STEPCAST_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::stepcast::assert_fail(#cond, __FILE__, __LINE__))
