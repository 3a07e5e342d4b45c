// The plain types the optimizers share between the CPU kernels (optim/) and
// the CUDA kernels (cuda/kernels.h): element types, AdamW's hyper-parameters
// and the 8-bit maps as the kernels read them.
#pragma once

#include <cstdint>

namespace stepcast::backend::kernels {

enum class DType { kFloat32, kBFloat16 };

struct AdamWArgs {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  int64_t step = 1;         // 1-based, after increment
  float grad_scale = 1.0f;  // gradients are multiplied by this first (1 / (ranks x GAS))
};

// One dynamic quantisation map of 8-bit AdamW (quant8.h): per level i, its
// first point, spacing and the threshold to the next level (16 slots, so
// that a SIMD permute reads them).
struct Quant8Map {
  int bits;
  float first[16], step[16], inv_step[16], threshold[16];
  float zero_threshold;  // below it: code 0
};

}  // namespace stepcast::backend::kernels
