// Timing helpers shared by the benchmarks: medians of repeated runs after one
// warm-up run (first touch, lazy initialisation).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace stepcast::bench {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of each of `repeats` runs of fn() after a warm-up; `sync` runs after
// each call and inside the timing (e.g. a device synchronisation).
template <class Fn, class Sync>
std::vector<double> time_runs(int repeats, Fn&& fn, Sync&& sync) {
  fn();
  sync();
  std::vector<double> out;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return out;
}

template <class Fn>
std::vector<double> time_runs(int repeats, Fn&& fn) {
  return time_runs(repeats, fn, [] {});
}

}  // namespace stepcast::bench
