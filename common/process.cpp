#include "common/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/errors.h"

extern char** environ;

namespace stepcast {

namespace {

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_child = 0;  // the pid spawn_and_wait waits for, or 0
struct sigaction g_old_int, g_old_term;
int g_guards = 0;

void record_signal(int sig) {
  g_signal = sig;
  const pid_t child = g_child;
  if (child > 0) ::kill(child, sig);  // async-signal-safe
}

}  // namespace

InterruptGuard::InterruptGuard() {
  if (g_guards++ > 0) return;
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a blocking wait returns EINTR and looks again
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptGuard::~InterruptGuard() {
  if (--g_guards > 0) return;
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

int interrupt_signal() { return g_signal; }

ScratchFolder::ScratchFolder(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr)
    throw IoError(tmpl + ": cannot make a scratch folder: " + std::strerror(errno));
  path_ = name.data();
}

ScratchFolder::~ScratchFolder() {
  remove_tree(path_);
}

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
  if (rc != 0)
    throw InputError(argv[0] + ": cannot start: " + std::strerror(rc) +
                     (stderr_path.empty() ? std::string() : " (its output would have gone to " + stderr_path + ")"));
  g_child = pid;
  // A signal that came between the guard and the spawn reaches the child now.
  if (g_signal != 0) ::kill(pid, g_signal);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      g_child = 0;
      throw InternalError(std::string("waitpid: ") + std::strerror(errno));
    }
  }
  g_child = 0;
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
