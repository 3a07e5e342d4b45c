// `train --nproc N` on one host: starts N copies of this program, one per
// rank, with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT). When one rank fails, the others are stopped
// (SIGTERM, then SIGKILL after a grace period) instead of hanging.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace stepcast::backend {

// Signals to the launcher (SIGINT, SIGTERM, SIGHUP) are forwarded to the ranks, and
// the launcher then exits 128 + the signal; ranks die with their launcher even when it is
// killed outright (die_with_launcher). Returns the exit code of the first rank that
// failed, or 0.
//
// emulated_nodes > 1 (dividing nproc) starts them as that many nodes of nproc / emulated_nodes
// ranks each, all on this host, to measure the multi-node path on one machine: each rank gets
// its node's LOCAL_RANK and LOCAL_WORLD_SIZE, its node's slice of the GPUs (CUDA_VISIBLE_DEVICES),
// and a host identity of its node's own (NCCL_HOSTID), so that NCCL sees separate hosts and
// moves the bytes between nodes over its network transport instead of NVLink or shared memory
// (with one rank per node, NCCL_P2P_DISABLE and NCCL_SHM_DISABLE as well). Each rank also
// receives `--emulated-node N`, its node's index.
int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_s = 10, int emulated_nodes = 1);

// What launch_local_ranks gives rank `rank` of `nproc` in `emulated_nodes` nodes: its node's
// index (0 without emulation) and its environment beyond MASTER_ADDR and MASTER_PORT, as pairs of
// name and value; `visible_devices` is the launcher's CUDA_VISIBLE_DEVICES (empty: unset).
struct RankEnvironment {
  int node = 0;
  std::vector<std::pair<std::string, std::string>> variables;
};
RankEnvironment rank_environment(int rank, int nproc, int emulated_nodes, const std::string& visible_devices);

// `--emulate-nodes` must be at least 1 and divide `--nproc` (ranks per emulated node); throws
// InputError naming both flags otherwise. train and microbench check their flags with it.
void check_emulated_nodes(int nproc, int emulated_nodes);

// In a rank started by launch_local_ranks (which passes `--launcher-pid PID` to each rank):
// the kernel sends this process SIGTERM when the launcher dies (PR_SET_PDEATHSIG); exits at
// once when it already has. With 0 (not started by it) nothing.
void die_with_launcher(int launcher_pid);

// A TCP port that was free a moment ago, on 127.0.0.1.
int free_port();

}  // namespace stepcast::backend
