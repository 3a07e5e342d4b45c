// Host allocations above and below glibc's largest mmap threshold (32 MiB on 64-bit Linux):
// allocate, touch every page, free, repeated. Above the threshold each allocation is fresh
// mmap'd pages that fault on first touch; below it glibc's heap keeps the pages mapped from one
// allocation to the next. DeepSpeed ZeRO-3's staged cross-dtype copies allocate such a host
// temporary per tensor (docs/engines.md). Each size's rate is printed with its ratio to the
// smallest size's, measured in the same run.
//   g++ -O2 -std=c++20 -o /tmp/alloc_touch_cliff bench/alloc_touch_cliff.cpp && /tmp/alloc_touch_cliff
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main() {
  volatile long sink = 0;
  double reference_bytes_per_s = 0;  // the first (smallest) size's rate
  std::size_t reference_mib = 0;
  for (const std::size_t mib : {4, 16, 31, 33, 64, 256}) {
    const std::size_t bytes = mib << 20;
    const int reps = static_cast<int>(4000000000UL / bytes) + 2;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      void* raw = nullptr;
      if (posix_memalign(&raw, 64, bytes) != 0) return 1;
      char* p = static_cast<char*>(raw);
      std::memset(p, r, bytes);
      sink = sink + p[bytes / 2] + p[bytes - 1];
      std::free(p);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double bytes_per_s = static_cast<double>(bytes) * reps / seconds;
    if (reference_bytes_per_s == 0) {
      reference_bytes_per_s = bytes_per_s;
      reference_mib = mib;
    }
    std::printf("%4zu MiB: %7.2f GB/s allocated, touched and freed, %6.3fx the %zu MiB rate\n", mib, bytes_per_s / 1e9,
                bytes_per_s / reference_bytes_per_s, reference_mib);
  }
}
