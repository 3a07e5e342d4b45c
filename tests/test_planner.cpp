// The planner's search, ranking, explanations and launcher configs.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "common/atomic_file.h"

#include "common/errors.h"
#include "planner/deepspeed_config.h"
#include "planner/plan_search.h"
#include "planner/report.h"
#include "planner/validate.h"
#include "common/stats.h"
#include <algorithm>
#include <cmath>
#include "test_util.h"

using namespace stepcast;
using stepcast::test::hardware;
using stepcast::test::model;

namespace {

SearchRequest request(const char* model_name, int gpus, const char* hw = "h200-sxm") {
  SearchRequest r;
  r.model = model(model_name);
  r.hardware = hardware(hw);
  r.base.gpus_per_node = gpus;
  r.base.seq_len = 2048;
  return r;
}

}  // namespace

TEST_CASE("recommend 6b on 2 GPUs: ranked, fitting, global batch respected") {
  SearchRequest r = request("6b", 2);
  SearchResult res = search_plans(r);
  REQUIRE(!res.ranked.empty());
  CHECK(res.evaluated == res.ranked.size() + res.dropped);
  for (size_t i = 0; i < res.ranked.size(); ++i) {
    const auto& p = res.ranked[i];
    CHECK(p.fits);
    CHECK(p.memory.gpu_total_bytes <= p.gpu_memory_limit_bytes);
    CHECK(p.config.global_batch() == 64);
    if (i > 0) CHECK(ranking_score(res.ranked[i - 1]) >= ranking_score(p));
  }
  // Every family appears once, with a reason.
  for (const auto& f : res.families) CHECK(!f.why.empty());
}

TEST_CASE("recommend: a plan that would rank first but only the card holds is named, not ranked") {
  SearchRequest r = request("6b", 2);
  const SearchResult free_res = search_plans(r);
  REQUIRE(!free_res.ranked.empty());
  CHECK_FALSE(free_res.best_tight);  // on the 140 GiB card the top plan has room
  const Prediction top = free_res.ranked.front();
  // A card 2 % above the top plan's need: the plan is tight there, and the one ranked first instead
  // is another, slower one.
  r.limits.gpu_memory_bytes = top.memory.gpu_required_bytes / 0.98;
  const SearchResult res = search_plans(r);
  REQUIRE(res.best_tight);
  CHECK(res.best_tight->tight);
  CHECK(ranking_score(*res.best_tight) >= ranking_score(top) * (1 - 1e-12));
  if (!res.ranked.empty()) CHECK(ranking_score(res.ranked.front()) <= ranking_score(*res.best_tight));
  for (const auto& p : res.ranked) CHECK_FALSE(p.tight);
  bool said = false;
  for (const auto& n : res.notes) said |= n.find("would rank first") != std::string::npos;
  CHECK(said);
}

TEST_CASE("an explicit global batch must divide over the ranks") {
  SearchRequest r = request("6b", 3);
  CHECK_THROWS_AS(search_plans(r), InputError);  // 64 is not a multiple of 3
  r.global_batch = 48;
  CHECK_NOTHROW(search_plans(r));
}

TEST_CASE("the global batch rule: a default rounds up to the ranks, free divides over any") {
  // By hand: 64 over 3 ranks is 21.33, so the next multiple is 22 x 3 = 66; 64 over 8 stays 64.
  CHECK(default_batch_for_ranks(64, 3) == 66);
  CHECK(default_batch_for_ranks(64, 8) == 64);
  CHECK(default_batch_for_ranks(64, 128) == 128);
  CHECK(batch_divides_ranks(66, 3));
  CHECK_FALSE(batch_divides_ranks(64, 3));
  CHECK(batch_divides_ranks(0, 7));  // free: GAS from the list
  CHECK_FALSE(batch_divides_ranks(64, 0));
}

TEST_CASE("70b on 1 GPU: nothing fits, and the planner says what would") {
  SearchRequest r = request("llama-2-70b", 1);
  SearchResult res = search_plans(r);
  CHECK(res.ranked.empty());
  REQUIRE(!res.suggestions.empty());
  bool more_gpus = false;
  for (const auto& s : res.suggestions) more_gpus |= s.find("would fit on") != std::string::npos;
  CHECK(more_gpus);
  // And with 8 GPUs something fits.
  SearchRequest r8 = request("llama-2-70b", 8);
  CHECK(!search_plans(r8).ranked.empty());
}

TEST_CASE("a tight GPU budget pushes the plan to offload, 8-bit states or checkpointing") {
  SearchRequest r = request("llama-2-7b", 1);
  r.limits.gpu_memory_bytes = 40.0 * 1073741824.0;
  SearchResult res = search_plans(r);
  REQUIRE(!res.ranked.empty());
  const TrainConfig& c = res.ranked.front().config;
  const bool saves = c.offload_optimizer == OffloadDevice::kCpu || c.optimizer == OptimizerKind::kAdamW8bit ||
                     c.activation_checkpointing;
  CHECK(saves);
  // Plain stage-0 AdamW needs 16 B x 6.74e9 = 108 GB of states alone: it must be dropped.
  bool stage0_adamw_fits = false;
  for (const auto& f : res.families)
    if (f.family == "stage 0 + AdamW") stage0_adamw_fits = f.any_fits;
  CHECK_FALSE(stage0_adamw_fits);
}

TEST_CASE("why-lose lines name the CPU optimizer for slow offload families") {
  SearchRequest r = request("llama-2-7b", 2);
  r.global_batch = 8;  // small batch: GAS cannot hide the CPU step
  SearchResult res = search_plans(r);
  bool found = false;
  for (const auto& f : res.families) {
    if (f.family == "stage 2 + CPU optimizer offload + AdamW") {
      CHECK(f.why.find("CPU AdamW") != std::string::npos);
      CHECK(f.loss_frac > 0.2);
      found = true;
    }
  }
  CHECK(found);
}

TEST_CASE("DeepSpeed config carries the plan's keys") {
  const ModelSpec m = model("6b");
  TrainConfig c;
  c.zero_stage = 3;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_params = OffloadDevice::kCpu;
  c.micro_batch = 4;
  c.gas = 8;
  c.gpus_per_node = 2;
  LauncherConfig lc = deepspeed_config(m, c);
  const auto& ds = lc.deepspeed;
  CHECK(ds["train_micro_batch_size_per_gpu"] == 4);
  CHECK(ds["gradient_accumulation_steps"] == 8);
  CHECK(ds["train_batch_size"] == 4 * 8 * 2);
  CHECK(ds["bf16"]["enabled"] == true);
  CHECK(ds["zero_optimization"]["stage"] == 3);
  CHECK(ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu");
  CHECK(ds["zero_optimization"]["offload_optimizer"]["pin_memory"] == true);
  CHECK(ds["zero_optimization"]["offload_param"]["device"] == "cpu");
  CHECK(ds["zero_optimization"]["offload_param"]["pin_memory"] == true);
  // Hugging Face "auto" values: h^2, 0.9 h^2, 10 h with h = 4096.
  CHECK(ds["zero_optimization"]["reduce_bucket_size"] == 4096LL * 4096);
  CHECK(ds["zero_optimization"]["stage3_prefetch_bucket_size"] == static_cast<int64_t>(0.9 * 4096 * 4096));
  CHECK(ds["zero_optimization"]["stage3_param_persistence_threshold"] == 40960);
  CHECK(ds["optimizer"]["type"] == "AdamW");
  // Stage 2 has no offload_param key at all.
  c.zero_stage = 2;
  c.offload_params = OffloadDevice::kNone;
  CHECK_FALSE(deepspeed_config(m, c).deepspeed["zero_optimization"].contains("offload_param"));
  // 8-bit on the GPU: the optimizer comes from the script, and a note says so.
  c.offload_optimizer = OffloadDevice::kNone;
  c.optimizer = OptimizerKind::kAdamW8bit;
  LauncherConfig q = deepspeed_config(m, c);
  CHECK_FALSE(q.deepspeed.contains("optimizer"));
  CHECK(!q.notes.empty());
  // Accelerate YAML points at the JSON.
  CHECK(accelerate_yaml(c, "ds.json").find("deepspeed_config_file: ds.json") != std::string::npos);
}

TEST_CASE("JSON contract fields") {
  SearchRequest r = request("6b", 2);
  SearchResult res = search_plans(r);
  ReportContext ctx{&r.model, &r.hardware, 1e9};
  nlohmann::json j = plan_to_json(res.ranked.front(), ctx);
  for (const char* k : {"zero_stage", "offload_optimizer", "offload_params", "optimizer", "precision", "micro_batch",
                        "gas", "seq_len", "gpus", "nodes", "activation_checkpointing"})
    CHECK(j["config"].contains(k));
  CHECK(j["fits"] == true);
  for (const char* k : {"step", "gas", "opt", "forward", "backward", "grad_comm", "param_gather",
                        "offload_transfer", "optimizer"})
    CHECK(j["time_s"].contains(k));
  for (const char* k : {"tokens_per_s", "world_samples_per_s", "rank_samples_per_s", "mfu"})
    CHECK(j["throughput"].contains(k));
  for (const char* k : {"params", "grads", "optimizer_states", "activations", "total"})
    CHECK(j["gpu_memory_bytes"].contains(k));
  CHECK(j["cpu_memory_bytes"].contains("total"));
  CHECK(j["train"]["time_s"].get<double>() > 0);
  CHECK(model_to_json(r.model)["params"] == 6'050'882'784);
  // GAS = 1: the split is undefined, written as null.
  TrainConfig c = res.ranked.front().config;
  c.gas = 1;
  CHECK(plan_to_json(evaluate(r.model, r.hardware, c), ctx)["time_s"]["gas"].is_null());
  // The ranking's weighing, by hand: optimizer offload (weight 1) and checkpointing (0.5) at
  // 0.5 % a unit handicap the plan 0.75 %, and its score is its tokens/s less that share.
  c.zero_stage = 2;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_params = OffloadDevice::kNone;
  c.optimizer = OptimizerKind::kAdamW;
  c.activation_checkpointing = true;
  const Prediction p = evaluate(r.model, r.hardware, c);
  const nlohmann::json rank = plan_to_json(p, ctx)["ranking"];
  CHECK(rank["mechanisms"] == nlohmann::json::array({"optimizer offload", "checkpointing"}));
  CHECK(rank["handicap_frac"].get<double>() == doctest::Approx(0.0075));
  CHECK(rank["score_tokens_per_s"].get<double>() == doctest::Approx(p.throughput.tokens_per_s * 0.9925));
}

TEST_CASE("plans beyond the calibrated micro-batches are flagged as extrapolated") {
  // The committed h200-sxm fit saw at most 65,536 tokens per micro-batch (pythia-2.8b,
  // micro-batch 32 x sequence 2048, checkpointed, in
  // data/runs/h200-sxm/2026-12-01_small_micro_1gpu.jsonl); micro-batch 64 at 2048 lies beyond it.
  const HardwareProfile hw = hardware("h200-sxm");
  REQUIRE(hw.coefs_calibrated);
  CHECK(hw.max_micro_tokens == 65536.0);
  const ModelSpec m = model("6b");
  const ReportContext ctx{&m, &hw, 0};
  TrainConfig c;
  c.gpus_per_node = 2;
  c.zero_stage = 3;
  c.seq_len = 2048;
  c.micro_batch = 32;
  CHECK_FALSE(plan_to_json(evaluate(m, hw, c), ctx)["extrapolated"].get<bool>());
  c.micro_batch = 64;
  CHECK(plan_to_json(evaluate(m, hw, c), ctx)["extrapolated"].get<bool>());
  CHECK(plans_table({evaluate(m, hw, c)}, ctx).find("beyond the calibration runs") != std::string::npos);
  // An uncalibrated profile has no range to leave.
  CHECK_FALSE(beyond_calibration(hardware("a40"), 64, 4096));
}

TEST_CASE("write_file_atomic: the whole text or nothing, no temporary left, one clear error") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("stepcast_atomic_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path target = dir / "out.json";
  write_file_atomic(target, "first");
  write_file_atomic(target, "second, longer");
  std::ifstream in(target);
  std::stringstream got;
  got << in.rdbuf();
  CHECK(got.str() == "second, longer");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() == "out.json" ? 0 : 1;
  CHECK(entries == 0);  // no temporary file left beside it
  // A folder that does not exist, and a target that is a folder: InputError naming the path.
  CHECK_THROWS_WITH_AS(write_file_atomic(dir / "missing" / "x.json", "x"), doctest::Contains("missing/x.json"),
                       InputError);
  CHECK_THROWS_AS(write_file_atomic(dir, "x"), InputError);
  // A folder that cannot be written (not as root, who may write anywhere): the reason, not "Success".
  fs::create_directories(dir / "ro");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  if (::geteuid() != 0) {
    CHECK_THROWS_WITH_AS(write_file_atomic(dir / "ro" / "x.json", "x"), doctest::Contains("Permission denied"),
                         InputError);
  }
  fs::permissions(dir / "ro", fs::perms::owner_all);
  fs::remove_all(dir);
}

TEST_CASE("the split-conformal 95 % quantile by hand") {
  // n = 19: rank ceil(0.95 x 20) = 19, the largest. n = 39: ceil(0.95 x 40) = 38, the second
  // largest. n = 10: ceil(10.45) = 11 > 10, the largest. None: 0.
  std::vector<double> s19, s39;
  for (int i = 1; i <= 19; ++i) s19.push_back(i);
  for (int i = 39; i >= 1; --i) s39.push_back(i);  // unsorted on purpose
  CHECK(conformal_q95(s19) == 19.0);
  CHECK(conformal_q95(s39) == 38.0);
  CHECK(conformal_q95({0.3, 0.1, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}) == 1.0);
  CHECK(conformal_q95({}) == 0.0);
}

TEST_CASE("Kendall's tau-b by hand, and the plans validate --sample chooses") {
  // x = 1..5, y = 3 1 2 5 4: of the 10 pairs, (1,2) (1,3) (4,5) are discordant, 7 concordant:
  // tau = (7 - 3) / 10.
  CHECK(kendall_tau_b({1, 2, 3, 4, 5}, {3, 1, 2, 5, 4}) == doctest::Approx(0.4));
  CHECK(kendall_tau_b({1, 2, 3}, {3, 2, 1}) == doctest::Approx(-1.0));
  // Ties: x = 1 1 2, y = 1 2 3: 2 concordant of 3 pairs, 1 tie in x: 2 / sqrt(2 x 3).
  CHECK(kendall_tau_b({1, 1, 2}, {1, 2, 3}) == doctest::Approx(2.0 / std::sqrt(6.0)));
  CHECK(kendall_tau_b({1}, {2}) == 0.0);
  // The top 3, then 2 spread over ranks 4..100 (indices 3 + 97 j / 3), then 2 random, all distinct.
  const std::vector<size_t> chosen = plans_to_validate(100, 3, 4, 7);
  REQUIRE(chosen.size() == 7);
  CHECK(chosen[0] == 0);
  CHECK(chosen[2] == 2);
  CHECK(chosen[3] == 3 + 97 / 3);
  CHECK(chosen[4] == 3 + 2 * 97 / 3);
  std::vector<size_t> sorted = chosen;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  CHECK(plans_to_validate(100, 3, 4, 7) == chosen);  // seeded
  CHECK(plans_to_validate(5, 3, 10, 1).size() == 5);  // never more than the ranking holds
  CHECK(plans_to_validate(2, 3, 0, 1) == std::vector<size_t>{0, 1});
}

TEST_CASE("wilson_interval: the score interval of a binomial proportion, by hand") {
  // 4 of 5 at z 1.96 (Wilson 1927): p = 0.8, z^2 / n = 0.76832; centre (0.8 + 0.38416) / 1.76832 =
  // 0.669651; half-width 1.96 / 1.76832 x sqrt(0.16 / 5 + 3.8416 / 100) = 1.108396 x 0.265360 =
  // 0.294124: [0.375527, 0.963775].
  const ProportionInterval a = wilson_interval(4, 5);
  CHECK(a.lo == doctest::Approx(0.375527).epsilon(1e-5));
  CHECK(a.hi == doctest::Approx(0.963775).epsilon(1e-5));
  // All inside: the lower end is n / (n + z^2), the upper 1 (Newcombe 1998, method 3).
  const ProportionInterval b = wilson_interval(20, 20);
  CHECK(b.lo == doctest::Approx(20.0 / (20.0 + 1.96 * 1.96)));
  CHECK(b.hi == doctest::Approx(1.0));
  // None inside: symmetric to all inside.
  const ProportionInterval c = wilson_interval(0, 20);
  CHECK(c.lo == doctest::Approx(0.0));
  CHECK(c.hi == doctest::Approx(1.96 * 1.96 / (20.0 + 1.96 * 1.96)));
  // It narrows with n around the same share, and holds the share.
  const ProportionInterval d = wilson_interval(90, 100), e = wilson_interval(900, 1000);
  CHECK(e.hi - e.lo < d.hi - d.lo);
  CHECK(d.lo < 0.9);
  CHECK(d.hi > 0.9);
  // 90 of 100 excludes 95 %: centre 0.919208 / 1.038416 = 0.885193, half-width 1.887490 x
  // sqrt(0.0009 + 0.00009604) = 0.059569, upper end 0.944762. 92 of 100 does not: centre
  // 0.939208 / 1.038416 = 0.904462, half-width 1.887490 x sqrt(0.000736 + 0.00009604) = 0.054448,
  // upper end 0.958910.
  CHECK(d.hi == doctest::Approx(0.944762).epsilon(1e-5));
  CHECK(wilson_interval(92, 100).hi == doctest::Approx(0.958910).epsilon(1e-5));
  // No trials: no information.
  CHECK(wilson_interval(0, 0).lo == 0.0);
  CHECK(wilson_interval(0, 0).hi == 1.0);
}

TEST_CASE("the Accelerate FSDP2 config of a plan") {
  TrainConfig c;
  c.engine = Engine::kFsdp2;
  c.zero_stage = 3;
  c.gpus_per_node = 2;
  c.offload_optimizer = c.offload_params = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  c.activation_checkpointing = true;
  const std::string y = accelerate_fsdp_yaml(test::model("llama-2-7b"), c);
  for (const char* line : {"distributed_type: FSDP\n", "  fsdp_version: 2\n", "  fsdp_reshard_after_forward: true\n",
                           "  fsdp_offload_params: true\n", "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n",
                           "  fsdp_activation_checkpointing: true\n", "mixed_precision: bf16\n", "num_processes: 2\n"})
    CHECK_MESSAGE(y.find(line) != std::string::npos, line);
  c.zero_stage = 2;
  c.offload_optimizer = c.offload_params = OffloadDevice::kNone;
  const std::string y2 = accelerate_fsdp_yaml(test::model("pythia-2.8b"), c);
  CHECK(y2.find("  fsdp_reshard_after_forward: false\n") != std::string::npos);
  CHECK(y2.find("  fsdp_transformer_layer_cls_to_wrap: GPTNeoXLayer\n") != std::string::npos);
  c.engine = Engine::kDeepSpeed;
  CHECK_THROWS_WITH_AS(accelerate_fsdp_yaml(test::model("llama-2-7b"), c), doctest::Contains("--engine fsdp2"),
                       InputError);
}

TEST_CASE("a plan names the regime dimensions it extrapolates in, with the calibrated range") {
  // The committed h200-sxm interval model: its fitted runs are on 1 and 2 GPUs of one node,
  // sequences 512-32768 (data/hardware/h200-sxm.toml, [coefficients.interval]).
  const ModelSpec m = test::model("llama-2-7b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  const ReportContext ctx{&m, &hw, 0};
  TrainConfig inside;
  inside.zero_stage = 3;
  inside.gpus_per_node = 2;
  inside.micro_batch = 4;
  inside.gas = 4;
  const nlohmann::json a = plan_to_json(evaluate(m, hw, inside), ctx);
  CHECK(a["extrapolated_dimensions"].empty());
  TrainConfig far = inside;
  far.gpus_per_node = 8;
  far.nodes = 2;
  far.seq_len = 65536;
  far.micro_batch = 1;
  far.activation_checkpointing = true;
  const nlohmann::json b = plan_to_json(evaluate(m, hw, far), ctx);
  REQUIRE(b["extrapolated_dimensions"].size() == 3);
  CHECK(b["extrapolated_dimensions"][0] == "GPUs 16 (calibrated: 1/2)");
  CHECK(b["extrapolated_dimensions"][1] == "nodes 2 (calibrated: 1)");
  CHECK(b["extrapolated_dimensions"][2] == "sequence 65536 (calibrated: 512-32768)");
  // An uncalibrated profile lists none: its header says it is transferred.
  const HardwareProfile a40 = test::hardware("a40");
  const ReportContext ctx40{&m, &a40, 0};
  CHECK(plan_to_json(evaluate(m, a40, far), ctx40)["extrapolated_dimensions"].empty());
}

TEST_CASE("the plans within the model's typical error of the top plan are counted as ones it cannot order") {
  // A calibrated profile's typical error is its fit's RMS residual; an uncalibrated one's, its
  // transferred 95 % quantile over 1.96 (one standard deviation of a normal error).
  const HardwareProfile h200 = hardware("h200-sxm"), a40 = hardware("a40");
  CHECK(typical_error_frac(h200) == h200.model_error_frac);
  CHECK(typical_error_frac(a40) == doctest::Approx(std::expm1(a40.transferred_log_q95 / 1.96)).epsilon(1e-12));
  for (const char* hw : {"h200-sxm", "a40"}) {
    CAPTURE(hw);
    const SearchResult res = search_plans(request("pythia-2.8b", 1, hw));
    // The H200's band (its fit's RMS) leaves plans outside; the A40's transferred band may hold all.
    if (std::string(hw) == "h200-sxm") REQUIRE(res.ranked.size() > res.tied_with_top);
    REQUIRE(res.ranked.size() >= res.tied_with_top);
    REQUIRE(res.tied_with_top >= 1);  // the top plan itself
    const double floor_tps = res.ranked.front().throughput.tokens_per_s * (1.0 - res.typical_error_frac);
    // Every ranked plan inside the band is counted, none outside it (the ranking's complexity
    // tie-break may interleave them, so count rather than cut at a rank).
    size_t inside = 0;
    for (const Prediction& p : res.ranked) inside += p.throughput.tokens_per_s >= floor_tps;
    CHECK(inside == res.tied_with_top);
    const bool noted = std::any_of(res.notes.begin(), res.notes.end(), [](const std::string& n) {
      return n.find("the model's typical error") != std::string::npos;
    });
    CHECK(noted == (res.tied_with_top > 1));
  }
}

TEST_CASE("on one GPU a peer's stages 1-3 without offload are plans; the Stepcast backend's are its stage 0") {
  // DeepSpeed with its AdamW on one H200, llama-2-7b, global batch 64: stage 0 holds bf16 weights,
  // fp32 gradients (its bf16 optimizer) and 12 B of fp32 master weights and moments, over 16 B a
  // parameter (108 GB) before activations; ZeRO-3 keeps the fp32 states in one flat partition and
  // fetches the bf16 weights by module. Measured by DeepSpeed 0.14.5 on one H200 at micro-batch 8,
  // checkpointed: 123.0 GiB reserved (data/runs/h200-sxm/2026-12-02_peers_deepspeed_1gpu_holdout2.jsonl).
  // Its stage 3 without offload must be searched and, fitting, rank above the CPU-offloaded plans.
  SearchRequest r = request("llama-2-7b", 1);
  r.base.engine = Engine::kDeepSpeed;
  r.optimizers = {OptimizerKind::kAdamW};
  SearchResult res = search_plans(r);
  REQUIRE(!res.ranked.empty());
  const TrainConfig& top = res.ranked.front().config;
  CHECK(top.zero_stage == 3);
  CHECK(top.offload_optimizer == OffloadDevice::kNone);
  for (const auto& n : res.notes) CHECK(n.find("partition nothing") == std::string::npos);
  // The Stepcast backend on one GPU: no stage 1-3 plan without offload (each equals its stage 0).
  SearchRequest s = request("llama-2-7b", 1);
  SearchResult sres = search_plans(s);
  for (const auto& p : sres.ranked)
    CHECK((p.config.zero_stage == 0 || p.config.offload_optimizer == OffloadDevice::kCpu));
  bool noted = false;
  for (const auto& n : sres.notes) noted |= n.find("partition nothing") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("complexity: each mechanism's weight, summed; the header's handicap range from the same table") {
  // README, "Ranking": parameter offload 1 %, CPU optimizer offload 0.5 %, stage 3, 8-bit states
  // and checkpointing 0.25 % each, i.e. weights 2, 1, 0.5, 0.5, 0.5 at 0.5 % per unit.
  TrainConfig c;
  c.zero_stage = 2;
  c.offload_optimizer = OffloadDevice::kNone;
  c.offload_params = OffloadDevice::kNone;
  c.optimizer = OptimizerKind::kAdamW;
  c.activation_checkpointing = false;
  CHECK(complexity(c) == 0.0);
  c.offload_optimizer = OffloadDevice::kCpu;
  CHECK(complexity(c) == 1.0);
  c.zero_stage = 3;
  c.offload_params = OffloadDevice::kCpu;
  c.optimizer = OptimizerKind::kAdamW8bit;
  c.activation_checkpointing = true;
  CHECK(complexity(c) == 2.0 + 1.0 + 0.5 + 0.5 + 0.5);
  CHECK(handicap_range_text() == "0.25-1 %");
}

TEST_CASE("hardware_for_device names the profile of the GPU the committed run records ran on") {
  // Expected values from outside the code: each record's env.device is the name the CUDA driver
  // reported on the lent machine, and the folder the record sits in is the profile it calibrates.
  namespace fs = std::filesystem;
  int checked = 0;
  for (const auto& dir : fs::directory_iterator(test::data_dir() / "runs")) {
    if (!dir.is_directory()) continue;
    std::set<std::string> devices;
    for (const auto& file : fs::directory_iterator(dir.path())) {
      if (file.path().extension() != ".jsonl") continue;
      std::ifstream in(file.path());
      std::string line;
      if (!std::getline(in, line)) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("env") && j["env"].contains("device")) devices.insert(j["env"]["device"]);
    }
    for (const auto& device : devices) {
      CAPTURE(device);
      CHECK(hardware_for_device(device, test::data_dir()) == dir.path().filename().string());
      ++checked;
    }
  }
  CHECK(checked >= 2);  // the H200 and the H100 folders
  CHECK_FALSE(hardware_for_device("cpu", test::data_dir()).has_value());
  CHECK_FALSE(hardware_for_device("NVIDIA H100", test::data_dir()).has_value());  // names match whole
}
