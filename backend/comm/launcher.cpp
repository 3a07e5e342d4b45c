#include "backend/comm/launcher.h"

#include "common/errors.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

extern char** environ;

namespace stepcast::backend {

namespace {

volatile sig_atomic_t g_launcher_signal = 0;

void record_launcher_signal(int sig) { g_launcher_signal = sig; }

}  // namespace

void die_with_launcher(int launcher_pid) {
  if (launcher_pid <= 0) return;
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The launcher may have died before the line above: then this rank's parent is no longer it.
  if (::getppid() != static_cast<pid_t>(launcher_pid)) std::_Exit(128 + SIGTERM);
}

int free_port() {
  // A port below Linux's ephemeral range (32768-60999): the kernel never hands it to an
  // outgoing connection (NCCL and Gloo open many), so a port found free stays free until
  // rank 0 listens on it; bind(0) would return an ephemeral one that another socket of
  // this host may take in between (seen as EADDRINUSE at the rendezvous).
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^ static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12000);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) break;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (ok) return port;
  }
  // Fallback: whatever the kernel picks.
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

void check_emulated_nodes(int nproc, int emulated_nodes) {
  if (emulated_nodes < 1 || nproc % emulated_nodes != 0)
    throw InputError("--emulate-nodes " + std::to_string(emulated_nodes) + " must divide --nproc " +
                     std::to_string(nproc) + " (ranks per emulated node)");
}

RankEnvironment rank_environment(int rank, int nproc, int emulated_nodes, const std::string& visible_devices) {
  const int nodes = std::max(1, emulated_nodes);
  const int per_node = nproc / nodes;
  const int node = rank / per_node;
  RankEnvironment out;
  out.node = node;
  auto& env = out.variables;
  env = {{"RANK", std::to_string(rank)},
         {"LOCAL_RANK", std::to_string(rank % per_node)},
         {"WORLD_SIZE", std::to_string(nproc)},
         {"LOCAL_WORLD_SIZE", std::to_string(per_node)}};
  if (nodes == 1) return out;
  // The node's GPUs: its slice of the launcher's visible devices, or of 0..nproc-1.
  std::vector<std::string> devices;
  if (visible_devices.empty()) {
    for (int d = 0; d < nproc; ++d) devices.push_back(std::to_string(d));
  } else {
    size_t begin = 0;
    while (begin <= visible_devices.size()) {
      const size_t end = std::min(visible_devices.find(',', begin), visible_devices.size());
      devices.push_back(visible_devices.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  std::string slice;
  for (int d = node * per_node; d < (node + 1) * per_node && d < static_cast<int>(devices.size()); ++d)
    slice += (slice.empty() ? "" : ",") + devices[d];
  env.emplace_back("CUDA_VISIBLE_DEVICES", slice);
  // NCCL's host hash, which decides whether two ranks may use peer-to-peer or shared-memory
  // transports, reads NCCL_HOSTID in place of the host name when it is set (NCCL, misc/utils.cc,
  // getHostHash): a node of its own for each emulated node.
  env.emplace_back("NCCL_HOSTID", "stepcast-emulated-node-" + std::to_string(node));
  if (per_node == 1) {
    env.emplace_back("NCCL_P2P_DISABLE", "1");
    env.emplace_back("NCCL_SHM_DISABLE", "1");
  }
  return out;
}

int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_s, int emulated_nodes) {
  const int port = free_port();
  // SIGINT, SIGTERM and SIGHUP to the launcher reach every rank (forwarded below); a
  // SIGKILL, which cannot be caught, reaches them through PR_SET_PDEATHSIG (die_with_launcher).
  struct sigaction sa {};
  sa.sa_handler = record_launcher_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  std::vector<pid_t> pids;
  // Each rank learns its launcher's pid as a flag, to die with it (die_with_launcher).
  std::vector<std::string> rank_args = args;
  rank_args.insert(rank_args.end(), {"--launcher-pid", std::to_string(::getpid())});
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  for (int r = 0; r < nproc; ++r) {
    const RankEnvironment rank_env = rank_environment(r, nproc, emulated_nodes, visible ? visible : "");
    std::vector<std::string> this_args = rank_args;
    if (emulated_nodes > 1) this_args.insert(this_args.end(), {"--emulated-node", std::to_string(rank_env.node)});
    std::vector<char*> argv;
    for (const auto& a : this_args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // This process's environment plus torchrun's variables for rank r.
    // Ours first: getenv returns the first match, so they win over inherited ones.
    std::vector<std::string> env_text;
    for (const auto& [key, value] : rank_env.variables) env_text.push_back(key + "=" + value);
    env_text.push_back("MASTER_ADDR=127.0.0.1");
    env_text.push_back("MASTER_PORT=" + std::to_string(port));
    // c10's logging (glog) would print its own copy of errors the ranks report in one line.
    if (std::getenv("GLOG_minloglevel") == nullptr) env_text.emplace_back("GLOG_minloglevel=3");
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
  std::chrono::steady_clock::time_point kill_at{}, peers_deadline{};
  bool terminating = false, awaiting_peers = false;
  int forwarded = 0;
  const auto terminate_all = [&](int sig) {
    stop_all(sig);
    terminating = true;
    kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(grace_s);
  };
  while (alive > 0) {
    if (g_launcher_signal != 0 && forwarded == 0) {
      forwarded = g_launcher_signal;
      std::fprintf(stderr, "train: %s: stopping the %zu ranks\n", strsignal(forwarded), alive);
      terminate_all(forwarded);
    }
    int status = 0;
    pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done == 0) {
      const auto now = std::chrono::steady_clock::now();
      if (terminating && now > kill_at) stop_all(SIGKILL);
      if (awaiting_peers && !terminating && now > peers_deadline) {
        std::fprintf(stderr, "train: a rank exited with status %d; stopping the other %zu\n", first_failure, alive);
        terminate_all(SIGTERM);
      }
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
      // Ranks that learned of the failure through a collective exit on their own within a
      // moment; the others (waiting in a collective for the dead one) are stopped.
      if (alive > 0 && !terminating) {
        awaiting_peers = true;
        peers_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      }
    }
  }
  if (forwarded != 0) return 128 + forwarded;
  return first_failure;
}

}  // namespace stepcast::backend
