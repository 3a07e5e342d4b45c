#include "common/process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/errors.h"

extern char** environ;

namespace stepcast {

std::string sibling_binary(const std::string& flag, const std::string& folder, const std::string& name) {
  namespace fs = std::filesystem;
  const std::string path =
      flag.empty() ? (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / folder / name).string() : flag;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw InputError(path + ": no " + name + " binary (build the backend, or pass --" + name + " PATH)");
  return path;
}

SpawnResult spawn_and_wait(const std::vector<std::string>& argv, const std::string& stdout_path,
                           const std::string& stderr_path, bool append) {
  STEPCAST_ASSERT(!argv.empty());
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  const int flags = O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC);  // no O_CLOEXEC: these are the child's stdout and stderr
  if (!stdout_path.empty()) posix_spawn_file_actions_addopen(&actions, 1, stdout_path.c_str(), flags, 0644);
  if (!stderr_path.empty()) {
    if (stderr_path == stdout_path) posix_spawn_file_actions_adddup2(&actions, 1, 2);
    else posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), flags, 0644);
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw InputError(argv[0] + ": cannot start: " + std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw InternalError(std::string("waitpid: ") + std::strerror(errno));
  }
  SpawnResult r;
  if (WIFSIGNALED(status)) {
    r.signalled = true;
    r.exit_status = 128 + WTERMSIG(status);
  } else {
    r.exit_status = WEXITSTATUS(status);
  }
  return r;
}

}  // namespace stepcast
