// QLoRA's frozen weights as tensors (the arithmetic of optim/nf4.h on any device): block-wise
// NF4 quantisation with torch operations, dequantisation (a CUDA kernel on the GPU, torch
// operations on the CPU), and the linear layer over a quantised weight whose backward
// dequantises the weight again instead of keeping it: autograd saves only the 4-bit codes,
// so a layer's activations do not pin a 16-bit copy of its weights (Dettmers et al. 2023, 3).
#pragma once

#include <torch/torch.h>

namespace stepcast::backend::nf4 {

// A weight is quantised when its elements fill whole blocks and whole bytes.
bool quantisable(int64_t numel);

// x (fp32, quantisable numel, any device) into `codes` (uint8, numel / 2: value 2i in the low
// nibble of byte i) and `absmax` (fp32, numel / kBlock), in place; the same codes as
// nf4::quantize.
void quantize_into(const torch::Tensor& x, torch::Tensor& codes, torch::Tensor& absmax);

// The flat weight (numel = 2 x codes) in `dtype` (bf16 or fp32), on the codes' device.
torch::Tensor dequantize(const torch::Tensor& codes, const torch::Tensor& absmax, torch::ScalarType dtype);

// y = x W^T with W (out x in) = dequantize(codes, absmax); no gradient for W.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& absmax, int64_t out,
                     int64_t in);

}  // namespace stepcast::backend::nf4
