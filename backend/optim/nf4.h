// 4-bit NormalFloat (NF4) weight quantisation (Dettmers et al. 2023, "QLoRA: Efficient Finetuning
// of Quantized LLMs", section 3): a frozen weight is cut into blocks of kBlock values, each block
// scaled by its absolute maximum, and every value stored as the 4-bit index of the nearest of 16
// levels placed at quantiles of the standard normal distribution (weights of trained networks
// are close to normal), with an exact 0.
//
// The levels: 8 positive ones at the normal quantiles of p = offset + k (0.5 - offset) / 8,
// k = 0 .. 7, and 7 negative ones at minus the quantiles of p = offset + k (0.5 - offset) / 7,
// k = 0 .. 6, plus 0; all divided by the largest, so that they span [-1, 1]. The offset,
// (1 - 1/(2 x 15) + 1 - 1/(2 x 16)) / 2 = 0.96770833, keeps the outermost quantiles finite
// (the asymmetric split gives 0 a level of its own). Codes are in level order: 0 is -1, 7 is 0,
// 15 is 1. Two codes share a byte, the first value in the low nibble.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace stepcast::backend::nf4 {

inline constexpr int64_t kBlock = 64;  // values per absmax (QLoRA's block size for weights)

// The standard normal quantile function (inverse CDF), to double precision: bisection on
// Phi(x) = erfc(-x / sqrt 2) / 2. p must lie in (0, 1).
double normal_quantile(double p);

// The 16 levels, ascending, computed from the construction above.
const std::array<float, 16>& levels();

// The code of the level nearest to y (y in [-1, 1]; clamped outside; NaN reads as 0).
uint8_t encode(float y);
inline float decode(uint8_t code) { return levels()[code & 0xF]; }

// A tensor's blocks: packed codes (two per byte) and one absmax per block.
struct Quantized {
  int64_t numel = 0;
  std::vector<uint8_t> packed;  // (numel + 1) / 2 bytes
  std::vector<float> absmax;    // ceil(numel / kBlock)
};

Quantized quantize(const float* x, int64_t numel);
// out[i] = decode(code i) x absmax of its block.
void dequantize(const Quantized& q, float* out);

}  // namespace stepcast::backend::nf4
