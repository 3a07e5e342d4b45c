// Block-wise dynamic quantisation of optimizer states (Dettmers et al. 2022,
// "8-bit Optimizers via Block-wise Quantization"): each block of kBlock values
// is scaled by its absolute maximum and every value is stored as the 8-bit
// code of the nearest point of a dynamic (tree-like) map, whose points are
// dense near 1 and spread over several decades towards 0.
//
// The map used here, for `bits` magnitude bits (7 for the signed first
// moment, whose top bit is the sign; 8 for the non-negative second moment):
// code 0 is 0; level i = 0 .. bits-1 holds the 2^i codes [2^i, 2^(i+1)),
// evenly spaced points first[i] + j step[i] (j = 0 .. 2^i - 1) spanning
// 10^(i - bits + 1) x (0.1 + 0.9 (j+1) / 2^i). Each level is a decade with
// twice the points of the one below: the exponent/fraction split of
// Dettmers' dynamic tree. The largest point is 1, the smallest nonzero
// 10^-(bits-1).
//
// Both directions are arithmetic, with no table search, so that the scalar,
// AVX-512 and CUDA kernels run the same operations:
//   decode(c) = fma(j, step[i], first[i]) with i = floor(log2 c), j = c - 2^i
//   encode(y) = level i = number of level thresholds (midpoints between
//               adjacent levels) at or below y; j = round((y - first[i]) / step[i])
//               clamped to the level; 0 below half the smallest point.
// That is the nearest point (up to float rounding at exact midpoints).
#pragma once

#include <cstdint>

#include "backend/optim/adamw_args.h"

namespace stepcast::backend::quant8 {

inline constexpr int64_t kBlock = 2048;     // values per absmax (the paper's block size)
inline constexpr int64_t kMinNumel = 4096;  // smaller tensors keep 32-bit states (bitsandbytes' min_8bit_size)

using Map = kernels::Quant8Map;

const Map& signed_magnitudes();  // 7 bits: the first moment's magnitudes
const Map& unsigned_map();       // 8 bits: the second moment

// y in [0, 1] (clamped; NaN reads as 1) -> the code of its nearest point.
uint8_t encode_magnitude(const Map& map, float y);
float decode_magnitude(const Map& map, uint8_t code);

// First moment: x in [-1, 1] -> sign (bit 7) | nearest 7-bit magnitude code.
uint8_t encode_signed(float x);
float decode_signed(uint8_t code);

// Second moment: x in [0, 1] -> nearest code; a positive value never becomes
// 0 (it takes the smallest nonzero point instead), so that a vanishing second
// moment cannot blow up the next update.
uint8_t encode_unsigned(float x);
float decode_unsigned(uint8_t code);

// Number of absmax blocks for n values.
inline int64_t num_blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

}  // namespace stepcast::backend::quant8
