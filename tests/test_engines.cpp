// The peer engines as features of the one step-time model, and the profile's engine sections.
// Byte counts are derived by hand from DeepSpeed v0.14.5's and torch 2.11's sources (cited in
// model/step_features.cpp).
#include <doctest/doctest.h>

#include "common/errors.h"
#include "common/text_file.h"
#include "model/prediction.h"
#include "model/train_config_json.h"
#include "test_util.h"

using namespace stepcast;
using stepcast::test::hardware;
using stepcast::test::model;

namespace {

TrainConfig offload(Engine e, int stage, int64_t gas) {
  TrainConfig c;
  c.engine = e;
  c.zero_stage = stage;
  c.gpus_per_node = 2;
  c.micro_batch = 4;
  c.gas = gas;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  if (e == Engine::kFsdp2) c.offload_params = OffloadDevice::kCpu;
  return c;
}

}  // namespace

TEST_CASE("DeepSpeed ZeRO-2 offload moves gradients over PCIe every micro-batch (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params()) / 2.0;  // partition of one of 2 ranks
  const StepFeatures f = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).step;
  // GAS 4: micro-batches 1-3 copy 2 B per parameter down; 2 and 3 also bring the host sum up
  // (2 B): (3 x 2 + 2 x 2) / 3 B per non-boundary micro-batch. The boundary sends fp32 (4 B)
  // after bringing the sum up (2 B); the update comes back as fp32 (4 B).
  CHECK(test::close(f.grad_host_bytes_micro, P * (3 * 2.0 + 2 * 2.0) / 3.0, 1e-12));
  CHECK(test::close(f.d2h_bytes_boundary, P * 6.0, 1e-12));
  CHECK(test::close(f.h2d_bytes_step, P * 4.0, 1e-12));
  CHECK(f.opt_pipelined == 0.0);
  CHECK(f.opt_bytes_per_param == 28.0);
  // Per step: 3 x (4/3 x 2P + ... ) = 10 P down and up before the boundary + 6 P + 4 P.
  const double total = 3.0 * f.grad_host_bytes_micro + f.d2h_bytes_boundary + f.h2d_bytes_step;
  CHECK(test::close(total, 20.0 * P, 1e-12));
  // The Stepcast backend copies each shard once (2 B) and the update once (2 B).
  TrainConfig ours = offload(Engine::kDeepSpeed, 2, 4);
  ours.engine = Engine::kStepcast;
  ours.offload_pipeline = true;
  const StepFeatures s = make_features(m, hw, ours).step;
  CHECK(s.grad_host_bytes_micro == 0.0);
  CHECK(test::close(s.d2h_bytes_boundary + s.h2d_bytes_step, 4.0 * P, 1e-12));
  // GAS 1: nothing before the boundary, which sends fp32 only.
  const StepFeatures one = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 1)).step;
  CHECK(one.grad_host_bytes_micro == 0.0);
  CHECK(test::close(one.d2h_bytes_boundary, 4.0 * P, 1e-12));
}

TEST_CASE("FSDP2 CPU offload uploads the fp32 shard in forward and backward, nothing after the step") {
  const ModelSpec m = model("llama-2-7b");
  const StepFeatures f = make_features(m, hardware("h200-sxm"), offload(Engine::kFsdp2, 3, 4)).step;
  const double P = static_cast<double>(m.total_params()) / 2.0;
  CHECK(test::close(f.param_h2d_bytes_micro, 2.0 * 4.0 * P, 1e-12));
  CHECK(test::close(f.d2h_bytes_boundary, 4.0 * P, 1e-12));
  CHECK(f.h2d_bytes_step == 0.0);
  CHECK(f.grad_host_bytes_micro == 0.0);
}

TEST_CASE("DeepSpeed ZeRO-3 fetches every module with parameters, a third time with checkpointing (hand count)") {
  // llama-2-7b's modules with parameters, as transformers registers them: q, k, v, o, gate, up,
  // down and two RMSNorms per layer (9 x 32), the embedding, the final norm and the untied
  // lm_head (3): 291. pythia-2.8b (gpt_neox): fused query_key_value, dense, dense_h_to_4h,
  // dense_4h_to_h and two LayerNorms (6 x 32), embed_in, final_layer_norm, embed_out: 195.
  const HardwareProfile hw = hardware("h200-sxm");
  const ModelSpec llama = model("llama-2-7b");
  const ModelSpec pythia = model("pythia-2.8b");
  CHECK(llama.param_modules_per_layer() * llama.num_layers + llama.param_modules_outside_layers() == 291);
  CHECK(pythia.param_modules_per_layer() * pythia.num_layers + pythia.param_modules_outside_layers() == 195);
  TrainConfig c;
  c.engine = Engine::kDeepSpeed;
  c.zero_stage = 3;
  c.gpus_per_node = 2;
  c.micro_batch = 4;
  c.gas = 2;
  StepFeatures f = make_features(llama, hw, c).step;
  CHECK(f.param_fetches_micro == 2.0 * 291);
  CHECK(f.gather_calls_micro == 2.0 * 291);
  CHECK(test::close(f.gather_bytes_micro, 2.0 * 2.0 * static_cast<double>(llama.total_params()), 1e-12));
  c.activation_checkpointing = true;
  f = make_features(pythia, hw, c).step;
  CHECK(f.param_fetches_micro == 3.0 * 195);
  CHECK(test::close(f.gather_bytes_micro, 3.0 * 2.0 * static_cast<double>(pythia.total_params()), 1e-12));
  // One rank fetches too (the hooks run); no collective then.
  c.gpus_per_node = 1;
  CHECK(make_features(pythia, hw, c).step.param_fetches_micro == 3.0 * 195);
  // Stage 2, FSDP2 and the Stepcast backend: none.
  c.gpus_per_node = 2;
  c.zero_stage = 2;
  CHECK(make_features(llama, hw, c).step.param_fetches_micro == 0.0);
  c.zero_stage = 3;
  c.engine = Engine::kFsdp2;
  CHECK(make_features(llama, hw, c).step.param_fetches_micro == 0.0);
  c.engine = Engine::kStepcast;
  const StepFeatures ours = make_features(llama, hw, c).step;
  CHECK(ours.param_fetches_micro == 0.0);
  CHECK(ours.gather_calls_micro == 2.0 * (llama.num_layers + 2));
  // Each fetch's host time adds to the step, unhidden: the prediction grows by fetches x GAS x
  // the coefficient when the coefficient moves from 0.
  c.engine = Engine::kDeepSpeed;
  c.activation_checkpointing = false;
  const StepFeatures ds = make_features(llama, hw, c).step;
  CoefVector k = for_engine(hw, "deepspeed").coefs;
  k[kParamFetchOverheadS] = 0.0;
  const double base_s = predict_step_time(ds, k.data()).step_s;
  k[kParamFetchOverheadS] = 1e-3;
  CHECK(predict_step_time(ds, k.data()).step_s == doctest::Approx(base_s + 2 * 582 * 1e-3).epsilon(1e-9));
}

TEST_CASE("an engine's constraints are checked where the configuration comes from") {
  TrainConfig c = offload(Engine::kFsdp2, 3, 1);
  c.offload_params = OffloadDevice::kNone;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("CPUOffloadPolicy"), InputError);
  c = TrainConfig{};
  c.engine = Engine::kFsdp2;
  c.zero_stage = 1;
  c.gpus_per_node = 2;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("must be 2 or 3"), InputError);
  c = offload(Engine::kDeepSpeed, 2, 1);
  c.offload_pipeline = true;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("--offload-pipeline must be off"), InputError);
  c = offload(Engine::kDeepSpeed, 2, 1);
  c.optimizer = OptimizerKind::kAdamW8bit;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("fp32 CPU Adam"), InputError);
  // JSON: the key is named, and the engine round-trips and keys the configuration.
  nlohmann::json j = train_config_to_json(offload(Engine::kDeepSpeed, 2, 4));
  CHECK(j.at("engine") == "deepspeed");
  CHECK(train_config_from_json(j, "r").engine == Engine::kDeepSpeed);
  CHECK(config_key("m", offload(Engine::kDeepSpeed, 2, 4)).ends_with(" engine=deepspeed"));
  j["engine"] = "megatron";
  CHECK_THROWS_WITH_AS(train_config_from_json(j, "r.config"), doctest::Contains("r.config.engine \"megatron\""),
                       InputError);
  j["engine"] = "deepspeed";
  j["offload_pipeline"] = true;
  CHECK_THROWS_WITH_AS(train_config_from_json(j, "r.config"), doctest::Contains("r.config.offload_pipeline must be off"),
                       InputError);
}

TEST_CASE("engine sections: read, written, and rejected on bad input") {
  const HardwareProfile hw = hardware("h200-sxm");
  const std::string text = read_text_file(hw.path);
  CalibratedCoefficients cc;
  cc.values = hw.coefs;
  cc.values[kActBytesMult] = 1.5;
  cc.values[kGemmEffMaxFrac] = 0.1;  // a hardware coefficient: not written into the section
  cc.model_error_frac = 0.07;
  cc.source = "test";
  cc.runs = {"runs/x.jsonl"};
  const std::string written = with_engine_section(text, "fsdp2", cc);
  const HardwareProfile back = parse_hardware_profile(written, "w.toml");
  REQUIRE(back.engines.count("fsdp2") == 1);
  const HardwareProfile fsdp = for_engine(back, "fsdp2");
  CHECK(fsdp.coefs[kActBytesMult] == 1.5);
  CHECK(fsdp.coefs[kGemmEffMaxFrac] == hw.coefs[kGemmEffMaxFrac]);  // the hardware's, shared
  CHECK(fsdp.model_error_frac == 0.07);
  CHECK(fsdp.calibration_runs == std::vector<std::string>{"runs/x.jsonl"});
  CHECK(for_engine(back, "stepcast").coefs == hw.coefs);
  // Writing twice replaces the section; the [coefficients] after it survive.
  const std::string twice = with_engine_section(written, "fsdp2", cc);
  CHECK(twice == written);
  CHECK(parse_hardware_profile(twice, "w.toml").coefs == hw.coefs);
  // A profile without the section: the engine is uncalibrated and gets the hardware's values.
  const HardwareProfile none = for_engine(hardware("a100-80gb-sxm"), "deepspeed");
  CHECK_FALSE(none.coefs_calibrated);
  // Bad input names the file and key.
  const size_t at = written.find("act_bytes_mult = 1.5");
  REQUIRE(at != std::string::npos);
  std::string bad = written;
  bad.replace(at, 20, "gemm_eff_max_frac = 0.5");
  CHECK_THROWS_WITH_AS(parse_hardware_profile(bad, "b.toml"),
                       doctest::Contains("b.toml: key 'engines.fsdp2.gemm_eff_max_frac' is not an engine coefficient"),
                       InputError);
  bad = written;
  bad.replace(at, 20, "act_bytes_mult = -1");
  CHECK_THROWS_AS(parse_hardware_profile(bad, "b.toml"), InputError);
  bad = written;
  bad.replace(bad.find("[engines.fsdp2]"), 15, "[engines.megatron]");
  CHECK_THROWS_WITH_AS(parse_hardware_profile(bad, "b.toml"), doctest::Contains("'engines.megatron'"), InputError);
}

TEST_CASE("the committed profile's peer sections predict their own runs' order of magnitude") {
  // Property: a peer plan uses its engine's coefficients, so the same configuration differs
  // between engines, and DeepSpeed's serial fp32 CPU Adam is slower than the pipelined backend.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig ds = offload(Engine::kDeepSpeed, 2, 4);
  TrainConfig ours = ds;
  ours.engine = Engine::kStepcast;
  ours.offload_pipeline = true;
  const double t_ds = evaluate(m, hw, ds).time.step_s, t_ours = evaluate(m, hw, ours).time.step_s;
  CHECK(t_ds > 1.5 * t_ours);
}

TEST_CASE("the interval model: regime distance by hand, half-width, and its profile section") {
  IntervalModel m;
  m.log_q95_seen = 0.10;
  m.log_q95_unseen = 0.25;
  m.models = {"llama-2-7b"};
  m.offloads = {"cpu", "none"};
  m.precisions = {"bf16"};
  m.attentions = {"flash"};
  m.zero_stages = {2, 3};
  m.world_sizes = {2};
  m.seq_min = 1024;
  m.seq_max = 4096;
  m.micro_tokens_max = 16384;
  TrainConfig c;
  c.zero_stage = 3;
  c.gpus_per_node = 2;
  c.micro_batch = 4;
  c.seq_len = 2048;
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 0);
  CHECK(unseen_dimensions(m, "pythia-2.8b", c) == 1);  // the model
  c.seq_len = 3000;                                    // inside [1024, 4096]: seen
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 0);
  c.seq_len = 8192;                                    // the range and micro-batch x sequence (32768 > 16384)
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 2);
  c.seq_len = 2048;
  c.zero_stage = 1;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.gpus_per_node = 8;  // stage 1 and 8 ranks unseen; "cpu" offload seen
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 2);
  CHECK(interval_log_halfwidth(m, 0) == doctest::Approx(0.10));
  CHECK(interval_log_halfwidth(m, 2) == doctest::Approx(0.10 + 2 * 0.15));
  // A calibrated profile with the model: a prediction's band is exp(half-width) - 1 of its step.
  HardwareProfile hw = hardware("h200-sxm");
  REQUIRE(hw.coefs_calibrated);
  hw.interval = m;
  TrainConfig seen;
  seen.zero_stage = 3;
  seen.gpus_per_node = 2;
  seen.micro_batch = 4;
  const Prediction p = evaluate(model("llama-2-7b"), hw, seen);
  CHECK(p.unseen_dims == 0);
  CHECK(1.96 * p.step_std_s == doctest::Approx(p.time.step_s * std::expm1(0.10)));
  const Prediction far = evaluate(model("pythia-2.8b"), hw, seen);
  CHECK(far.unseen_dims == 1);
  CHECK(1.96 * far.step_std_s == doctest::Approx(far.time.step_s * std::expm1(0.25)));
  // Written and read back inside [coefficients] and an engine section.
  CalibratedCoefficients cc;
  cc.values = hw.coefs;
  cc.interval = m;
  const std::string text = read_text_file(hw.path);
  const HardwareProfile back = parse_hardware_profile(with_calibrated_coefficients(text, cc), "w.toml");
  CHECK(back.interval.log_q95_unseen == doctest::Approx(0.25));
  CHECK(back.interval.zero_stages == std::vector<int64_t>{2, 3});
  CHECK(back.interval.models == std::vector<std::string>{"llama-2-7b"});
  const std::string eng = with_engine_section(text, "deepspeed", cc);
  CHECK(with_engine_section(eng, "deepspeed", cc) == eng);  // the section and its interval replaced, not doubled
  CHECK(for_engine(parse_hardware_profile(eng, "w.toml"), "deepspeed").interval.seq_max == 4096);
  std::string bad = eng;
  bad.replace(bad.find("log_q95_unseen = 0.25"), 21, "log_q95_unseen = 0.05");  // below the seen quantile
  CHECK_THROWS_AS(parse_hardware_profile(bad, "b.toml"), InputError);
}
