// 8-bit AdamW on the CPU (declared in cpu_adamw.h): scalar and AVX-512
// bodies over one quantisation block at a time. Pass 1 dequantises, updates
// and writes the parameters, keeping the new fp32 moments of the block in a
// small buffer (L1/L2-resident) and their absmax; pass 2 quantises them.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>
#include <stdexcept>
#include <string>

#include "backend/adamw_math.h"
#include "backend/adamw_simd.h"
#include "backend/cpu_adamw.h"
#include "backend/quant8.h"
#include "model/errors.h"

namespace stepcast::backend {

namespace {

using quant8::kBlock;

struct Block8 {
  float* p;       // fp32 master weights, or null with the split ones below
  uint16_t* hi;   // split master weights (cpu_adamw.h): the bf16 upper half, which is the upload copy
  int16_t* lo;    // and the signed remainder
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
    if (b.hi) {
      float x = join_master(b.hi[i], b.lo[i]);
      adamw_one(x, m, v, b.g.at(i), c);
      split_master(x, b.hi[i], b.lo[i]);
    } else {
      store_param(b.out, b.od, i, adamw_one(b.p[i], m, v, b.g.at(i), c));
    }
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

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

// Software prefetch of a later block into L2 while this one is computed: the two passes
// are compute-heavy, and the hardware streamers restart at every 4 KiB page of the five
// streams. A block's lines come in 32 groups of 64 elements (parameters 4 lines, gradient
// 2 (bf16) or 4 (fp32), each code array 1). $STEPCAST_Q8_PREFETCH picks the plan:
//   pass2: the next block's 32 groups during pass 2 only (session 4's kernel);
//   0: none;  D (1..8): block k + D's groups spread over both passes (16 in pass 1, one
//   every 8 iterations; 16 in pass 2, one every 2), so that requests leave at an even rate.
constexpr int kPrefetchPass2 = -1;

int prefetch_plan() {
  static const int plan = [] {
    const char* env = std::getenv("STEPCAST_Q8_PREFETCH");
    if (!env || !*env) return 2;
    const std::string e(env);
    if (e == "pass2") return kPrefetchPass2;
    if (e.size() == 1 && e[0] >= '0' && e[0] <= '8') return e[0] - '0';
    throw InputError("STEPCAST_Q8_PREFETCH=\"" + e + "\" is not valid (valid: pass2, 0 to 8)");
  }();
  return plan;
}

struct PrefetchLines {
  const char* p;   // fp32 master, or the split master's upper half
  const char* lo;  // the split master's remainder (null without)
  const char* g;
  const char* qm;
  const char* qv;
  int g_lines;  // gradient lines per group

  PrefetchLines(const Block8& b, int blocks_ahead) {
    const int64_t ahead = blocks_ahead * kBlock, gsize = b.g.dtype == kernels::DType::kBFloat16 ? 2 : 4;
    p = b.hi ? reinterpret_cast<const char*>(b.hi + ahead) : reinterpret_cast<const char*>(b.p + ahead);
    lo = b.hi ? reinterpret_cast<const char*>(b.lo + ahead) : nullptr;
    g = static_cast<const char*>(b.g.ptr) + ahead * gsize;
    qm = reinterpret_cast<const char*>(b.qm + ahead);
    qv = reinterpret_cast<const char*>(b.qv + ahead);
    g_lines = static_cast<int>(gsize);  // 64 elements x gsize bytes / 64
  }
  // Group j (elements 64 j .. 64 j + 63). Prefetches past the arrays' end never fault.
  void group(int64_t j) const {
    if (lo) {
      for (int u = 0; u < 2; ++u) _mm_prefetch(p + (2 * j + u) * 64, _MM_HINT_T1);
      for (int u = 0; u < 2; ++u) _mm_prefetch(lo + (2 * j + u) * 64, _MM_HINT_T1);
    } else {
      for (int u = 0; u < 4; ++u) _mm_prefetch(p + (4 * j + u) * 64, _MM_HINT_T1);
    }
    for (int u = 0; u < g_lines; ++u) _mm_prefetch(g + (g_lines * j + u) * 64, _MM_HINT_T1);
    _mm_prefetch(qm + j * 64, _MM_HINT_T1);
    _mm_prefetch(qv + j * 64, _MM_HINT_T1);
  }
};

AVX512 inline __m512i load_codes(const uint8_t* q) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
}

// The AVX-512 body is written for few operations per element (it is compute-
// bound on 16 threads of a Sapphire Rapids host, where fp32 AdamW is memory-
// bound): both directions of the map are table lookups keyed by a float's
// exponent, the tables carry the block's scale, and the reciprocal square
// root and reciprocal are the 14-bit estimates (relative error 2^-14, far
// under the 8-bit states' own; the fp32 kernel keeps exact division).
//
// Decoding: the code c, as a float f = c x 2^shift, has exponent 127 + shift
// + level and its top fraction bit splits the level in two; bits(f) >> 22
// (5 bits) picks one of 32 slots holding the level's line: value =
// f x slope + intercept. Every code of a slot lies on one line (checked when
// the table is built). The signed map's magnitude is shifted by 24, next to
// the sign bit, which then flips the value.
struct DecodeTable {
  alignas(64) float intercept[32];
  alignas(64) float slope[32];
};

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

DecodeTable decode_table(const quant8::Map& m, int shift) {
  DecodeTable t{};
  bool used[32] = {};
  int zero_slot_codes = 0;
  const int codes = 1 << m.bits;
  for (int c = 0; c < codes; ++c) {
    const float f = std::ldexp(static_cast<float>(c), shift);
    const int s = static_cast<int>(float_bits(f) >> 22) & 31;
    const float value = quant8::decode_magnitude(m, static_cast<uint8_t>(c));
    float slope, intercept;
    if (c == 0 || (s == 0 && shift == 0)) {
      // Code 0 is f = 0, slot 0, which (unshifted) it shares with code 2: the line through the origin.
      ++zero_slot_codes;
      slope = c == 0 ? 0.0f : value / f;
      intercept = 0.0f;
      if (c == 0 && shift == 0) continue;  // the next code of slot 0 sets the slope
    } else {
      const int level = 31 - __builtin_clz(static_cast<unsigned>(c));
      slope = level == 0 ? 0.0f : std::ldexp(m.step[level], -shift);
      intercept = level == 0 ? m.first[0] : m.first[level] - static_cast<float>(1 << level) * m.step[level];
    }
    if (used[s] && (t.slope[s] != slope || t.intercept[s] != intercept))
      throw std::logic_error("quant8: two lines share a decode slot");
    used[s] = true;
    t.slope[s] = slope;
    t.intercept[s] = intercept;
  }
  if (shift == 0 && zero_slot_codes != 2) throw std::logic_error("quant8: slot 0 holds codes other than 0 and 2");
  return t;
}

// Encoding: y in [2^-31, 1] (clamped) is looked up by its exponent e (slot e & 31,
// one slot per binade). A binade holds at most one of the thresholds between
// levels (checked here); the slot gives the level index below it (base) and
// that threshold (split, 2 if none). Level index k: 0 below the zero
// threshold, level + 1 above; per k, code = min(round(y x inv_step + offset), top).
// Rounding cannot fall below the level's first code: the gap between levels is
// exactly the upper level's step, so at the threshold t = 2^level - 0.5.
struct EncodeTable {
  alignas(64) float split[32];
  alignas(64) int32_t base[32];
  alignas(64) float inv_step[16];
  alignas(64) float offset[16];
  alignas(64) int32_t top[16];
};

EncodeTable encode_table(const quant8::Map& m, int below_zero_code) {
  EncodeTable t{};
  std::vector<float> thresholds{m.zero_threshold};
  for (int k = 0; k + 1 < m.bits; ++k) thresholds.push_back(m.threshold[k]);
  for (int s = 0; s < 32; ++s) {
    const float lo = std::ldexp(1.0f, s - 31), hi = 2.0f * lo;  // exponent 96 + s
    int base = 0, inside = 0;
    t.split[s] = 2.0f;
    for (float thr : thresholds) {
      if (thr <= lo) ++base;
      else if (thr < hi) {
        t.split[s] = thr;
        ++inside;
      }
    }
    if (inside > 1) throw std::logic_error("quant8: a binade holds two level thresholds");
    t.base[s] = base;
  }
  t.inv_step[0] = 0.0f;
  t.offset[0] = static_cast<float>(below_zero_code);
  t.top[0] = below_zero_code;
  for (int level = 0; level < m.bits; ++level) {
    t.inv_step[level + 1] = m.inv_step[level];
    t.offset[level + 1] = static_cast<float>(1 << level) - m.first[level] * m.inv_step[level];
    t.top[level + 1] = (2 << level) - 1;
  }
  return t;
}

struct EncodeRegs {
  __m512 split_lo, split_hi, inv_step, offset;
  __m512i base_lo, base_hi, top;
};

AVX512 EncodeRegs encode_regs(const EncodeTable& t) {
  return {_mm512_load_ps(t.split),     _mm512_load_ps(t.split + 16),
          _mm512_load_ps(t.inv_step),  _mm512_load_ps(t.offset),
          _mm512_load_si512(t.base),   _mm512_load_si512(t.base + 16),
          _mm512_load_si512(t.top)};
}

// y already in [2^-31, 1].
AVX512 inline __m512 encode_t(const EncodeRegs& r, __m512 y, __m512i& top) {
  const __m512i s = _mm512_srli_epi32(_mm512_castps_si512(y), 23);  // permutes read its low 5 bits
  __m512i k = _mm512_permutex2var_epi32(r.base_lo, s, r.base_hi);
  const __m512 split = _mm512_permutex2var_ps(r.split_lo, s, r.split_hi);
  k = _mm512_mask_add_epi32(k, _mm512_cmp_ps_mask(y, split, _CMP_GE_OQ), k, _mm512_set1_epi32(1));
  top = _mm512_permutexvar_epi32(k, r.top);
  return _mm512_fmadd_ps(y, _mm512_permutexvar_ps(k, r.inv_step), _mm512_permutexvar_ps(k, r.offset));
}

// 4 x 16 codes (0..255 in int32 lanes) -> 64 bytes in order.
AVX512 inline void store_codes64(uint8_t* q, __m512i a, __m512i b, __m512i c, __m512i d) {
  // The packs interleave per 128-bit lane: dword 4 l + r holds register r's lane l.
  const __m512i packed = _mm512_packus_epi16(_mm512_packus_epi32(a, b), _mm512_packus_epi32(c, d));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_storeu_si512(q, _mm512_permutexvar_epi32(order, packed));
}

// The bf16 copy: the AVX512_BF16 conversion where the CPU has it (round to nearest
// even; it also flushes fp32 denormals, which parameters are not), else the integer
// rounding of store_out16. Inline assembly, so that this function needs no BF16 target.
// Plain stores: with the fp32 kernel's non-temporal stores (half lines, interleaved with
// this kernel's two passes) the 8-bit update ran 2.1x slower at 16 threads on the H200
// host's Xeon (2.98 against 6.27 Gparam/s, same run).
template <bool kNativeBf16>
AVX512 inline void store_out16_8bit(void* out, kernels::DType od, int64_t i, __m512 x) {
  if constexpr (kNativeBf16) {
    if (out && od == kernels::DType::kBFloat16) {
      __m256i h;
      asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(x));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), h);
      return;
    }
  }
  store_out16(out, od, i, x);
}

template <bool kNativeBf16, bool kSplit>
AVX512 void block_avx512(const Block8& b, const Consts& c) {
  alignas(64) float mb[kBlock], vb[kBlock];
  static const DecodeTable sdec = decode_table(quant8::signed_magnitudes(), 24);
  static const DecodeTable udec = decode_table(quant8::unsigned_map(), 0);
  static const EncodeTable senc = encode_table(quant8::signed_magnitudes(), 0);
  static const EncodeTable uenc = encode_table(quant8::unsigned_map(), 1);
  // The block's scale and the betas ride in the decode lines: they give b1 m and b2 v.
  const __m512 sm = _mm512_set1_ps(*b.am * c.b1), sv = _mm512_set1_ps(*b.av * c.b2);
  const __m512 m_int_lo = _mm512_mul_ps(_mm512_load_ps(sdec.intercept), sm);
  const __m512 m_int_hi = _mm512_mul_ps(_mm512_load_ps(sdec.intercept + 16), sm);
  const __m512 m_slope_lo = _mm512_mul_ps(_mm512_load_ps(sdec.slope), sm);
  const __m512 m_slope_hi = _mm512_mul_ps(_mm512_load_ps(sdec.slope + 16), sm);
  const __m512 v_int_lo = _mm512_mul_ps(_mm512_load_ps(udec.intercept), sv);
  const __m512 v_int_hi = _mm512_mul_ps(_mm512_load_ps(udec.intercept + 16), sv);
  const __m512 v_slope_lo = _mm512_mul_ps(_mm512_load_ps(udec.slope), sv);
  const __m512 v_slope_hi = _mm512_mul_ps(_mm512_load_ps(udec.slope + 16), sv);
  // The gradient's scale rides in the moments' gradient terms.
  const __m512 gm = _mm512_set1_ps(c.one_minus_b1 * c.scale), gv = _mm512_set1_ps(c.one_minus_b2 * c.scale * c.scale);
  const __m512 dec = _mm512_set1_ps(c.decay), ibc2 = _mm512_set1_ps(c.inv_bc2_sqrt), eps = _mm512_set1_ps(c.eps),
               ss = _mm512_set1_ps(c.step_size), tiny = _mm512_set1_ps(FLT_MIN);
  const __m512i sign_bit = _mm512_set1_epi32(INT32_MIN), magnitude_bits = _mm512_set1_epi32(0x7F000000);
  __m512 vmax_m = _mm512_setzero_ps(), vmin_m = _mm512_setzero_ps(), vmax_v = _mm512_setzero_ps();
  const int plan = prefetch_plan();
  const PrefetchLines ahead(b, plan == kPrefetchPass2 ? 1 : plan);
  const bool spread = plan > 0 && b.n == kBlock;
  const int64_t body = b.n / 16 * 16;
  for (int64_t i = 0; i < body; i += 16) {
    if (spread && (i & 127) == 0) ahead.group(i / 128);  // groups 0 .. 15
    // b1 m_old: the magnitude bits as f = (code & 0x7F) << 24, the sign (bit 7) flips the value.
    const __m512i shifted = _mm512_slli_epi32(load_codes(b.qm + i), 24);
    const __m512 fm = _mm512_cvtepi32_ps(_mm512_and_si512(shifted, magnitude_bits));
    const __m512i sm_slot = _mm512_srli_epi32(_mm512_castps_si512(fm), 22);
    const __m512 m_mag = _mm512_fmadd_ps(fm, _mm512_permutex2var_ps(m_slope_lo, sm_slot, m_slope_hi),
                                         _mm512_permutex2var_ps(m_int_lo, sm_slot, m_int_hi));
    const __m512 m_old = _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(_mm512_castps_si512(m_mag), shifted, sign_bit, 0x78));  // A ^ (B & C)
    // b2 v_old.
    const __m512 fv = _mm512_cvtepi32_ps(load_codes(b.qv + i));
    const __m512i sv_slot = _mm512_srli_epi32(_mm512_castps_si512(fv), 22);
    const __m512 v_old = _mm512_fmadd_ps(fv, _mm512_permutex2var_ps(v_slope_lo, sv_slot, v_slope_hi),
                                         _mm512_permutex2var_ps(v_int_lo, sv_slot, v_int_hi));
    const __m512 g = load_grad16(b.g, i);
    const __m512 mi = _mm512_fmadd_ps(gm, g, m_old);
    const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(gv, g), g, v_old);
    // sqrt(v) = v / sqrt(v), with v >= FLT_MIN in the estimate so that v = 0 gives 0.
    const __m512 root = _mm512_mul_ps(vi, _mm512_rsqrt14_ps(_mm512_max_ps(vi, tiny)));
    const __m512 inv_denom = _mm512_rcp14_ps(_mm512_fmadd_ps(root, ibc2, eps));
    const __m512 x_old = kSplit ? load_master16(b.hi, b.lo, i) : _mm512_loadu_ps(b.p + i);
    const __m512 x = _mm512_fnmadd_ps(ss, _mm512_mul_ps(mi, inv_denom), _mm512_mul_ps(x_old, dec));
    if constexpr (kSplit) {
      store_master16(b.hi, b.lo, i, x);
    } else {
      _mm512_storeu_ps(b.p + i, x);
      store_out16_8bit<kNativeBf16>(b.out, b.od, i, x);
    }
    _mm512_store_ps(mb + i, mi);
    _mm512_store_ps(vb + i, vi);
    vmax_m = _mm512_max_ps(vmax_m, mi);
    vmin_m = _mm512_min_ps(vmin_m, mi);
    vmax_v = _mm512_max_ps(vmax_v, vi);
  }
  float max_m = std::max(_mm512_reduce_max_ps(vmax_m), -_mm512_reduce_min_ps(vmin_m));
  float max_v = _mm512_reduce_max_ps(vmax_v);
  pass1_scalar(b, body, c, mb, vb, max_m, max_v);
  *b.am = max_m;
  *b.av = max_v;
  const float inv_m = max_m > 0 ? 1.0f / max_m : 0.0f, inv_v = max_v > 0 ? 1.0f / max_v : 0.0f;

  const EncodeRegs es = encode_regs(senc), eu = encode_regs(uenc);
  const __m512 vinv_m = _mm512_set1_ps(inv_m), vinv_v = _mm512_set1_ps(inv_v), ones = _mm512_set1_ps(1.0f),
               floor_y = _mm512_set1_ps(0x1p-31f), abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(INT32_MAX));
  const __m512i sign_to_bit7 = _mm512_set1_epi32(0x80);
  const int64_t body64 = b.n / 64 * 64;
  // Pass 2 works in L1: without prefetches it leaves the memory bus idle.
  for (int64_t i = 0; i < body64; i += 64) {
    const int64_t line = i / 64;  // 0 .. 31
    if (plan == kPrefetchPass2) ahead.group(line);
    else if (spread && (line & 1) == 0) ahead.group(16 + line / 2);  // groups 16 .. 31
    __m512i qm[4], qv[4];
    for (int u = 0; u < 4; ++u) {
      const int64_t k = i + 16 * u;
      // min(y, 1) also maps NaN to 1 (the second operand is returned), as the scalar encoder does.
      const __m512 m = _mm512_mul_ps(_mm512_load_ps(mb + k), vinv_m);
      const __m512 ym = _mm512_max_ps(_mm512_min_ps(_mm512_and_ps(m, abs_mask), ones), floor_y);
      __m512i top;
      const __m512 tm = encode_t(es, ym, top);
      qm[u] = _mm512_ternarylogic_epi32(_mm512_min_epi32(_mm512_cvtps_epi32(tm), top),
                                        _mm512_srli_epi32(_mm512_castps_si512(m), 24), sign_to_bit7,
                                        0xF8);  // A | (B & C): the sign into bit 7
      const __m512 yv0 = _mm512_min_ps(_mm512_mul_ps(_mm512_load_ps(vb + k), vinv_v), ones);
      const __mmask16 positive = _mm512_cmp_ps_mask(yv0, _mm512_setzero_ps(), _CMP_GT_OQ);
      const __m512 tv = encode_t(eu, _mm512_max_ps(yv0, floor_y), top);
      qv[u] = _mm512_min_epi32(_mm512_maskz_cvtps_epi32(positive, tv), top);  // 0 stays 0; positive is >= 1
    }
    store_codes64(b.qm + i, qm[0], qm[1], qm[2], qm[3]);
    store_codes64(b.qv + i, qv[0], qv[1], qv[2], qv[3]);
  }
  pass2_scalar(b, body64, mb, vb, inv_m, inv_v);
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
    __m256 x = _mm256_mul_ps(b.hi ? load_master8(b.hi, b.lo, i) : _mm256_loadu_ps(b.p + i), k.dec);
    const __m256 mi = _mm256_fmadd_ps(k.b1, m_old, _mm256_mul_ps(k.omb1, gi));
    const __m256 vi = _mm256_fmadd_ps(k.b2, v_old, _mm256_mul_ps(k.omb2, _mm256_mul_ps(gi, gi)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), k.ibc2, k.eps);
    x = _mm256_sub_ps(x, _mm256_mul_ps(k.ss, _mm256_div_ps(mi, denom)));
    if (b.hi) {
      store_master8(b.hi, b.lo, i, x);
    } else {
      _mm256_storeu_ps(b.p + i, x);
      store_out8(b.out, b.od, i, x);
    }
    _mm256_store_ps(mb + i, mi);
    _mm256_store_ps(vb + i, vi);
    vmax_m = _mm256_max_ps(vmax_m, _mm256_and_ps(mi, abs_mask));
    vmax_v = _mm256_max_ps(vmax_v, vi);
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

// Either master (fp32) with out, or hi and lo (split master weights, no separate copy).
void run8(float* master, uint16_t* hi, int16_t* lo, uint8_t* qm, uint8_t* qv, float* am, float* av, const void* grad,
          kernels::DType grad_dtype, void* out, kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& a,
          SimdLevel level) {
  const Consts c = consts_of(a);
  if (level == SimdLevel::kAuto) level = tuned_simd_level(CpuKernel::kAdamW8bit);
  prefetch_plan();  // a bad $STEPCAST_Q8_PREFETCH throws here, not on a worker thread
  static const bool has_bf16 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  const int64_t gsize = grad_dtype == kernels::DType::kBFloat16 ? 2 : 4;
  const int64_t osize = out_dtype == kernels::DType::kBFloat16 ? 2 : 4;
  cpu_parallel_for(n, kBlock, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; s += kBlock) {
      const int64_t k = s / kBlock;
      Block8 b{master ? master + s : nullptr,
               hi ? hi + s : nullptr,
               lo ? lo + s : nullptr,
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
          if (hi) block_avx512<false, true>(b, c);
          else if (has_bf16) block_avx512<true, false>(b, c);
          else block_avx512<false, false>(b, c);
          break;
        case SimdLevel::kAvx2: block_avx2(b, c); break;
        default: block_scalar(b, c); break;
      }
    }
  });
}

}  // namespace

void cpu_adamw8bit(float* master, uint8_t* qm, uint8_t* qv, float* am, float* av, const void* grad,
                   kernels::DType grad_dtype, void* out, kernels::DType out_dtype, int64_t n,
                   const kernels::AdamWArgs& a, SimdLevel level) {
  run8(master, nullptr, nullptr, qm, qv, am, av, grad, grad_dtype, out, out_dtype, n, a, level);
}

void cpu_adamw8bit_split(uint16_t* master_hi, int16_t* master_lo, uint8_t* qm, uint8_t* qv, float* am, float* av,
                         const void* grad, kernels::DType grad_dtype, int64_t n, const kernels::AdamWArgs& a,
                         SimdLevel level) {
  run8(nullptr, master_hi, master_lo, qm, qv, am, av, grad, grad_dtype, nullptr, kernels::DType::kBFloat16, n, a,
       level);
}

}  // namespace stepcast::backend
