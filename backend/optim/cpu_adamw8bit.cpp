// 8-bit AdamW on the CPU (declared in cpu_adamw.h): scalar and AVX-512
// bodies over one quantisation block at a time. Pass 1 dequantises, updates
// and writes the parameters, keeping the new fp32 moments of the block in a
// small buffer (L1/L2-resident) and their absmax; pass 2 quantises them.
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>
#include <stdexcept>
#include <string>

#include "backend/optim/adamw_math.h"
#include "backend/optim/adamw_simd.h"
#include "backend/optim/cpu_adamw.h"
#include "backend/optim/quant8.h"
#include "common/errors.h"

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

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512cd")))

// Software prefetch of a later block into L2 while this one is computed: the two passes
// are compute-heavy, and the hardware streamers restart at every 4 KiB page of the five
// streams. A block's lines come in 32 groups of 64 elements (parameters 4 lines, gradient
// 2 (bf16) or 4 (fp32), each code array 1); the groups of the block kPrefetchBlocksAhead
// ahead are spread over both passes (16 in pass 1, one every 8 iterations; 16 in pass 2,
// one every 2), so that requests leave at an even rate (data/bench/h200-sxm, a50b8f2).
constexpr int kPrefetchBlocksAhead = 2;

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

// The AVX-512 body is written for few vector operations per element: on 16
// threads of the one-GPU H200 host's Xeon it was bound by the vector ports
// (pass 1 alone ran at the DRAM bound, pass 2 alone at twice the speed of
// both: docs/backend_v2_results.md); with the encoder below it
// runs at 80-85 % of the bandwidth bound. Both directions
// of the map are table lookups in registers, the tables carry the block's
// scale, and the reciprocal square root and reciprocal are the 14-bit
// estimates (relative error 2^-14, far under the 8-bit states' own; the fp32
// kernel keeps exact division).
//
// Decoding: the code's magnitude as an integer (the m code's 7 bits shifted
// up by 24, next to its sign bit; the v code as is) has the level in its
// leading zeros, lzcnt = 31 - shift - level, and lzcnt & 15 picks one of 16
// slots (32 for code 0: slot 0) holding the level's line, value =
// float(integer) x slope + intercept: one-register lookups.
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

struct DecodeTable {
  alignas(64) float intercept[16];
  alignas(64) float slope[16];
};

DecodeTable decode_table(const quant8::Map& m, int shift) {
  DecodeTable t{};  // slot 0: code 0, the zero line
  bool used[16] = {true};
  for (int level = 0; level < m.bits; ++level) {
    const int slot = (31 - shift - level) & 15;
    if (used[slot]) throw InternalError("quant8: two levels share a decode slot");
    used[slot] = true;
    // Level 0 is one point; the others are lines through their evenly spaced points.
    t.slope[slot] = level == 0 ? 0.0f : std::ldexp(m.step[level], -shift);
    t.intercept[slot] = level == 0 ? m.first[0] : m.first[level] - static_cast<float>(1 << level) * m.step[level];
  }
  for (int c = 0; c < (1 << m.bits); ++c) {  // every code decodes to its point (to float rounding)
    const int slot = (c == 0 ? 32 : __builtin_clz(static_cast<unsigned>(c) << shift)) & 15;
    const float f = std::ldexp(static_cast<float>(c), shift);
    const float value = std::fma(f, t.slope[slot], t.intercept[slot]);
    const float point = quant8::decode_magnitude(m, static_cast<uint8_t>(c));
    if (std::fabs(value - point) > 1e-6f * point) throw InternalError("quant8: a decode line misses its point");
  }
  return t;
}

// A code's magnitude as an integer (lanes of 32 bits) -> its value: the line of the slot
// its leading zeros pick (the tables carry the block's scale).
AVX512 inline __m512 decode_lines(__m512i magnitude, __m512 slope, __m512 intercept) {
  const __m512i slot = _mm512_lzcnt_epi32(magnitude);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(magnitude), _mm512_permutexvar_ps(slot, slope),
                         _mm512_permutexvar_ps(slot, intercept));
}

// Encoding. Join the map's points p_0 = 0 < p_1 < ... (decode_magnitude) by straight
// lines: the interpolant t(y), with t(p_c) = c, crosses c + 1/2 at the midpoint of p_c and
// p_c+1, so round(t(y)) is the code of the nearest point. Its pieces: line 0 through 0 and
// the smallest point (slope 1 / first[0]), then level L's line (L = 1 .. bits - 1), which
// already passes through level L - 1's last point (the gap from there to level L's first
// point is level L's step, 10^(L - bits + 1) x 0.9 / 2^L). The slopes fall (by 4.5, then
// by 5 per level), so t is concave: it is the minimum of its lines, and of any subset of
// them that holds the line in force. Line L gives way to L + 1 at level L's last point, a
// decade below the next switch, so that an interval of two binades holds at most one switch
// and t there is the smaller of two lines.
//
// The kernel encodes the moment x itself, not y = x / absmax: per block, each of the 16
// two-binade slots of x in [floor, absmax] (slot = x's top 8 bits & 15; floor = absmax x
// 2^-28 for the signed map, absmax x first[0] for the unsigned one) gets its two lines,
// scaled by 1 / absmax. Per 16 values: a max (which also takes |x| and the floor), 4
// one-register lookups, 2 FMAs, a min, no clamp: |x| <= absmax keeps t <= the top code.
struct EncodeLines {
  alignas(64) float inv[16];  // line k: t = y x inv[k] + off[k]; unused entries repeat the last line
  alignas(64) float off[16];
  float bp[16];               // line k gives way to k + 1 at y = bp[k]
  int lines;
  float floor;                // y below it encodes as y = floor
};

EncodeLines encode_lines(const quant8::Map& m, bool positive) {
  EncodeLines e{};
  e.lines = m.bits;
  e.inv[0] = 1.0f / m.first[0];
  e.off[0] = 0.0f;
  for (int level = 1; level < m.bits; ++level) {
    e.inv[level] = m.inv_step[level];
    e.off[level] = static_cast<float>(1 << level) - m.first[level] * m.inv_step[level];
  }
  for (int k = m.bits; k < 16; ++k) {
    e.inv[k] = e.inv[m.bits - 1];
    e.off[k] = e.off[m.bits - 1];
  }
  for (int level = 0; level + 1 < m.bits; ++level)
    e.bp[level] = quant8::decode_magnitude(m, static_cast<uint8_t>((2 << level) - 1));
  // The unsigned map gives a positive y at least code 1 (quant8.h): the smallest point.
  e.floor = positive ? m.first[0] : 0x1p-28f;
  for (int level = 0; level + 2 < m.bits; ++level)  // a decade apart: at most one per two binades
    if (e.bp[level + 1] < 4.0f * e.bp[level]) throw InternalError("quant8: two encoder switches within two binades");
  if (e.floor >= 0.5f * m.first[0] && !positive) throw InternalError("quant8: the encoder's floor is not below code 1");
  return e;
}

// Smallest absmax (other than 0) of a block that the AVX-512 encoder takes: the 16 slots
// below it start at a normal float. Smaller (and infinite or NaN) ones: scalar encoder.
constexpr float kMinEncodeAbsmax = 0x1p-95f;

struct SlotLines {
  __m512 a_lo, b_lo, a_hi, b_hi;  // per slot: the two lines, t = x a + b
  __m512 floor;
};

// absmax: 0 (all values 0: every code 0) or in [kMinEncodeAbsmax, FLT_MAX].
AVX512 inline SlotLines slot_lines(const EncodeLines& e, float absmax) {
  if (absmax == 0.0f) return {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const __m512i one = _mm512_set1_epi32(1);
  // Slot j holds x's top 8 bits h with h & 15 = j and h in [top - 15, top]: x in [2^(2h-127), 2^(2h-125)).
  const __m512i top = _mm512_set1_epi32(static_cast<int>(float_bits(absmax) >> 24));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i h = _mm512_sub_epi32(top, _mm512_and_si512(_mm512_sub_epi32(top, lane), _mm512_set1_epi32(15)));
  const __m512 slot_start = _mm512_castsi512_ps(_mm512_slli_epi32(h, 24));
  __m512i k = _mm512_setzero_si512();  // the line in force at the slot's start
  for (int s = 0; s + 1 < e.lines; ++s)
    k = _mm512_mask_add_epi32(k, _mm512_cmp_ps_mask(_mm512_set1_ps(e.bp[s] * absmax), slot_start, _CMP_LE_OQ), k, one);
  const __m512i k_next = _mm512_min_epi32(_mm512_add_epi32(k, one), _mm512_set1_epi32(e.lines - 1));
  const __m512 a = _mm512_mul_ps(_mm512_load_ps(e.inv), _mm512_set1_ps(1.0f / absmax)), b = _mm512_load_ps(e.off);
  return {_mm512_permutexvar_ps(k, a), _mm512_permutexvar_ps(k, b), _mm512_permutexvar_ps(k_next, a),
          _mm512_permutexvar_ps(k_next, b), _mm512_set1_ps(e.floor * absmax)};
}

// x already >= the floor (and <= absmax): the code, before its conversion to an integer
// (round to nearest even).
AVX512 inline __m512 encode_t(const SlotLines& r, __m512 x) {
  const __m512i s = _mm512_srli_epi32(_mm512_castps_si512(x), 24);  // permutes read its low 4 bits
  return _mm512_min_ps(_mm512_fmadd_ps(x, _mm512_permutexvar_ps(s, r.a_lo), _mm512_permutexvar_ps(s, r.b_lo)),
                       _mm512_fmadd_ps(x, _mm512_permutexvar_ps(s, r.a_hi), _mm512_permutexvar_ps(s, r.b_hi)));
}

// 4 x 16 codes (0..255 in int32 lanes) -> 64 bytes in order.
AVX512 inline void store_codes64(uint8_t* q, __m512i a, __m512i b, __m512i c, __m512i d) {
  // The packs interleave per 128-bit lane: dword 4 l + r holds register r's lane l.
  const __m512i packed = _mm512_packus_epi16(_mm512_packus_epi32(a, b), _mm512_packus_epi32(c, d));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  _mm512_storeu_si512(q, _mm512_permutexvar_epi32(order, packed));
}

// What a block's parameters come from and go to, fixed per call (template
// arguments, so that the loop holds no branch on them).
enum class Out { kNone, kBf16, kBf16Native, kFp32, kSplit };

// The bf16 copy: the AVX512_BF16 conversion where the CPU has it (round to nearest
// even; it also flushes fp32 denormals, which parameters are not), else the integer
// rounding of store_out16. Inline assembly, so that this function needs no BF16 target.
// Plain stores: with the fp32 kernel's non-temporal stores (half lines, interleaved with
// this kernel's two passes) the 8-bit update ran 2.1x slower at 16 threads on the H200
// host's Xeon (2.98 against 6.27 Gparam/s, same run).
template <Out kOut>
AVX512 inline void store_copy(void* out, int64_t i, __m512 x) {
  if constexpr (kOut == Out::kBf16Native) {
    __m256i h;
    asm("vcvtneps2bf16 %1, %0" : "=v"(h) : "v"(x));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), h);
  } else if constexpr (kOut == Out::kBf16) {
    store_out16(out, kernels::DType::kBFloat16, i, x);
  } else if constexpr (kOut == Out::kFp32) {
    _mm512_storeu_ps(static_cast<float*>(out) + i, x);
  }
}

// The AVX-512 body.
template <Out kOut, bool kGradBf16>
AVX512 void block_avx512(const Block8& b, const Consts& c) {
  constexpr bool kSplit = kOut == Out::kSplit;
  alignas(64) float mb[kBlock], vb[kBlock];
  static const DecodeTable sdec = decode_table(quant8::signed_magnitudes(), 24);
  static const DecodeTable udec = decode_table(quant8::unsigned_map(), 0);
  static const EncodeLines senc = encode_lines(quant8::signed_magnitudes(), false);
  static const EncodeLines uenc = encode_lines(quant8::unsigned_map(), true);
  // Locals, so that the loop does not reload them after every store.
  float* const p = b.p;
  uint16_t* const hi = b.hi;
  int16_t* const lo = b.lo;
  uint8_t* const qm = b.qm;
  uint8_t* const qv = b.qv;
  void* const out = b.out;
  const GradIn g_in{b.g.ptr, kGradBf16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32};
  const int64_t n = b.n;
  // The block's scale and the betas ride in the decode lines: they give b1 m and b2 v.
  const __m512 sm = _mm512_set1_ps(*b.am * c.b1), sv = _mm512_set1_ps(*b.av * c.b2);
  const __m512 m_int = _mm512_mul_ps(_mm512_load_ps(sdec.intercept), sm);
  const __m512 m_slope = _mm512_mul_ps(_mm512_load_ps(sdec.slope), sm);
  const __m512 v_int = _mm512_mul_ps(_mm512_load_ps(udec.intercept), sv);
  const __m512 v_slope = _mm512_mul_ps(_mm512_load_ps(udec.slope), sv);
  // The gradient's scale rides in the moments' gradient terms.
  const __m512 gm = _mm512_set1_ps(c.one_minus_b1 * c.scale), gv = _mm512_set1_ps(c.one_minus_b2 * c.scale * c.scale);
  // The step size rides in the denominator: step / (root ibc2 + eps) = 1 / (root ibc2' + eps')
  // with ibc2' = ibc2 / step, eps' = eps / step. No step (0, or so small that those overflow):
  // ibc2' = 0, eps' = inf, whose reciprocal is 0.
  const float ibc2_per_step = c.inv_bc2_sqrt / c.step_size, eps_per_step = c.eps / c.step_size;
  const bool steps = c.step_size > 0 && std::isfinite(ibc2_per_step) && std::isfinite(eps_per_step);
  const __m512 dec = _mm512_set1_ps(c.decay), ibc2 = _mm512_set1_ps(steps ? ibc2_per_step : 0.0f),
               eps = _mm512_set1_ps(steps ? eps_per_step : INFINITY), tiny = _mm512_set1_ps(FLT_MIN);
  const __m512i sign_bit = _mm512_set1_epi32(INT32_MIN), magnitude_bits = _mm512_set1_epi32(0x7F000000);
  __m512 vmax_m = _mm512_setzero_ps(), vmax_v = _mm512_setzero_ps();
  const PrefetchLines ahead(b, kPrefetchBlocksAhead);
  const bool spread = n == kBlock;
  // 64 values at a time; the tail goes to the scalar code.
  const int64_t body = n / 64 * 64;
  for (int64_t i0 = 0; i0 < body; i0 += 64) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const int64_t i = i0 + 16 * u;
      if (spread && (i & 127) == 0) ahead.group(i / 128);  // groups 0 .. 15
      // b1 m_old: the magnitude bits as (code & 0x7F) << 24; the sign (bit 7, now 31) flips the value.
      const __m512i shifted = _mm512_slli_epi32(load_codes(qm + i), 24);
      const __m512 m_mag = decode_lines(_mm512_and_si512(shifted, magnitude_bits), m_slope, m_int);
      const __m512 m_old = _mm512_castsi512_ps(
          _mm512_ternarylogic_epi32(_mm512_castps_si512(m_mag), shifted, sign_bit, 0x78));  // A ^ (B & C)
      // b2 v_old.
      const __m512 v_old = decode_lines(load_codes(qv + i), v_slope, v_int);
      const __m512 g = load_grad16(g_in, i);
      const __m512 mi = _mm512_fmadd_ps(gm, g, m_old);
      const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(gv, g), g, v_old);
      // sqrt(v) = v / sqrt(v), with v >= FLT_MIN in the estimate so that v = 0 gives 0.
      const __m512 root = _mm512_mul_ps(vi, _mm512_rsqrt14_ps(_mm512_max_ps(vi, tiny)));
      const __m512 step_per_m = _mm512_rcp14_ps(_mm512_fmadd_ps(root, ibc2, eps));
      const __m512 x_old = kSplit ? load_master16(hi, lo, i) : _mm512_loadu_ps(p + i);
      const __m512 x = _mm512_fnmadd_ps(mi, step_per_m, _mm512_mul_ps(x_old, dec));
      if constexpr (kSplit) {
        store_master16(hi, lo, i, x);
      } else {
        _mm512_storeu_ps(p + i, x);
        store_copy<kOut>(out, i, x);
      }
      _mm512_store_ps(mb + i, mi);
      _mm512_store_ps(vb + i, vi);
      vmax_m = _mm512_range_ps(vmax_m, mi, 0x0B);  // max(|a|, |b|), sign cleared
      vmax_v = _mm512_max_ps(vmax_v, vi);
    }
  }
  float max_m = _mm512_reduce_max_ps(vmax_m);
  float max_v = _mm512_reduce_max_ps(vmax_v);
  pass1_scalar(b, body, c, mb, vb, max_m, max_v);
  *b.am = max_m;
  *b.av = max_v;
  const float inv_m = max_m > 0 ? 1.0f / max_m : 0.0f, inv_v = max_v > 0 ? 1.0f / max_v : 0.0f;
  auto encodable = [](float absmax) { return absmax == 0.0f || (absmax >= kMinEncodeAbsmax && absmax <= FLT_MAX); };
  if (!encodable(max_m) || !encodable(max_v)) {  // tiny, infinite or NaN: the scalar encoder
    pass2_scalar(b, 0, mb, vb, inv_m, inv_v);
    return;
  }
  const SlotLines es = slot_lines(senc, max_m), eu = slot_lines(uenc, max_v);
  const __m512i sign_to_bit7 = _mm512_set1_epi32(0x80);
  const int64_t body64 = n / 64 * 64;
  // Pass 2 works in L1: without prefetches it leaves the memory bus idle.
  for (int64_t i = 0; i < body64; i += 64) {
    const int64_t line = i / 64;  // 0 .. 31
    if (spread && (line & 1) == 0) ahead.group(16 + line / 2);  // groups 16 .. 31
    __m512i cm[4], cv[4];
    for (int u = 0; u < 4; ++u) {
      const int64_t k = i + 16 * u;
      // max(|m|, floor), the sign cleared. A NaN moment (from a NaN gradient, after which
      // training has diverged anyway) gives magnitude code 0 here, 127 in the scalar encoder.
      const __m512 m = _mm512_load_ps(mb + k);
      const __m512 ym = _mm512_range_ps(m, es.floor, 0x0B);
      cm[u] = _mm512_ternarylogic_epi32(_mm512_cvtps_epi32(encode_t(es, ym)), _mm512_srli_epi32(_mm512_castps_si512(m), 24), sign_to_bit7,
                                        0xF8);  // A | (B & C): the sign into bit 7
      // v >= 0; 0 stays code 0 (so does NaN, 255 in the scalar encoder), any other v is at least code 1.
      const __m512 v = _mm512_load_ps(vb + k);
      const __mmask16 positive = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
      cv[u] = _mm512_maskz_cvtps_epi32(positive, encode_t(eu, _mm512_max_ps(v, eu.floor)));
    }
    store_codes64(qm + i, cm[0], cm[1], cm[2], cm[3]);
    store_codes64(qv + i, cv[0], cv[1], cv[2], cv[3]);
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

template <bool kGradBf16>
void (*avx512_body_for(Out kind))(const Block8&, const Consts&) {
  switch (kind) {
    case Out::kNone: return block_avx512<Out::kNone, kGradBf16>;
    case Out::kBf16: return block_avx512<Out::kBf16, kGradBf16>;
    case Out::kBf16Native: return block_avx512<Out::kBf16Native, kGradBf16>;
    case Out::kFp32: return block_avx512<Out::kFp32, kGradBf16>;
    case Out::kSplit: return block_avx512<Out::kSplit, kGradBf16>;
  }
  return nullptr;
}

// Either master (fp32) with out, or hi and lo (split master weights, no separate copy).
void run8(float* master, uint16_t* hi, int16_t* lo, uint8_t* qm, uint8_t* qv, float* am, float* av, const void* grad,
          kernels::DType grad_dtype, void* out, kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& a,
          SimdLevel level) {
  const Consts c = consts_of(a);
  if (level == SimdLevel::kAuto) level = selected_simd();
  static const bool has_bf16 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  const int64_t gsize = grad_dtype == kernels::DType::kBFloat16 ? 2 : 4;
  const bool grad_bf16 = grad_dtype == kernels::DType::kBFloat16;
  const Out kind = hi ? Out::kSplit
                   : !out ? Out::kNone
                   : out_dtype == kernels::DType::kFloat32 ? Out::kFp32
                   : has_bf16 ? Out::kBf16Native
                              : Out::kBf16;
  void (*const avx512)(const Block8&, const Consts&) = grad_bf16 ? avx512_body_for<true>(kind) : avx512_body_for<false>(kind);
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
        case SimdLevel::kAvx512: avx512(b, c); break;
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
