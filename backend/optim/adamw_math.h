// The AdamW update of one element (torch.optim.AdamW's arithmetic), shared
// by the CPU kernels (fp32 and 8-bit states): internal to backend/.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/optim/cpu_adamw.h"
#include "backend/optim/adamw_args.h"

namespace stepcast::backend {

struct Consts {
  float b1, b2, one_minus_b1, one_minus_b2, inv_bc2_sqrt, eps, step_size, decay, scale;
};

inline Consts consts_of(const kernels::AdamWArgs& a) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
  const float bc2_sqrt =
      std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step))));
  return {a.beta1, a.beta2, 1.0f - a.beta1, 1.0f - a.beta2, 1.0f / bc2_sqrt, a.eps, a.lr / bc1,
          1.0f - a.lr * a.weight_decay, a.grad_scale};
}

// The reference arithmetic (torch.optim.AdamW), one element.
inline float adamw_one(float& p, float& m, float& v, float gi, const Consts& c) {
  const float g = gi * c.scale;
  float x = p * c.decay;
  m = c.b1 * m + c.one_minus_b1 * g;
  v = c.b2 * v + c.one_minus_b2 * g * g;
  x -= c.step_size * m / (std::sqrt(v) * c.inv_bc2_sqrt + c.eps);
  p = x;
  return x;
}

// The gradient, bf16 or fp32, read as fp32.
struct GradIn {
  const void* ptr;
  kernels::DType dtype;
  float at(int64_t i) const {
    if (dtype == kernels::DType::kFloat32) return static_cast<const float*>(ptr)[i];
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(ptr)[i]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  }
};

// out[i] = x in the working precision (bf16 rounded to nearest even, or fp32); out may be null.
inline void store_param(void* out, kernels::DType od, int64_t i, float x) {
  if (!out) return;
  if (od == kernels::DType::kBFloat16) static_cast<uint16_t*>(out)[i] = float_to_bf16(x);
  else static_cast<float*>(out)[i] = x;
}

}  // namespace stepcast::backend
