#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "common/errors.h"
#include "backend/cuda/check.h"
#include "backend/cuda/kernels.h"
#include "backend/optim/quant8.h"

namespace stepcast::backend::kernels {

namespace {

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <class T>
__global__ void add_kernel(T* dst, const T* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)
    store(dst, i, load(dst, i) + load(src, i));
}

template <class G, class P>
__global__ void adamw_kernel(float* __restrict__ master, float* __restrict__ m, float* __restrict__ v,
                             const G* __restrict__ grad, P* __restrict__ out, int64_t n, AdamWArgs a,
                             float bias_correction1, float bias_correction2_sqrt) {
  const float step_size = a.lr / bias_correction1;
  const float decay = 1.0f - a.lr * a.weight_decay;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const float g = load(grad, i) * a.grad_scale;
    float p = master[i] * decay;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    const float denom = sqrtf(vi) / bias_correction2_sqrt + a.eps;
    p -= step_size * mi / denom;
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
    if (out) store(out, i, p);
  }
}

int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 132 * 16 ? (b < 1 ? 1 : b) : 132 * 16);
}

// --- 8-bit AdamW ------------------------------------------------------------------
constexpr int kQ8Threads = 256;
constexpr int kQ8SignedBits = 7, kQ8UnsignedBits = 8;  // quant8.h: the two maps' magnitude bits

// The two maps (signed magnitudes, unsigned), set before each launch.
__constant__ Quant8Map c_q8_maps[2];

// A map in shared memory: levels are indexed per element (divergent), which
// shared memory serves in one pass and a parameter or constant bank would not.
struct SharedMap {
  float first[16], step[16], inv_step[16], threshold[16];
  float zero_threshold;
  int bits;
};

// quant8::encode_magnitude / decode_magnitude, the same operations on the device.
// The level thresholds live in registers (`thr`, loaded once per thread): the
// level search is BITS - 1 register compares instead of as many shared-memory
// loads, which bounded the kernel's throughput; first and inv_step, indexed per
// element, stay in shared memory.
template <int BITS>
__device__ inline int q8_encode(const SharedMap& m, const float (&thr)[BITS - 1], float zero_threshold, float y) {
  y = fminf(fmaxf(y, 0.0f), 1.0f);
  if (y < zero_threshold) return 0;
  int i = 0;
#pragma unroll
  for (int k = 0; k + 1 < BITS; ++k) i += y >= thr[k] ? 1 : 0;
  const float t = __fmul_rn(__fsub_rn(y, m.first[i]), m.inv_step[i]);
  int j = __float2int_rn(t);
  const int last = (1 << i) - 1;
  j = j < 0 ? 0 : (j > last ? last : j);
  return (1 << i) + j;
}

__device__ inline float q8_decode(const SharedMap& m, int code) {
  if (code == 0) return 0.0f;
  const int i = 31 - __clz(code);
  return __fmaf_rn(static_cast<float>(code - (1 << i)), m.step[i], m.first[i]);
}

// Eight consecutive values of a float or bf16 array (one or two 16-byte accesses).
__device__ inline void load8(const float* p, float* v) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
// bf16 <-> float by bit operations on whole 32-bit words, so that nothing is
// addressed byte by byte and the values stay in registers (no local memory).
__device__ inline void load8(const __nv_bfloat16* p, float* v) {
  const uint4 raw = reinterpret_cast<const uint4*>(p)[0];
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
  }
}
__device__ inline void store8(float* p, const float* v) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ inline void store8(__nv_bfloat16* p, const float* v) {
  unsigned w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    w[k] = static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k]))) |
           (static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * k + 1]))) << 16);
  reinterpret_cast<uint4*>(p)[0] = make_uint4(w[0], w[1], w[2], w[3]);
}

// One CUDA block per quantisation block of kQ8Threads x 8 values; each thread
// owns 8 consecutive values (16-byte loads and stores; element by element at
// the end of the array or when `vec` is false).
template <class G, class P>
__global__ void __launch_bounds__(kQ8Threads) adamw8bit_kernel(float* __restrict__ master, uint8_t* __restrict__ qm,
                                                              uint8_t* __restrict__ qv, float* __restrict__ am,
                                                              float* __restrict__ av, const G* __restrict__ grad,
                                                              P* __restrict__ out, int64_t n, AdamWArgs a,
                                                              float bc1, float bc2_sqrt, bool vec) {
  __shared__ SharedMap maps[2];
  __shared__ float red_m[kQ8Threads / 32], red_v[kQ8Threads / 32];
  if (threadIdx.x < 32) {
    const int w = threadIdx.x >> 4, k = threadIdx.x & 15;
    const Quant8Map& c = c_q8_maps[w];
    maps[w].first[k] = c.first[k];
    maps[w].step[k] = c.step[k];
    maps[w].inv_step[k] = c.inv_step[k];
    maps[w].threshold[k] = c.threshold[k];
    if (k == 0) {
      maps[w].zero_threshold = c.zero_threshold;
      maps[w].bits = c.bits;
    }
  }
  __syncthreads();
  const SharedMap& smap = maps[0];
  const SharedMap& umap = maps[1];
  float thr_s[kQ8SignedBits - 1], thr_u[kQ8UnsignedBits - 1];
#pragma unroll
  for (int k = 0; k + 1 < kQ8SignedBits; ++k) thr_s[k] = smap.threshold[k];
#pragma unroll
  for (int k = 0; k + 1 < kQ8UnsignedBits; ++k) thr_u[k] = umap.threshold[k];
  const float zero_s = smap.zero_threshold, zero_u = umap.zero_threshold;
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * 8 * kQ8Threads + 8 * threadIdx.x;
  const int count = i0 >= n ? 0 : static_cast<int>(n - i0 < 8 ? n - i0 : 8);
  const bool full = vec && count == 8;
  const float am_old = am[blockIdx.x], av_old = av[blockIdx.x];
  const float step_size = a.lr / bc1, decay = 1.0f - a.lr * a.weight_decay;
  float g[8], p[8], m_new[8], v_new[8];
  uint8_t cm[8], cv[8];
  if (full) {
    load8(grad + i0, g);
    load8(master + i0, p);
    const uint2 rm = *reinterpret_cast<const uint2*>(qm + i0), rv = *reinterpret_cast<const uint2*>(qv + i0);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      cm[k] = static_cast<uint8_t>(((k < 4 ? rm.x : rm.y) >> (8 * (k & 3))) & 0xFFu);
      cv[k] = static_cast<uint8_t>(((k < 4 ? rv.x : rv.y) >> (8 * (k & 3))) & 0xFFu);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const bool in = k < count;
      g[k] = in ? load(grad, i0 + k) : 0.0f;
      p[k] = in ? master[i0 + k] : 0.0f;
      cm[k] = in ? qm[i0 + k] : 0;
      cv[k] = in ? qv[i0 + k] : 0;
    }
  }
  float max_m = 0.0f, max_v = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float mag = q8_decode(smap, cm[k] & 0x7F);
    const float m_old = ((cm[k] & 0x80) ? -mag : mag) * am_old;
    const float v_old = q8_decode(umap, cv[k]) * av_old;
    const float gk = g[k] * a.grad_scale;
    const float mi = a.beta1 * m_old + (1.0f - a.beta1) * gk;
    const float vi = a.beta2 * v_old + (1.0f - a.beta2) * gk * gk;
    p[k] = p[k] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + a.eps);
    m_new[k] = k < count ? mi : 0.0f;
    v_new[k] = k < count ? vi : 0.0f;
    max_m = fmaxf(max_m, fabsf(m_new[k]));
    max_v = fmaxf(max_v, v_new[k]);
  }
  if (full) {
    store8(master + i0, p);
    if (out) store8(out + i0, p);
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {  // unrolled with constant indices: the arrays stay in registers
      if (k >= count) break;
      master[i0 + k] = p[k];
      if (out) store(out, i0 + k, p[k]);
    }
  }
  // Block-wide absmax of the new moments.
  for (int off = 16; off > 0; off >>= 1) {
    max_m = fmaxf(max_m, __shfl_xor_sync(0xffffffffu, max_m, off));
    max_v = fmaxf(max_v, __shfl_xor_sync(0xffffffffu, max_v, off));
  }
  if ((threadIdx.x & 31) == 0) {
    red_m[threadIdx.x >> 5] = max_m;
    red_v[threadIdx.x >> 5] = max_v;
  }
  __syncthreads();
  max_m = 0.0f;
  max_v = 0.0f;
  for (int w = 0; w < kQ8Threads / 32; ++w) {
    max_m = fmaxf(max_m, red_m[w]);
    max_v = fmaxf(max_v, red_v[w]);
  }
  const float inv_m = max_m > 0.0f ? 1.0f / max_m : 0.0f, inv_v = max_v > 0.0f ? 1.0f / max_v : 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float ym = m_new[k] * inv_m, yv = v_new[k] * inv_v;
    int c = q8_encode<kQ8SignedBits>(smap, thr_s, zero_s, fabsf(ym));
    if (signbit(ym)) c |= 0x80;
    cm[k] = static_cast<uint8_t>(c);
    c = q8_encode<kQ8UnsignedBits>(umap, thr_u, zero_u, yv);
    if (c == 0 && yv > 0.0f) c = 1;  // a positive second moment never becomes 0
    cv[k] = static_cast<uint8_t>(c);
  }
  if (full) {
    uint2 rm = make_uint2(0u, 0u), rv = make_uint2(0u, 0u);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      (k < 4 ? rm.x : rm.y) |= static_cast<unsigned>(cm[k]) << (8 * (k & 3));
      (k < 4 ? rv.x : rv.y) |= static_cast<unsigned>(cv[k]) << (8 * (k & 3));
    }
    *reinterpret_cast<uint2*>(qm + i0) = rm;
    *reinterpret_cast<uint2*>(qv + i0) = rv;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (k >= count) break;
      qm[i0 + k] = cm[k];
      qv[i0 + k] = cv[k];
    }
  }
  if (threadIdx.x == 0) {
    am[blockIdx.x] = max_m;
    av[blockIdx.x] = max_v;
  }
}

}  // namespace

void adamw8bit(float* master, uint8_t* qm, uint8_t* qv, float* am, float* av, const void* grad, DType grad_dtype,
               void* param_out, DType param_dtype, int64_t n, const AdamWArgs& a, const Quant8Map& smap,
               const Quant8Map& umap, void* stream) {
  if (n == 0) return;
  constexpr int kPerThread = 8;
  constexpr int64_t kBlockValues = kPerThread * kQ8Threads;
  static_assert(kBlockValues == quant8::kBlock, "one CUDA block per quantisation block");
  auto s = static_cast<cudaStream_t>(stream);
  if (smap.bits != kQ8SignedBits || umap.bits != kQ8UnsignedBits)
    throw InternalError("adamw8bit: the kernel is compiled for 7-bit signed and 8-bit unsigned maps");
  const Quant8Map maps[2] = {smap, umap};
  CUDA_CHECK(cudaMemcpyToSymbolAsync(c_q8_maps, maps, sizeof maps, 0, cudaMemcpyHostToDevice, s));
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
  const float bc2_sqrt =
      std::sqrt(1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step))));
  const int blocks = static_cast<int>((n + kBlockValues - 1) / kBlockValues);
  // 16-byte accesses need 16-byte aligned arrays (8-byte for the codes).
  const auto aligned = [](const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  const bool vec = aligned(master, 16) && aligned(grad, 16) && (!param_out || aligned(param_out, 16)) &&
                   aligned(qm, 8) && aligned(qv, 8);
  const bool g16 = grad_dtype == DType::kBFloat16, p16 = param_dtype == DType::kBFloat16;
#define Q8_LAUNCH(G, P)                                                                                        \
  adamw8bit_kernel<<<blocks, kQ8Threads, 0, s>>>(master, qm, qv, am, av, static_cast<const G*>(grad), \
                                                 static_cast<P*>(param_out), n, a, bc1, bc2_sqrt, vec)
  if (g16 && p16) Q8_LAUNCH(__nv_bfloat16, __nv_bfloat16);
  else if (g16) Q8_LAUNCH(__nv_bfloat16, float);
  else if (p16) Q8_LAUNCH(float, __nv_bfloat16);
  else Q8_LAUNCH(float, float);
#undef Q8_LAUNCH
  CUDA_CHECK(cudaGetLastError());
}

void add_inplace(void* dst, const void* src, int64_t n, DType dtype, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kFloat32)
    add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(static_cast<float*>(dst), static_cast<const float*>(src), n);
  else
    add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(static_cast<__nv_bfloat16*>(dst),
                                                  static_cast<const __nv_bfloat16*>(src), n);
  CUDA_CHECK(cudaGetLastError());
}

void adamw(float* master, float* exp_avg, float* exp_avg_sq, const void* grad, DType grad_dtype, void* param_out,
           DType param_dtype, int64_t n, const AdamWArgs& a, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step)));
  const float bc2_sqrt = std::sqrt(bc2);
  const int threads = 256, blocks = blocks_for(n, threads);
  const bool g16 = grad_dtype == DType::kBFloat16, p16 = param_dtype == DType::kBFloat16;
  if (g16 && p16)
    adamw_kernel<<<blocks, threads, 0, s>>>(master, exp_avg, exp_avg_sq, static_cast<const __nv_bfloat16*>(grad),
                                            static_cast<__nv_bfloat16*>(param_out), n, a, bc1, bc2_sqrt);
  else if (g16 && !p16)
    adamw_kernel<<<blocks, threads, 0, s>>>(master, exp_avg, exp_avg_sq, static_cast<const __nv_bfloat16*>(grad),
                                            static_cast<float*>(param_out), n, a, bc1, bc2_sqrt);
  else if (!g16 && p16)
    adamw_kernel<<<blocks, threads, 0, s>>>(master, exp_avg, exp_avg_sq, static_cast<const float*>(grad),
                                            static_cast<__nv_bfloat16*>(param_out), n, a, bc1, bc2_sqrt);
  else
    adamw_kernel<<<blocks, threads, 0, s>>>(master, exp_avg, exp_avg_sq, static_cast<const float*>(grad),
                                            static_cast<float*>(param_out), n, a, bc1, bc2_sqrt);
  CUDA_CHECK(cudaGetLastError());
}

namespace {

struct Nf4Levels {
  float v[16];
};

// One thread expands 8 code bytes (16 values, a quarter of one 64-value block, so one scale)
// per iteration: an 8-byte load and 16-byte stores keep the kernel at HBM speed. The 16 levels
// sit in shared memory, where the lanes' different codes read without serialising (a kernel
// parameter indexed by the code serialises the warp on its distinct addresses).
template <class T>
__device__ inline void store16(T* out, const float (&v)[16]);

template <>
__device__ inline void store16(__nv_bfloat16* out, const float (&v)[16]) {
  __nv_bfloat162 h[8];
  for (int i = 0; i < 8; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  reinterpret_cast<uint4*>(out)[0] = *reinterpret_cast<const uint4*>(&h[0]);
  reinterpret_cast<uint4*>(out)[1] = *reinterpret_cast<const uint4*>(&h[4]);
}

template <>
__device__ inline void store16(float* out, const float (&v)[16]) {
  for (int i = 0; i < 4; ++i) reinterpret_cast<float4*>(out)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

template <class T>
__global__ void nf4_dequantize_kernel(const uint2* __restrict__ codes, const float* __restrict__ absmax,
                                      T* __restrict__ out, int64_t words, Nf4Levels levels) {
  __shared__ float level[16];
  if (threadIdx.x < 16) level[threadIdx.x] = levels.v[threadIdx.x];
  __syncthreads();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += stride) {
    const uint2 c = codes[w];
    const float scale = absmax[w / 4];  // 4 words of 16 values make one 64-value block
    float v[16];
    for (int b = 0; b < 4; ++b) {
      const uint32_t lo = (c.x >> (8 * b)) & 0xFFu, hi = (c.y >> (8 * b)) & 0xFFu;
      v[2 * b] = level[lo & 0xF] * scale;
      v[2 * b + 1] = level[lo >> 4] * scale;
      v[8 + 2 * b] = level[hi & 0xF] * scale;
      v[8 + 2 * b + 1] = level[hi >> 4] * scale;
    }
    store16(out + 16 * w, v);
  }
}

}  // namespace

void nf4_dequantize(const uint8_t* codes, const float* absmax, void* out, DType out_dtype, int64_t n,
                    const float* levels, void* stream) {
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  Nf4Levels l;
  for (int i = 0; i < 16; ++i) l.v[i] = levels[i];
  // Quantised tensors hold a multiple of 128 values (nf4_tensor.h: quantisable), and the layout
  // packs their codes at multiples of 64 bytes: whole 8-byte words, 16-byte aligned outputs.
  if (n % 16 != 0 || reinterpret_cast<uintptr_t>(codes) % 8 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw std::invalid_argument("nf4_dequantize: " + std::to_string(n) +
                                " values, codes or output not aligned to 8 and 16 bytes");
  const int64_t words = n / 16;
  const auto* w = reinterpret_cast<const uint2*>(codes);
  if (out_dtype == DType::kBFloat16)
    nf4_dequantize_kernel<<<blocks_for(words, 256), 256, 0, s>>>(w, absmax, static_cast<__nv_bfloat16*>(out), words, l);
  else
    nf4_dequantize_kernel<<<blocks_for(words, 256), 256, 0, s>>>(w, absmax, static_cast<float*>(out), words, l);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace stepcast::backend::kernels
