// Parameter counts against the Hugging Face implementations, and parsing of
// cards and config.json files.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "common/join.h"
#include "model/toml_reader.h"
#include "test_util.h"

using namespace stepcast;
using stepcast::test::model;

TEST_CASE("catalog parameter counts equal the Hugging Face implementations") {
  // Counted on the meta device from the Hugging Face transformers classes (sum of numel).
  CHECK(model("llama-2-7b").total_params() == 6'738'415'616);
  CHECK(model("llama-2-13b").total_params() == 13'015'864'320);
  CHECK(model("llama-3-8b").total_params() == 8'030'261'248);
  CHECK(model("gpt-j-6b").total_params() == 6'050'882'784);
  CHECK(model("pythia-2.8b").total_params() == 2'775'208'960);
  CHECK(model("gpt-neox-20b").total_params() == 20'554'567'680);
  // Published model-card figures (Hugging Face model pages / papers):
  CHECK(model("mistral-7b").total_params() == 7'241'732'096);   // "7.24B"
  CHECK(model("llama-2-70b").total_params() == 68'976'648'192); // "69B"
  CHECK(model("llama-3-70b").total_params() == 70'553'706'496); // "70.6B"
  CHECK(model("qwen2.5-7b").total_params() == 7'615'616'512);   // Qwen2.5 report: 7.61B, 6.53B non-embedding
  CHECK(model("qwen2.5-14b").total_params() == 14'770'033'664); // 14.7B
  CHECK(model("qwen2.5-32b").total_params() == 32'763'876'352); // 32.5B non-embedding 31.0B
  // llama-3.2-3b ("3.21B"), by hand: tied embedding 128256 x 3072 = 394,002,432; a layer q, o
  // 2 x 3072^2 + k, v 2 x 3072 x 1024 (8 of 24 heads) + 3 x 3072 x 8192 + 2 norms x 3072
  // = 100,669,440, x 28 = 2,818,744,320; + final norm 3,072.
  CHECK(model("llama-3.2-3b").total_params() == 3'212'749'824);
}

TEST_CASE("hand derivation: llama-2-7b") {
  // embed 32000*4096 = 131,072,000 (twice: untied lm_head)
  // layer: 4 * 4096^2 (q,k,v,o) = 67,108,864; 3 * 4096 * 11008 = 135,266,304; 2 norms 8,192
  //        = 202,383,360; x 32 = 6,476,267,520; + final norm 4,096
  const ModelSpec m = model("7b");
  CHECK(m.params_per_layer() == 202'383'360);
  CHECK(m.embedding_params() == 131'072'000);
  CHECK(m.lm_head_params() == 131'072'000);
  CHECK(m.final_norm_params() == 4'096);
}

TEST_CASE("qwen2.5-7b non-embedding count matches the published 6.53B") {
  const ModelSpec m = model("qwen2.5-7b");
  const double non_embedding = static_cast<double>(m.total_params() - m.embedding_params() - m.lm_head_params());
  CHECK(non_embedding == doctest::Approx(6.53e9).epsilon(0.001));
}

static const char* kGpt2Config = R"({
  "model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": null,
  "vocab_size": 50257, "n_positions": 1024, "layer_norm_epsilon": 1e-05})";

static const char* kOpt125mConfig = R"({
  "model_type": "opt", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
  "ffn_dim": 3072, "vocab_size": 50272, "max_position_embeddings": 2048,
  "word_embed_proj_dim": 768, "do_layer_norm_before": true, "enable_bias": true})";

static const char* kOpt350mConfig = R"({
  "model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
  "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048,
  "word_embed_proj_dim": 512, "do_layer_norm_before": false})";

TEST_CASE("config.json of the legacy families") {
  // GPT-2 small: 124,439,808 parameters (HF GPT2LMHeadModel, tied lm_head counted once).
  CHECK(parse_hf_config(kGpt2Config, "gpt2/config.json").total_params() == 124'439'808);
  // OPT-125m: 125,239,296 (positions table has max_position_embeddings + 2 rows).
  CHECK(parse_hf_config(kOpt125mConfig, "opt-125m/config.json").total_params() == 125'239'296);
  // OPT-350m: 331,196,416 (project_in/out 512<->1024, no final layer norm).
  CHECK(parse_hf_config(kOpt350mConfig, "opt-350m/config.json").total_params() == 331'196'416);
}

TEST_CASE("config.json equals the card for each catalog family") {
  struct Case {
    const char* card;
    const char* json;
  };
  const Case cases[] = {
      {"llama-2-7b", R"({"model_type":"llama","hidden_size":4096,"intermediate_size":11008,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":32,"vocab_size":32000,
        "max_position_embeddings":4096,"rms_norm_eps":1e-05,"hidden_act":"silu","tie_word_embeddings":false})"},
      {"llama-3-8b", R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
        "max_position_embeddings":8192,"rope_theta":500000.0})"},
      {"mistral-7b", R"({"model_type":"mistral","hidden_size":4096,"intermediate_size":14336,
        "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":32000,
        "max_position_embeddings":32768})"},
      {"qwen2.5-7b", R"({"model_type":"qwen2","hidden_size":3584,"intermediate_size":18944,
        "num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,"vocab_size":152064,
        "tie_word_embeddings":false})"},
      {"gpt-j-6b", R"({"model_type":"gptj","n_embd":4096,"n_layer":28,"n_head":16,"rotary_dim":64,
        "n_inner":null,"vocab_size":50400,"n_positions":2048})"},
      {"pythia-2.8b", R"({"model_type":"gpt_neox","hidden_size":2560,"num_hidden_layers":32,
        "num_attention_heads":32,"intermediate_size":10240,"vocab_size":50304,"rotary_pct":0.25,
        "use_parallel_residual":true,"tie_word_embeddings":false})"},
      {"gpt-neox-20b", R"({"model_type":"gpt_neox","hidden_size":6144,"num_hidden_layers":44,
        "num_attention_heads":64,"intermediate_size":24576,"vocab_size":50432,"rotary_pct":0.25})"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.card);
    const ModelSpec card = model(c.card);
    const ModelSpec hf = parse_hf_config(c.json, std::string(c.card) + "/config.json");
    CHECK(hf.total_params() == card.total_params());
    CHECK(hf.num_kv_heads == card.num_kv_heads);
    CHECK(hf.rotary_dim == card.rotary_dim);
    CHECK(hf.parallel_residual == card.parallel_residual);
  }
}

TEST_CASE("grouped-query attention and tied embeddings") {
  // Qwen2.5-0.5B: tied embeddings, 14 heads, 2 KV heads: 494,032,768 parameters.
  const char* json = R"({"model_type":"qwen2","hidden_size":896,"intermediate_size":4864,
    "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,"vocab_size":151936,
    "tie_word_embeddings":true})";
  const ModelSpec m = parse_hf_config(json, "qwen2.5-0.5b/config.json");
  CHECK(m.kv_dim() == 128);
  CHECK(m.total_params() == 494'032'768);
}

TEST_CASE("bad model input names file, key and value") {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([] { parse_hf_config(R"({"model_type":"bert"})", "x/config.json"); });
  CHECK(m.find("x/config.json") != std::string::npos);
  CHECK(m.find("model_type") != std::string::npos);
  CHECK(m.find("bert") != std::string::npos);

  m = message([] { parse_hf_config(R"({"model_type":"llama","hidden_size":"big"})", "y.json"); });
  CHECK(m.find("hidden_size") != std::string::npos);
  CHECK(m.find("\"big\"") != std::string::npos);

  m = message([] { parse_hf_config("{\"model_type\": ", "z.json"); });
  CHECK(m.find("z.json: malformed JSON") != std::string::npos);

  m = message([] {
    parse_model_card("name = \"t\"\nmodel_type = \"llama\"\nsource = \"s\"\nhiden_size = 4\n", "t.toml");
  });
  CHECK(m.find("t.toml") != std::string::npos);
  CHECK(m.find("hiden_size") != std::string::npos);

  m = message([] {
    parse_model_card("name = \"t\"\nmodel_type = \"llama\"\nsource = \"s\"\nhidden_size = -4\n"
                     "num_layers = 2\nnum_heads = 2\nintermediate_size = 8\nvocab_size = 10\n", "t.toml");
  });
  CHECK(m.find("hidden_size") != std::string::npos);
  CHECK(m.find("-4") != std::string::npos);

  m = message([] { parse_model_card("name = \n", "broken.toml"); });
  CHECK(m.find("broken.toml:1:") != std::string::npos);

  m = message([] { resolve_model("gpt-5", stepcast::test::data_dir()); });
  CHECK(m.find("unknown model 'gpt-5'") != std::string::npos);
  CHECK(m.find("llama-2-7b") != std::string::npos);

  m = message([] { parse_hf_config(R"({"model_type":"llama","hidden_size":4096,"intermediate_size":1,
     "num_hidden_layers":1,"num_attention_heads":32,"num_key_value_heads":5,"vocab_size":10})", "g.json"); });
  // config.json's own name for the key, not the card's.
  CHECK(m.find("num_key_value_heads") != std::string::npos);
}

TEST_CASE("a calibrated [coefficients] section reads back as written") {
  const HardwareProfile base = test::hardware("a40");
  std::ifstream in(base.path);
  std::stringstream text;
  text << in.rdbuf();
  CalibratedCoefficients c;
  c.values = default_coefs();
  c.values[kGemmEffMaxFrac] = 0.612345678;
  c.values[kCollLatencyS] = 3.25e-5;
  c.std_errors.assign(kNumCoefs, 0.0);
  c.std_errors[kGemmEffMaxFrac] = 0.01;
  c.free = {kGemmEffMaxFrac, kCollLatencyS};
  c.covariance.assign(kNumCoefs, std::vector<double>(kNumCoefs, 0.0));
  c.covariance[kGemmEffMaxFrac][kGemmEffMaxFrac] = 1e-4;
  c.covariance[kGemmEffMaxFrac][kCollLatencyS] = c.covariance[kCollLatencyS][kGemmEffMaxFrac] = -2e-9;
  c.covariance[kCollLatencyS][kCollLatencyS] = 4e-12;
  c.model_error_frac = 0.031;
  c.max_micro_tokens = 8192;
  c.source = "test";
  c.runs = {"runs/h200-sxm/a.jsonl", "/abs/with \"quote\".jsonl"};
  c.holdout = HoldoutSplit{0.25, 3};
  const std::string written = with_calibrated_coefficients(text.str(), c);
  const HardwareProfile hw = parse_hardware_profile(written, "written.toml");
  CHECK(hw.coefs_calibrated);
  CHECK(hw.calibration_runs == c.runs);
  CHECK(hw.calibration_holdout.frac == 0.25);
  CHECK(hw.calibration_holdout.seed == 3);
  CHECK(hw.gpu.name == base.gpu.name);  // everything before [coefficients] is kept
  CHECK(hw.coefs[kGemmEffMaxFrac] == doctest::Approx(0.612345678).epsilon(1e-9));
  CHECK(hw.coefs[kCollLatencyS] == doctest::Approx(3.25e-5).epsilon(1e-9));
  CHECK(hw.coef_std_errors[kGemmEffMaxFrac] == doctest::Approx(0.01));
  CHECK(hw.coef_covariance[kGemmEffMaxFrac][kCollLatencyS] == doctest::Approx(-2e-9));
  CHECK(hw.coef_covariance[kCollLatencyS][kCollLatencyS] == doctest::Approx(4e-12));
  CHECK(hw.model_error_frac == doctest::Approx(0.031));
  CHECK(hw.max_micro_tokens == doctest::Approx(8192));
  // Written twice, the section is replaced, not appended.
  CHECK(with_calibrated_coefficients(written, c) == written);
}

TEST_CASE("a malformed TOML file is reported on one line, the parser's quoted character escaped") {
  // toml++ quotes the character it saw; here a line break after the 'f' of a boolean.
  try {
    TomlReader::parse("a = f\nb = 1\n", "x.toml");
    FAIL("parsed");
  } catch (const InputError& e) {
    const std::string msg = e.what();
    CHECK(msg.starts_with("x.toml:1:"));
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find("malformed TOML") != std::string::npos);
  }
}

TEST_CASE("the valid-value lists of error messages: elements joined by a comma and a space") {
  CHECK(join_names(std::vector<std::string>{}).empty());
  CHECK(join_names(std::vector<std::string>{"avx2"}) == "avx2");
  CHECK(join_names(std::vector<std::string>{"none", "cpu"}) == "none, cpu");
  const std::vector<std::pair<int, const char*>> table = {{0, "flash"}, {1, "math"}};
  CHECK(join_names(table, [](const auto& e) { return e.second; }) == "flash, math");
}
