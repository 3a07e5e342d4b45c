// `train --nproc N` on one host: starts N copies of this program, one per
// rank, with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT). When one rank fails, the others are stopped
// (SIGTERM, then SIGKILL after a grace period) instead of hanging.
#pragma once

#include <string>
#include <vector>

namespace stepcast::backend {

// Signals to the launcher (SIGINT, SIGTERM, SIGHUP) are forwarded to the ranks, and
// the launcher then exits 128 + the signal; ranks die with their launcher even when it is
// killed outright (die_with_launcher). Returns the exit code of the first rank that
// failed, or 0.
int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_s = 10);

// In a rank started by launch_local_ranks (which passes `--launcher-pid PID` to each rank):
// the kernel sends this process SIGTERM when the launcher dies (PR_SET_PDEATHSIG); exits at
// once when it already has. With 0 (not started by it) nothing.
void die_with_launcher(int launcher_pid);

// A TCP port that was free a moment ago, on 127.0.0.1.
int free_port();

}  // namespace stepcast::backend
