#include "backend/cpu_adamw.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

namespace stepcast::backend {

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

namespace {
constexpr int64_t kGrain = 1 << 16;
}

void cpu_adamw(float* master, float* m, float* v, const float* grad, void* out, kernels::DType out_dtype, int64_t n,
               const kernels::AdamWArgs& a) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
  const float bc2_sqrt =
      std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step))));
  const float step_size = a.lr / bc1;
  const float decay = 1.0f - a.lr * a.weight_decay;
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = grad[i] * a.grad_scale;
      float p = master[i] * decay;
      const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
      const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
      const float denom = std::sqrt(vi) / bc2_sqrt + a.eps;
      p -= step_size * mi / denom;
      master[i] = p;
      m[i] = mi;
      v[i] = vi;
    }
    if (!out) return;
    if (out_dtype == kernels::DType::kBFloat16) {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = begin; i < end; ++i) o[i] = float_to_bf16(master[i]);
    } else {
      auto* o = static_cast<float*>(out);
      if (o != master) std::memcpy(o + begin, master + begin, static_cast<size_t>(end - begin) * sizeof(float));
    }
  });
}

void cpu_accumulate(float* acc, const void* src, kernels::DType dtype, int64_t n, bool overwrite) {
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    if (dtype == kernels::DType::kBFloat16) {
      const auto* s = static_cast<const uint16_t*>(src);
      if (overwrite)
        for (int64_t i = begin; i < end; ++i) acc[i] = bf16_to_float(s[i]);
      else
        for (int64_t i = begin; i < end; ++i) acc[i] += bf16_to_float(s[i]);
    } else {
      const auto* s = static_cast<const float*>(src);
      if (overwrite)
        for (int64_t i = begin; i < end; ++i) acc[i] = s[i];
      else
        for (int64_t i = begin; i < end; ++i) acc[i] += s[i];
    }
  });
}

}  // namespace stepcast::backend
