#include "model/model_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
#include "common/text_file.h"
#include "model/toml_reader.h"

namespace stepcast {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// Parameter counting. Each term mirrors a module of the Hugging Face
// implementation of the family (modeling_llama.py, modeling_gptj.py,
// modeling_gpt_neox.py, modeling_gpt2.py, modeling_opt.py):
//   attention  q: h x q_dim (+q_dim bias), k and v: h x kv_dim (+kv_dim bias),
//              o: q_dim x h (+h bias)
//   MLP        gated (SwiGLU): gate and up h x i, down i x h (+2i + h bias)
//              plain: h x i and i x h (+i + h bias)
//   norms      RMSNorm: h weights; LayerNorm: h weights + h biases
// ---------------------------------------------------------------------------
int64_t ModelSpec::params_per_layer() const {
  const int64_t h = hidden_size;
  int64_t attention = h * q_dim() + 2 * h * kv_dim() + q_dim() * h;
  if (qkv_bias) attention += q_dim() + 2 * kv_dim();
  if (attn_out_bias) attention += h;

  const int64_t i = intermediate_size;
  int64_t mlp = gated_mlp ? 3 * h * i : 2 * h * i;
  if (mlp_bias) mlp += gated_mlp ? 2 * i + h : i + h;

  const int64_t norm_params = (norm == NormKind::kLayer ? 2 : 1) * h;
  return attention + mlp + norms_per_layer * norm_params;
}

int64_t ModelSpec::embedding_params() const {
  int64_t params = vocab_size * embed_dim() + learned_position_embeddings * hidden_size;
  if (embed_dim() != hidden_size) params += 2 * embed_dim() * hidden_size;  // OPT project_in/out
  return params;
}

int64_t ModelSpec::lm_head_params() const {
  if (tied_embeddings) return lm_head_bias ? vocab_size : 0;
  return vocab_size * embed_dim() + (lm_head_bias ? vocab_size : 0);
}

int64_t ModelSpec::final_norm_params() const {
  if (!final_norm) return 0;
  return (norm == NormKind::kLayer ? 2 : 1) * hidden_size;
}

namespace {

// Architectures whose transformers implementation holds q, k and v in one projection.
bool fused_qkv(const ModelSpec& m) {
  return m.model_type == "gpt_neox" || m.model_type == "gpt2" || m.model_type == "mpt";
}

}  // namespace

int64_t ModelSpec::param_modules_per_layer() const {
  const int64_t attn = fused_qkv(*this) ? 2 : 4;
  const int64_t mlp = gated_mlp ? 3 : 2;
  return attn + mlp + norms_per_layer;
}

int64_t ModelSpec::param_modules_outside_layers() const {
  return 1 + (learned_position_embeddings > 0 ? 1 : 0) + (word_embed_proj_dim > 0 ? 2 : 0) + (final_norm ? 1 : 0) +
         (tied_embeddings ? 0 : 1);
}

int64_t ModelSpec::param_tensors_per_layer() const {
  const bool fused = fused_qkv(*this);
  const int64_t attn_weights = fused ? 2 : 4;
  const int64_t mlp_weights = gated_mlp ? 3 : 2;
  const int64_t biases = (qkv_bias ? (fused ? 1 : 3) : 0) + (attn_out_bias ? 1 : 0) + (mlp_bias ? mlp_weights : 0);
  return attn_weights + mlp_weights + biases + norms_per_layer * (norm == NormKind::kLayer ? 2 : 1);
}

int64_t ModelSpec::param_tensors_outside_layers() const {
  return 1 + (learned_position_embeddings > 0 ? 1 : 0) + (word_embed_proj_dim > 0 ? 2 : 0) +
         (final_norm ? (norm == NormKind::kLayer ? 2 : 1) : 0) + (tied_embeddings ? 0 : 1 + (lm_head_bias ? 1 : 0));
}

TransformersImpl transformers_impl(const ModelSpec& m) {
  TransformersImpl t;
  if (m.model_type == "gptj") {
    t.has_sdpa = false;
    t.fp32_query_key = true;
    t.position_table_rows = m.max_position_embeddings;
  }
  return t;
}

int64_t ModelSpec::total_params() const {
  return embedding_params() + num_layers * params_per_layer() + final_norm_params() +
         lm_head_params();
}

static const char* kKnownModelTypes[] = {"llama", "mistral", "qwen2", "gpt_neox", "gptj", "gpt2", "mpt",
                                         "opt"};

static std::string known_model_types() {
  std::string out;
  for (const char* t : kKnownModelTypes) out += (out.empty() ? "" : ", ") + std::string(t);
  return out;
}

void validate_model_spec(const ModelSpec& m, const std::string& origin,
                         const std::map<std::string, std::string>& source_keys) {
  auto bad = [&](const std::string& key, int64_t value, const std::string& why) {
    const auto it = source_keys.find(key);
    throw InputError(origin + ": key '" + (it == source_keys.end() ? key : it->second) + "' = " +
                     std::to_string(value) + " " + why);
  };
  if (m.hidden_size <= 0) bad("hidden_size", m.hidden_size, "must be positive");
  if (m.num_layers <= 0) bad("num_layers", m.num_layers, "must be positive");
  if (m.num_heads <= 0) bad("num_heads", m.num_heads, "must be positive");
  if (m.num_kv_heads <= 0 || m.num_kv_heads > m.num_heads || m.num_heads % m.num_kv_heads != 0)
    bad("num_kv_heads", m.num_kv_heads,
        "must divide num_heads = " + std::to_string(m.num_heads));
  if (m.head_dim <= 0 || m.head_dim > (1 << 20)) bad("head_dim", m.head_dim, "is out of range [1, 2^20]");
  if (m.intermediate_size <= 0) bad("intermediate_size", m.intermediate_size, "must be positive");
  if (m.vocab_size <= 0 || m.vocab_size > (1 << 24)) bad("vocab_size", m.vocab_size, "is out of range [1, 2^24]");
  if (m.rotary_dim < 0 || m.rotary_dim > m.head_dim)
    bad("rotary_dim", m.rotary_dim, "must lie in [0, head_dim = " + std::to_string(m.head_dim) + "]");
  if (m.norms_per_layer < 1 || m.norms_per_layer > 2)
    bad("norms_per_layer", m.norms_per_layer, "must be 1 or 2");
  if (m.max_position_embeddings < 0)
    bad("max_position_embeddings", m.max_position_embeddings, "must not be negative");
  // A guard against nonsense sizes that would overflow the counts (10^15 parameters), in
  // doubles, naming the key that makes the model too large.
  const double h = static_cast<double>(m.hidden_size), d = static_cast<double>(m.head_dim);
  const double attention = h * d * (2.0 * m.num_heads + 2.0 * m.num_kv_heads);
  const double mlp = h * static_cast<double>(m.intermediate_size) * 3.0;
  const double embeddings = static_cast<double>(m.vocab_size) * h * 2.0;
  constexpr double kMaxParams = 1e15;
  const auto too_big = [&](const std::string& key, int64_t value) { bad(key, value, "gives a model over 10^15 parameters"); };
  if (embeddings > kMaxParams) too_big(m.vocab_size > m.hidden_size ? "vocab_size" : "hidden_size",
                                       m.vocab_size > m.hidden_size ? m.vocab_size : m.hidden_size);
  if (attention > kMaxParams) too_big(m.head_dim > m.hidden_size ? "head_dim" : "hidden_size",
                                      m.head_dim > m.hidden_size ? m.head_dim : m.hidden_size);
  if (mlp > kMaxParams) too_big(m.intermediate_size > m.hidden_size ? "intermediate_size" : "hidden_size",
                                m.intermediate_size > m.hidden_size ? m.intermediate_size : m.hidden_size);
  if ((attention + mlp) * static_cast<double>(m.num_layers) + embeddings > kMaxParams) too_big("num_layers", m.num_layers);
}

// ---------------------------------------------------------------------------
// Stepcast TOML cards
// ---------------------------------------------------------------------------
ModelSpec parse_model_card(const std::string& text, const std::string& origin) {
  toml::table table = TomlReader::parse(text, origin);
  TomlReader r(table, origin);
  r.reject_unknown_keys({"name", "aliases", "model_type", "source", "hidden_size", "num_layers",
                         "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                         "vocab_size", "max_position_embeddings", "gated_mlp", "norm", "qkv_bias",
                         "attn_out_bias", "mlp_bias", "lm_head_bias", "tied_embeddings",
                         "parallel_residual", "norms_per_layer", "final_norm", "rotary_dim",
                         "learned_position_embeddings", "word_embed_proj_dim", "norm_eps",
                         "rope_theta"});
  constexpr int64_t kBig = int64_t{1} << 40;
  ModelSpec m;
  m.name = r.get_string("name");
  if (m.name.empty()) throw InputError(origin + ": key 'name' must not be empty");
  m.model_type = r.get_string("model_type");
  if (std::find(std::begin(kKnownModelTypes), std::end(kKnownModelTypes), m.model_type) ==
      std::end(kKnownModelTypes))
    throw InputError(origin + ": key 'model_type' = \"" + m.model_type +
                     "\" is not supported (valid: " + known_model_types() + ")");
  m.source = r.get_string("source");
  m.hidden_size = r.get_int("hidden_size", 1, kBig);
  m.num_layers = r.get_int("num_layers", 1, 100000);
  m.num_heads = r.get_int("num_heads", 1, 1 << 20);
  m.num_kv_heads = r.get_int_or("num_kv_heads", m.num_heads, 1, 1 << 20);
  // Without head_dim the heads split the hidden size evenly, as in config.json.
  if (m.hidden_size % m.num_heads != 0 && !table.contains("head_dim"))
    throw InputError(origin + ": key 'num_heads' = " + std::to_string(m.num_heads) + " must divide hidden_size = " +
                     std::to_string(m.hidden_size) + " (or give head_dim)");
  const int64_t default_head_dim = m.hidden_size / m.num_heads;
  m.head_dim = r.get_int_or("head_dim", default_head_dim, 1, 1 << 20);
  m.intermediate_size = r.get_int("intermediate_size", 1, kBig);
  m.vocab_size = r.get_int("vocab_size", 1, kBig);
  m.max_position_embeddings = r.get_int_or("max_position_embeddings", 0, 0, kBig);
  m.gated_mlp = r.get_bool_or("gated_mlp", false);
  const std::string norm = r.get_string_or("norm", "rms");
  if (norm == "rms") {
    m.norm = NormKind::kRms;
  } else if (norm == "layer") {
    m.norm = NormKind::kLayer;
  } else {
    throw InputError(origin + ": key 'norm' = \"" + norm + "\" is not valid (valid: rms, layer)");
  }
  m.qkv_bias = r.get_bool_or("qkv_bias", false);
  m.attn_out_bias = r.get_bool_or("attn_out_bias", false);
  m.mlp_bias = r.get_bool_or("mlp_bias", false);
  m.lm_head_bias = r.get_bool_or("lm_head_bias", false);
  m.tied_embeddings = r.get_bool_or("tied_embeddings", false);
  m.parallel_residual = r.get_bool_or("parallel_residual", false);
  m.norms_per_layer = r.get_int_or("norms_per_layer", 2, 1, 2);
  m.final_norm = r.get_bool_or("final_norm", true);
  m.rotary_dim = r.get_int_or("rotary_dim", 0, 0, kBig);
  m.learned_position_embeddings = r.get_int_or("learned_position_embeddings", 0, 0, kBig);
  m.word_embed_proj_dim = r.get_int_or("word_embed_proj_dim", 0, 0, kBig);
  m.norm_eps = r.get_double_or("norm_eps", 1e-5, 0.0, 1.0);
  m.rope_theta = r.get_double_or("rope_theta", 10000.0, 0.0, 1e12);
  validate_model_spec(m, origin);
  return m;
}

ModelSpec load_model_card(const fs::path& path) {
  return parse_model_card(read_text_file(path), path.string());
}

// ---------------------------------------------------------------------------
// Hugging Face config.json
// ---------------------------------------------------------------------------
namespace {

class JsonReader {
 public:
  JsonReader(const nlohmann::json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  bool present(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  [[noreturn]] void fail(const char* key, const std::string& what) const {
    std::string value = j_.contains(key) ? j_.at(key).dump() : "(missing)";
    if (value.size() > 60) value = value.substr(0, 57) + "...";
    throw InputError(origin_ + ": key '" + key + "' = " + value + " " + what);
  }

  int64_t integer(const char* key, int64_t min_value = 1) const {
    if (!present(key)) fail(key, "is required (a positive integer)");
    const auto& v = j_.at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer");
    int64_t out = v.get<int64_t>();
    if (out < min_value || out > (int64_t{1} << 40)) fail(key, "is out of range");
    return out;
  }
  // First key present of `keys`, e.g. {"hidden_size", "n_embd"}.
  int64_t integer_any(std::initializer_list<const char*> keys, int64_t min_value = 1) const {
    for (const char* k : keys)
      if (present(k)) return integer(k, min_value);
    std::string names;
    for (const char* k : keys) names += (names.empty() ? "" : " or ") + std::string(k);
    throw InputError(origin_ + ": key '" + names + "' is required (a positive integer)");
  }
  int64_t integer_or(const char* key, int64_t fallback, int64_t min_value = 1) const {
    return present(key) ? integer(key, min_value) : fallback;
  }
  double number_or(const char* key, double fallback) const {
    if (!present(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_number()) fail(key, "must be a number");
    double out = v.get<double>();
    if (!std::isfinite(out) || out < 0) fail(key, "must be a finite non-negative number");
    return out;
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!present(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_boolean()) fail(key, "must be true or false");
    return v.get<bool>();
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!present(key)) return fallback;
    const auto& v = j_.at(key);
    if (!v.is_string()) fail(key, "must be a string");
    return v.get<std::string>();
  }

 private:
  const nlohmann::json& j_;
  std::string origin_;
};

// The sizes of a multi-head (not grouped-query) family under its own config.json keys.
struct SizeKeys {
  const char* hidden;
  const char* layers;
  const char* heads;
  const char* inner;
  bool inner_defaults_to_4h;  // an absent `inner` means 4 x hidden (GPT-2, GPT-J, GPT-NeoX)
};

void read_mha_sizes(const JsonReader& r, const SizeKeys& k, ModelSpec& m) {
  m.hidden_size = r.integer(k.hidden);
  m.num_layers = r.integer(k.layers);
  m.num_heads = r.integer(k.heads);
  m.num_kv_heads = m.num_heads;
  m.head_dim = m.hidden_size / m.num_heads;
  m.intermediate_size = k.inner_defaults_to_4h ? r.integer_or(k.inner, 4 * m.hidden_size) : r.integer(k.inner);
  m.vocab_size = r.integer("vocab_size");
}

}  // namespace

ModelSpec parse_hf_config(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  check_json_depth(text, origin);
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& err) {
    throw InputError(origin + ": malformed JSON at byte " + std::to_string(err.byte) + ": " +
                     std::string(err.what()).substr(std::string(err.what()).find(':') + 2));
  } catch (const nlohmann::json::exception& err) {  // e.g. a number that overflows a double
    throw InputError(origin + ": malformed JSON: " + std::string(err.what()));
  }
  if (!j.is_object()) throw InputError(origin + ": a config.json must hold a JSON object");
  JsonReader r(j, origin);
  ModelSpec m;
  m.model_type = r.string_or("model_type", "");
  m.source = origin;
  m.name = r.string_or("_name_or_path", "");
  if (m.name.empty()) m.name = fs::path(origin).parent_path().filename().string();
  if (m.name.empty()) m.name = m.model_type;
  const std::string& t = m.model_type;

  if (t == "llama" || t == "mistral" || t == "qwen2") {
    m.hidden_size = r.integer("hidden_size");
    m.num_layers = r.integer("num_hidden_layers");
    m.num_heads = r.integer("num_attention_heads");
    m.num_kv_heads = r.integer_or("num_key_value_heads", m.num_heads);
    m.head_dim = r.integer_or("head_dim", m.hidden_size / m.num_heads);
    m.intermediate_size = r.integer("intermediate_size");
    m.vocab_size = r.integer("vocab_size");
    m.max_position_embeddings = r.integer_or("max_position_embeddings", 0, 0);
    m.gated_mlp = true;  // LlamaMLP / MistralMLP / Qwen2MLP always have gate, up, down
    m.norm = NormKind::kRms;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
    if (t == "qwen2") {
      m.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o without
    } else {
      m.qkv_bias = r.boolean_or("attention_bias", false);
      m.attn_out_bias = m.qkv_bias;
    }
    m.mlp_bias = r.boolean_or("mlp_bias", false);
    const double partial = r.number_or("partial_rotary_factor", 1.0);
    m.rotary_dim = static_cast<int64_t>(std::llround(partial * m.head_dim));
    m.norm_eps = r.number_or("rms_norm_eps", 1e-6);
    m.rope_theta = r.number_or("rope_theta", 10000.0);
  } else if (t == "gptj") {
    read_mha_sizes(r, {"n_embd", "n_layer", "n_head", "n_inner", true}, m);
    m.max_position_embeddings = r.integer_or("n_positions", 0, 0);
    m.norm = NormKind::kLayer;
    m.norms_per_layer = 1;  // ln_1 feeds both attention and MLP
    m.parallel_residual = true;
    m.mlp_bias = true;
    m.lm_head_bias = true;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
    m.rotary_dim = r.integer_or("rotary_dim", m.head_dim, 0);
    m.norm_eps = r.number_or("layer_norm_epsilon", 1e-5);
  } else if (t == "gpt_neox") {
    read_mha_sizes(r, {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", true}, m);
    m.max_position_embeddings = r.integer_or("max_position_embeddings", 0, 0);
    m.norm = NormKind::kLayer;
    m.qkv_bias = r.boolean_or("attention_bias", true);
    m.attn_out_bias = m.qkv_bias;
    m.mlp_bias = true;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", false);
    m.parallel_residual = r.boolean_or("use_parallel_residual", true);
    const double pct = r.number_or("rotary_pct", 0.25);
    m.rotary_dim = static_cast<int64_t>(m.head_dim * pct);  // int(head_size * rotary_pct)
    m.norm_eps = r.number_or("layer_norm_eps", 1e-5);
    m.rope_theta = r.number_or("rotary_emb_base", 10000.0);
  } else if (t == "gpt2") {
    read_mha_sizes(r, {"n_embd", "n_layer", "n_head", "n_inner", true}, m);
    m.max_position_embeddings = r.integer_or("n_positions", 1024);
    m.learned_position_embeddings = m.max_position_embeddings;
    m.norm = NormKind::kLayer;
    m.qkv_bias = m.attn_out_bias = m.mlp_bias = true;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", true);
    m.norm_eps = r.number_or("layer_norm_epsilon", 1e-5);
  } else if (t == "opt") {
    read_mha_sizes(r, {"hidden_size", "num_hidden_layers", "num_attention_heads", "ffn_dim", false}, m);
    m.max_position_embeddings = r.integer_or("max_position_embeddings", 2048);
    m.learned_position_embeddings = m.max_position_embeddings + 2;  // OPT's offset of 2
    m.word_embed_proj_dim = r.integer_or("word_embed_proj_dim", m.hidden_size);
    m.norm = NormKind::kLayer;
    const bool bias = r.boolean_or("enable_bias", true);
    m.qkv_bias = m.attn_out_bias = m.mlp_bias = bias;
    m.tied_embeddings = r.boolean_or("tie_word_embeddings", true);
    m.final_norm = r.boolean_or("do_layer_norm_before", true) &&
                   !r.boolean_or("_remove_final_layer_norm", false);
  } else {
    throw InputError(origin + ": key 'model_type' = \"" + t + "\" is not supported (valid: " +
                     known_model_types() + ")");
  }
  if (m.hidden_size % m.num_heads != 0 && !r.present("head_dim"))
    r.fail(m.model_type == "gptj" || m.model_type == "gpt2" ? "n_head" : "num_attention_heads",
           "must divide the hidden size " + std::to_string(m.hidden_size));
  // Errors name the key as this config.json spells it.
  std::map<std::string, std::string> keys;
  if (t == "gptj" || t == "gpt2")
    keys = {{"hidden_size", "n_embd"}, {"num_layers", "n_layer"}, {"num_heads", "n_head"},
            {"num_kv_heads", "n_head"}, {"intermediate_size", "n_inner"}};
  else
    keys = {{"num_layers", "num_hidden_layers"}, {"num_heads", "num_attention_heads"},
            {"num_kv_heads", t == "llama" || t == "mistral" || t == "qwen2" ? "num_key_value_heads" : "num_attention_heads"},
            {"intermediate_size", t == "opt" ? "ffn_dim" : "intermediate_size"}};
  validate_model_spec(m, origin, keys);
  return m;
}

ModelSpec load_hf_config(const fs::path& path) {
  fs::path file = fs::is_directory(path) ? path / "config.json" : path;
  return parse_hf_config(read_text_file(file), file.string());
}

// ---------------------------------------------------------------------------
// Catalog
// ---------------------------------------------------------------------------
std::vector<CatalogEntry> list_model_catalog(const fs::path& data_dir) {
  std::vector<CatalogEntry> out;
  const fs::path dir = data_dir / "models";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir.string() + ": model catalog folder not found");
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    toml::table table = TomlReader::parse(read_text_file(entry.path()), entry.path().string());
    TomlReader r(table, entry.path().string());
    out.push_back({r.get_string("name"), r.get_string_array_or("aliases"), entry.path()});
  }
  std::sort(out.begin(), out.end(),
            [](const CatalogEntry& a, const CatalogEntry& b) { return a.name < b.name; });
  return out;
}

fs::path resolve_data_dir(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("STEPCAST_DATA_DIR")) return env;
  return STEPCAST_DATA_DIR;
}

ModelSpec resolve_model(const std::string& name, const fs::path& data_dir) {
  std::error_code ec;
  const fs::path as_path(name);
  if (fs::exists(as_path, ec)) {
    if (fs::is_directory(as_path, ec) || as_path.extension() == ".json")
      return load_hf_config(as_path);
    return load_model_card(as_path);
  }
  if (name.find('/') != std::string::npos || name.ends_with(".toml") || name.ends_with(".json"))
    throw InputError(name + ": no such file (--model takes a catalog name, a .toml card, a "
                            "config.json or a folder holding one)");
  std::string known;
  for (const auto& entry : list_model_catalog(data_dir)) {
    bool match = entry.name == name ||
                 std::find(entry.aliases.begin(), entry.aliases.end(), name) != entry.aliases.end();
    if (match) return load_model_card(entry.path);
    known += (known.empty() ? "" : ", ") + entry.name;
    for (const auto& a : entry.aliases) known += " (" + a + ")";
  }
  throw InputError("unknown model '" + name + "' (known: " + known + ")");
}

std::vector<LayerProjection> layer_projections(const ModelSpec& m) {
  const int64_t h = m.hidden_size, i = m.intermediate_size;
  std::vector<int64_t> qkv_rows{m.q_dim(), m.kv_dim(), m.kv_dim()};
  if (m.model_type == "gpt_neox") qkv_rows = {m.q_dim() + 2 * m.kv_dim()};
  std::vector<int64_t> up_rows = m.gated_mlp ? std::vector<int64_t>{i, i} : std::vector<int64_t>{i};
  return {LayerProjection{"qkv", m.q_dim() + 2 * m.kv_dim(), h, qkv_rows, true},
          LayerProjection{"o", h, m.q_dim(), {h}, true},
          LayerProjection{"up", m.gated_mlp ? 2 * i : i, h, up_rows, false},
          LayerProjection{"down", h, i, {h}, false}};
}

}  // namespace stepcast
