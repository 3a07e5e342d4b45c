// Timing helpers shared by the benchmarks: medians of repeated runs after one
// warm-up run (first touch, lazy initialisation).
#pragma once

#include "common/stats.h"
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace stepcast::bench {

// Positional argument `index` as a positive integer, else `fallback` when absent; anything
// else ends the program with one line naming the argument and the value (exit 2).
inline long long positive_arg(int argc, char** argv, int index, const char* name, long long fallback) {
  if (index >= argc) return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(argv[index], &end, 10);
  if (end == argv[index] || *end != '\0' || v <= 0) {
    std::fprintf(stderr, "%s: argument %d (%s) \"%s\" is not a positive integer\n", argv[0], index, name,
                 argv[index]);
    std::exit(2);
  }
  return v;
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
