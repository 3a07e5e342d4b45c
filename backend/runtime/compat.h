// The small set of places where LibTorch 1.13 (Debian, CPU) and 2.x (the GPU
// machine's torch) differ. Everything else in the backend is version-agnostic.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

namespace stepcast::compat {

inline constexpr bool kTorch2 = TORCH_VERSION_MAJOR >= 2;

// Causal scaled-dot-product attention on (B, heads, S, head_dim) tensors.
// 2.x: at::scaled_dot_product_attention (flash / memory-efficient kernels on
// the GPU). 1.13: the materialised softmax(QK^T / sqrt(d)) V, which is exact.
inline torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true);
#else
  const int64_t s = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;
  auto mask = torch::ones({s, s}, torch::dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores.to(torch::kFloat), -1).to(q.scalar_type()), v);
#endif
}

// RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * w, accumulated
// in fp32. LibTorch >= 2.4 has at::rms_norm (a fused kernel on the GPU in
// recent versions); 1.13 composes it from elementwise ops.
inline torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
  return at::rms_norm(x, {x.size(-1)}, w, eps);
#else
  auto xf = x.to(torch::kFloat);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return y.to(x.scalar_type()) * w;
#endif
}

// Frees / re-allocates the memory behind a tensor's storage while keeping the
// storage object (and every view and autograd reference to it) alive: how
// stage 3 drops gathered parameters after forward and refills them before
// backward (PyTorch FSDP does the same with storage resizing).
inline void free_storage(const torch::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  impl->set_nbytes(0);
}

inline void alloc_storage(const torch::Tensor& t, size_t nbytes) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  if (impl->nbytes() == nbytes) return;
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

}  // namespace stepcast::compat
