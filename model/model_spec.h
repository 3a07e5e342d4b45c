// ModelSpec: the architecture facts of a decoder-only transformer that the
// cost model and the backend need, read from a TOML card in data/models/ or
// from a Hugging Face config.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace stepcast {

enum class NormKind { kRms, kLayer };

struct ModelSpec {
  std::string name;        // catalog name, e.g. "llama-2-7b"
  std::string model_type;  // Hugging Face model_type: llama, mistral, qwen2, gpt_neox, gptj, gpt2, opt
  std::string source;      // where the numbers come from

  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // grouped-query attention; == num_heads for MHA
  int64_t head_dim = 0;      // usually hidden_size / num_heads
  int64_t intermediate_size = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;

  bool gated_mlp = false;          // SwiGLU: gate, up, down (three matrices)
  NormKind norm = NormKind::kRms;  // RMSNorm (weight) or LayerNorm (weight + bias)
  bool qkv_bias = false;           // bias on q, k, v projections
  bool attn_out_bias = false;      // bias on the attention output projection
  bool mlp_bias = false;           // bias on the MLP matrices
  bool lm_head_bias = false;       // GPT-J's lm_head has a bias
  bool tied_embeddings = false;    // lm_head shares the input embedding
  bool parallel_residual = false;  // GPT-J / GPT-NeoX: attention and MLP read the same input
  int64_t norms_per_layer = 2;     // GPT-J: 1 (shared input norm); others 2
  bool final_norm = true;
  int64_t rotary_dim = 0;                  // 0 = no rotary; == head_dim for full rotary
  int64_t learned_position_embeddings = 0;  // rows of a learned position table (GPT-2, OPT)
  int64_t word_embed_proj_dim = 0;          // OPT: embedding width if != hidden_size
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;

  // A sequence longer than config.json's max_position_embeddings, for a model whose positions
  // stop there: rotary embeddings trained to that length, or a learned table of that many rows.
  // (ALiBi and other unbounded schemes are not flagged.)
  bool beyond_trained_context(int64_t seq) const {
    return max_position_embeddings > 0 && seq > max_position_embeddings &&
           (rotary_dim > 0 || learned_position_embeddings > 0);
  }

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t embed_dim() const { return word_embed_proj_dim > 0 ? word_embed_proj_dim : hidden_size; }

  // Parameter counts exactly as the Hugging Face implementation registers
  // them (tied weights counted once, buffers such as rotary inv_freq excluded).
  int64_t params_per_layer() const;
  int64_t embedding_params() const;  // token (+ position) embeddings and OPT projections
  int64_t lm_head_params() const;    // 0 when tied
  int64_t final_norm_params() const;
  int64_t total_params() const;
  // Modules that hold parameters, as the Hugging Face implementation registers them: per layer
  // the attention projections (q, k, v, o; one fused qkv for gpt_neox, gpt2 and mpt), the MLP
  // matrices (three gated, two plain) and the norms; outside the layers the embeddings, the
  // final norm and an untied lm_head. ZeRO-3 hooks fetch each one on its own.
  int64_t param_modules_per_layer() const;
  int64_t param_modules_outside_layers() const;
  // Parameter tensors (weights and biases) as transformers registers them, in a layer and outside.
  int64_t param_tensors_per_layer() const;
  int64_t param_tensors_outside_layers() const;
};

// How Hugging Face transformers (5.17, the version on the GPU host) implements an architecture,
// where the peers' harnesses run it and it differs from our backend. One place for facts read
// from transformers' modeling code and measured with the peers:
// - has_sdpa: GPTJForCausalLM raises "does not support an attention implementation through
//   torch.nn.functional.scaled_dot_product_attention yet"
//   (data/runs/h200-sxm/logs/2026-12-01_peers_deepspeed_1gpu_holdout_peer.log), so the peers
//   build it with attn_implementation="eager";
// - fp32_query_key: GPT-J's _attn upcasts query and key to fp32 (modeling_gptj.py), so its
//   eager scores are fp32 up to the cast back;
// - position_table_rows: GPT-J's create_sinusoidal_positions builds a table of n_positions rows
//   and indexes it by position: a longer sequence is a CUDA device-side assert (measured with
//   DeepSpeed on the H200 at sequence 4096,
//   data/runs/h200-sxm/logs/2026-12-02_peers_deepspeed_1gpu_attention.log). 0: no fixed table.
struct TransformersImpl {
  bool has_sdpa = true;
  bool fp32_query_key = false;
  int64_t position_table_rows = 0;
};
TransformersImpl transformers_impl(const ModelSpec& m);

// One of a layer's four weight matrices as the Stepcast backend stores it (q, k and v fused in
// "qkv"; gate and up fused in "up" for gated MLPs), with the output rows of each part the
// Hugging Face model keeps as a module of its own (q_proj, k_proj, v_proj; gate_proj,
// up_proj), which is where PEFT puts one adapter each. GPT-NeoX keeps query_key_value as one
// module: one part. The cost model, the backend's layout and its transformer read this list.
struct LayerProjection {
  std::string stem;                 // parameter name without ".weight": qkv, o, up, down
  int64_t out = 0, in = 0;          // the stored weight's shape (out x in)
  std::vector<int64_t> part_rows;   // output rows of each separately adapted part; they sum to out
  bool attention = false;           // an attention projection (else the MLP's)
};
std::vector<LayerProjection> layer_projections(const ModelSpec& spec);

// Checks ranges and consistency; throws InputError naming `origin` (a file).
// `source_keys` maps a field's name (as in TOML cards) to the key the source file spells
// it with (config.json's num_hidden_layers, n_embd, ...), for the error message.
void validate_model_spec(const ModelSpec& spec, const std::string& origin,
                         const std::map<std::string, std::string>& source_keys = {});

// Reads a Stepcast model card (TOML). Throws InputError naming file, key and value.
ModelSpec load_model_card(const std::filesystem::path& path);

// Reads a Hugging Face config.json (a file, or a folder that holds one).
ModelSpec load_hf_config(const std::filesystem::path& path);

// Parses card text / config.json text (for tests and fuzzing); `origin` names
// the file in error messages.
ModelSpec parse_model_card(const std::string& toml_text, const std::string& origin);
ModelSpec parse_hf_config(const std::string& json_text, const std::string& origin);

struct CatalogEntry {
  std::string name;
  std::vector<std::string> aliases;
  std::filesystem::path path;
};

// The cards in data_dir/models, sorted by name.
std::vector<CatalogEntry> list_model_catalog(const std::filesystem::path& data_dir);

// The folder with models/ and hardware/: an explicit --data-dir flag, else
// $STEPCAST_DATA_DIR, else the data/ of the source tree this build came from.
std::filesystem::path resolve_data_dir(const std::string& flag);

// Resolves --model: a catalog name or alias, a .toml card path, a config.json
// path, or a folder holding config.json. Unknown names list the known ones.
ModelSpec resolve_model(const std::string& name_or_path, const std::filesystem::path& data_dir);

}  // namespace stepcast
