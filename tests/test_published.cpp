// Published throughputs (data/published) and the engine sections a profile takes from another.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "calibrate/published.h"
#include "common/errors.h"
#include "model/prediction.h"
#include "test_util.h"

using namespace stepcast;
using namespace stepcast::calibrate;
using stepcast::test::data_dir;
namespace fs = std::filesystem;

TEST_CASE("the committed published rows span sources, GPU kinds and node counts") {
  // Issue 18 asks for >= 20 rows from >= 3 independent sources, >= 3 GPU kinds, >= 2 node counts.
  std::set<std::string> sources, kinds;
  std::set<int> nodes;
  size_t rows = 0;
  for (const auto& f : published_files(data_dir())) {
    const PublishedSource s = load_published(f, data_dir());
    CHECK(!s.url.empty());
    CHECK(s.retrieved.size() == 10);  // YYYY-MM-DD
    sources.insert(s.id);
    for (const auto& r : s.rows) {
      ++rows;
      kinds.insert(r.hardware_name);
      nodes.insert(r.config.nodes);
      CHECK(r.tokens_per_s_per_gpu > 0);
    }
  }
  CHECK(rows >= 20);
  CHECK(sources.size() >= 3);
  CHECK(kinds.size() >= 3);
  CHECK(nodes.size() >= 2);
}

TEST_CASE("a published row becomes nodes of the profile's node size, and its prediction is per GPU") {
  const fs::path p = fs::temp_directory_path() / "stepcast_published_test.toml";
  std::ofstream(p) << R"([source]
id = "hand"
title = "a hand-written row"
url = "https://example.org"
retrieved = "2026-12-01"
engine = "fsdp2"

[[rows]]
where = "64 GPUs"
model = "llama-2-13b"
hardware = "a100-80gb-sxm"
gpus = 64
seq = 4096
micro_batch = 2
gas = 1
tokens_per_s_per_gpu = 2000
)";
  const PublishedSource s = load_published(p, data_dir());
  REQUIRE(s.rows.size() == 1);
  const PublishedRow& r = s.rows.front();
  // a100-80gb-sxm has gpus_per_node_max = 8: 64 GPUs are 8 nodes of 8, at stage 3 (full sharding).
  CHECK(r.config.gpus_per_node == 8);
  CHECK(r.config.nodes == 8);
  CHECK(r.config.zero_stage == 3);
  CHECK(r.config.engine == Engine::kFsdp2);
  // The report's per-GPU figure: the world's tokens/s over 64 (the error is relative to 2000).
  const Prediction pr = evaluate(r.model, test::hardware("a100-80gb-sxm"), r.config);
  CHECK(pr.throughput.tokens_per_s / 64 == doctest::Approx(pr.throughput.rank_samples_per_s * 4096));
  fs::remove(p);
}

TEST_CASE("bad published rows name the file and the key") {
  const fs::path p = fs::temp_directory_path() / "stepcast_published_bad.toml";
  const std::string head = R"([source]
id = "hand"
title = "t"
url = "u"
retrieved = "2026-12-01"
engine = "fsdp2"
[[rows]]
where = "w"
model = "llama-2-13b"
hardware = "a100-80gb-sxm"
seq = 2048
micro_batch = 1
gas = 1
tokens_per_s_per_gpu = 1
)";
  std::ofstream(p) << head << "gpus = 12\n";
  CHECK_THROWS_WITH_AS(load_published(p, data_dir()), doctest::Contains("rows[0].gpus = 12 is not a whole number of 8-GPU"),
                       InputError);
  std::ofstream(p) << head << "gpus = 8\ngpu = 8\n";
  CHECK_THROWS_WITH_AS(load_published(p, data_dir()), doctest::Contains("stepcast_published_bad.toml"), InputError);
  std::ofstream(p) << head << "gpus = 8\nstage = 1\n";  // FSDP2 shards at stage 2 or 3
  CHECK_THROWS_AS(load_published(p, data_dir()), InputError);
  fs::remove(p);
}

TEST_CASE("a profile with engines_from takes the other profile's engine time coefficients, not calibrated") {
  const HardwareProfile a40 = test::hardware("a40");
  const HardwareProfile h200 = test::hardware("h200-sxm");
  REQUIRE(a40.engines_from == "h200-sxm");
  for (const std::string engine : {"deepspeed", "fsdp2"}) {
    CAPTURE(engine);
    REQUIRE(a40.engines.count(engine) == 1);
    const EngineSection& t = a40.engines.at(engine);
    const EngineSection& ref = h200.engines.at(engine);
    CHECK_FALSE(t.calibrated);
    for (const auto& [c, v] : ref.values) {
      CAPTURE(coef_table()[c].name);
      if (is_memory_coef(c)) CHECK(t.values.count(c) == 0);
      else CHECK(t.values.at(c) == v);
    }
    CHECK_FALSE(for_engine(a40, engine).coefs_calibrated);
    CHECK(coefficient_status(a40, engine) == "engine from h200-sxm, hardware uncalibrated");
  }
  CHECK(coefficient_status(h200, "deepspeed") == "calibrated");
}
