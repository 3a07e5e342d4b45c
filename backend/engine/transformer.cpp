#include "backend/engine/transformer.h"

#include <cmath>

#include "backend/engine/nf4_tensor.h"
#include "backend/runtime/compat.h"
#include "common/errors.h"

namespace stepcast::backend {

const torch::Tensor& UnitParams::operator[](const std::string& name) const {
  for (size_t i = 0; i < layout->params.size(); ++i)
    if (layout->params[i].name == name) return tensors[i];
  STEPCAST_ASSERT(frozen != nullptr && "unknown parameter");
  return (*frozen)[name];
}

bool UnitParams::has(const std::string& name) const {
  for (const auto& p : layout->params)
    if (p.name == name) return true;
  return frozen != nullptr && frozen->has(name);
}

UnitParams make_views(const UnitLayout& unit, const torch::Tensor& flat, bool requires_grad) {
  UnitParams out;
  out.layout = &unit;
  for (const auto& slot : unit.params) {
    torch::Tensor v = flat.narrow(0, slot.offset, slot.numel).view(slot.shape);
    if (requires_grad) v = v.detach().requires_grad_(true);
    out.tensors.push_back(v);
  }
  return out;
}

Transformer::Transformer(const ModelSpec& spec, torch::Device device, LoraSettings lora)
    : spec_(spec),
      projections_(layer_projections(spec)),
      device_(device),
      lora_(lora),
      interleaved_rotary_(spec.model_type == "gptj") {}

std::pair<int64_t, int64_t> Transformer::weight_shape(const std::string& stem) const {
  if (const LayerProjection* p = find_projection(projections_, stem)) return {p->out, p->in};
  STEPCAST_ASSERT(stem == "lm_head");
  return {spec_.vocab_size, spec_.hidden_size};
}

torch::Tensor Transformer::proj(const UnitParams& p, const std::string& stem, const torch::Tensor& x) const {
  const std::string w = stem + ".weight", b = stem + ".bias";
  const bool adapted = p.has(stem + ".lora_a");
  // An adapted projection runs on the tokens as rows, so that its base output is a tensor of
  // its own (not a view) which the adapter's update can write in place: autograd then passes
  // the output's gradient through unchanged, where an in-place write into a view would copy it.
  const torch::Tensor rows = adapted ? x.reshape({-1, x.size(-1)}) : x;
  torch::Tensor y;
  if (p.has(w)) {
    y = torch::nn::functional::linear(rows, p[w], p.has(b) ? p[b] : torch::Tensor());
  } else {
    const auto [out, in] = weight_shape(stem);
    y = nf4::linear(rows, p[w + ".nf4"], p[w + ".absmax"], out, in);
    if (p.has(b)) y = y + p[b];
  }
  if (adapted) {
    const torch::Tensor a_in = lora_.dropout > 0.0 ? torch::dropout(rows, lora_.dropout, /*train=*/true) : rows;
    const torch::Tensor low = torch::nn::functional::linear(a_in, p[stem + ".lora_a"]);  // (tokens, S r)
    // y += scale * low B^T in one GEMM that reads and writes y: no product, concatenation,
    // scaled copy or second output materialised. Fused projections take segment s of the
    // output from their own rank-r slice of `low`: B's segments as one block-diagonal
    // (out, S r) matrix.
    const torch::Tensor& b_lora = p[stem + ".lora_b"];
    const LayerProjection* fused = find_projection(projections_, stem);
    const torch::Tensor b_mat = fused != nullptr && fused->part_rows.size() > 1
                                    ? torch::block_diag(b_lora.split_with_sizes(fused->part_rows, 0))
                                    : b_lora;
    y.addmm_(low, b_mat.t(), /*beta=*/1.0, /*alpha=*/lora_.scale);
    std::vector<int64_t> out_shape = x.sizes().vec();
    out_shape.back() = y.size(-1);
    y = y.view(out_shape);
  }
  return y;
}

torch::Tensor Transformer::embed(const UnitParams& p, const torch::Tensor& tokens) const {
  return torch::embedding(p["wte"], tokens);
}

torch::Tensor Transformer::norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const {
  if (spec_.norm == NormKind::kLayer) return torch::layer_norm(x, {spec_.hidden_size}, weight, bias, spec_.norm_eps);
  return compat::rms_norm(x, weight, spec_.norm_eps);
}

torch::Tensor Transformer::norm(const UnitParams& p, const std::string& prefix, const torch::Tensor& x) const {
  const bool biased = spec_.norm == NormKind::kLayer;
  return norm(x, p[prefix + ".weight"], biased ? p[prefix + ".bias"] : torch::Tensor());
}

void Transformer::ensure_rotary_cache(int64_t seq) const {
  if (cached_seq_ == seq) return;
  const int64_t rd = spec_.rotary_dim;
  // inv_freq_j = theta^(-2j / rd), angle(pos, j) = pos * inv_freq_j (Su et al. 2021).
  auto j = torch::arange(0, rd, 2, torch::dtype(torch::kFloat));
  auto inv_freq = torch::pow(spec_.rope_theta, -j / static_cast<double>(rd));
  auto pos = torch::arange(seq, torch::dtype(torch::kFloat));
  auto angles = torch::outer(pos, inv_freq);  // (S, rd/2)
  cos_ = angles.cos().to(device_);
  sin_ = angles.sin().to(device_);
  cached_seq_ = seq;
}

torch::Tensor Transformer::rotary(const torch::Tensor& x, int64_t seq) const {
  const int64_t rd = spec_.rotary_dim;
  if (rd == 0) return x;
  ensure_rotary_cache(seq);
  auto cos = cos_.view({1, seq, 1, rd / 2}).to(x.scalar_type());
  auto sin = sin_.view({1, seq, 1, rd / 2}).to(x.scalar_type());
  auto rot = x.narrow(-1, 0, rd);
  torch::Tensor out;
  if (interleaved_rotary_) {
    // GPT-J: rotate_every_two on pairs (x0, x1), (x2, x3), ...
    auto x1 = rot.slice(-1, 0, rd, 2), x2 = rot.slice(-1, 1, rd, 2);
    out = torch::stack({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).flatten(-2);
  } else {
    // Llama / NeoX: rotate_half on the first and second halves.
    auto x1 = rot.narrow(-1, 0, rd / 2), x2 = rot.narrow(-1, rd / 2, rd / 2);
    out = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  }
  if (rd == x.size(-1)) return out;
  return torch::cat({out, x.narrow(-1, rd, x.size(-1) - rd)}, -1);
}

torch::Tensor Transformer::attention(const UnitParams& p, const torch::Tensor& x) const {
  const int64_t b = x.size(0), s = x.size(1);
  const int64_t nh = spec_.num_heads, nkv = spec_.num_kv_heads, d = spec_.head_dim;
  auto qkv = proj(p, "qkv", x);
  auto q = qkv.narrow(-1, 0, nh * d).view({b, s, nh, d});
  auto k = qkv.narrow(-1, nh * d, nkv * d).view({b, s, nkv, d});
  auto v = qkv.narrow(-1, (nh + nkv) * d, nkv * d).view({b, s, nkv, d});
  q = rotary(q, s).transpose(1, 2);  // (B, nh, S, d)
  k = rotary(k, s).transpose(1, 2);
  v = v.transpose(1, 2);
  if (nkv != nh) {  // grouped-query attention: each KV head serves nh / nkv query heads
    k = k.repeat_interleave(nh / nkv, 1);
    v = v.repeat_interleave(nh / nkv, 1);
  }
  auto o = compat::causal_attention(q.contiguous(), k.contiguous(), v.contiguous());
  o = o.transpose(1, 2).reshape({b, s, nh * d});
  return proj(p, "o", o);
}

torch::Tensor Transformer::mlp(const UnitParams& p, const torch::Tensor& x) const {
  auto up = proj(p, "up", x);
  torch::Tensor act;
  if (spec_.gated_mlp) {
    auto gu = up.chunk(2, -1);
    act = torch::silu(gu[0]) * gu[1];  // SwiGLU (Shazeer 2020)
  } else {
    act = torch::gelu(up, spec_.model_type == "gptj" ? "tanh" : "none");
  }
  return proj(p, "down", act);
}

torch::Tensor Transformer::layer(const UnitParams& p, const torch::Tensor& x) const {
  if (spec_.parallel_residual) {
    // GPT-J: x + attn(ln1(x)) + mlp(ln1(x)); GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x)).
    auto h1 = norm(p, "norm1", x);
    auto h2 = spec_.norms_per_layer == 2 ? norm(p, "norm2", x) : h1;
    return x + attention(p, h1) + mlp(p, h2);
  }
  auto h = x + attention(p, norm(p, "norm1", x));
  return h + mlp(p, norm(p, "norm2", h));
}

torch::Tensor Transformer::head_loss(const UnitParams& p, const torch::Tensor& x, const torch::Tensor& targets) const {
  auto h = spec_.final_norm ? norm(p, "norm", x) : x;
  auto logits = proj(p, "lm_head", h);
  return torch::nn::functional::cross_entropy(logits.to(torch::kFloat).view({-1, spec_.vocab_size}),
                                              targets.reshape({-1}));
}

void init_unit(const UnitLayout& unit, torch::Tensor& flat, uint64_t seed, int64_t num_layers) {
  // Normal(0, 0.02) weights, residual-output projections scaled by
  // 1/sqrt(2 L) (GPT-2, Radford et al. 2019), norms at one, biases at zero.
  // On the CPU a private generator; on the GPU the device's default generator
  // seeded per unit (fast for billions of values; the same on every rank).
  c10::optional<at::Generator> gen;
  if (flat.is_cpu()) {
    gen = at::detail::createCPUGenerator(seed);
  } else {
    torch::manual_seed(seed);
  }
  flat.zero_();
  for (const auto& slot : unit.params) {
    auto view = flat.narrow(0, slot.offset, slot.numel);
    switch (slot.init) {
      case Init::kNormal: view.normal_(0.0, 0.02, gen); break;
      case Init::kScaledNormal: view.normal_(0.0, 0.02 / std::sqrt(2.0 * num_layers), gen); break;
      case Init::kOnes: view.fill_(1.0); break;
      case Init::kZeros: break;
      case Init::kLoraA: {
        const double bound = 1.0 / std::sqrt(static_cast<double>(slot.shape.at(1)));
        view.uniform_(-bound, bound, gen);
        break;
      }
    }
  }
}

}  // namespace stepcast::backend
