#include "backend/engine/cpu_update_worker.h"

#include <algorithm>
#include <chrono>

namespace stepcast::backend {

CpuUpdateWorker::CpuUpdateWorker(size_t num_units, UpdateFn update)
    : update_(std::move(update)), done_step_(num_units, 0), thread_([this] { loop(); }) {}

CpuUpdateWorker::~CpuUpdateWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CpuUpdateWorker::enqueue(size_t unit, int64_t step, const kernels::AdamWArgs& args, std::function<void()> wait,
                              bool hold) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    (hold ? held_ : queue_).push_back(Job{unit, step, args, std::move(wait)});
  }
  cv_.notify_all();
}

void CpuUpdateWorker::release_held() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!held_.empty()) {
      queue_.push_back(std::move(held_.front()));
      held_.pop_front();
    }
  }
  cv_.notify_all();
}

void CpuUpdateWorker::sort_queue_by_unit() {
  std::lock_guard<std::mutex> lock(mu_);
  std::stable_sort(queue_.begin(), queue_.end(), [](const Job& a, const Job& b) { return a.unit < b.unit; });
}

void CpuUpdateWorker::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    double seconds = 0;
    try {
      job.wait();  // the unit's gradient shard has reached the host
      const auto t0 = std::chrono::steady_clock::now();
      update_(job.unit, job.args);  // its own step's arguments
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      seconds_[job.step & 1] += seconds;
      done_step_[job.unit] = job.step;
    }
    cv_.notify_all();
  }
}

void CpuUpdateWorker::wait_done(size_t unit, int64_t step) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return error_ || done_step_[unit] >= step; });
  if (error_) std::rethrow_exception(error_);
}

bool CpuUpdateWorker::done(size_t unit, int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  return done_step_[unit] >= step;
}

void CpuUpdateWorker::reset_seconds(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  seconds_[step & 1] = 0;
}

double CpuUpdateWorker::seconds(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_[step & 1];
}

}  // namespace stepcast::backend
