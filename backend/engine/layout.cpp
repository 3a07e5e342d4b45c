#include "backend/engine/layout.h"

#include <algorithm>

#include "backend/engine/nf4_tensor.h"
#include "backend/optim/nf4.h"
#include "backend/optim/quant8.h"
#include "common/errors.h"

namespace stepcast::backend {

const ParamSlot& UnitLayout::param(const std::string& n) const {
  for (const auto& p : params)
    if (p.name == n) return p;
  STEPCAST_ASSERT(false && "unknown parameter name");
}

namespace {

class UnitBuilder {
 public:
  UnitBuilder(UnitKind kind, std::string name) {
    unit_.kind = kind;
    unit_.name = std::move(name);
  }
  void add(const std::string& name, std::vector<int64_t> shape, Init init) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    unit_.params.push_back({name, std::move(shape), unit_.numel, n, init});
    unit_.numel += n;
  }
  UnitLayout finish(int world) {
    // Small tensors last, so that each shard splits into one 8-bit range and one 32-bit range.
    std::stable_partition(unit_.params.begin(), unit_.params.end(),
                          [](const ParamSlot& p) { return p.numel >= quant8::kMinNumel; });
    int64_t offset = 0;
    unit_.small_begin = -1;
    for (ParamSlot& p : unit_.params) {
      if (p.numel < quant8::kMinNumel && unit_.small_begin < 0) unit_.small_begin = offset;
      p.offset = offset;
      offset += p.numel;
    }
    if (unit_.small_begin < 0) unit_.small_begin = unit_.numel;
    // Shards start on a quantisation block, so that 8-bit AdamW's blocks are the same at every stage.
    const int64_t align = quant8::kBlock * world;
    unit_.world = world;
    unit_.padded_numel = std::max(align, (unit_.numel + align - 1) / align * align);
    return unit_;
  }

 private:
  UnitLayout unit_;
};

}  // namespace

std::vector<UnitLayout> build_layout(const ModelSpec& m, int world) {
  const bool llama_like = m.model_type == "llama" || m.model_type == "mistral" || m.model_type == "qwen2";
  if (!llama_like && m.model_type != "gpt_neox" && m.model_type != "gptj")
    throw InputError("model '" + m.name + "' (model_type " + m.model_type +
                     "): the backend runs llama, mistral, qwen2, gpt_neox and gptj");
  if (m.tied_embeddings) throw InputError("model '" + m.name + "': tied embeddings are not supported by the backend");
  if (m.learned_position_embeddings > 0 || m.word_embed_proj_dim > 0)
    throw InputError("model '" + m.name + "': learned position embeddings are not supported by the backend");
  const int64_t h = m.hidden_size, i = m.intermediate_size;
  const bool layer_norm = m.norm == NormKind::kLayer;
  std::vector<UnitLayout> units;

  UnitBuilder embed(UnitKind::kEmbedding, "embed");
  embed.add("wte", {m.vocab_size, h}, Init::kNormal);
  units.push_back(embed.finish(world));

  for (int64_t l = 0; l < m.num_layers; ++l) {
    UnitBuilder u(UnitKind::kLayer, "layer" + std::to_string(l));
    auto norm = [&](const std::string& name) {
      u.add(name + ".weight", {h}, Init::kOnes);
      if (layer_norm) u.add(name + ".bias", {h}, Init::kZeros);
    };
    norm("norm1");
    if (m.norms_per_layer == 2) norm("norm2");
    // q, k and v in one matrix: one GEMM (rows: q_dim, then kv_dim for k and v).
    u.add("qkv.weight", {m.q_dim() + 2 * m.kv_dim(), h}, Init::kNormal);
    if (m.qkv_bias) u.add("qkv.bias", {m.q_dim() + 2 * m.kv_dim()}, Init::kZeros);
    u.add("o.weight", {h, m.q_dim()}, Init::kScaledNormal);
    if (m.attn_out_bias) u.add("o.bias", {h}, Init::kZeros);
    if (m.gated_mlp) {
      u.add("up.weight", {2 * i, h}, Init::kNormal);  // gate rows, then up rows
      if (m.mlp_bias) u.add("up.bias", {2 * i}, Init::kZeros);
    } else {
      u.add("up.weight", {i, h}, Init::kNormal);
      if (m.mlp_bias) u.add("up.bias", {i}, Init::kZeros);
    }
    u.add("down.weight", {h, i}, Init::kScaledNormal);
    if (m.mlp_bias) u.add("down.bias", {h}, Init::kZeros);
    units.push_back(u.finish(world));
  }

  UnitBuilder head(UnitKind::kHead, "head");
  if (m.final_norm) {
    head.add("norm.weight", {h}, Init::kOnes);
    if (layer_norm) head.add("norm.bias", {h}, Init::kZeros);
  }
  head.add("lm_head.weight", {m.vocab_size, h}, Init::kNormal);
  if (m.lm_head_bias) head.add("lm_head.bias", {m.vocab_size}, Init::kZeros);
  units.push_back(head.finish(world));
  return units;
}

const LayerProjection* find_projection(const std::vector<LayerProjection>& projections, const std::string& stem) {
  for (const LayerProjection& p : projections)
    if (p.stem == stem) return &p;
  return nullptr;
}

bool lora_targeted(const ModelSpec& spec, const std::string& w, LoraTargets t) {
  const std::string suffix = ".weight";
  if (w.size() <= suffix.size() || w.compare(w.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const LayerProjection* p = find_projection(layer_projections(spec), w.substr(0, w.size() - suffix.size()));
  return p != nullptr && lora_adapts(p->attention, t);
}

int64_t lora_segments(const ModelSpec& spec, const std::string& stem) {
  const LayerProjection* p = find_projection(layer_projections(spec), stem);
  return p == nullptr ? 1 : static_cast<int64_t>(p->part_rows.size());
}

std::vector<UnitLayout> build_adapter_layout(const ModelSpec& spec, const std::vector<UnitLayout>& base, int64_t rank,
                                             LoraTargets targets, int world) {
  std::vector<UnitLayout> out;
  for (const UnitLayout& b : base) {
    UnitBuilder u(b.kind, b.name);
    if (b.kind == UnitKind::kLayer)
      for (const ParamSlot& p : b.params) {
        if (!lora_targeted(spec, p.name, targets)) continue;
        const std::string stem = p.name.substr(0, p.name.size() - std::string(".weight").size());
        const int64_t segments = lora_segments(spec, stem);
        u.add(stem + ".lora_a", {segments * rank, p.shape[1]}, Init::kLoraA);
        u.add(stem + ".lora_b", {p.shape[0], rank}, Init::kZeros);
      }
    out.push_back(u.finish(world));
  }
  return out;
}

std::vector<FrozenLayout> build_frozen_layout(const std::vector<UnitLayout>& base, bool qlora, int world) {
  std::vector<FrozenLayout> out;
  for (const UnitLayout& b : base) {
    UnitBuilder work(b.kind, b.name), codes(b.kind, b.name), absmax(b.kind, b.name);
    for (const ParamSlot& p : b.params) {
      // QLoRA quantises the layers' projection weights; embeddings, head, norms and biases stay 16-bit.
      const bool quantised = qlora && b.kind == UnitKind::kLayer && p.shape.size() == 2 && nf4::quantisable(p.numel);
      if (quantised) {
        codes.add(p.name + ".nf4", {p.numel / 2}, p.init);
        absmax.add(p.name + ".absmax", {p.numel / nf4::kBlock}, p.init);
      } else {
        work.add(p.name, p.shape, p.init);
      }
    }
    out.push_back({work.finish(world), codes.finish(world), absmax.finish(world)});
  }
  return out;
}

int64_t total_numel(const std::vector<UnitLayout>& units) {
  int64_t n = 0;
  for (const auto& u : units) n += u.numel;
  return n;
}

}  // namespace stepcast::backend
