// A fuzz target per parser: model cards (TOML), hardware profiles (TOML), Hugging Face
// config.json, planner plan files, run records and micro-benchmark records (JSONL), run
// lists, and checkpoint manifests. Each seed is a real file of its kind; each input is
// a seed with random edits (bytes cut, inserted, replaced, the text truncated; numbers
// made huge, negative, fractional or strings; structure nested deep). The property:
// every input either parses or throws InputError with a message; nothing crashes, hangs
// or throws anything else. Built with -fsanitize=address,undefined in CI as well
// (scripts/test.sh), where an out-of-bounds read or an overflow fails it.
//
// Usage: stepcast_fuzz [--iterations N] [--seed S]   (CI runs a short pass; by hand,
// --iterations 200000 runs for minutes). A failing input is written to
// fuzz_failure_<target>.txt in the current folder.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "backend/engine/manifest.h"
#include "calibrate/measure.h"
#include "calibrate/micro_record.h"
#include "calibrate/run_record.h"
#include "common/errors.h"
#include "common/text_file.h"
#include "model/hardware.h"
#include "model/model_spec.h"
#include "model/train_config_json.h"

using namespace stepcast;
namespace fs = std::filesystem;

namespace {

std::string mutate(std::string text, std::mt19937_64& rng) {
  static const std::string pieces[] = {"=",    "\"", "[",  "]",  "{",     "}",   ",",   "-",
                                       "0",    "1e999", "nan", "true", "\n", " ", "-1", "99999999999999999999",
                                       ".",    "#",  ":",  "-0.5", "1.7", "\"x\"", "null", "[[[[[[[["};
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !text.empty(); ++e) {
    const size_t pos = rng() % text.size();
    switch (rng() % 6) {
      case 0: text.erase(pos, 1 + rng() % 8); break;
      case 1: text.insert(pos, pieces[rng() % std::size(pieces)]); break;
      case 2: text[pos] = static_cast<char>(rng() % 256); break;
      case 3: text = text.substr(0, pos); break;
      case 4: {  // a number becomes another number
        const size_t d = text.find_first_of("0123456789", pos);
        if (d == std::string::npos) break;
        const size_t end = text.find_first_not_of("0123456789.e+-", d);
        static const char* numbers[] = {"0", "-7", "1e308", "4294967297", "9223372036854775808", "2.5", "1e-320"};
        text.replace(d, (end == std::string::npos ? text.size() : end) - d, numbers[rng() % std::size(numbers)]);
        break;
      }
      case 5: {  // deep nesting at one place
        const int depth = 50 + static_cast<int>(rng() % 200);
        text.insert(pos, std::string(static_cast<size_t>(depth), rng() % 2 ? '[' : '{'));
        break;
      }
    }
  }
  return text;
}

struct Target {
  std::string name;
  std::string seed_text;
  std::function<void(const std::string&)> parse;
};

std::string write_temp(const std::string& text, const std::string& suffix) {
  static const fs::path dir = fs::temp_directory_path() / ("stepcast_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path p = dir / ("input" + suffix);
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

}  // namespace

int main(int argc, char** argv) {
  long iterations = 1500;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iterations")) iterations = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seed")) seed = std::strtoull(argv[i + 1], nullptr, 10);
  }
  const fs::path data = STEPCAST_DATA_DIR;
  const fs::path repo = data.parent_path();

  backend::CheckpointIdentity id;
  id.model = "test-llama-tiny";
  id.params = 119104;
  id.world_size = 2;
  id.rank = 1;
  id.state = {{"zero_stage", 2}, {"optimizer", "adamw"}, {"precision", "fp32"}, {"split_master", false}};
  TrainConfig plan_config;
  plan_config.zero_stage = 3;
  plan_config.offload_optimizer = OffloadDevice::kCpu;
  std::string runs_seed, micro_seed;
  {
    std::istringstream runs(read_text_file(data / "runs" / "h200-sxm" / "2026-11-30_calibration_v3.jsonl"));
    std::istringstream micro(read_text_file(data / "runs" / "h200-sxm" / "2026-11-30_calibration_v3_micro.jsonl"));
    std::string line;
    for (int k = 0; k < 4 && std::getline(runs, line); ++k) runs_seed += line + "\n";
    for (int k = 0; k < 8 && std::getline(micro, line); ++k) micro_seed += line + "\n";
  }
  // JSONL inputs end in a newline: a torn last line is the reader's documented warning path.
  const auto as_lines = [](std::string t) { return t.empty() || t.back() == '\n' ? t : t + "\n"; };

  const std::vector<Target> targets = {
      {"model_card", read_text_file(data / "models" / "llama-3-8b.toml"),
       [](const std::string& t) { (void)parse_model_card(t, "fuzz.toml").total_params(); }},
      {"hardware_profile", read_text_file(data / "hardware" / "h200-sxm.toml"),
       [](const std::string& t) { (void)parse_hardware_profile(t, "fuzz.toml"); }},
      {"config_json",
       R"({"model_type":"llama","hidden_size":4096,"intermediate_size":14336,"num_hidden_layers":32,)"
       R"("num_attention_heads":32,"num_key_value_heads":8,"vocab_size":128256,"max_position_embeddings":8192,)"
       R"("rope_theta":500000.0,"tie_word_embeddings":false,"head_dim":128,"rms_norm_eps":1e-5})",
       [](const std::string& t) { (void)parse_hf_config(t, "fuzz/config.json").total_params(); }},
      {"plan_file", nlohmann::json({{"plans", {{{"config", train_config_to_json(plan_config)}}}}}).dump(),
       [](const std::string& t) { (void)plan_config_from_text(t, "fuzz_plan.json"); }},
      {"run_records", runs_seed,
       [&](const std::string& t) { (void)calibrate::load_runs({write_temp(as_lines(t), ".jsonl")}, data); }},
      {"micro_records", micro_seed,
       [&](const std::string& t) { (void)calibrate::load_micro({write_temp(as_lines(t), ".jsonl")}); }},
      {"run_list", read_text_file(repo / "bench" / "runlists" / "calibration.txt"),
       [](const std::string& t) { (void)calibrate::read_run_list(write_temp(t, ".txt")); }},
      {"checkpoint_manifest", backend::manifest_text(id, 6, {{765721, 0x4bf172f0u}, {765721, 0x0e766339u}}),
       [&](const std::string& t) { (void)backend::check_manifest(t, "fuzz/manifest.json", id); }},
  };

  int failed = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    const Target& target = targets[k];
    std::mt19937_64 rng(seed * 1000003 + k);
    long parsed = 0, rejected = 0;
    try {
      target.parse(target.seed_text);  // the seed itself is valid
    } catch (const std::exception& e) {
      std::printf("FAIL %s: the seed does not parse: %s\n", target.name.c_str(), e.what());
      ++failed;
      continue;
    }
    for (long i = 0; i < iterations; ++i) {
      const std::string input = mutate(target.seed_text, rng);
      try {
        target.parse(input);
        ++parsed;
      } catch (const InputError& e) {
        ++rejected;
        if (std::strlen(e.what()) < 10 || std::strchr(e.what(), '\n') != nullptr) {
          std::printf("FAIL %s: InputError message not one line: '%s'\n", target.name.c_str(), e.what());
          std::ofstream("fuzz_failure_" + target.name + ".txt", std::ios::binary) << input;
          ++failed;
          break;
        }
      } catch (const std::exception& e) {
        std::printf("FAIL %s: %s: %s (input in fuzz_failure_%s.txt)\n", target.name.c_str(), typeid(e).name(),
                    e.what(), target.name.c_str());
        std::ofstream("fuzz_failure_" + target.name + ".txt", std::ios::binary) << input;
        ++failed;
        break;
      }
    }
    std::printf("%-20s %8ld inputs: %8ld parsed, %8ld rejected with one line\n", target.name.c_str(),
                parsed + rejected, parsed, rejected);
    // The edits must reach both outcomes, or the target tests nothing.
    if (rejected == 0 || (iterations >= 200 && rejected < iterations / 10)) {
      std::printf("FAIL %s: too few rejected inputs (%ld)\n", target.name.c_str(), rejected);
      ++failed;
    }
  }
  std::error_code ec;
  fs::remove_all(fs::temp_directory_path() / ("stepcast_fuzz_" + std::to_string(::getpid())), ec);
  return failed == 0 ? 0 : 1;
}
