// The cores the CPU optimizer runs on. Ranks on one host split its physical
// cores into contiguous shares (in package, core order: on a two-socket host
// two ranks get one socket each), each rank's process is bound to its share,
// and the optimizer's threads are persistent, one bound to each core of it
// (the first logical CPU of the core: one thread per physical core).
// `train --cpu-bind off` leaves every thread unbound (for comparison).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace stepcast::backend {

struct LogicalCpu {
  int id = 0;       // the kernel's CPU number
  int package = 0;  // physical_package_id
  int core = 0;     // core_id within the package
};

// The logical CPUs this process may run on (sched_getaffinity), with their
// topology from /sys/devices/system/cpu (a CPU without it is its own core).
std::vector<LogicalCpu> allowed_cpus();

// Rank `local_rank` of `local_world` ranks on one host: the logical CPUs of
// its share of the physical cores, cores [P r / L, P (r + 1) / L) of the P
// in (package, core) order (a rank left without a core gets core r mod P).
// The first logical CPU of each core comes first, in core order, then the
// cores' other logical CPUs (SMT siblings).
std::vector<int> rank_cpus(const std::vector<LogicalCpu>& cpus, int local_rank, int local_world);

// Physical cores in a rank_cpus() list.
int physical_cores(const std::vector<LogicalCpu>& cpus, const std::vector<int>& ids);

// Binds the process (its threads from now on; the calling thread now) to
// `ids` and makes them the optimizer threads' cores: thread t runs on
// ids[t mod size]. Without this call the threads use rank_cpus(allowed, 0, 1),
// bound. With bind = false the threads use those cores' count, unbound.
void bind_cpus(const std::vector<int>& ids, bool bind = true);

// Whether the optimizer's threads are bound to their cores.
bool cpus_bound();

// "0-14,16": a CPU list as the kernel writes it.
std::string cpu_list_string(std::vector<int> ids);

// Runs fn(t) for t in [0, threads) on the pool's persistent threads (thread t
// bound to core t mod size) and returns when all have finished; the first
// exception thrown is rethrown here. One run at a time (callers queue).
void run_on_cores(int threads, const std::function<void(int)>& fn);

}  // namespace stepcast::backend
