// SIMD pieces shared by the CPU AdamW kernels (fp32 states in cpu_adamw.cpp,
// 8-bit states in cpu_adamw8bit.cpp): the broadcast hyper-parameters, the
// gradient load (bf16 or fp32) and the parameter store (bf16 rounded to
// nearest even, or fp32), for 16 lanes (AVX-512) and 8 lanes (AVX2 + FMA).
// Internal to backend/.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/optim/adamw_math.h"

#define STEPCAST_TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))
#define STEPCAST_TARGET_AVX2 __attribute__((target("avx2,fma")))

namespace stepcast::backend {

struct AdamWRegs16 {
  __m512 b1, b2, omb1, omb2, ibc2, eps, ss, dec, sc;
};

STEPCAST_TARGET_AVX512 inline AdamWRegs16 adamw_regs16(const Consts& c) {
  return {_mm512_set1_ps(c.b1),           _mm512_set1_ps(c.b2),        _mm512_set1_ps(c.one_minus_b1),
          _mm512_set1_ps(c.one_minus_b2), _mm512_set1_ps(c.inv_bc2_sqrt), _mm512_set1_ps(c.eps),
          _mm512_set1_ps(c.step_size),    _mm512_set1_ps(c.decay),     _mm512_set1_ps(c.scale)};
}

STEPCAST_TARGET_AVX512 inline __m512 load_grad16(GradIn g, int64_t i) {
  if (g.dtype == kernels::DType::kFloat32) return _mm512_loadu_ps(static_cast<const float*>(g.ptr) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g.ptr) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// out[i .. i+15] = x, as bf16 (round to nearest even: bits + 0x7fff + ((bits >> 16) & 1),
// keep the high half) or fp32. out may be null.
// kStream: non-temporal stores (the copy is read next by the GPU's DMA engine, not by this
// core: its lines skip the read for ownership and stay out of the cache); out + i must then be
// 64-byte aligned (fp32) or 32-byte aligned (bf16), and the writer must _mm_sfence() before
// another thread reads the copy (parallel_chunks does).
template <bool kStream = false>
STEPCAST_TARGET_AVX512 inline void store_out16(void* out, kernels::DType od, int64_t i, __m512 x) {
  if (!out) return;
  if (od == kernels::DType::kFloat32) {
    if constexpr (kStream) _mm512_stream_ps(static_cast<float*>(out) + i, x);
    else _mm512_storeu_ps(static_cast<float*>(out) + i, x);
    return;
  }
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __m256i* dst = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i);
  if constexpr (kStream) _mm256_stream_si256(dst, _mm512_cvtepi32_epi16(r));
  else _mm256_storeu_si256(dst, _mm512_cvtepi32_epi16(r));
}

// Split master weights (cpu_adamw.h: split_master / join_master), 16 lanes: the fp32
// value from its halves, and the halves of a new value (the low 16 bits of both).
STEPCAST_TARGET_AVX512 inline __m512 load_master16(const uint16_t* hi, const int16_t* lo, int64_t i) {
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi + i)));
  const __m512i l = _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo + i)));
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 16), l));
}

// The remainder x - (hi << 16) is in [-0x8000, 0x7fff], so its 16 bits are x's own low
// 16 bits: the truncating conversion stores it.
STEPCAST_TARGET_AVX512 inline void store_master16(uint16_t* hi, int16_t* lo, int64_t i, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i h = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8000)), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), _mm512_cvtepi32_epi16(h));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), _mm512_cvtepi32_epi16(u));
}

// Whether the output copy takes non-temporal stores: 64-byte aligned (every chunk and block
// starts at a multiple of 64 elements from it).
bool can_stream(const void* out);

struct AdamWRegs8 {
  __m256 b1, b2, omb1, omb2, ibc2, eps, ss, dec, sc;
};

STEPCAST_TARGET_AVX2 inline AdamWRegs8 adamw_regs8(const Consts& c) {
  return {_mm256_set1_ps(c.b1),           _mm256_set1_ps(c.b2),        _mm256_set1_ps(c.one_minus_b1),
          _mm256_set1_ps(c.one_minus_b2), _mm256_set1_ps(c.inv_bc2_sqrt), _mm256_set1_ps(c.eps),
          _mm256_set1_ps(c.step_size),    _mm256_set1_ps(c.decay),     _mm256_set1_ps(c.scale)};
}

STEPCAST_TARGET_AVX2 inline __m256 load_grad8(GradIn g, int64_t i) {
  if (g.dtype == kernels::DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(g.ptr) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g.ptr) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// out[i .. i+7] = x, as bf16 (round to nearest even) or fp32. out may be null.
STEPCAST_TARGET_AVX2 inline void store_out8(void* out, kernels::DType od, int64_t i, __m256 x) {
  if (!out) return;
  if (od == kernels::DType::kFloat32) {
    _mm256_storeu_ps(static_cast<float*>(out) + i, x);
    return;
  }
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb), 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i),
                   _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

// Split master weights, 8 lanes (hi in [0, 0xffff] and lo in [-0x8000, 0x7fff]: the packs keep them).
STEPCAST_TARGET_AVX2 inline __m256 load_master8(const uint16_t* hi, const int16_t* lo, int64_t i) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hi + i)));
  const __m256i l = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo + i)));
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(h, 16), l));
}

STEPCAST_TARGET_AVX2 inline void store_master8(uint16_t* hi, int16_t* lo, int64_t i, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i h = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8000)), 16);
  const __m256i r = _mm256_sub_epi32(u, _mm256_slli_epi32(h, 16));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(hi + i),
                   _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lo + i),
                   _mm_packs_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

}  // namespace stepcast::backend
