#include "backend/optim/cpu_adamw.h"

#include "backend/optim/adamw_math.h"
#include "backend/optim/adamw_simd.h"
#include "backend/optim/cpu_cores.h"
#include "backend/optim/quant8.h"
#include "common/errors.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

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

int g_threads = 0;  // 0: hardware concurrency

// Runs fn(begin, end) over [0, n) on `threads` threads in contiguous chunks
// (`align`-element multiples so that SIMD bodies and quantisation blocks rarely need a tail).
template <class Fn>
void parallel_chunks(int64_t n, int64_t align, Fn&& fn) {
  int threads = g_threads > 0 ? g_threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n / (1 << 15))));
  if (threads <= 1) {
    fn(int64_t{0}, n);
    _mm_sfence();
    return;
  }
  const int64_t chunk = ((n + threads - 1) / threads + align - 1) / align * align;
  // The pool's persistent threads, each bound to one core of this rank's share (cpu_cores.h).
  run_on_cores(threads, [&](int t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
    _mm_sfence();  // non-temporal stores visible before the run returns
  });
}

void adamw_scalar(float* p, float* m, float* v, GradIn g, void* out, kernels::DType od, int64_t b, int64_t e,
                  const Consts& c) {
  for (int64_t i = b; i < e; ++i) {
    store_param(out, od, i, adamw_one(p[i], m[i], v[i], g.at(i), c));
  }
}

// AVX-512: 16 parameters per iteration; one pass over p, m, v, g and the output.
template <bool kStream>
STEPCAST_TARGET_AVX512 void adamw_avx512(float* p, float* m, float* v, GradIn g, void* out, kernels::DType od,
                                         int64_t b, int64_t e, const Consts& c) {
  const AdamWRegs16 k = adamw_regs16(c);
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m512 gi = _mm512_mul_ps(load_grad16(g, i), k.sc);
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(p + i), k.dec);
    const __m512 mi = _mm512_fmadd_ps(k.b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(k.omb1, gi));
    const __m512 vi = _mm512_fmadd_ps(k.b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(k.omb2, _mm512_mul_ps(gi, gi)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), k.ibc2, k.eps);
    x = _mm512_sub_ps(x, _mm512_mul_ps(k.ss, _mm512_div_ps(mi, denom)));
    _mm512_storeu_ps(p + i, x);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    store_out16<kStream>(out, od, i, x);
  }
  adamw_scalar(p, m, v, g, out, od, i, e, c);
}

// AVX2 + FMA: 8 parameters per iteration.
STEPCAST_TARGET_AVX2 void adamw_avx2(float* p, float* m, float* v, GradIn g, void* out, kernels::DType od, int64_t b,
                                     int64_t e, const Consts& c) {
  const AdamWRegs8 k = adamw_regs8(c);
  int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 gi = _mm256_mul_ps(load_grad8(g, i), k.sc);
    __m256 x = _mm256_mul_ps(_mm256_loadu_ps(p + i), k.dec);
    const __m256 mi = _mm256_fmadd_ps(k.b1, _mm256_loadu_ps(m + i), _mm256_mul_ps(k.omb1, gi));
    const __m256 vi = _mm256_fmadd_ps(k.b2, _mm256_loadu_ps(v + i), _mm256_mul_ps(k.omb2, _mm256_mul_ps(gi, gi)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), k.ibc2, k.eps);
    x = _mm256_sub_ps(x, _mm256_mul_ps(k.ss, _mm256_div_ps(mi, denom)));
    _mm256_storeu_ps(p + i, x);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    store_out8(out, od, i, x);
  }
  adamw_scalar(p, m, v, g, out, od, i, e, c);
}

}  // namespace

SimdLevel cpu_simd_level() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
      return SimdLevel::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return level;
}

namespace {

std::atomic<SimdLevel> g_selected{SimdLevel::kAuto};

bool cpu_has(SimdLevel level) {
  const SimdLevel widest = cpu_simd_level();
  switch (level) {
    case SimdLevel::kAvx512: return widest == SimdLevel::kAvx512;
    case SimdLevel::kAvx2: return widest != SimdLevel::kScalar;
    default: return true;
  }
}

}  // namespace

void select_simd(SimdLevel level) {
  if (!cpu_has(level))
    throw InputError(std::string("--cpu-simd ") + simd_name(level) + " is not available on this CPU (its widest: " +
                     simd_name(cpu_simd_level()) + ")");
  g_selected.store(level);
}

SimdLevel selected_simd() {
  const SimdLevel s = g_selected.load();
  return s == SimdLevel::kAuto ? cpu_simd_level() : s;
}

void cpu_parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_chunks(n, align, fn);
}

bool can_stream(const void* out) { return out && reinterpret_cast<uintptr_t>(out) % 64 == 0; }

void split_master_n(const float* x, uint16_t* hi, int16_t* lo, int64_t n) {
  for (int64_t i = 0; i < n; ++i) split_master(x[i], hi[i], lo[i]);
}

void join_master_n(const uint16_t* hi, const int16_t* lo, float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = join_master(hi[i], lo[i]);
}

void set_cpu_threads(int threads) { g_threads = threads; }
int cpu_threads() { return g_threads > 0 ? g_threads : static_cast<int>(std::thread::hardware_concurrency()); }

void cpu_adamw(float* master, float* m, float* v, const void* grad_ptr, kernels::DType grad_dtype, void* out,
               kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& a, SimdLevel level) {
  const Consts c = consts_of(a);
  const GradIn grad{grad_ptr, grad_dtype};
  if (level == SimdLevel::kAuto) level = selected_simd();
  const bool stream = can_stream(out);
  parallel_chunks(n, 64, [&](int64_t b, int64_t e) {
    switch (level) {
      case SimdLevel::kAvx512:
        if (stream) adamw_avx512<true>(master, m, v, grad, out, out_dtype, b, e, c);
        else adamw_avx512<false>(master, m, v, grad, out, out_dtype, b, e, c);
        break;
      case SimdLevel::kAvx2: adamw_avx2(master, m, v, grad, out, out_dtype, b, e, c); break;
      default: adamw_scalar(master, m, v, grad, out, out_dtype, b, e, c); break;
    }
  });
}

}  // namespace stepcast::backend
