// planner diagnose: the founding report's phases derived by hand, speeds recovered from runs the
// model itself makes at known speeds (calibration tested by recovery), the resources that cannot
// bear on a run, and bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "common/errors.h"
#include "planner/diagnose.h"
#include "test_util.h"

using namespace stepcast;

namespace {

// DeepSpeed ZeRO-2 with its CPU Adam, pythia-2.8b on one H200: a plan whose optimizer runs on the
// CPU, so that every resource but the links bears on it.
TrainConfig deepspeed_offload() {
  TrainConfig c;
  c.engine = Engine::kDeepSpeed;
  c.zero_stage = 2;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  c.offload_overlap_forward = false;
  c.micro_batch = 4;
  c.gas = 2;
  c.seq_len = 2048;
  return c;
}

// What the model predicts for `c` on `hw` with `speeds`, as a measurement of the step, GAS and OPT
// time, and forward, backward and optimizer.
MeasuredStep synthetic(const ModelSpec& m, const HardwareProfile& hw, const TrainConfig& c, const ResourceSpeeds& speeds) {
  const HardwareProfile hw_engine = c.engine == Engine::kStepcast ? hw : for_engine(hw, engine_name(c.engine));
  const ScaledMachine sm = scale_machine(hw_engine, c, {}, speeds);
  const Prediction p = evaluate(m, sm.hardware, c, sm.limits);
  MeasuredStep out;
  out.step_s = p.time.step_s;
  out.gas_s = p.time.gas_s;
  out.opt_s = p.time.opt_s;
  out.forward_s = p.time.forward_s;
  out.backward_s = p.time.backward_s + p.time.recompute_s;
  out.optimizer_s = p.time.optimizer_total_s;
  return out;
}

// The same job on our backend, its CPU optimizer pipelined with the backward.
TrainConfig stepcast_offload() {
  TrainConfig c = deepspeed_offload();
  c.engine = Engine::kStepcast;
  c.offload_pipeline = true;
  return c;
}

bool names(const std::vector<Resource>& rs, Resource r) { return std::find(rs.begin(), rs.end(), r) != rs.end(); }

}  // namespace

TEST_CASE("diagnose: the founding report's one-GPU ZeRO-2 row, its micro-batch and its step after the backward") {
  // The report's zero_stage_2 row (data/published/founding_report.toml): GAS 5, GAS time 51.642 s,
  // OPT time 25.455 s. GAS time is GAS - 1 = 4 micro-batches: 51.642 / 4 = 12.9105 s each; OPT time
  // is the last micro-batch and the step after it: 25.455 - 12.9105 = 12.5445 s.
  const ModelSpec m = test::model("pythia-2.8b");
  const HardwareProfile hw = test::hardware("a40");
  TrainConfig c = deepspeed_offload();
  c.precision = Precision::kFp16;
  c.attention = AttentionKind::kMath;
  c.activation_checkpointing = true;
  c.micro_batch = 8;
  c.gas = 5;
  ResourceLimits limits;
  limits.cpu_cores_node = 8;  // the pod's 8 vCPUs
  MeasuredStep meas;
  meas.gas_s = 51.642;
  meas.opt_s = 25.455;
  const Diagnosis d = diagnose(m, hw, c, limits, meas);
  REQUIRE(d.runs[0].micro_batch_measured_s);
  CHECK(*d.runs[0].micro_batch_measured_s == doctest::Approx(12.9105));
  CHECK(*d.runs[0].after_last_micro_batch_measured_s == doctest::Approx(12.5445));
  // The fitted phases are the two given; the step after the backward is the larger miss (the
  // report's own finding: a third of the step in the CPU optimizer), so the CPU optimizer is the
  // single resource that explains the run best.
  REQUIRE(d.runs[0].phases.size() == 2);
  CHECK(d.runs[0].phases[0].fitted);
  CHECK(d.runs[0].phases[1].fitted);
  REQUIRE(!d.singles.empty());
  CHECK(d.singles.front().resources.front() == Resource::kCpuOptimizer);
  CHECK(d.singles.front().speeds.front() < 0.5);
  // One GPU: no link between GPUs or nodes bears on it.
  CHECK(names(d.no_bearing, Resource::kIntraNode));
  CHECK(names(d.no_bearing, Resource::kInterNode));
  // Two speeds for two phases: exactly determined, said so.
  if (d.explanation.resources.size() == 2) CHECK(d.exactly_determined);
}

TEST_CASE("diagnose: speeds recovered from the model's own prediction at known speeds") {
  const ModelSpec m = test::model("pythia-2.8b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  const TrainConfig c = deepspeed_offload();
  SUBCASE("the CPU optimizer at a quarter of its speed") {
    ResourceSpeeds truth;
    truth[Resource::kCpuOptimizer] = 0.25;
    const Diagnosis d = diagnose(m, hw, c, {}, synthetic(m, hw, c, truth));
    REQUIRE(d.explanation.resources.size() == 1);
    CHECK(d.explanation.resources[0] == Resource::kCpuOptimizer);
    CHECK(d.explanation.speeds[0] == doctest::Approx(0.25).epsilon(0.01));
    CHECK(d.explanation.rms_log_error < 1e-3);
    CHECK(d.rms_log_error > 0.2);  // the profile's speeds miss it (the OPT time by about 2x)
  }
  SUBCASE("our backend's GPU at 0.7 and CPU optimizer at 0.3: four phases, two speeds") {
    // Our backend's forward, backward and optimizer are the model's own phases: they and the
    // step are fitted (a peer's GAS and OPT time alone would give two phases for two speeds).
    const TrainConfig ours = stepcast_offload();
    ResourceSpeeds truth;
    truth[Resource::kGpu] = 0.7;
    truth[Resource::kCpuOptimizer] = 0.3;
    const Diagnosis d = diagnose(m, hw, ours, {}, synthetic(m, hw, ours, truth));
    REQUIRE(d.best_pair);
    REQUIRE(d.explanation.resources.size() == 2);
    CHECK(!d.exactly_determined);
    for (size_t i = 0; i < 2; ++i) {
      const double want = d.explanation.resources[i] == Resource::kGpu ? 0.7 : 0.3;
      CHECK(names({Resource::kGpu, Resource::kCpuOptimizer}, d.explanation.resources[i]));
      CHECK(d.explanation.speeds[i] == doctest::Approx(want).epsilon(0.01));
    }
    CHECK(d.explanation.rms_log_error < 1e-3);
  }
  SUBCASE("the profile's own speeds: nothing to explain") {
    const Diagnosis d = diagnose(m, hw, c, {}, synthetic(m, hw, c, ResourceSpeeds{}), 0.05);
    CHECK(d.rms_log_error < 1e-9);
    CHECK(d.within_noise);
    CHECK(d.explanation.resources.empty());
  }
  SUBCASE("a CPU optimizer 3 % slow, within the model's own 10 % error: nothing to explain") {
    ResourceSpeeds truth;
    truth[Resource::kCpuOptimizer] = 0.97;
    const Diagnosis d = diagnose(m, hw, c, {}, synthetic(m, hw, c, truth), 0.10);
    CHECK(d.within_noise);
    CHECK(d.explanation.resources.empty());
    // The resources are still solved and listed: the CPU optimizer first, near its true speed.
    REQUIRE(!d.singles.empty());
    CHECK(d.singles.front().speeds[0] == doctest::Approx(0.97).epsilon(0.01));
  }
}

TEST_CASE("diagnose: speed 1 changes no prediction; a plan without offload has no CPU optimizer or PCIe to blame") {
  const ModelSpec m = test::model("llama-2-7b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  TrainConfig c;
  c.gpus_per_node = 2;
  c.zero_stage = 3;
  c.micro_batch = 4;
  c.gas = 2;
  const ScaledMachine same = scale_machine(hw, c, {}, ResourceSpeeds{});
  CHECK(evaluate(m, same.hardware, c, same.limits).time.step_s == doctest::Approx(evaluate(m, hw, c).time.step_s).epsilon(1e-12));
  MeasuredStep meas;
  meas.step_s = 1.3 * evaluate(m, hw, c).time.step_s;
  const Diagnosis d = diagnose(m, hw, c, {}, meas);
  CHECK(names(d.no_bearing, Resource::kCpuOptimizer));
  CHECK(names(d.no_bearing, Resource::kPcie));
  CHECK(names(d.no_bearing, Resource::kInterNode));  // one node
  CHECK(!names(d.no_bearing, Resource::kGpu));
  CHECK(!names(d.no_bearing, Resource::kIntraNode));  // two GPUs, ZeRO-3: its gathers
  // One phase, a slower step: the GPU alone meets it, at about 1 / 1.3 of its speed (not exactly:
  // the launches and the host's share of the step do not scale with the GPU).
  const ResourceFit* gpu = nullptr;
  for (const ResourceFit& f : d.singles)
    if (f.resources[0] == Resource::kGpu) gpu = &f;
  REQUIRE(gpu);
  CHECK(gpu->rms_log_error < 1e-3);
  CHECK(gpu->speeds[0] < 0.8);
  CHECK(gpu->speeds[0] > 0.6);
}

TEST_CASE("diagnose: several runs share the machine's speeds; each left out is predicted from the others") {
  // Three plans on one machine whose CPU optimizer runs at 0.3 and GPU at 0.8 of the profile's
  // speeds, measured as the model predicts them there: together they give both speeds back, and
  // each run left out is predicted from the other two's diagnosis exactly (a property: the
  // speeds are the machine's, not a run's).
  const ModelSpec m = test::model("pythia-2.8b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  ResourceSpeeds truth;
  truth[Resource::kCpuOptimizer] = 0.3;
  truth[Resource::kGpu] = 0.8;
  std::vector<DiagnosedRun> runs;
  for (int stage : {1, 2, 3}) {
    TrainConfig c = deepspeed_offload();
    c.zero_stage = stage;
    c.micro_batch = 2 * stage;
    runs.push_back({"stage " + std::to_string(stage), m, c, {}, synthetic(m, hw, c, truth)});
  }
  const Diagnosis d = diagnose(hw, runs);
  REQUIRE(d.runs.size() == 3);
  REQUIRE(d.explanation.resources.size() == 2);
  CHECK(!d.exactly_determined);
  for (size_t i = 0; i < 2; ++i)
    CHECK(d.explanation.speeds[i] == doctest::Approx(d.explanation.resources[i] == Resource::kGpu ? 0.8 : 0.3).epsilon(0.02));
  const std::vector<LeftOut> loo = leave_one_out(hw, runs, 0.0);
  REQUIRE(loo.size() == 3);
  for (const LeftOut& l : loo) {
    REQUIRE(l.at_profile.phases.size() == 6);  // step, GAS, OPT, forward, backward, optimizer
    for (size_t k = 0; k < 6; ++k) CHECK(l.diagnosed_s[k] == doctest::Approx(l.at_profile.phases[k].measured_s).epsilon(0.02));
    CHECK(std::abs(l.at_profile.phases[0].predicted_s / l.at_profile.phases[0].measured_s - 1.0) > 0.1);
  }
  // One machine, one engine: a run of another engine is refused.
  runs.push_back(runs.front());
  runs.back().config.engine = Engine::kFsdp2;
  CHECK_THROWS_AS(diagnose(hw, runs), InputError);
}

TEST_CASE("diagnose: one phase is met by every resource that bears on it; the least change is named") {
  const ModelSpec m = test::model("pythia-2.8b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  const TrainConfig c = deepspeed_offload();
  ResourceSpeeds truth;
  truth[Resource::kCpuOptimizer] = 0.25;
  MeasuredStep step_only;
  step_only.step_s = synthetic(m, hw, c, truth).step_s;
  const Diagnosis d = diagnose(m, hw, c, {}, step_only);
  REQUIRE(d.explanation.resources.size() == 1);
  CHECK(d.exactly_determined);  // one speed, one phase: said so
  for (const ResourceFit& f : d.singles)
    if (!f.at_bound && f.rms_log_error < 1e-3)
      CHECK(std::abs(std::log(d.explanation.speeds[0])) <= std::abs(std::log(f.speeds[0])) + 1e-9);
}

TEST_CASE("diagnose: bad input") {
  const ModelSpec m = test::model("pythia-2.8b");
  const HardwareProfile hw = test::hardware("h200-sxm");
  const TrainConfig c = deepspeed_offload();
  CHECK_THROWS_AS(diagnose(m, hw, c, {}, MeasuredStep{}), InputError);
  MeasuredStep neg;
  neg.step_s = -1.0;
  CHECK_THROWS_AS(diagnose(m, hw, c, {}, neg), InputError);
  MeasuredStep zero;
  zero.step_s = 0.0;
  CHECK_THROWS_AS(diagnose(m, hw, c, {}, zero), InputError);
}
