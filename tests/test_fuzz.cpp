// Property test of the parsers: mutated model cards, hardware profiles and
// config.json files either parse or throw InputError; nothing crashes, hangs
// or throws anything else.
#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "common/errors.h"
#include "test_util.h"

using namespace stepcast;

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::string pieces[] = {"=", "\"", "[", "]", "{", "}", ",", "-", "0", "1e999", "nan",
                                       "true", "\n", " ", "-1", "99999999999999999999", ".", "#", ":"};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !text.empty(); ++e) {
    const size_t pos = rng() % text.size();
    switch (rng() % 4) {
      case 0: text.erase(pos, 1 + rng() % 8); break;
      case 1: text.insert(pos, pieces[rng() % std::size(pieces)]); break;
      case 2: text[pos] = static_cast<char>(rng() % 256); break;
      case 3: text = text.substr(0, pos); break;
    }
  }
  return text;
}

template <class Parse>
void fuzz(const std::string& seed_text, Parse parse, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 1500; ++i) {
    const std::string text = mutate(seed_text, rng);
    try {
      parse(text);
      ++parsed;
    } catch (const InputError& e) {
      ++rejected;
      CHECK(std::string(e.what()).size() > 5);
    }
  }
  // The mutations must exercise both outcomes.
  CHECK(rejected > 100);
  CHECK(parsed + rejected == 1500);
}

}  // namespace

TEST_CASE("fuzz: model cards") {
  const std::string card = slurp(test::data_dir() / "models" / "llama-3-8b.toml");
  fuzz(card, [](const std::string& t) { return parse_model_card(t, "fuzz.toml").total_params(); }, 1);
}

TEST_CASE("fuzz: hardware profiles") {
  const std::string profile = slurp(test::data_dir() / "hardware" / "h200-sxm.toml");
  fuzz(profile, [](const std::string& t) { return parse_hardware_profile(t, "fuzz.toml").gpu.memory_bytes; }, 2);
}

TEST_CASE("fuzz: config.json") {
  const std::string json = R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,
    "num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,
    "max_position_embeddings":8192,"rope_theta":500000.0,"tie_word_embeddings":false})";
  fuzz(json, [](const std::string& t) { return parse_hf_config(t, "fuzz.json").total_params(); }, 3);
}

TEST_CASE("every shipped card and profile parses") {
  for (const auto& e : list_model_catalog(test::data_dir())) CHECK_NOTHROW(load_model_card(e.path));
  for (const auto& n : list_hardware(test::data_dir())) CHECK_NOTHROW(resolve_hardware(n, test::data_dir()));
}

TEST_CASE("coefficient table: ids in order, defaults within bounds") {
  const auto& table = coef_table();
  for (int i = 0; i < kNumCoefs; ++i) {
    CAPTURE(table[i].name);
    CHECK(table[i].id == i);
    CHECK(table[i].lower <= table[i].default_value);
    CHECK(table[i].default_value <= table[i].upper);
    CHECK(coef_by_name(table[i].name) == table[i].id);
  }
}
