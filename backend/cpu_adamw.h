// AdamW on the CPU for optimizer offload: fp32 master weights and moments in
// host memory, multi-threaded, writing the updated parameter in the working
// precision straight into the (pinned) upload buffer. Same arithmetic as the
// CUDA kernel and as torch.optim.AdamW.
#pragma once

#include <cstdint>
#include <functional>

#include "backend/kernels.h"

namespace stepcast::backend {

// The instruction set the update runs with, chosen at run time (kAuto: the
// widest the CPU has).
enum class SimdLevel { kAuto, kScalar, kAvx2, kAvx512 };
SimdLevel cpu_simd_level();
const char* simd_name(SimdLevel level);

// What kAuto resolves to for each kernel: $STEPCAST_CPU_SIMD (scalar, avx2 or
// avx512) when set, else the fastest level this CPU has, timed once per
// process on 16 Mi parameters with the optimizer's threads, the widest unless
// a narrower one is 5 % faster (on the H200 host's Xeon, AVX2 beat AVX-512
// for fp32 AdamW in one session and not in the next; AVX-512 won for 8-bit).
enum class CpuKernel { kAdamW, kAdamW8bit };
SimdLevel tuned_simd_level(CpuKernel kernel);

// Threads of the CPU optimizer and accumulation (a rank's share of the host's
// cores); 0 = all hardware threads. Own std::threads, not OpenMP's pool.
void set_cpu_threads(int threads);
int cpu_threads();

// The gradient is read in grad_dtype (bf16 as it comes down from the GPU, or
// fp32); out_dtype selects what `param_out` holds (bf16 or fp32); param_out
// may be null, and may be the gradient's own buffer (each element's gradient
// is read before its parameter is written). 28 bytes of memory traffic per
// parameter with bf16 in and out.
void cpu_adamw(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, kernels::DType grad_dtype,
               void* param_out, kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& args,
               SimdLevel level = SimdLevel::kAuto);

// 8-bit AdamW (Dettmers et al. 2022) over n parameters: the moments are held
// as block-wise quantised codes (quant8.h: exp_avg signed, exp_avg_sq
// unsigned, one fp32 absmax per kBlock values each); they are dequantised,
// updated with the fp32 arithmetic of cpu_adamw, and requantised with the
// block's new absmax. Master weights stay fp32. Zero codes and absmax are the
// zero state. 16 bytes of traffic per parameter with bf16 in and out.
void cpu_adamw8bit(float* master, uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code, float* exp_avg_absmax,
                   float* exp_avg_sq_absmax, const void* grad, kernels::DType grad_dtype, void* param_out,
                   kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& args,
                   SimdLevel level = SimdLevel::kAuto);

// Runs fn(begin, end) over [0, n) on the optimizer's threads in contiguous
// chunks, each a multiple of `align` elements (except the last).
void cpu_parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);

// Round-to-nearest-even fp32 -> bf16, and back.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

}  // namespace stepcast::backend
