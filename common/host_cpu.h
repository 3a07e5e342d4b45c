// The host's CPU time as the kernel counts it (/proc/stat, proc(5)): which share of the CPUs' time
// went to other guests (steal) or to work while a step ran. Lent machines are virtual; where a
// launch-bound step moves between machines by 20-45 % with the same build (docs/calibration.md,
// session 34), the records keep these to tell a busy host from a slow one.
#pragma once

#include <array>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace stepcast {

// The aggregate "cpu" line of /proc/stat: user nice system idle iowait irq softirq steal, in clock
// ticks since boot (guest time is inside user). Empty when the text has no such line.
struct CpuTicks {
  std::array<double, 8> t{};  // user, nice, system, idle, iowait, irq, softirq, steal
  double total() const {
    double s = 0;
    for (double v : t) s += v;
    return s;
  }
  double idle() const { return t[3] + t[4]; }
  double steal() const { return t[7]; }
};

inline std::optional<CpuTicks> parse_proc_stat(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu ", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    CpuTicks c;
    for (double& v : c.t)
      if (!(fields >> v)) return std::nullopt;
    return c;
  }
  return std::nullopt;
}

inline std::optional<CpuTicks> read_proc_stat() {
  std::ifstream in("/proc/stat");
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_proc_stat(text.str());
}

// Between two samples: the share of all CPUs' ticks stolen by the hypervisor, and the share busy
// (neither idle, iowait nor stolen), over the ticks that passed on all CPUs together. The kernel
// counts a tick (USER_HZ, 100 a second on Linux) to whatever ran when it fell, so a sample shorter
// than a few ticks says little: a step of a few milliseconds may see no tick, or only idle ones.
// Both shares are 0 when no tick passed.
struct CpuShare {
  double steal_frac = 0, busy_frac = 0;
  double ticks = 0;  // all CPUs' ticks between the samples
};
inline CpuShare cpu_share(const CpuTicks& before, const CpuTicks& after) {
  const double total = after.total() - before.total();
  if (!(total > 0)) return {};
  const double steal = after.steal() - before.steal();
  const double idle = after.idle() - before.idle();
  return {steal / total, (total - idle - steal) / total, total};
}

// The mean of /proc/cpuinfo's "cpu MHz" lines (the clock each CPU reports now), 0 when none.
inline double mean_cpu_mhz_of(const std::string& cpuinfo) {
  std::istringstream in(cpuinfo);
  std::string line;
  double sum = 0;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    try {
      sum += std::stod(line.substr(colon + 1));
      ++n;
    } catch (...) {
    }
  }
  return n ? sum / n : 0.0;
}

inline double mean_cpu_mhz() {
  std::ifstream in("/proc/cpuinfo");
  if (!in) return 0.0;
  std::ostringstream text;
  text << in.rdbuf();
  return mean_cpu_mhz_of(text.str());
}

}  // namespace stepcast
