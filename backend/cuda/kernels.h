// Host-side launchers of the backend's own CUDA kernels (kernels.cu). Plain
// types only, so that C++ files include this without CUDA headers.
#pragma once

#include <cstdint>

#include "backend/optim/adamw_args.h"

namespace stepcast::backend::kernels {

// dst[i] += src[i] on `stream`.
void add_inplace(void* dst, const void* src, int64_t n, DType dtype, void* stream);

// One fused AdamW update over n parameters (Loshchilov & Hutter 2019, in the
// form of torch.optim.AdamW): reads the gradient (fp32 or bf16), fp32 master
// weights and moments; writes master, moments and the updated parameter in the
// working precision to `param_out` (may be null). 28 bytes per parameter for a
// bf16 gradient and bf16 output.
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype,
           void* param_out, DType param_dtype, int64_t n, const AdamWArgs& args, void* stream);

// 8-bit AdamW (Dettmers et al. 2022) over n parameters with block-wise
// quantised moments: one CUDA block per quantisation block. Same arithmetic
// and encoding as cpu_adamw8bit.
void adamw8bit(float* master, uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code, float* exp_avg_absmax,
               float* exp_avg_sq_absmax, const void* grad, DType grad_dtype, void* param_out, DType param_dtype,
               int64_t n, const AdamWArgs& args, const Quant8Map& signed_map, const Quant8Map& unsigned_map,
               void* stream);

// NF4 dequantisation (nf4.h): out[i] = levels[code i] x absmax[i / 64], codes two per byte
// (value 2j in the low nibble of byte j); `levels` is the 16-entry code book (host memory,
// passed by value); `out` in `out_dtype`. A grid-stride loop over 8-byte words of codes; n a
// multiple of 16, codes 8-byte and out 16-byte aligned (std::invalid_argument otherwise).
void nf4_dequantize(const uint8_t* codes, const float* absmax, void* out, DType out_dtype, int64_t n,
                    const float* levels, void* stream);

}  // namespace stepcast::backend::kernels
