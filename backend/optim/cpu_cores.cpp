#include "backend/optim/cpu_cores.h"

#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

#include "common/errors.h"

namespace stepcast::backend {

namespace {

int read_int(const std::string& path, int fallback) {
  std::ifstream f(path);
  int v;
  return f >> v ? v : fallback;
}

bool pin_thread(pid_t tid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(tid, sizeof set, &set) == 0;
}

// Cores in (package, core) order, each with its logical CPUs ascending.
std::vector<std::vector<int>> cores_of(const std::vector<LogicalCpu>& cpus) {
  std::map<std::pair<int, int>, std::vector<int>> by_core;
  for (const LogicalCpu& c : cpus) by_core[{c.package, c.core}].push_back(c.id);
  std::vector<std::vector<int>> cores;
  for (auto& [key, ids] : by_core) {
    std::sort(ids.begin(), ids.end());
    cores.push_back(ids);
  }
  return cores;
}

// The persistent threads of run_on_cores.
class Pool {
 public:
  ~Pool() { stop_all(); }

  void set_cpus(std::vector<int> ids, bool bind) {
    std::lock_guard<std::mutex> run(run_mu_);
    stop_all();  // threads re-pin when they are started again
    cpus_ = std::move(ids);
    bind_ = bind;
  }

  bool bound() const { return bind_; }

  void run(int threads, const std::function<void(int)>& fn) {
    std::lock_guard<std::mutex> run(run_mu_);
    if (cpus_.empty()) {
      const auto all = allowed_cpus();
      cpus_ = rank_cpus(all, 0, 1);
    }
    while (static_cast<int>(threads_.size()) < threads) {
      const int t = static_cast<int>(threads_.size());
      threads_.emplace_back([this, t] { loop(t); });
    }
    std::unique_lock<std::mutex> lock(mu_);
    fn_ = &fn;
    active_ = threads;
    remaining_ = threads;
    error_ = nullptr;
    ++generation_;
    work_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop(int t) {
    if (bind_) pin_thread(0, cpus_[t % cpus_.size()]);
    int64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (t >= active_) continue;
        fn = fn_;
      }
      std::exception_ptr error;
      try {
        (*fn)(t);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (error && !error_) error_ = error;
      if (--remaining_ == 0) done_.notify_all();
    }
  }

  void stop_all() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& th : threads_) th.join();
    threads_.clear();
    stop_ = false;
  }

  std::mutex run_mu_;  // one run (or re-binding) at a time
  std::mutex mu_;
  std::condition_variable work_, done_;
  std::vector<std::thread> threads_;
  std::vector<int> cpus_;
  bool bind_ = true;
  const std::function<void(int)>* fn_ = nullptr;
  int active_ = 0, remaining_ = 0;
  int64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

std::vector<LogicalCpu> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<LogicalCpu> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 0; i < n; ++i) out.push_back({i, 0, i});
    return out;
  }
  for (int id = 0; id < CPU_SETSIZE; ++id) {
    if (!CPU_ISSET(id, &set)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(id) + "/topology/";
    const int package = read_int(dir + "physical_package_id", 0);
    const int core = read_int(dir + "core_id", -1);
    out.push_back({id, package, core >= 0 ? core : (1 << 20) + id});
  }
  return out;
}

std::vector<int> rank_cpus(const std::vector<LogicalCpu>& cpus, int local_rank, int local_world) {
  if (cpus.empty()) throw InternalError("rank_cpus: no CPUs");
  if (local_world < 1 || local_rank < 0 || local_rank >= local_world)
    throw InternalError("rank_cpus: rank " + std::to_string(local_rank) + " of " +
                                std::to_string(local_world));
  const auto cores = cores_of(cpus);
  const int64_t p = static_cast<int64_t>(cores.size());
  int64_t lo = p * local_rank / local_world, hi = p * (local_rank + 1) / local_world;
  if (lo == hi) {
    lo = local_rank % p;
    hi = lo + 1;
  }
  std::vector<int> ids;
  for (int64_t c = lo; c < hi; ++c) ids.push_back(cores[c].front());
  for (int64_t c = lo; c < hi; ++c) ids.insert(ids.end(), cores[c].begin() + 1, cores[c].end());
  return ids;
}

int physical_cores(const std::vector<LogicalCpu>& cpus, const std::vector<int>& ids) {
  std::map<std::pair<int, int>, int> seen;
  for (const LogicalCpu& c : cpus)
    if (std::find(ids.begin(), ids.end(), c.id) != ids.end()) seen[{c.package, c.core}] = 1;
  return static_cast<int>(seen.size());
}

void bind_cpus(const std::vector<int>& ids, bool bind) {
  if (ids.empty()) throw InternalError("bind_cpus: no CPUs");
  if (bind) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int id : ids) CPU_SET(id, &set);
    // Every thread the process has now (LibTorch's, the runtime's); later ones inherit.
    std::error_code ec;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec)) {
      const pid_t tid = static_cast<pid_t>(std::atoi(task.path().filename().c_str()));
      if (tid > 0) sched_setaffinity(tid, sizeof set, &set);
    }
    sched_setaffinity(0, sizeof set, &set);
  }
  pool().set_cpus(ids, bind);
}

bool cpus_bound() { return pool().bound(); }

std::string cpu_list_string(std::vector<int> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::string s;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(ids[i]);
    if (j > i) s += '-' + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

void run_on_cores(int threads, const std::function<void(int)>& fn) {
  if (threads < 1) throw InternalError("run_on_cores: " + std::to_string(threads) + " threads");
  pool().run(threads, fn);
}

}  // namespace stepcast::backend
