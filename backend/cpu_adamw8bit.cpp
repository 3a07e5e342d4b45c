// 8-bit AdamW on the CPU (declared in cpu_adamw.h): scalar and AVX-512
// bodies over one quantisation block at a time. Pass 1 dequantises, updates
// and writes the parameters, keeping the new fp32 moments of the block in a
// small buffer (L1/L2-resident) and their absmax; pass 2 quantises them.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "backend/adamw_math.h"
#include "backend/adamw_simd.h"
#include "backend/cpu_adamw.h"
#include "backend/quant8.h"

namespace stepcast::backend {

namespace {

using quant8::kBlock;

struct Block8 {
  float* p;
  uint8_t* qm;
  uint8_t* qv;
  float* am;  // this block's absmax (in: old, out: new)
  float* av;
  GradIn g;   // indexed from the block's start
  void* out;
  kernels::DType od;
  int64_t n;  // values in the block (kBlock but for the last)
};

// Elements [from, b.n) of a block, scalar; returns the running absmax.
void pass1_scalar(const Block8& b, int64_t from, const Consts& c, float* mb, float* vb, float& max_m, float& max_v) {
  const float am = *b.am, av = *b.av;
  for (int64_t i = from; i < b.n; ++i) {
    float m = quant8::decode_signed(b.qm[i]) * am;
    float v = quant8::decode_unsigned(b.qv[i]) * av;
    const float x = adamw_one(b.p[i], m, v, b.g.at(i), c);
    store_param(b.out, b.od, i, x);
    mb[i] = m;
    vb[i] = v;
    max_m = std::max(max_m, std::fabs(m));
    max_v = std::max(max_v, v);
  }
}

void pass2_scalar(const Block8& b, int64_t from, const float* mb, const float* vb, float inv_m, float inv_v) {
  for (int64_t i = from; i < b.n; ++i) {
    b.qm[i] = quant8::encode_signed(mb[i] * inv_m);
    b.qv[i] = quant8::encode_unsigned(vb[i] * inv_v);
  }
}

void block_scalar(const Block8& b, const Consts& c) {
  alignas(64) float mb[kBlock], vb[kBlock];
  float max_m = 0, max_v = 0;
  pass1_scalar(b, 0, c, mb, vb, max_m, max_v);
  *b.am = max_m;
  *b.av = max_v;
  pass2_scalar(b, 0, mb, vb, max_m > 0 ? 1.0f / max_m : 0.0f, max_v > 0 ? 1.0f / max_v : 0.0f);
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd")))

AVX512 inline __m512i load_codes(const uint8_t* q) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
}

// The map's constants in registers. Levels: first point and spacing per level
// (16 slots, a permute reads them; slot 15 is 0 so that code 0 decodes to 0).
// Encoding finds the level from the float's binade: y in [2^-i, 2^-i+1) has
// level base[i] + (y >= split[i]), since a binade holds at most one of the
// level thresholds (checked when the tables are built).
struct MapRegs {
  __m512 first, step, inv_step, zero_threshold;
  __m512i base_lo, base_hi;    // base[0..31]
  __m512 split_lo, split_hi;   // split[0..31]
};

AVX512 MapRegs map_regs(const quant8::Map& m) {
  alignas(64) float first[16] = {}, step[16] = {}, inv_step[16] = {}, split[32];
  alignas(64) int32_t base[32];
  for (int i = 0; i < m.bits; ++i) {
    first[i] = m.first[i];
    step[i] = m.step[i];
    inv_step[i] = m.inv_step[i];
  }
  for (int i = 0; i < 32; ++i) {
    const float lo = std::ldexp(1.0f, -i), hi = std::ldexp(1.0f, 1 - i);
    int level = 0, inside = 0;
    split[i] = 2.0f;  // no threshold in this binade: y < 2 always
    for (int k = 0; k + 1 < m.bits; ++k) {
      if (m.threshold[k] <= lo) ++level;
      else if (m.threshold[k] < hi) {
        split[i] = m.threshold[k];
        ++inside;
      }
    }
    if (inside > 1) throw std::logic_error("quant8: a binade holds two level thresholds");
    base[i] = level;
  }
  MapRegs r;
  r.first = _mm512_load_ps(first);
  r.step = _mm512_load_ps(step);
  r.inv_step = _mm512_load_ps(inv_step);
  r.zero_threshold = _mm512_set1_ps(m.zero_threshold);
  r.base_lo = _mm512_load_si512(base);
  r.base_hi = _mm512_load_si512(base + 16);
  r.split_lo = _mm512_load_ps(split);
  r.split_hi = _mm512_load_ps(split + 16);
  return r;
}

// quant8::encode_magnitude on 16 lanes; y already clamped to [0, 1].
AVX512 inline __m512i encode16(const MapRegs& r, __m512 y) {
  const __m512i one = _mm512_set1_epi32(1);
  // Binade index 127 - exponent, in [0, 31] (y <= 1; zero and tiny values land on 31).
  const __m512i binade = _mm512_min_epi32(
      _mm512_sub_epi32(_mm512_set1_epi32(127), _mm512_srli_epi32(_mm512_castps_si512(y), 23)), _mm512_set1_epi32(31));
  __m512i level = _mm512_permutex2var_epi32(r.base_lo, binade, r.base_hi);
  const __m512 split = _mm512_permutex2var_ps(r.split_lo, binade, r.split_hi);
  level = _mm512_mask_add_epi32(level, _mm512_cmp_ps_mask(y, split, _CMP_GE_OQ), level, one);
  const __m512 t = _mm512_mul_ps(_mm512_sub_ps(y, _mm512_permutexvar_ps(level, r.first)),
                                 _mm512_permutexvar_ps(level, r.inv_step));
  const __m512i base = _mm512_sllv_epi32(one, level);  // 2^level
  __m512i j = _mm512_cvtps_epi32(t);                   // round to nearest even, as the scalar encoder
  j = _mm512_max_epi32(_mm512_setzero_si512(), _mm512_min_epi32(j, _mm512_sub_epi32(base, one)));
  const __m512i code = _mm512_add_epi32(base, j);
  return _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(y, r.zero_threshold, _CMP_GE_OQ), code);
}

// quant8::decode_magnitude on 16 lanes: level = 31 - lzcnt(code); code 0 gives
// level -1, whose slot 15 holds zeros, and a shift count past 31 gives 0.
AVX512 inline __m512 decode16(const MapRegs& r, __m512i code) {
  const __m512i level = _mm512_sub_epi32(_mm512_set1_epi32(31), _mm512_lzcnt_epi32(code));
  const __m512i j = _mm512_sub_epi32(code, _mm512_sllv_epi32(_mm512_set1_epi32(1), level));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(j), _mm512_permutexvar_ps(level, r.step),
                         _mm512_permutexvar_ps(level, r.first));
}

// 1 / d and sqrt(v) from the 14-bit estimates plus one Newton step (~23 bits):
// pipelined, where the divide and the square root hold their unit for 12-16 cycles.
AVX512 inline __m512 recip(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

AVX512 inline __m512 sqrt_nr(__m512 v) {
  const __m512 rs = _mm512_rsqrt14_ps(v);
  const __m512 s0 = _mm512_mul_ps(v, rs);
  const __m512 s = _mm512_mul_ps(s0, _mm512_fnmadd_ps(_mm512_mul_ps(s0, rs), _mm512_set1_ps(0.5f), _mm512_set1_ps(1.5f)));
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ), s);  // sqrt(0) = 0, not 0 x inf
}

AVX512 void block_avx512(const Block8& b, const Consts& c) {
  alignas(64) float mb[kBlock], vb[kBlock];
  static const MapRegs smap = map_regs(quant8::signed_magnitudes());
  static const MapRegs umap = map_regs(quant8::unsigned_map());
  const AdamWRegs16 k = adamw_regs16(c);
  const __m512 am = _mm512_set1_ps(*b.am), av = _mm512_set1_ps(*b.av);
  const __m512i mask7 = _mm512_set1_epi32(0x7F), one = _mm512_set1_epi32(1);
  __m512 vmax_m = _mm512_setzero_ps(), vmax_v = _mm512_setzero_ps();
  const int64_t body = b.n / 16 * 16;
  for (int64_t i = 0; i < body; i += 16) {
    const __m512i cm = load_codes(b.qm + i), cv = load_codes(b.qv + i);
    const __m512 mag = decode16(smap, _mm512_and_si512(cm, mask7));
    const __m512i sign = _mm512_slli_epi32(_mm512_srli_epi32(cm, 7), 31);
    const __m512 m_old = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(mag), sign)), am);
    const __m512 v_old = _mm512_mul_ps(decode16(umap, cv), av);
    const __m512 gi = _mm512_mul_ps(load_grad16(b.g, i), k.sc);
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(b.p + i), k.dec);
    const __m512 mi = _mm512_fmadd_ps(k.b1, m_old, _mm512_mul_ps(k.omb1, gi));
    const __m512 vi = _mm512_fmadd_ps(k.b2, v_old, _mm512_mul_ps(k.omb2, _mm512_mul_ps(gi, gi)));
    const __m512 denom = _mm512_fmadd_ps(sqrt_nr(vi), k.ibc2, k.eps);
    x = _mm512_sub_ps(x, _mm512_mul_ps(k.ss, _mm512_mul_ps(mi, recip(denom))));
    _mm512_storeu_ps(b.p + i, x);
    _mm512_store_ps(mb + i, mi);
    _mm512_store_ps(vb + i, vi);
    vmax_m = _mm512_max_ps(vmax_m, _mm512_abs_ps(mi));
    vmax_v = _mm512_max_ps(vmax_v, vi);
    store_out16(b.out, b.od, i, x);
  }
  float max_m = _mm512_reduce_max_ps(vmax_m), max_v = _mm512_reduce_max_ps(vmax_v);
  pass1_scalar(b, body, c, mb, vb, max_m, max_v);
  *b.am = max_m;
  *b.av = max_v;
  const float inv_m = max_m > 0 ? 1.0f / max_m : 0.0f, inv_v = max_v > 0 ? 1.0f / max_v : 0.0f;

  const __m512 vinv_m = _mm512_set1_ps(inv_m), vinv_v = _mm512_set1_ps(inv_v), ones = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < body; i += 16) {
    const __m512 m = _mm512_mul_ps(_mm512_load_ps(mb + i), vinv_m);
    const __m512 v = _mm512_mul_ps(_mm512_load_ps(vb + i), vinv_v);
    // min(y, 1) also maps NaN to 1 (the second operand is returned), as the scalar encoder does.
    __m512i qm = encode16(smap, _mm512_min_ps(_mm512_abs_ps(m), ones));
    qm = _mm512_or_si512(qm, _mm512_slli_epi32(_mm512_srli_epi32(_mm512_castps_si512(m), 31), 7));
    const __m512 yv = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), ones);
    __m512i qv = encode16(umap, yv);
    const __mmask16 positive_zero = _mm512_mask_cmpeq_epi32_mask(_mm512_cmp_ps_mask(yv, _mm512_setzero_ps(), _CMP_GT_OQ),
                                                                 qv, _mm512_setzero_si512());
    qv = _mm512_mask_mov_epi32(qv, positive_zero, one);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qm + i), _mm512_cvtepi32_epi8(qm));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qv + i), _mm512_cvtepi32_epi8(qv));
  }
  pass2_scalar(b, body, mb, vb, inv_m, inv_v);
}

#define AVX2 __attribute__((target("avx2,fma")))

struct MapRegs8 {
  __m256 first, step, inv_step, zero_threshold;
  __m256 threshold[7];
  int levels;
};

AVX2 MapRegs8 map_regs8(const quant8::Map& m) {
  MapRegs8 r;
  r.first = _mm256_loadu_ps(m.first);  // levels 0..7 (8 slots: one permutevar8x32)
  r.step = _mm256_loadu_ps(m.step);
  r.inv_step = _mm256_loadu_ps(m.inv_step);
  r.zero_threshold = _mm256_set1_ps(m.zero_threshold);
  r.levels = m.bits;
  for (int k = 0; k + 1 < m.bits; ++k) r.threshold[k] = _mm256_set1_ps(m.threshold[k]);
  return r;
}

AVX2 inline __m256i encode8(const MapRegs8& r, __m256 y) {
  const __m256i one = _mm256_set1_epi32(1);
  __m256i level = _mm256_setzero_si256();
  for (int k = 0; k + 1 < r.levels; ++k)
    level = _mm256_sub_epi32(level, _mm256_castps_si256(_mm256_cmp_ps(y, r.threshold[k], _CMP_GE_OQ)));
  const __m256 t = _mm256_mul_ps(_mm256_sub_ps(y, _mm256_permutevar8x32_ps(r.first, level)),
                                 _mm256_permutevar8x32_ps(r.inv_step, level));
  const __m256i base = _mm256_sllv_epi32(one, level);
  __m256i j = _mm256_cvtps_epi32(t);
  j = _mm256_max_epi32(_mm256_setzero_si256(), _mm256_min_epi32(j, _mm256_sub_epi32(base, one)));
  const __m256i nonzero = _mm256_castps_si256(_mm256_cmp_ps(y, r.zero_threshold, _CMP_GE_OQ));
  return _mm256_and_si256(_mm256_add_epi32(base, j), nonzero);
}

AVX2 inline __m256 decode8(const MapRegs8& r, __m256i code) {
  const __m256i level =
      _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(code)), 23), _mm256_set1_epi32(127));
  const __m256i j = _mm256_sub_epi32(code, _mm256_sllv_epi32(_mm256_set1_epi32(1), level));
  const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(j), _mm256_permutevar8x32_ps(r.step, level),
                                   _mm256_permutevar8x32_ps(r.first, level));
  const __m256i is_zero = _mm256_cmpeq_epi32(code, _mm256_setzero_si256());
  return _mm256_andnot_ps(_mm256_castsi256_ps(is_zero), v);
}

AVX2 inline void store_codes8(uint8_t* q, __m256i c) {
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packus_epi16(w, w));
}

AVX2 inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

AVX2 void block_avx2(const Block8& b, const Consts& c) {
  alignas(64) float mb[kBlock], vb[kBlock];
  const MapRegs8 smap = map_regs8(quant8::signed_magnitudes());
  const MapRegs8 umap = map_regs8(quant8::unsigned_map());
  const AdamWRegs8 k = adamw_regs8(c);
  const __m256 am = _mm256_set1_ps(*b.am), av = _mm256_set1_ps(*b.av);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i mask7 = _mm256_set1_epi32(0x7F), one = _mm256_set1_epi32(1);
  __m256 vmax_m = _mm256_setzero_ps(), vmax_v = _mm256_setzero_ps();
  const int64_t body = b.n / 8 * 8;
  for (int64_t i = 0; i < body; i += 8) {
    const __m256i cm = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qm + i)));
    const __m256i cv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qv + i)));
    const __m256 mag = decode8(smap, _mm256_and_si256(cm, mask7));
    const __m256i sign = _mm256_slli_epi32(_mm256_srli_epi32(cm, 7), 31);
    const __m256 m_old = _mm256_mul_ps(_mm256_xor_ps(mag, _mm256_castsi256_ps(sign)), am);
    const __m256 v_old = _mm256_mul_ps(decode8(umap, cv), av);
    const __m256 gi = _mm256_mul_ps(load_grad8(b.g, i), k.sc);
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(b.p + i), k.dec);
    const __m256 mi = _mm256_fmadd_ps(k.b1, m_old, _mm256_mul_ps(k.omb1, gi));
    const __m256 vi = _mm256_fmadd_ps(k.b2, v_old, _mm256_mul_ps(k.omb2, _mm256_mul_ps(gi, gi)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), k.ibc2, k.eps);
    x = _mm256_sub_ps(x, _mm256_mul_ps(k.ss, _mm256_div_ps(mi, denom)));
    _mm256_storeu_ps(b.p + i, x);
    _mm256_store_ps(mb + i, mi);
    _mm256_store_ps(vb + i, vi);
    vmax_m = _mm256_max_ps(vmax_m, _mm256_and_ps(mi, abs_mask));
    vmax_v = _mm256_max_ps(vmax_v, vi);
    store_out8(b.out, b.od, i, x);
  }
  float max_m = hmax8(vmax_m), max_v = hmax8(vmax_v);
  pass1_scalar(b, body, c, mb, vb, max_m, max_v);
  *b.am = max_m;
  *b.av = max_v;
  const float inv_m = max_m > 0 ? 1.0f / max_m : 0.0f, inv_v = max_v > 0 ? 1.0f / max_v : 0.0f;

  const __m256 vinv_m = _mm256_set1_ps(inv_m), vinv_v = _mm256_set1_ps(inv_v), ones = _mm256_set1_ps(1.0f),
               zeros = _mm256_setzero_ps();
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 m = _mm256_mul_ps(_mm256_load_ps(mb + i), vinv_m);
    const __m256 v = _mm256_mul_ps(_mm256_load_ps(vb + i), vinv_v);
    // min(y, 1) maps NaN to 1 (the second operand), as the scalar encoder does.
    __m256i qm = encode8(smap, _mm256_min_ps(_mm256_and_ps(m, abs_mask), ones));
    qm = _mm256_or_si256(qm, _mm256_slli_epi32(_mm256_srli_epi32(_mm256_castps_si256(m), 31), 7));
    const __m256 yv = _mm256_min_ps(_mm256_max_ps(v, zeros), ones);
    __m256i qv = encode8(umap, yv);
    // A positive second moment never becomes 0: code 0 with y > 0 takes code 1.
    const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(yv, zeros, _CMP_GT_OQ));
    const __m256i zero_code = _mm256_cmpeq_epi32(qv, _mm256_setzero_si256());
    qv = _mm256_or_si256(qv, _mm256_and_si256(_mm256_and_si256(positive, zero_code), one));
    store_codes8(b.qm + i, qm);
    store_codes8(b.qv + i, qv);
  }
  pass2_scalar(b, body, mb, vb, inv_m, inv_v);
}

}  // namespace

void cpu_adamw8bit(float* master, uint8_t* qm, uint8_t* qv, float* am, float* av, const void* grad,
                   kernels::DType grad_dtype, void* out, kernels::DType out_dtype, int64_t n,
                   const kernels::AdamWArgs& a, SimdLevel level) {
  const Consts c = consts_of(a);
  if (level == SimdLevel::kAuto) level = tuned_simd_level(CpuKernel::kAdamW8bit);
  // The AVX-512 body also needs AVX512CD (lzcnt); without it the AVX2 body runs.
  static const bool has_cd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512cd") != 0;
  }();
  const int64_t gsize = grad_dtype == kernels::DType::kBFloat16 ? 2 : 4;
  const int64_t osize = out_dtype == kernels::DType::kBFloat16 ? 2 : 4;
  cpu_parallel_for(n, kBlock, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; s += kBlock) {
      const int64_t k = s / kBlock;
      Block8 b{master + s,
               qm + s,
               qv + s,
               am + k,
               av + k,
               GradIn{static_cast<const char*>(grad) + s * gsize, grad_dtype},
               out ? static_cast<char*>(out) + s * osize : nullptr,
               out_dtype,
               std::min(kBlock, n - s)};
      switch (level) {
        case SimdLevel::kAvx512:
          if (has_cd) block_avx512(b, c);
          else block_avx2(b, c);
          break;
        case SimdLevel::kAvx2: block_avx2(b, c); break;
        default: block_scalar(b, c); break;
      }
    }
  });
}

}  // namespace stepcast::backend
