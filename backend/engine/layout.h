// The backend's parameter layout: the model split into units (embedding,
// each layer, head), each unit one flat buffer holding its parameters back to
// back. ZeRO partitions, gathers, reduces and updates unit by unit.
#pragma once

#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/train_config.h"

namespace stepcast::backend {

// kScaledNormal: output projections, 1/sqrt(2L). kLoraA: a LoRA down-projection A (r x in),
// uniform in +-1/sqrt(in) (Kaiming-uniform with a = sqrt 5, the PEFT library's default; the
// up-projection B starts at zero so that training starts from the base model, Hu et al. 2021).
enum class Init { kNormal, kZeros, kOnes, kScaledNormal, kLoraA };

struct ParamSlot {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // elements into the unit's flat buffer
  int64_t numel = 0;
  Init init = Init::kNormal;
};

enum class UnitKind { kEmbedding, kLayer, kHead };

struct UnitLayout {
  UnitKind kind = UnitKind::kLayer;
  std::string name;
  std::vector<ParamSlot> params;
  int64_t numel = 0;         // parameters
  int64_t padded_numel = 0;  // rounded up to a multiple of world size x 2048 (8-bit AdamW's block)
  // Parameters of tensors under quant8::kMinNumel come last, from here on:
  // 8-bit AdamW keeps 32-bit states for [small_begin, padded_numel).
  int64_t small_begin = 0;
  int64_t shard_numel() const { return padded_numel / world; }
  int64_t world = 1;
  const ParamSlot& param(const std::string& name) const;
};

// Throws InputError for families the backend does not run (gpt2, opt, tied embeddings).
std::vector<UnitLayout> build_layout(const ModelSpec& spec, int world_size);

int64_t total_numel(const std::vector<UnitLayout>& units);

// A layer's projection by its stem ("qkv", "o", "up", "down"; model_spec.h layer_projections),
// or nullptr for any other parameter (norms, biases).
const LayerProjection* find_projection(const std::vector<LayerProjection>& projections, const std::string& stem);

// PEFT: whether a layer's weight ("qkv.weight", "o.weight", "up.weight", "down.weight")
// carries an adapter for `targets`.
bool lora_targeted(const ModelSpec& spec, const std::string& weight_name, LoraTargets targets);

// The adapters of a fused projection: one per part the Hugging Face model keeps as a module
// (LayerProjection::part_rows), as PEFT adapts q_proj, k_proj, v_proj, gate_proj and up_proj
// separately: 3 for qkv (1 for GPT-NeoX's query_key_value), 2 for a gated up, else 1.
int64_t lora_segments(const ModelSpec& spec, const std::string& stem);

// PEFT's trainable units, one per base unit, in the same order: for each targeted weight
// "X.weight" (out x in) of a layer, "X.lora_a" (S r x in: the segments' A matrices stacked)
// and "X.lora_b" (out x r: segment s's B in its own rows of the weight), so that segment s of
// the output gains (alpha / r) B_s A_s x. The embedding and head units hold no adapter: their
// buffers are padding only (one block per rank), so that every unit reduces and gathers alike.
std::vector<UnitLayout> build_adapter_layout(const ModelSpec& spec, const std::vector<UnitLayout>& base, int64_t rank,
                                             LoraTargets targets, int world_size);

// PEFT's frozen base weights of one unit, by storage: parameters in the working precision,
// and with QLoRA the layer weights in NF4 as "X.weight.nf4" (uint8 codes, numel / 2) and
// "X.weight.absmax" (fp32, numel / 64); each padded for sharding like a trainable unit.
struct FrozenLayout {
  UnitLayout work, codes, absmax;
};
std::vector<FrozenLayout> build_frozen_layout(const std::vector<UnitLayout>& base, bool qlora, int world_size);

}  // namespace stepcast::backend
