// GPU optimizers: Stepcast's fused AdamW (fp32 states, bf16 gradient in and
// bf16 parameter out) and 8-bit AdamW (block-wise quantised moments, Dettmers
// et al. 2022) against torch's fused CUDA AdamW (at::_fused_adamw_, fp32),
// on the same parameter count, with the HBM bandwidth measured in the same
// run (a device-to-device copy). Prints medians, bandwidth fractions, state
// memory per parameter and the ratios against torch.
//   gpu_optimizer_bench [params (default 1Gi)] [repeats (default 9)]
#include <cuda_runtime.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/optim/quant8.h"
#include "bench/bench_util.h"

using namespace stepcast::backend;

namespace {

template <class Fn>
double time_median_s(int repeats, Fn&& fn) {
  return stepcast::median(stepcast::bench::time_runs(repeats, fn, [] { cudaDeviceSynchronize(); }));
}

}  // namespace

int main(int argc, char** argv) {
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "gpu_optimizer_bench: no CUDA device (run it on the GPU machine)\n");
    return 2;
  }
  const int64_t n = stepcast::bench::positive_arg(argc, argv, 1, "params", int64_t{1} << 30);
  const int repeats = static_cast<int>(stepcast::bench::positive_arg(argc, argv, 2, "repeats", 9));
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const auto bf16 = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto u8 = torch::dtype(torch::kByte).device(torch::kCUDA);

  // The bound: a device-to-device copy of 4 n bytes reads and writes 8 n bytes.
  double hbm_bps = 0;
  {
    auto a = torch::empty({n}, f32), b = torch::empty({n}, f32);
    const double s = time_median_s(repeats, [&] { b.copy_(a); });
    hbm_bps = 8.0 * static_cast<double>(n) / s;
  }

  struct Row {
    std::string name;
    double traffic_bytes, state_bytes, s;
  };
  std::vector<Row> rows;
  auto grad32 = torch::randn({n}, f32) * 1e-3;
  auto grad16 = grad32.to(torch::kBFloat16);
  kernels::AdamWArgs args;
  args.lr = 1e-4f;
  int64_t step = 0;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  {
    // fp32 parameters, gradients and moments: read p g m v, write p m v = 28 B/param; states 8 B (p is the master).
    auto p = torch::randn({n}, f32) * 0.02, m = torch::zeros({n}, f32), v = torch::zeros({n}, f32);
    auto steps = torch::zeros({1}, f32);
    rows.push_back({"torch _fused_adamw_ (CUDA, fp32)", 28.0, 8.0, time_median_s(repeats, [&] {
                      at::_fused_adamw_({p}, {grad32}, {m}, {v}, {}, {steps}, 1e-4, 0.9, 0.999, 0.0, 1e-8, false,
                                        false);
                    })});
  }
#endif
  {
    // bf16 gradient 2 + master 8 + m 8 + v 8 + bf16 parameter 2 = 28 B; states: master + m + v = 12 B.
    auto master = torch::randn({n}, f32) * 0.02, m = torch::zeros({n}, f32), v = torch::zeros({n}, f32);
    auto out = torch::empty({n}, bf16);
    rows.push_back({"stepcast adamw (bf16 grad/param, fp32 states)", 28.0, 12.0, time_median_s(repeats, [&] {
                      args.step = ++step;
                      kernels::adamw(master.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(),
                                     grad16.data_ptr(), kernels::DType::kBFloat16, out.data_ptr(),
                                     kernels::DType::kBFloat16, n, args, nullptr);
                    })});
  }
  {
    // bf16 gradient 2 + master 8 + codes 2 x 2 + bf16 parameter 2 = 16 B; states: master 4 + codes 2 (+ absmax).
    auto master = torch::randn({n}, f32) * 0.02;
    auto qm = torch::zeros({n}, u8), qv = torch::zeros({n}, u8);
    auto am = torch::zeros({quant8::num_blocks(n)}, f32), av = torch::zeros({quant8::num_blocks(n)}, f32);
    auto out = torch::empty({n}, bf16);
    rows.push_back({"stepcast adamw8bit (bf16 grad/param)", 16.0, 6.0 + 8.0 / quant8::kBlock,
                    time_median_s(repeats, [&] {
                      args.step = ++step;
                      kernels::adamw8bit(master.data_ptr<float>(), qm.data_ptr<uint8_t>(), qv.data_ptr<uint8_t>(),
                                         am.data_ptr<float>(), av.data_ptr<float>(), grad16.data_ptr(),
                                         kernels::DType::kBFloat16, out.data_ptr(), kernels::DType::kBFloat16, n,
                                         args, quant8::signed_magnitudes(), quant8::unsigned_map(), nullptr);
                    })});
  }
  const double ref = rows.front().s;
  std::printf("GPU AdamW, %lld parameters, LibTorch %s; HBM copy bandwidth measured: %.0f GB/s\n",
              static_cast<long long>(n), TORCH_VERSION, hbm_bps / 1e9);
  std::printf("%-46s %8s %8s %9s %9s %9s %9s\n", "variant", "B/param", "state B", "median", "Gparam/s", "of HBM",
              "vs torch");
  std::printf("%-46s %8s %8s %9s %9s %9s %9s\n", "", "traffic", "/param", "ms", "", "%", "x");
  for (const auto& r : rows)
    std::printf("%-46s %8.0f %8.2f %9.2f %9.2f %9.1f %9.2f\n", r.name.c_str(), r.traffic_bytes, r.state_bytes,
                1e3 * r.s, n / r.s / 1e9, 100.0 * n * r.traffic_bytes / r.s / hbm_bps, ref / r.s);
  return 0;
}
