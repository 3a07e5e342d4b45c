// AdamW on the CPU for optimizer offload: fp32 master weights and moments in
// host memory, multi-threaded, writing the updated parameter in the working
// precision straight into the (pinned) upload buffer. Same arithmetic as the
// CUDA kernel and as torch.optim.AdamW.
#pragma once

#include <cstdint>

#include "backend/kernels.h"

namespace stepcast::backend {

// The instruction set the update runs with, chosen at run time (kAuto: the
// widest the CPU has).
enum class SimdLevel { kAuto, kScalar, kAvx2, kAvx512 };
SimdLevel cpu_simd_level();
const char* simd_name(SimdLevel level);

// Threads of the CPU optimizer and accumulation (a rank's share of the host's
// cores); 0 = all hardware threads. Own std::threads, not OpenMP's pool.
void set_cpu_threads(int threads);
int cpu_threads();

// out_dtype selects what `param_out` holds (bf16 or fp32); param_out may be null.
void cpu_adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad, void* param_out,
               kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& args,
               SimdLevel level = SimdLevel::kAuto);

// acc[i] += src[i] (src bf16 or fp32), multi-threaded: accumulating offloaded
// gradient shards in fp32 on the host.
void cpu_accumulate(float* acc, const void* src, kernels::DType src_dtype, int64_t n, bool overwrite);

// Round-to-nearest-even fp32 -> bf16, and back.
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t b);

}  // namespace stepcast::backend
