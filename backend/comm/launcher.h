// `train --nproc N` on one host: starts N copies of this program, one per
// rank, with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT). When one rank fails, the others are stopped
// (SIGTERM, then SIGKILL after a grace period) instead of hanging.
#pragma once

#include <string>
#include <vector>

namespace stepcast::backend {

// Returns the exit code of the first rank that failed, or 0.
int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_s = 10);

// A TCP port that was free a moment ago, on 127.0.0.1.
int free_port();

}  // namespace stepcast::backend
