#include "backend/optim/nf4.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace stepcast::backend::nf4 {

double normal_quantile(double p) {
  if (!(p > 0.0 && p < 1.0)) throw std::invalid_argument("normal_quantile: p must lie in (0, 1)");
  double lo = -40.0, hi = 40.0;
  for (int i = 0; i < 200 && hi - lo > 1e-300; ++i) {
    const double mid = 0.5 * (lo + hi);
    const double cdf = 0.5 * std::erfc(-mid / std::sqrt(2.0));
    (cdf < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

const std::array<float, 16>& levels() {
  static const std::array<float, 16> kLevels = [] {
    const double offset = 0.5 * ((1.0 - 1.0 / 30.0) + (1.0 - 1.0 / 32.0));
    std::array<double, 16> v{};
    size_t n = 0;
    for (int k = 0; k < 8; ++k) v[n++] = normal_quantile(offset + k * (0.5 - offset) / 8.0);
    for (int k = 0; k < 7; ++k) v[n++] = -normal_quantile(offset + k * (0.5 - offset) / 7.0);
    v[n++] = 0.0;
    std::sort(v.begin(), v.end());
    const double top = v.back();
    std::array<float, 16> out{};
    for (size_t i = 0; i < 16; ++i) out[i] = static_cast<float>(v[i] / top);
    return out;
  }();
  return kLevels;
}

uint8_t encode(float y) {
  if (std::isnan(y)) y = 0.0f;
  const auto& l = levels();
  // Nearest level: count the midpoints between adjacent levels at or below y.
  uint8_t code = 0;
  for (size_t i = 0; i + 1 < l.size(); ++i)
    if (y >= 0.5f * (l[i] + l[i + 1])) code = static_cast<uint8_t>(i + 1);
  return code;
}

Quantized quantize(const float* x, int64_t numel) {
  Quantized q;
  q.numel = numel;
  q.packed.assign(static_cast<size_t>((numel + 1) / 2), 0);
  q.absmax.assign(static_cast<size_t>((numel + kBlock - 1) / kBlock), 0.0f);
  for (int64_t b = 0; b * kBlock < numel; ++b) {
    const int64_t begin = b * kBlock, end = std::min(numel, begin + kBlock);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::abs(x[i]));
    q.absmax[static_cast<size_t>(b)] = m;
    const float inv = m > 0.0f ? 1.0f / m : 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const uint8_t c = encode(x[i] * inv);
      uint8_t& byte = q.packed[static_cast<size_t>(i / 2)];
      byte = static_cast<uint8_t>(i % 2 == 0 ? (byte & 0xF0) | c : (byte & 0x0F) | (c << 4));
    }
  }
  return q;
}

void dequantize(const Quantized& q, float* out) {
  for (int64_t i = 0; i < q.numel; ++i) {
    const uint8_t byte = q.packed[static_cast<size_t>(i / 2)];
    const uint8_t c = i % 2 == 0 ? (byte & 0x0F) : (byte >> 4);
    out[i] = decode(c) * q.absmax[static_cast<size_t>(i / kBlock)];
  }
}

}  // namespace stepcast::backend::nf4
