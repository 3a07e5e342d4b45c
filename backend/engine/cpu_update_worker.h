// The CPU side of the offload pipeline: one thread that runs the CPU
// optimizer on each unit's gradient shard as it reaches the host, in the order
// the shards arrive (or, for serial offload, once the whole backward has
// ended), and records per unit the last step whose update is done. The engine
// uploads a unit's parameters once its update is done (engine.h).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/optim/adamw_args.h"

namespace stepcast::backend {

class CpuUpdateWorker {
 public:
  // update(unit, args) runs the CPU optimizer on that unit's shard with its step's arguments.
  using UpdateFn = std::function<void(size_t unit, const kernels::AdamWArgs& args)>;

  CpuUpdateWorker(size_t num_units, UpdateFn update);
  ~CpuUpdateWorker();
  CpuUpdateWorker(const CpuUpdateWorker&) = delete;
  CpuUpdateWorker& operator=(const CpuUpdateWorker&) = delete;

  // Queues unit's update of `step`; `wait` blocks until its gradient shard is on the host.
  // Held jobs wait for release_held() (serial offload: DeepSpeed's order).
  void enqueue(size_t unit, int64_t step, const kernels::AdamWArgs& args, std::function<void()> wait, bool hold);
  void release_held();
  // The queued jobs in forward order (the embedding, whose gradient comes last, first).
  void sort_queue_by_unit();

  // Blocks until unit's update of `step` (or a later one) is done; rethrows the worker's error.
  void wait_done(size_t unit, int64_t step);
  bool done(size_t unit, int64_t step);

  // CPU optimizer seconds of a step (kept for two steps: the next may begin before this one ends).
  void reset_seconds(int64_t step);
  double seconds(int64_t step);

 private:
  struct Job {
    size_t unit = 0;
    int64_t step = 0;
    kernels::AdamWArgs args;
    std::function<void()> wait;
  };
  void loop();

  UpdateFn update_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_, held_;
  std::vector<int64_t> done_step_;
  double seconds_[2] = {0, 0};  // by step parity
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace stepcast::backend
