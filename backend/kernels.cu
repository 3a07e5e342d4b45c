#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/kernels.h"

namespace stepcast::backend::kernels {

namespace {

void check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed at " + file + ":" + std::to_string(line) + ": " +
                             cudaGetErrorString(err));
}
#define CUDA_CHECK(call) check((call), #call, __FILE__, __LINE__)

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

}  // namespace

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

}  // namespace stepcast::backend::kernels
