// parallel_for (common/parallel.h): every index once, the sequential result, exceptions carried.
#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "common/parallel.h"

using namespace stepcast;

TEST_CASE("parallel_for runs every index exactly once, on any number of threads") {
  for (unsigned threads : {0u, 1u, 2u, 3u, 8u, 64u}) {
    CAPTURE(threads);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      CAPTURE(n);
      std::vector<std::atomic<int>> seen(n);
      std::vector<double> out(n, 0.0);
      parallel_for(n, [&](size_t i) {
        ++seen[i];
        out[i] = static_cast<double>(i) * static_cast<double>(i);  // each index writes its own slot
      }, threads);
      for (size_t i = 0; i < n; ++i) {
        CHECK(seen[i] == 1);
        CHECK(out[i] == static_cast<double>(i) * static_cast<double>(i));
      }
    }
  }
}

TEST_CASE("parallel_for rethrows a body's exception after its threads stop") {
  std::atomic<int> ran{0};
  CHECK_THROWS_WITH_AS(parallel_for(
                           100,
                           [&](size_t i) {
                             ++ran;
                             if (i == 5) throw std::runtime_error("index 5 failed");
                           },
                           4),
                       "index 5 failed", std::runtime_error);
  CHECK(ran >= 6);  // the indices up to the failing one were taken; the rest may be skipped
  CHECK(ran <= 100);
}
