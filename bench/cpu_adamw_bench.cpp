// CPU AdamW for optimizer offload: Stepcast's SIMD kernels against LibTorch's
// CPU AdamW followed by the copy of the updated parameters into a bf16 buffer
// (what an offload step needs), on the same tensors and thread count, with
// the memory-bandwidth bound measured in the same run (a kernel with AdamW's
// exact traffic and trivial arithmetic).
//   cpu_adamw_bench [params (default 32M)] [threads (default all)] [repeats (default 7)]
// Our kernels with a bf16 gradient run as the offload step calls them: the
// updated bf16 parameters are written over the gradient, in place (the
// pinned staging buffer). Each variant's bytes per parameter are counted in
// main(); the bandwidth comes from a kernel moving fp32 AdamW's exact
// pattern (28 B/param: read the bf16 gradient, master, m, v; write master,
// m, v and the bf16 copy over the gradient), and "of bound" is each
// variant's bytes/s over it. The 8-bit variant (Dettmers et al. 2022) moves
// 16 B/param. All variants and the probe are timed interleaved, one run of
// each per round, and each reports its median over the rounds.
#include <immintrin.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <cstdio>
#include <thread>
#include <vector>

#include "backend/optim/cpu_adamw.h"
#include "backend/optim/cpu_cores.h"
#include "backend/optim/quant8.h"
#include "bench/bench_util.h"

using namespace stepcast::backend;
using stepcast::median;

namespace {

// The bound: a kernel with AdamW's exact memory traffic as the offload step runs it
// (read the bf16 gradient, p, m, v; write p, m, v and the bf16 copy over the gradient,
// in place: 28 B per element, no read for ownership) and trivial arithmetic, vectorised,
// on the same threads. Its bytes/s is the ceiling for AdamW.
__attribute__((target("avx2"))) void stream_like(float* __restrict p, float* __restrict m, float* __restrict v,
                                                 uint16_t* __restrict go, int64_t lo, int64_t hi) {
  int64_t i = lo;
  for (; i + 16 <= hi; i += 16) {
    const __m256i g16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(go + i));
    for (int h = 0; h < 2; ++h) {
      const int64_t k = i + 8 * h;
      const __m256 gi = _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(h ? _mm256_extracti128_si256(g16, 1) : _mm256_castsi256_si128(g16)), 16));
      _mm256_storeu_ps(p + k, _mm256_add_ps(_mm256_loadu_ps(p + k), gi));
      _mm256_storeu_ps(m + k, _mm256_add_ps(_mm256_loadu_ps(m + k), gi));
      _mm256_storeu_ps(v + k, _mm256_add_ps(_mm256_loadu_ps(v + k), gi));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(go + i), g16);  // the copy's store (same values)
  }
  for (; i < hi; ++i) {
    const float gi = bf16_to_float(go[i]);
    p[i] += gi;
    m[i] += gi;
    v[i] += gi;
  }
}

}  // namespace

int run(int argc, char** argv) {
  const int64_t n = stepcast::bench::positive_arg(argc, argv, 1, "params", int64_t{32} << 20);
  const int threads = static_cast<int>(
      stepcast::bench::positive_arg(argc, argv, 2, "threads", std::thread::hardware_concurrency()));
  const int repeats = static_cast<int>(stepcast::bench::positive_arg(argc, argv, 3, "repeats", 7));
  at::set_num_threads(threads);
  set_cpu_threads(threads);
  torch::manual_seed(0);
  auto master = torch::randn({n}), m = torch::zeros({n}), v = torch::zeros({n}), grad = torch::randn({n});
  auto grad16 = grad.to(torch::kBFloat16);
  auto out = torch::empty({n}, torch::kBFloat16);
  auto code_m = torch::zeros({n}, torch::kByte), code_v = torch::zeros({n}, torch::kByte);
  auto absmax_m = torch::zeros({quant8::num_blocks(n)}), absmax_v = torch::zeros({quant8::num_blocks(n)});
  kernels::AdamWArgs args;
  args.lr = 1e-4f;
  int64_t step = 0;

  // Bytes per parameter each variant must move (reads + writes):
  //   torch + copy: g, p, m, v read (16), p, m, v written (12), then p read again and bf16 written (6) = 34
  //   ours, fp32 gradient: 16 + 12 + bf16 out 2 = 30;  bf16 gradient (as offload delivers it), copy written
  //   over it: 14 + 12 + 2 = 28
  //   ours, 8-bit: bf16 g 2, p 4 + 4, codes 2 + 2, bf16 copy over g 2 = 16 (+ 16 B of absmax per 2048)
  enum class Kind { kBound, kReference, kFp32, kFp32Bf16Grad, k8bit, k8bitSplit };
  struct Row {
    std::string name;
    double bytes_per_param;
    Kind kind;
    std::function<void()> fn;
    double s = 0;
  };
  std::vector<Row> rows;
  // The bound (first row): the probe on the optimizer's own pool, the same threads bound to the same cores.
  auto bp = torch::zeros({n}), bm = torch::zeros({n}), bv = torch::zeros({n});
  auto bg = torch::full({n}, 1e-3, torch::kBFloat16);
  const int64_t chunk = (n + threads - 1) / threads;
  rows.push_back({"bandwidth probe (AdamW's traffic, in place)", 28.0, Kind::kBound, [&] {
                    run_on_cores(threads, [&](int t) {
                      const int64_t lo = std::min(n, t * chunk), hi = std::min(n, lo + chunk);
                      stream_like(bp.data_ptr<float>(), bm.data_ptr<float>(), bv.data_ptr<float>(),
                                  reinterpret_cast<uint16_t*>(bg.data_ptr()), lo, hi);
                    });
                  }});
  // Reference: LibTorch's AdamW followed by the bf16 copy an offload step needs. Fused on
  // torch >= 2.4 (at::_fused_adamw_ on the CPU), else torch::optim's loop of tensor ops.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  auto rp = master.clone(), rg = grad.clone(), rm = torch::zeros({n}), rv = torch::zeros({n});
  auto steps = torch::zeros({1});
  rows.push_back({"torch _fused_adamw_ (CPU) + bf16 copy", 34.0, Kind::kReference, [&] {
                    at::_fused_adamw_({rp}, {rg}, {rm}, {rv}, {}, {steps}, 1e-4, 0.9, 0.999, 0.0, 1e-8, false, false);
                    out.copy_(rp);
                  }});
#else
  auto rp = master.clone().requires_grad_(true);
  torch::optim::AdamW ref_opt({rp}, torch::optim::AdamWOptions(1e-4));
  rp.mutable_grad() = grad.clone();
  rows.push_back({"torch::optim::AdamW + bf16 copy", 34.0, Kind::kReference, [&] {
                    ref_opt.step();
                    out.copy_(rp.detach());
                  }});
#endif
  std::vector<SimdLevel> levels{SimdLevel::kScalar};
  if (cpu_simd_level() != SimdLevel::kScalar) levels.push_back(SimdLevel::kAvx2);
  if (cpu_simd_level() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  for (SimdLevel level : levels) {
    for (bool g16 : {false, true}) {
      rows.push_back({std::string("stepcast cpu_adamw ") + simd_name(level) + (g16 ? " bf16 grad" : " fp32 grad"),
                      g16 ? 28.0 : 30.0, g16 ? Kind::kFp32Bf16Grad : Kind::kFp32, [&, level, g16] {
                        args.step = ++step;
                        cpu_adamw(master.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                                  g16 ? grad16.data_ptr() : grad.data_ptr(),
                                  g16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32,
                                  g16 ? grad16.data_ptr() : out.data_ptr(), kernels::DType::kBFloat16, n, args,
                                  level);
                      }});
    }
  }
  const auto q8_name = [](SimdLevel level, const char* what) {
    return std::string("stepcast cpu_adamw8bit ") + simd_name(level) + " " + what;
  };
  for (SimdLevel level : levels) {
    rows.push_back({q8_name(level, "bf16 grad"), 16.0, Kind::k8bit, [&, level] {
                      args.step = ++step;
                      cpu_adamw8bit(master.data_ptr<float>(), code_m.data_ptr<uint8_t>(), code_v.data_ptr<uint8_t>(),
                                    absmax_m.data_ptr<float>(), absmax_v.data_ptr<float>(), grad16.data_ptr(),
                                    kernels::DType::kBFloat16, grad16.data_ptr(), kernels::DType::kBFloat16, n, args,
                                    level);
                    }});
  }
  // Split master weights (the 8-bit offload layout): the bf16 upper half is the upload copy,
  // updated in place; the gradient arrives in its own buffer: bf16 g 2, hi 2 + 2, lo 2 + 2,
  // codes 2 + 2 = 14 B.
  auto split_hi = torch::empty({n}, torch::kInt16), split_lo = torch::empty({n}, torch::kInt16);
  auto split_qm = torch::zeros({n}, torch::kByte), split_qv = torch::zeros({n}, torch::kByte);
  auto split_am = torch::zeros({quant8::num_blocks(n)}), split_av = torch::zeros({quant8::num_blocks(n)});
  auto split_g = grad.to(torch::kBFloat16);
  {
    auto* h = reinterpret_cast<uint16_t*>(split_hi.data_ptr());
    auto* l = reinterpret_cast<int16_t*>(split_lo.data_ptr());
    const float* x = master.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) split_master(x[i], h[i], l[i]);
  }
  for (SimdLevel level : levels) {
    if (level == SimdLevel::kScalar) continue;
    rows.push_back({q8_name(level, "split master"), 14.0, Kind::k8bitSplit, [&, level] {
                      args.step = ++step;
                      cpu_adamw8bit_split(reinterpret_cast<uint16_t*>(split_hi.data_ptr()),
                                          reinterpret_cast<int16_t*>(split_lo.data_ptr()), split_qm.data_ptr<uint8_t>(),
                                          split_qv.data_ptr<uint8_t>(), split_am.data_ptr<float>(),
                                          split_av.data_ptr<float>(), split_g.data_ptr(), kernels::DType::kBFloat16, n,
                                          args, level);
                    }});
  }
  // Interleaved: every round times each variant once, starting one further along the list each
  // round, so that a disturbance of the host lands on all variants alike; medians per variant.
  std::vector<std::vector<double>> times(rows.size());
  for (auto& r : rows) r.fn();  // warm-up: first touch, lazy initialisation
  for (int round = 0; round < repeats; ++round) {
    for (size_t k = 0; k < rows.size(); ++k) {
      const size_t i = (k + round) % rows.size();
      const auto t0 = std::chrono::steady_clock::now();
      rows[i].fn();
      times[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) rows[i].s = median(times[i]);
  const double bw = 28.0 * n / rows.front().s;
  rows.erase(rows.begin());  // the probe is reported as the bound, not as a variant
  // The fastest row of a kind (its index), or -1 where the run has none.
  const auto best = [&](Kind kind) {
    int found = -1;
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].kind == kind && (found < 0 || rows[i].s < rows[found].s)) found = static_cast<int>(i);
    return found;
  };
  const int fp32_best = best(Kind::kFp32Bf16Grad), q8_best = best(Kind::k8bit), split_best = best(Kind::k8bitSplit);

  const double ref = rows.front().s;
  std::printf("CPU AdamW, %lld parameters, %d threads (%s), SIMD available: %s (training's default), LibTorch %s\n",
              static_cast<long long>(n), threads, cpus_bound() ? "bound to cores" : "unbound",
              simd_name(cpu_simd_level()), TORCH_VERSION);
  std::printf("measured bandwidth (AdamW's traffic pattern in place, trivial arithmetic, same threads, interleaved "
              "with the variants): %.1f GB/s; medians of %d interleaved rounds\n", bw / 1e9, repeats);
  std::printf("%-50s %8s %9s %9s %9s %9s %9s\n", "variant", "B/param", "median", "Gparam/s", "GB/s", "of bound",
              "vs torch");
  std::printf("%-50s %8s %9s %9s %9s %9s %9s\n", "", "", "ms", "", "", "%", "x");
  for (const auto& r : rows)
    std::printf("%-50s %8.0f %9.2f %9.3f %9.1f %9.1f %9.2f\n", r.name.c_str(), r.bytes_per_param, 1e3 * r.s,
                n / r.s / 1e9, n * r.bytes_per_param / r.s / 1e9, 100.0 * (n * r.bytes_per_param / r.s) / bw,
                ref / r.s);
  // The 8-bit goal is for the kernel training runs: split master weights (the engine's default for
  // 8-bit offload in bf16) where a SIMD body has them, else the fp32-master kernel.
  const int q8_engine = split_best >= 0 ? split_best : q8_best;
  std::printf("ratios: fp32 states (bf16 grad, best) vs torch + copy: %.2fx (goal >= 1.15x); "
              "8-bit as training runs it (%s, best SIMD level) vs our fp32: %.2fx (goal >= 1.7x)\n",
              ref / rows[fp32_best].s, split_best >= 0 ? "split master weights" : "fp32 master weights",
              rows[fp32_best].s / rows[q8_engine].s);
  if (split_best >= 0)
    std::printf("        8-bit with fp32 master weights (best) vs our fp32: %.2fx; split vs fp32 master weights: %.2fx\n",
                rows[fp32_best].s / rows[q8_best].s, rows[q8_best].s / rows[split_best].s);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_adamw_bench: %s\n", e.what());
    return 2;
  }
}
