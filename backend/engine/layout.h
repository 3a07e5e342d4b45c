// The backend's parameter layout: the model split into units (embedding,
// each layer, head), each unit one flat buffer holding its parameters back to
// back. ZeRO partitions, gathers, reduces and updates unit by unit.
#pragma once

#include <string>
#include <vector>

#include "model/model_spec.h"

namespace stepcast::backend {

enum class Init { kNormal, kZeros, kOnes, kScaledNormal };  // scaled: output projections, 1/sqrt(2L)

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

}  // namespace stepcast::backend
