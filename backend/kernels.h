// Host-side launchers of the backend's own CUDA kernels (kernels.cu). Plain
// types only, so that C++ files include this without CUDA headers.
#pragma once

#include <cstdint>

namespace stepcast::backend::kernels {

enum class DType { kFloat32, kBFloat16 };

// dst[i] += src[i] on `stream`.
void add_inplace(void* dst, const void* src, int64_t n, DType dtype, void* stream);

struct AdamWArgs {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;         // 1-based, after increment
  float grad_scale = 1.0f;  // gradients are multiplied by this first (1 / (ranks x GAS))
};

// One fused AdamW update over n parameters (Loshchilov & Hutter 2019, in the
// form of torch.optim.AdamW): reads the gradient (fp32 or bf16), fp32 master
// weights and moments; writes master, moments and the updated parameter in the
// working precision to `param_out` (may be null). 28 bytes per parameter for a
// bf16 gradient and bf16 output.
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
           void* param_out, DType param_dtype, int64_t n, const AdamWArgs& args, void* stream);

}  // namespace stepcast::backend::kernels
