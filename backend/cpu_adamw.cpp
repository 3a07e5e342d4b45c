#include "backend/cpu_adamw.h"

#include "backend/adamw_math.h"
#include "backend/quant8.h"
#include "model/errors.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
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
    return;
  }
  const int64_t chunk = ((n + threads - 1) / threads + align - 1) / align * align;
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    if (b < e) pool.emplace_back([&fn, b, e] { fn(b, e); });
  }
  fn(int64_t{0}, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

void adamw_scalar(float* p, float* m, float* v, GradIn g, void* out, kernels::DType od, int64_t b, int64_t e,
                  const Consts& c) {
  for (int64_t i = b; i < e; ++i) {
    const float x = adamw_one(p[i], m[i], v[i], g.at(i), c);
    if (out) {
      if (od == kernels::DType::kBFloat16) static_cast<uint16_t*>(out)[i] = float_to_bf16(x);
      else static_cast<float*>(out)[i] = x;
    }
  }
}

// AVX-512: 16 parameters per iteration; one pass over p, m, v, g and the output.
__attribute__((target("avx512f,avx512bw"))) inline __m512 load_grad16(GradIn g, int64_t i) {
  if (g.dtype == kernels::DType::kFloat32) return _mm512_loadu_ps(static_cast<const float*>(g.ptr) + i);
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(g.ptr) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma"))) inline __m256 load_grad8(GradIn g, int64_t i) {
  if (g.dtype == kernels::DType::kFloat32) return _mm256_loadu_ps(static_cast<const float*>(g.ptr) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g.ptr) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx512f,avx512bw"))) void adamw_avx512(float* p, float* m, float* v, GradIn g,
                                                               void* out, kernels::DType od, int64_t b, int64_t e,
                                                               const Consts& c) {
  const __m512 b1 = _mm512_set1_ps(c.b1), b2 = _mm512_set1_ps(c.b2), omb1 = _mm512_set1_ps(c.one_minus_b1),
               omb2 = _mm512_set1_ps(c.one_minus_b2), ibc2 = _mm512_set1_ps(c.inv_bc2_sqrt),
               eps = _mm512_set1_ps(c.eps), ss = _mm512_set1_ps(c.step_size), dec = _mm512_set1_ps(c.decay),
               sc = _mm512_set1_ps(c.scale);
  const __m512i round_bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    const __m512 gi = _mm512_mul_ps(load_grad16(g, i), sc);
    __m512 x = _mm512_mul_ps(_mm512_loadu_ps(p + i), dec);
    const __m512 mi = _mm512_fmadd_ps(b1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, gi));
    const __m512 vi = _mm512_fmadd_ps(b2, _mm512_loadu_ps(v + i), _mm512_mul_ps(omb2, _mm512_mul_ps(gi, gi)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), ibc2, eps);
    x = _mm512_sub_ps(x, _mm512_mul_ps(ss, _mm512_div_ps(mi, denom)));
    _mm512_storeu_ps(p + i, x);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    if (!out) continue;
    if (od == kernels::DType::kBFloat16) {
      // Round to nearest even: bits + 0x7fff + ((bits >> 16) & 1), keep the high half.
      const __m512i bits = _mm512_castps_si512(x);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
      const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, round_bias), lsb), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), _mm512_cvtepi32_epi16(r));
    } else {
      _mm512_storeu_ps(static_cast<float*>(out) + i, x);
    }
  }
  adamw_scalar(p, m, v, g, out, od, i, e, c);
}

// AVX2 + FMA: 8 parameters per iteration.
__attribute__((target("avx2,fma"))) void adamw_avx2(float* p, float* m, float* v, GradIn g, void* out,
                                                     kernels::DType od, int64_t b, int64_t e, const Consts& c) {
  const __m256 b1 = _mm256_set1_ps(c.b1), b2 = _mm256_set1_ps(c.b2), omb1 = _mm256_set1_ps(c.one_minus_b1),
               omb2 = _mm256_set1_ps(c.one_minus_b2), ibc2 = _mm256_set1_ps(c.inv_bc2_sqrt),
               eps = _mm256_set1_ps(c.eps), ss = _mm256_set1_ps(c.step_size), dec = _mm256_set1_ps(c.decay),
               sc = _mm256_set1_ps(c.scale);
  const __m256i round_bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    __m256i halves[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t k = i + 8 * h;
      const __m256 gi = _mm256_mul_ps(load_grad8(g, k), sc);
      __m256 x = _mm256_mul_ps(_mm256_loadu_ps(p + k), dec);
      const __m256 mi = _mm256_fmadd_ps(b1, _mm256_loadu_ps(m + k), _mm256_mul_ps(omb1, gi));
      const __m256 vi = _mm256_fmadd_ps(b2, _mm256_loadu_ps(v + k), _mm256_mul_ps(omb2, _mm256_mul_ps(gi, gi)));
      const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), ibc2, eps);
      x = _mm256_sub_ps(x, _mm256_mul_ps(ss, _mm256_div_ps(mi, denom)));
      _mm256_storeu_ps(p + k, x);
      _mm256_storeu_ps(m + k, mi);
      _mm256_storeu_ps(v + k, vi);
      if (out && od == kernels::DType::kFloat32) _mm256_storeu_ps(static_cast<float*>(out) + k, x);
      const __m256i bits = _mm256_castps_si256(x);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
      halves[h] = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, round_bias), lsb), 16);
    }
    if (out && od == kernels::DType::kBFloat16) {
      // packus interleaves 128-bit lanes: [a0-3 b0-3 a4-7 b4-7] -> reorder the 64-bit quarters.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(halves[0], halves[1]), 0xD8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + i), packed);
    }
  }
  adamw_scalar(p, m, v, g, out, od, i, e, c);
}

}  // namespace

SimdLevel cpu_simd_level() {
  static const SimdLevel level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) return SimdLevel::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
    return SimdLevel::kScalar;
  }();
  return level;
}

const char* simd_name(SimdLevel l) {
  return l == SimdLevel::kAvx512 ? "avx512" : l == SimdLevel::kAvx2 ? "avx2" : "scalar";
}

namespace {

SimdLevel probe(CpuKernel kernel) {
  if (const char* env = std::getenv("STEPCAST_CPU_SIMD"); env && *env) {
    const std::string e = env;
    if (e == "scalar") return SimdLevel::kScalar;
    if (e == "avx2" && cpu_simd_level() != SimdLevel::kScalar) return SimdLevel::kAvx2;
    if (e == "avx512" && cpu_simd_level() == SimdLevel::kAvx512) return SimdLevel::kAvx512;
    throw InputError("STEPCAST_CPU_SIMD=\"" + e + "\" is not valid here (valid: scalar, avx2, avx512 up to this CPU's " +
                     simd_name(cpu_simd_level()) + "; or unset to time them)");
  }
  std::vector<SimdLevel> levels;
  if (cpu_simd_level() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  if (cpu_simd_level() != SimdLevel::kScalar) levels.push_back(SimdLevel::kAvx2);
  if (levels.size() < 2) return cpu_simd_level();
  const int64_t n = int64_t{16} << 20;  // beyond the caches: the regime the optimizer runs in
  std::vector<float> p(static_cast<size_t>(n), 0.01f), m(static_cast<size_t>(n)), v(static_cast<size_t>(n));
  std::vector<uint16_t> g(static_cast<size_t>(n), float_to_bf16(1e-3f)), out(static_cast<size_t>(n));
  std::vector<uint8_t> qm(static_cast<size_t>(n)), qv(static_cast<size_t>(n));
  std::vector<float> am(static_cast<size_t>(quant8::num_blocks(n))), av(am.size());
  kernels::AdamWArgs args;
  SimdLevel best = levels.front();
  double best_s = 1e30;
  for (SimdLevel level : levels) {
    double t_min = 1e30;
    for (int r = 0; r < 6; ++r) {  // the first run warms up
      const auto t0 = std::chrono::steady_clock::now();
      args.step = r + 1;
      if (kernel == CpuKernel::kAdamW)
        cpu_adamw(p.data(), m.data(), v.data(), g.data(), kernels::DType::kBFloat16, out.data(),
                  kernels::DType::kBFloat16, n, args, level);
      else
        cpu_adamw8bit(p.data(), qm.data(), qv.data(), am.data(), av.data(), g.data(), kernels::DType::kBFloat16,
                      out.data(), kernels::DType::kBFloat16, n, args, level);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) t_min = std::min(t_min, s);
    }
    // Levels come widest first; a narrower one must win by 5 % (noise would otherwise decide).
    if (t_min < 0.95 * best_s) {
      best_s = t_min;
      best = level;
    }
  }
  return best;
}

}  // namespace

SimdLevel tuned_simd_level(CpuKernel kernel) {
  if (kernel == CpuKernel::kAdamW) {
    static const SimdLevel level = probe(CpuKernel::kAdamW);
    return level;
  }
  static const SimdLevel level = probe(CpuKernel::kAdamW8bit);
  return level;
}

void cpu_parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn) {
  parallel_chunks(n, align, fn);
}

void set_cpu_threads(int threads) { g_threads = threads; }
int cpu_threads() { return g_threads > 0 ? g_threads : static_cast<int>(std::thread::hardware_concurrency()); }

void cpu_adamw(float* master, float* m, float* v, const void* grad_ptr, kernels::DType grad_dtype, void* out,
               kernels::DType out_dtype, int64_t n, const kernels::AdamWArgs& a, SimdLevel level) {
  const Consts c = consts_of(a);
  const GradIn grad{grad_ptr, grad_dtype};
  if (level == SimdLevel::kAuto) level = tuned_simd_level(CpuKernel::kAdamW);
  parallel_chunks(n, 64, [&](int64_t b, int64_t e) {
    switch (level) {
      case SimdLevel::kAvx512: adamw_avx512(master, m, v, grad, out, out_dtype, b, e, c); break;
      case SimdLevel::kAvx2: adamw_avx2(master, m, v, grad, out, out_dtype, b, e, c); break;
      default: adamw_scalar(master, m, v, grad, out, out_dtype, b, e, c); break;
    }
  });
}

}  // namespace stepcast::backend
