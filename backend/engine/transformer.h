// The decoder-only transformer, written as functions of each unit's
// parameters so that the ZeRO engine decides where parameters live and when
// they exist. Families: Llama/Mistral/Qwen2 (RMSNorm, SwiGLU, RoPE, GQA,
// optional q/k/v bias), GPT-NeoX (LayerNorm with bias, parallel residual,
// partial rotary, biases), GPT-J (one LayerNorm feeding attention and MLP in
// parallel, interleaved partial rotary, lm_head bias).
#pragma once

#include <torch/torch.h>

#include "backend/engine/layout.h"

namespace stepcast::backend {

// Views of one unit's parameters, in layout order. With PEFT the trainable adapters are the
// unit's own and the frozen base weights are looked up next, through `frozen` (a chain: the
// working-precision weights, then QLoRA's codes, then their scales).
struct UnitParams {
  const UnitLayout* layout = nullptr;
  std::vector<torch::Tensor> tensors;
  const UnitParams* frozen = nullptr;
  const torch::Tensor& operator[](const std::string& name) const;
  bool has(const std::string& name) const;
};

// Views (shapes from the layout) into `flat`; `requires_grad` makes them leaves.
UnitParams make_views(const UnitLayout& unit, const torch::Tensor& flat, bool requires_grad);

// How the projections apply adapters (TrainConfig's LoRA settings): y = x W^T + b +
// (alpha / r) dropout(x) A^T B^T wherever the unit holds "X.lora_a" and "X.lora_b".
struct LoraSettings {
  double scale = 1.0;    // alpha / r
  double dropout = 0.0;  // probability of zeroing an input of the adapter
};

class Transformer {
 public:
  Transformer(const ModelSpec& spec, torch::Device device, LoraSettings lora = {});

  torch::Tensor embed(const UnitParams& p, const torch::Tensor& tokens) const;  // (B, S) -> (B, S, h)
  torch::Tensor layer(const UnitParams& p, const torch::Tensor& x) const;       // (B, S, h) -> (B, S, h)
  // Mean cross-entropy (fp32) of next-token prediction; targets (B, S).
  torch::Tensor head_loss(const UnitParams& p, const torch::Tensor& x, const torch::Tensor& targets) const;

  const ModelSpec& spec() const { return spec_; }

  // The family's norm on x (B, S, h): RMSNorm with `weight`, or LayerNorm with `weight` and
  // `bias`. Public, with rotary, so that microbench's element-wise suite times these very ops.
  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias) const;
  torch::Tensor rotary(const torch::Tensor& x, int64_t seq) const;  // (B, S, heads, d)

 private:
  torch::Tensor norm(const UnitParams& p, const std::string& prefix, const torch::Tensor& x) const;
  torch::Tensor attention(const UnitParams& p, const torch::Tensor& x) const;
  torch::Tensor mlp(const UnitParams& p, const torch::Tensor& x) const;
  // The projection `stem` ("qkv", "o", "up", "down", "lm_head"): its weight in the working
  // precision or in NF4, its bias, and its adapter, whichever the unit holds.
  torch::Tensor proj(const UnitParams& p, const std::string& stem, const torch::Tensor& x) const;
  std::pair<int64_t, int64_t> weight_shape(const std::string& stem) const;  // (out, in)
  void ensure_rotary_cache(int64_t seq) const;

  ModelSpec spec_;
  std::vector<LayerProjection> projections_;  // layer_projections(spec_), looked up by stem
  torch::Device device_;
  LoraSettings lora_;
  bool interleaved_rotary_ = false;  // GPT-J rotates pairs (0,1), (2,3), ...
  mutable torch::Tensor cos_, sin_;  // (S, rotary_dim / 2), fp32
  mutable int64_t cached_seq_ = 0;
};

// Deterministic initialisation of a whole unit into `flat` (fp32, padded
// length): the same seed gives the same weights on every rank and device type.
void init_unit(const UnitLayout& unit, torch::Tensor& flat_fp32, uint64_t seed, int64_t num_layers);

}  // namespace stepcast::backend
