#include "backend/comm/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

extern char** environ;

namespace stepcast::backend {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_s) {
  const int port = free_port();
  std::vector<pid_t> pids;
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < nproc; ++r) {
    // This process's environment plus torchrun's variables for rank r.
    // Ours first: getenv returns the first match, so they win over inherited ones.
    std::vector<std::string> env_text;
    for (const auto& [key, value] :
         {std::pair<std::string, std::string>{"RANK", std::to_string(r)}, {"LOCAL_RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(nproc)}, {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}})
      env_text.push_back(key + "=" + value);
    for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_t pid = 0;
    const int err = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
    if (err != 0) {
      std::fprintf(stderr, "train: cannot start rank %d: %s\n", r, std::strerror(err));
      for (pid_t p : pids) ::kill(p, SIGTERM);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      return 127;
    }
    pids.push_back(pid);
  }
  int first_failure = 0;
  size_t alive = pids.size();
  auto stop_all = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(p, sig);
  };
  std::chrono::steady_clock::time_point kill_at{};
  bool terminating = false;
  while (alive > 0) {
    int status = 0;
    pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done == 0) {
      if (terminating && std::chrono::steady_clock::now() > kill_at) stop_all(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (done < 0) break;
    for (pid_t& p : pids)
      if (p == done) p = -1;
    --alive;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && first_failure == 0) {
      first_failure = code;
      if (alive > 0) {
        std::fprintf(stderr, "train: a rank exited with status %d; stopping the other %zu\n", code, alive);
        stop_all(SIGTERM);
        terminating = true;
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
      }
    }
  }
  return first_failure;
}

}  // namespace stepcast::backend
