// The error kinds every Stepcast program shares (shared STYLE: "Errors").
//
//  - InputError: the user's bad input (CLI value, TOML card, JSON, config.json,
//    a run record). The message names the file, the key, the value and what
//    would be valid. Exit status 2.
//  - OutOfMemoryError: the run does not fit on the device (exit status 3).
//  - NonFiniteLossError: training diverged (exit status 4).
//  - IoError: the system refused a read or write the input was fine for (disk
//    full, a file-size limit, permission, an I/O error); names the path and the
//    system's reason. Exit status 5.
//  - InterruptedError: the user stopped the program (SIGINT/SIGTERM) between
//    units of work; what is written stays consistent. Exit status 130.
//  - InternalError / STEPCAST_ASSERT: a broken invariant, i.e. our own bug; names
//    the expression, file and line (as c10's internal asserts do). Exit status 1,
//    as every other unexpected failure.
// Only run_main (common/run_main.h) catches these and ends the process; the
// libraries never do.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace stepcast {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

class OutOfMemoryError : public std::runtime_error {
 public:
  explicit OutOfMemoryError(const std::string& message) : std::runtime_error(message) {}
};

class NonFiniteLossError : public std::runtime_error {
 public:
  NonFiniteLossError(int64_t step, double loss)
      : std::runtime_error("loss is " + std::to_string(loss) + " at step " + std::to_string(step)), step_(step) {}
  int64_t step() const { return step_; }

 private:
  int64_t step_;
};

class IoError : public std::runtime_error {
 public:
  explicit IoError(const std::string& message) : std::runtime_error(message) {}
};

class InterruptedError : public std::runtime_error {
 public:
  explicit InterruptedError(const std::string& message) : std::runtime_error(message) {}
};

// Another rank of the same run failed and has said why on stderr: this rank
// exits with the same status and adds no line of its own.
class PeerFailure : public std::runtime_error {
 public:
  PeerFailure(int exit_status, const std::string& message) : std::runtime_error(message), exit_status_(exit_status) {}
  int exit_status() const { return exit_status_; }

 private:
  int exit_status_;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& message) : std::logic_error(message) {}
};

[[noreturn]] inline void assert_fail(const char* expr, const char* file, int line) {
  throw InternalError(std::string("stepcast internal error: assertion '") + expr + "' failed at " + file + ":" +
                      std::to_string(line));
}

// Exit statuses of every Stepcast program (README: "Exit codes").
enum ExitStatus : int {
  kExitOk = 0,
  kExitFailure = 1,      // an internal error or an unexpected failure (I/O, a library)
  kExitBadInput = 2,     // InputError, or a command line that does not parse
  kExitOutOfMemory = 3,  // OutOfMemoryError
  kExitNonFinite = 4,    // NonFiniteLossError
  kExitIo = 5,           // IoError: disk full, file-size limit, permission, I/O error
  kExitInterrupted = 130,  // InterruptedError (128 + SIGINT, as a shell reports Ctrl-C)
};

}  // namespace stepcast

// A broken invariant: our bug, never the user's input.
#define STEPCAST_ASSERT(cond) \
  ((cond) ? static_cast<void>(0) : ::stepcast::assert_fail(#cond, __FILE__, __LINE__))
