// The collectives the ZeRO engine needs, over flat buffers. Two
// implementations: NCCL on the GPU (enqueued on the runtime's communication
// stream) and c10d's ProcessGroupGloo on the CPU (synchronous), where
// reduce-scatter and the flat all-gather are expressed through what Gloo has
// (all-reduce then keep the local shard; list all-gather into views).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "backend/runtime/runtime.h"


namespace stepcast::backend {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string name() const = 0;
  // Sum over ranks, in place.
  virtual void all_reduce_sum(torch::Tensor& t) = 0;
  // `full` has world x shard elements; shard r of the sum lands in `shard` on rank r.
  // `full` may be overwritten.
  virtual void reduce_scatter_sum(torch::Tensor& full, torch::Tensor& shard) = 0;
  // Rank r's `shard` lands at [r x n, (r+1) x n) of `full` on every rank.
  virtual void all_gather(const torch::Tensor& shard, torch::Tensor& full) = 0;
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  virtual void barrier() = 0;
};

struct Rendezvous {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int timeout_s = 300;
  int local_world = 1;  // ranks on this host
};

// torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), as `launch_local_ranks` sets it; a world of one where it is absent.
Rendezvous rendezvous_from_env(int timeout_s);

// The store all ranks meet through (rank 0 serves it).
c10::intrusive_ptr<c10d::Store> make_store(const Rendezvous& rv);

std::unique_ptr<Collectives> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, const Rendezvous& rv);
std::unique_ptr<Collectives> make_nccl(const c10::intrusive_ptr<c10d::Store>& store, const Rendezvous& rv,
                                       Runtime& runtime);
// A world of one: every collective is the identity.
std::unique_ptr<Collectives> make_single();

// The collectives of a world: one rank alone, or the ranks of `rv` meeting
// through a store, over NCCL on a CUDA runtime and Gloo on the CPU.
struct Connection {
  c10::intrusive_ptr<c10d::Store> store;  // null for a world of one
  std::unique_ptr<Collectives> comm;
};
Connection connect(const Rendezvous& rv, Runtime& runtime);

}  // namespace stepcast::backend
