// AdamW on the CPU for optimizer offload: fp32 master weights and moments in
// host memory, multi-threaded, writing the updated parameter in the working
// precision straight into the (pinned) upload buffer. Same arithmetic as the
// CUDA kernel and as torch.optim.AdamW.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>

#include "backend/optim/adamw_args.h"
#include "model/train_config.h"

namespace stepcast::backend {

// The instruction set the update runs with, chosen at run time (kAuto: the
// widest the CPU has).
// The flag's setting (model/train_config.h: CpuSimd) is the level itself.
using SimdLevel = CpuSimd;
SimdLevel cpu_simd_level();
inline const char* simd_name(SimdLevel level) { return cpu_simd_name(level); }

// What kAuto resolves to: the level `train --cpu-simd` selected, else the widest
// this CPU has (on the H200 host's Xeon, AVX-512 is the fastest for the bf16
// gradients training feeds both kernels: data/bench/h200-sxm). select_simd
// throws InputError for a level this CPU lacks; kAuto restores the default.
void select_simd(SimdLevel level);
SimdLevel selected_simd();

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

// Split master weights (8-bit offload): the fp32 master x is held as two
// 16-bit halves, hi = x rounded to bf16 (to nearest, ties away from zero:
// (bits + 0x8000) >> 16) and lo = bits - (hi << 16), a signed 16-bit
// remainder. bits = (hi << 16) + lo exactly, for every float. hi is the bf16
// copy the GPU needs, so the update writes it in place and moves 14 bytes per
// parameter instead of 16 (the upload copy is not written separately, and the
// gradient comes in its own buffer). hi differs from round-to-nearest-even
// only at exact ties, by one bf16 unit away from zero.
inline void split_master(float x, uint16_t& hi, int16_t& lo) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  hi = static_cast<uint16_t>((u + 0x8000u) >> 16);
  lo = static_cast<int16_t>(static_cast<uint16_t>(u));  // u - (hi << 16) is in [-0x8000, 0x7fff]: u's low 16 bits
}
inline float join_master(uint16_t hi, int16_t lo) {
  const uint32_t u = (static_cast<uint32_t>(hi) << 16) + static_cast<uint32_t>(static_cast<int32_t>(lo));
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// Whole arrays of them (host memory).
void split_master_n(const float* x, uint16_t* hi, int16_t* lo, int64_t n);
void join_master_n(const uint16_t* hi, const int16_t* lo, float* x, int64_t n);

// cpu_adamw8bit with split master weights: master_hi is also the bf16 copy.
// 14 bytes of traffic per parameter with a bf16 gradient.
void cpu_adamw8bit_split(uint16_t* master_hi, int16_t* master_lo, uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code,
                         float* exp_avg_absmax, float* exp_avg_sq_absmax, const void* grad, kernels::DType grad_dtype,
                         int64_t n, const kernels::AdamWArgs& args, SimdLevel level = SimdLevel::kAuto);

// Runs fn(begin, end) over [0, n) on the optimizer's threads in contiguous
// chunks, each a multiple of `align` elements (except the last).
void cpu_parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);

// Round-to-nearest-even fp32 -> bf16, and back.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

}  // namespace stepcast::backend
