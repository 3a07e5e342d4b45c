// The threads parallel_for uses when its caller names none: a program's --threads flag sets it
// once at its start (0: the machine's hardware threads).
inline unsigned& default_parallel_threads() {
  static unsigned threads = 0;
  return threads;
}

// body(i) for every i in [0, n) on up to `threads` threads (0: default_parallel_threads()).
// Each index is run once; a body that writes only its own index's results gives the sequential
// outcome whatever the threads. The first exception a body throws is rethrown here, after every
// thread has stopped taking indices.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace stepcast {

inline void parallel_for(size_t n, const std::function<void(size_t)>& body, unsigned threads = 0) {
  if (threads == 0) threads = default_parallel_threads();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<size_t>(threads, n));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex first_mutex;
  const auto work = [&] {
    for (size_t i; !failed && (i = next++) < n;) {
      try {
        body(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(first_mutex);
        if (!first) first = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace stepcast
