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
// `append`, else truncated). Throws InputError when the program cannot start.
SpawnResult spawn_and_wait(const std::vector<std::string>& argv, const std::string& stdout_path = "",
                           const std::string& stderr_path = "", bool append = false);

}  // namespace stepcast
