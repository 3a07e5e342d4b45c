// Starting the other Stepcast programs (train, microbench, peer harnesses)
// from planner validate and calibrate measure: an argv vector handed to
// posix_spawn, never a shell, so that no flag value is ever interpreted.
#pragma once

#include <string>
#include <vector>

namespace stepcast {

// A program built beside the running one (build/<tool>/<tool> -> build/<folder>/<name>),
// or `flag` when given. Throws InputError naming the path when there is no such file.
std::string sibling_binary(const std::string& flag, const std::string& folder, const std::string& name);

struct SpawnResult {
  int exit_status = 0;  // the program's exit status, or 128 + the signal that ended it
  bool signalled = false;
};

// Runs argv[0] with argv (PATH is not searched) and waits for it. stdout_path /
// stderr_path, when not empty, receive the program's output (appended when
// `append`, else truncated). Throws InputError when the program cannot start, naming
// the program and, when given, the log its output would have gone to.
SpawnResult spawn_and_wait(const std::vector<std::string>& argv, const std::string& stdout_path = "",
                           const std::string& stderr_path = "", bool append = false);

// While alive, SIGINT and SIGTERM do not end this process: they are recorded (and
// forwarded to the child spawn_and_wait is running), so that a loop over runs stops
// between them with its outputs consistent: after each child, a caller checks
// interrupt_signal() and throws InterruptedError. The previous handlers come back
// at destruction.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
};

// The signal that arrived under an InterruptGuard, or 0.
int interrupt_signal();

// A folder made for this process alone (mkdtemp under the system's temporary
// folder) and removed with everything in it when the object goes.
class ScratchFolder {
 public:
  explicit ScratchFolder(const std::string& prefix);
  ~ScratchFolder();
  ScratchFolder(const ScratchFolder&) = delete;
  ScratchFolder& operator=(const ScratchFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace stepcast
