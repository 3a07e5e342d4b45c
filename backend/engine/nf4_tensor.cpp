#include "backend/engine/nf4_tensor.h"

#include "backend/cuda/kernels.h"
#include "backend/optim/nf4.h"
#include "common/errors.h"

#ifdef STEPCAST_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace stepcast::backend::nf4 {

namespace {

torch::Tensor levels_on(torch::Device device) {
  const auto& l = levels();
  return torch::tensor(std::vector<float>(l.begin(), l.end()), torch::dtype(torch::kFloat)).to(device);
}

// The 15 midpoints between adjacent levels, computed as encode() does.
torch::Tensor midpoints_on(torch::Device device) {
  const auto& l = levels();
  std::vector<float> mid;
  for (size_t i = 0; i + 1 < l.size(); ++i) mid.push_back(0.5f * (l[i] + l[i + 1]));
  return torch::tensor(mid, torch::dtype(torch::kFloat)).to(device);
}

torch::Tensor dequantize_torch(const torch::Tensor& codes, const torch::Tensor& absmax, torch::ScalarType dtype) {
  const torch::Tensor lo = torch::bitwise_and(codes, 15).to(torch::kLong);
  const torch::Tensor hi = torch::bitwise_right_shift(codes, 4).to(torch::kLong);
  const torch::Tensor idx = torch::stack({lo, hi}, 1).view({-1});
  const torch::Tensor values = levels_on(codes.device()).index_select(0, idx).view({-1, kBlock});
  return (values * absmax.view({-1, 1})).view({-1}).to(dtype);
}

class Nf4Linear : public torch::autograd::Function<Nf4Linear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& codes, const torch::Tensor& absmax, int64_t out, int64_t in) {
    ctx->save_for_backward({codes, absmax});
    ctx->saved_data["out"] = out;
    ctx->saved_data["in"] = in;
    const torch::Tensor w = dequantize(codes, absmax, x.scalar_type()).view({out, in});
    return torch::matmul(x, w.t());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t out = ctx->saved_data["out"].toInt(), in = ctx->saved_data["in"].toInt();
    const torch::Tensor w = dequantize(saved[0], saved[1], grads[0].scalar_type()).view({out, in});
    return {torch::matmul(grads[0], w), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool quantisable(int64_t numel) { return numel > 0 && numel % (2 * kBlock) == 0; }

void quantize_into(const torch::Tensor& x, torch::Tensor& codes, torch::Tensor& absmax) {
  STEPCAST_ASSERT(quantisable(x.numel()) && codes.numel() * 2 == x.numel() && absmax.numel() * kBlock == x.numel());
  const torch::Tensor blocks = x.to(torch::kFloat).reshape({-1, kBlock});
  const torch::Tensor m = blocks.abs().amax(1);
  const torch::Tensor inv = torch::where(m > 0, 1.0f / m, torch::zeros_like(m));
  const torch::Tensor y = torch::nan_to_num(blocks * inv.view({-1, 1}), 0.0);
  // Code = how many midpoints lie at or below y (encode()'s rule, ties upward).
  const torch::Tensor c = torch::bucketize(y, midpoints_on(x.device()), /*out_int32=*/true, /*right=*/true)
                              .view({-1, 2})
                              .to(torch::kByte);
  codes.copy_(torch::bitwise_or(c.select(1, 0), torch::bitwise_left_shift(c.select(1, 1), 4)));
  absmax.copy_(m);
}

torch::Tensor dequantize(const torch::Tensor& codes, const torch::Tensor& absmax, torch::ScalarType dtype) {
#if defined(STEPCAST_BACKEND_CUDA) && defined(STEPCAST_TORCH_CUDA)
  if (codes.is_cuda()) {
    torch::Tensor out = torch::empty({codes.numel() * 2}, torch::dtype(dtype).device(codes.device()));
    kernels::nf4_dequantize(codes.data_ptr<uint8_t>(), absmax.data_ptr<float>(), out.data_ptr(),
                            dtype == torch::kBFloat16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32,
                            out.numel(), levels().data(),
                            c10::cuda::getCurrentCUDAStream(codes.device().index()).stream());
    return out;
  }
#endif
  return dequantize_torch(codes, absmax, dtype);
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& codes, const torch::Tensor& absmax, int64_t out,
                     int64_t in) {
  return Nf4Linear::apply(x, codes, absmax, out, in);
}

}  // namespace stepcast::backend::nf4
