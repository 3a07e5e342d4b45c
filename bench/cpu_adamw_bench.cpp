// CPU AdamW for optimizer offload: Stepcast's SIMD kernels against LibTorch's
// CPU AdamW followed by the copy of the updated parameters into a bf16 buffer
// (what an offload step needs), on the same tensors and thread count, with
// the memory-bandwidth bound measured in the same run (a kernel with AdamW's
// exact traffic and trivial arithmetic).
//   cpu_adamw_bench [params (default 32M)] [threads (default all)] [repeats (default 7)]
// Bytes per parameter counted: read grad, master, m, v (4 x 4 B); write
// master, m, v (3 x 4 B) and the bf16 copy (2 B): 30 B.
#include <immintrin.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "backend/cpu_adamw.h"

using namespace stepcast::backend;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Fn>
std::vector<double> time_it(int repeats, Fn&& fn) {
  fn();  // warm-up (first touch)
  std::vector<double> out;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    fn();
    out.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return out;
}

// The bound: a kernel with AdamW's exact memory traffic (read g, p, m, v;
// write p, m, v and a bf16 copy: 30 B per element) and trivial arithmetic,
// vectorised, on the same threads. Its bytes/s is the ceiling for AdamW.
__attribute__((target("avx2"))) void stream_like(float* __restrict p, float* __restrict m, float* __restrict v,
                                                 const float* __restrict g, uint16_t* __restrict o, int64_t lo,
                                                 int64_t hi) {
  int64_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    __m256i halves[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t k = i + 8 * h;
      const __m256 gi = _mm256_loadu_ps(g + k);
      const __m256 x = _mm256_add_ps(_mm256_loadu_ps(p + k), gi);
      _mm256_storeu_ps(p + k, x);
      _mm256_storeu_ps(m + k, _mm256_add_ps(_mm256_loadu_ps(m + k), gi));
      _mm256_storeu_ps(v + k, _mm256_add_ps(_mm256_loadu_ps(v + k), gi));
      halves[h] = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0xD8));
  }
  for (; i < hi; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
    o[i] = static_cast<uint16_t>(i);
  }
}

double bound_bytes_per_s(int64_t n, int threads, int repeats) {
  auto p = torch::zeros({n}), m = torch::zeros({n}), v = torch::zeros({n}), g = torch::ones({n});
  auto o = torch::empty({n}, torch::kBFloat16);
  auto run = [&] {
    std::vector<std::thread> pool;
    const int64_t chunk = (n + threads - 1) / threads;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const int64_t lo = t * chunk, hi = std::min(n, lo + chunk);
        stream_like(p.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(),
                    reinterpret_cast<uint16_t*>(o.data_ptr()), lo, hi);
      });
    for (auto& th : pool) th.join();
  };
  return 30.0 * n / median(time_it(repeats, run));
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{32} << 20);
  const int threads = argc > 2 ? std::atoi(argv[2]) : static_cast<int>(std::thread::hardware_concurrency());
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 7;
  at::set_num_threads(threads);
  set_cpu_threads(threads);
  torch::manual_seed(0);
  const double bytes_per_param = 30.0;
  const double bw = bound_bytes_per_s(n, threads, repeats);

  auto master = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n}), grad = torch::randn({n});
  auto out = torch::empty({n}, torch::kBFloat16);
  kernels::AdamWArgs args;
  args.lr = 1e-4f;
  int64_t step = 0;

  struct Row {
    std::string name;
    double s;
  };
  std::vector<Row> rows;
  // Reference: LibTorch's AdamW (torch::optim, foreach-free C++ loop of tensor ops) + bf16 copy.
  {
    auto p = master.clone().requires_grad_(true);
    torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(1e-4));
    p.mutable_grad() = grad.clone();
    rows.push_back({"torch::optim::AdamW + bf16 copy", median(time_it(repeats, [&] {
                      opt.step();
                      out.copy_(p.detach());
                    }))});
  }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  {
    auto p = master.clone(), g = grad.clone(), m2 = torch::zeros({n}), v2 = torch::zeros({n});
    auto steps = torch::zeros({1});
    rows.push_back({"at::_fused_adamw_ (CPU) + bf16 copy", median(time_it(repeats, [&] {
                      at::_fused_adamw_({p}, {g}, {m2}, {v2}, {}, {steps}, 1e-4, 0.9, 0.999, 0.0, 1e-8, false, false);
                      out.copy_(p);
                    }))});
  }
#endif
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level == SimdLevel::kAvx512 && cpu_simd_level() != SimdLevel::kAvx512) continue;
    if (level == SimdLevel::kAvx2 && cpu_simd_level() == SimdLevel::kScalar) continue;
    rows.push_back({std::string("stepcast cpu_adamw ") + simd_name(level), median(time_it(repeats, [&] {
                      args.step = ++step;
                      cpu_adamw(master.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                                grad.data_ptr<float>(), out.data_ptr(), kernels::DType::kBFloat16, n, args, level);
                    }))});
  }

  const double ref = rows.front().s;
  std::printf("CPU AdamW, %lld fp32 parameters, %d threads, SIMD available: %s, LibTorch %s\n",
              static_cast<long long>(n), threads, simd_name(cpu_simd_level()), TORCH_VERSION);
  std::printf("measured bound (AdamW's traffic, trivial arithmetic, same threads): %.1f GB/s -> %.2f Gparam/s at %.0f B/param\n",
              bw / 1e9, bw / bytes_per_param / 1e9, bytes_per_param);
  std::printf("%-40s %10s %10s %10s %10s %10s\n", "variant", "median", "Gparam/s", "GB/s", "of bound", "vs torch");
  std::printf("%-40s %10s %10s %10s %10s %10s\n", "", "ms", "", "", "%", "x");
  for (const auto& r : rows)
    std::printf("%-40s %10.2f %10.3f %10.1f %10.1f %10.2f\n", r.name.c_str(), 1e3 * r.s, n / r.s / 1e9,
                n * bytes_per_param / r.s / 1e9, 100.0 * (n * bytes_per_param / r.s) / bw, ref / r.s);
  return 0;
}
