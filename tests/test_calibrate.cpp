// The Ceres fit: recovery of known coefficients from synthetic measurements,
// the same from a bad start, and the committed H200 profile reproduced from
// the committed runs.
#include <ceres/jet.h>
#include "doctest_after_glog.h"

#include <fstream>
#include <random>
#include <sstream>

#include "calibrate/cross_validate.h"
#include "calibrate/fit.h"
#include "calibrate/measured_fit.h"
#include "calibrate/measure.h"
#include "calibrate/micro_record.h"
#include "calibrate/report.h"
#include "calibrate/run_record.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/units.h"
#include "model/prediction.h"
#include "test_util.h"

using namespace stepcast;
using namespace stepcast::calibrate;

// Synthetic records are written with designated initialisers; the fields left out are zero.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace fs = std::filesystem;

namespace {

// Known "true" coefficients: every free coefficient moved away from its default.
CoefVector truth() {
  CoefVector c = default_coefs();
  c[kGemmEffMaxFrac] = 0.62;
  c[kGemmHalfDim] = 120.0;
  c[kBackwardSlowdownMult] = 1.25;
  c[kElementwiseTrafficMult] = 5.0;
  c[kLayerOverheadS] = 60e-6;
  c[kGpuOptBwEffFrac] = 0.55;
  c[kCpuCoreBytesPerSPerLane] = 0.9e9;
  c[kCpuDramEffFrac] = 0.6;
  c[kActBytesMult] = 1.2;
  c[kGpuWorkspaceBytes] = 2.5e9;
  c[kIntraBusEffFrac] = 0.6;
  c[kCollLatencyS] = 80e-6;
  return c;
}

// A designed set of configurations, "measured" with the true coefficients
// and 1 % multiplicative noise.
std::vector<Observation> synthetic(uint64_t seed) {
  const HardwareProfile hw = test::hardware("h200-sxm");
  const CoefVector t = truth();
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.01);
  std::vector<Observation> out;
  for (const char* name : {"llama-2-7b", "gpt-j-6b", "pythia-2.8b", "qwen2.5-7b"}) {
    const ModelSpec m = test::model(name);
    for (int gpus : {1, 2, 4})
      for (int stage = 0; stage <= 3; ++stage)
        for (int off = 0; off <= (stage > 0 ? 1 : 0); ++off)
          for (int64_t micro : {1, 4})
            for (int64_t seq : {1024, 4096})
              for (double cores : {4.0, 0.0}) {  // 4 cores: the CPU optimizer is core-bound; 0: the profile's
                if (cores > 0 && !off) continue;
                TrainConfig c;
                c.zero_stage = stage;
                c.offload_optimizer = off ? OffloadDevice::kCpu : OffloadDevice::kNone;
                c.gpus_per_node = gpus;
                c.micro_batch = micro;
                c.gas = 4;
                c.seq_len = seq;
                c.activation_checkpointing = micro == 4 && seq == 4096;
                Observation o;
                o.features = make_features(m, hw, c, ResourceLimits{0, 0, cores});
                const auto st = predict_step_time(o.features.step, t.data());
                const auto mem = predict_memory(o.features.memory, t.data());
                o.step_s = st.step_s * (1 + noise(rng));
                o.forward_s = st.forward_s * (1 + noise(rng));
                o.backward_s = (st.backward_s + st.recompute_s) * (1 + noise(rng));
                o.optimizer_s = (off ? st.optimizer_total_s : st.optimizer_s) * (1 + noise(rng));  // as the fit reads it
                o.gpu_memory_bytes = mem.gpu_total_bytes * (1 + noise(rng));
                o.key = std::string(name) + std::to_string(out.size());
                out.push_back(o);
              }
  }
  return out;
}

// The synthetic set spans 1-4 GPUs and every stage, so it also identifies the
// link efficiency (which the H200 fit takes from nccl-tests instead).
std::vector<Coef> synthetic_free() {
  std::vector<Coef> free = default_free_coefs();
  free.push_back(kIntraBusEffFrac);
  return free;
}

void check_recovered(const FitResult& fit) {
  const CoefVector t = truth();
  // Well-identified coefficients (they dominate some phase of some run): 5 %.
  for (Coef c : {kGemmEffMaxFrac, kBackwardSlowdownMult, kGpuOptBwEffFrac, kCpuCoreBytesPerSPerLane, kCpuDramEffFrac,
                 kActBytesMult, kGpuWorkspaceBytes}) {
    CAPTURE(coef_table()[c].name);
    CHECK(fit.coefs[c] == doctest::Approx(t[c]).epsilon(0.05));
  }
  // Second-order ones (shape penalty, element-wise traffic, overheads, links): 30 %.
  for (Coef c : {kGemmHalfDim, kElementwiseTrafficMult, kLayerOverheadS, kIntraBusEffFrac, kCollLatencyS}) {
    CAPTURE(coef_table()[c].name);
    CHECK(fit.coefs[c] == doctest::Approx(t[c]).epsilon(0.30));
  }
  // The true values lie within a few standard errors of the fit.
  for (Coef c : synthetic_free()) {
    CAPTURE(coef_table()[c].name);
    CHECK(std::abs(fit.coefs[c] - t[c]) <= 5 * fit.std_errors[c] + 1e-3 * std::abs(t[c]));
  }
}

}  // namespace

TEST_CASE("synthetic recovery: known coefficients come back from noisy measurements") {
  const auto obs = synthetic(11);
  REQUIRE(obs.size() > 100);
  FitOptions fo;
  fo.free = synthetic_free();
  const FitResult fit = fit_coefficients(obs, default_coefs(), fo);
  CHECK(fit.converged);
  CHECK(fit.covariance_ok);
  check_recovered(fit);
  // 1 % noise: the fitted model's residual is about that.
  CHECK(fit.model_error_frac < 0.02);
}

TEST_CASE("synthetic recovery from a bad starting point") {
  const auto obs = synthetic(12);
  FitOptions fo;
  fo.free = synthetic_free();
  CoefVector start = default_coefs();
  for (Coef c : fo.free) {
    const CoefInfo& info = coef_table()[c];
    start[c] = std::clamp(info.default_value * (c % 2 ? 2.0 : 0.4), info.lower, info.upper);
  }
  const FitResult fit = fit_coefficients(obs, start, fo);
  check_recovered(fit);
}

TEST_CASE("the step-time uncertainty is the first-order propagation of the coefficient covariance") {
  // Reference: sqrt(g' C g) with g the exact gradient from ceres::Jet (the model's
  // finite differences are what the planner uses).
  const auto obs = synthetic(13);
  FitOptions fo;
  fo.free = synthetic_free();
  const FitResult fit = fit_coefficients(obs, default_coefs(), fo);
  using Jet = ceres::Jet<double, kNumCoefs>;
  for (size_t i = 0; i < obs.size(); i += 17) {
    std::array<Jet, kNumCoefs> jets;
    for (int k = 0; k < kNumCoefs; ++k) jets[k] = Jet(fit.coefs[k], k);
    const Jet step = predict_step_time(obs[i].features.step, jets.data()).step_s;
    double var = 0;
    for (int a = 0; a < kNumCoefs; ++a)
      for (int b = 0; b < kNumCoefs; ++b) var += step.v[a] * fit.covariance[a][b] * step.v[b];
    const double fd = stepcast::step_time_std_s(obs[i].features.step, fit.coefs, fit.covariance);
    CHECK(var > 0);
    CHECK(fd == doctest::Approx(std::sqrt(var)).epsilon(1e-4));
  }
}

namespace {

// Component coefficients, each moved away from its default.
CoefVector component_truth() {
  CoefVector c = default_coefs();
  c[kGemmEffMaxFrac] = 0.71;
  c[kGemmHalfDim] = 90.0;
  c[kAttnEffMaxFrac] = 0.48;
  c[kAttnHalfSeqTokens] = 700.0;
  c[kCollLatencyS] = 40e-6;
  c[kIntraBusEffFrac] = 0.72;
  c[kRsAgBusEffMult] = 1.1;
  c[kPcieEffFrac] = 0.8;
  c[kCpuCoreBytesPerSPerLane] = 0.7e9;
  c[kCpuDramEffFrac] = 0.65;
  c[kCpuLaneFlopsPerS] = 1.5e9;
  c[kGpuOptBwEffFrac] = 0.6;
  c[kGpuOptFlopsPerS] = 5e12;
  c[kOptStepOverheadS] = 5e-5;
  c[kCpuOptStepOverheadS] = 2e-3;
  c[kAttnBwdEffMaxFrac] = 0.4;
  c[kAttnBwdHalfSeqTokens] = 1500.0;
  c[kElementwiseBwEffFrac] = 0.8;
  return c;
}

// What `microbench` measures on a 2-GPU host (the shapes and sizes of
// backend/microbench_main.cpp), "measured" with the true coefficients and 2 %
// multiplicative noise.
std::vector<MicroRecord> synthetic_micro(uint64_t seed, const CoefVector& t = component_truth(),
                                        const HardwareProfile& hw = test::hardware("h200-sxm")) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(0.0, 0.02);
  std::vector<MicroRecord> out;
  auto add = [&](MicroRecord r) {
    r.seconds = predict_micro(r, hw, t.data()) * (1 + noise(rng));
    out.push_back(r);
  };
  for (double m : {2048.0, 8192.0, 16384.0})
    for (const auto& nk : std::vector<std::pair<double, double>>{{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008},
                                                                 {32000, 4096}, {7680, 2560}, {2560, 10240}})
      add({.bench = MicroBench::kGemm, .m = m, .n = nk.first, .k = nk.second});
  for (double s : {512.0, 1024.0, 2048.0, 4096.0, 8192.0})
    for (MicroBench b : {MicroBench::kAttention, MicroBench::kAttentionBwd})
      add({.bench = b, .batch = 16384 / s, .heads = 32, .seq_len = s, .head_dim = 128});
  for (MicroBench b : {MicroBench::kAllReduce, MicroBench::kReduceScatter, MicroBench::kAllGather})
    for (double mib = 1; mib <= 1024; mib *= 4) add({.bench = b, .bytes = mib * 1048576.0, .world = 2});
  for (MicroBench b : {MicroBench::kH2D, MicroBench::kD2H})
    for (double mib : {64.0, 256.0, 1024.0}) add({.bench = b, .bytes = mib * 1048576.0});
  for (OptimizerKind o : {OptimizerKind::kAdamW, OptimizerKind::kAdamW8bit}) {
    for (double threads : {1.0, 2.0, 4.0, 8.0, 16.0, 32.0})
      add({.bench = MicroBench::kCpuOptimizer, .optimizer = o, .params = 67108864.0, .threads = threads});
    for (double params : {1048576.0, 16777216.0, 268435456.0})
      add({.bench = MicroBench::kGpuOptimizer, .optimizer = o, .params = params});
  }
  // One decoder layer's element-wise work at 8192 and 16384 tokens (the analytic bytes microbench
  // writes for pythia-2.8b, llama-2-7b and qwen2.5-7b).
  for (double tokens : {8192.0, 16384.0})
    for (double bytes_per_token : {81920.0, 153600.0, 196608.0})
      add({.bench = MicroBench::kElementwise, .bytes = bytes_per_token * tokens, .model = "m", .tokens = tokens});
  return out;
}

}  // namespace

TEST_CASE("component fit: each component's coefficients come back from its micro-benchmarks") {
  const HardwareProfile hw = test::hardware("h200-sxm");
  const auto micro = synthetic_micro(21);
  const CoefVector t = component_truth();
  FitOptions fo;
  const FitResult fit = fit_components(micro, hw, default_coefs(), fo);
  CHECK(fit.converged);
  CHECK(fit.covariance_ok);
  // The coefficients no micro-benchmark reads stay at their start.
  for (Coef c : {kBackwardSlowdownMult, kActBytesMult, kGpuWorkspaceBytes, kCpuOptOverlapFrac})
    CHECK(fit.coefs[c] == default_coefs()[c]);
  // Those that set a rate over a size sweep: 5 %. The second-order ones (a tile
  // half-size, a latency under large transfers, the sequence half-point): 30 %.
  for (Coef c : {kGemmEffMaxFrac, kAttnEffMaxFrac, kAttnBwdEffMaxFrac, kIntraBusEffFrac, kRsAgBusEffMult,
                 kPcieEffFrac, kCpuDramEffFrac, kCpuCoreBytesPerSPerLane, kGpuOptBwEffFrac, kGpuOptFlopsPerS,
                 kElementwiseBwEffFrac}) {
    CAPTURE(coef_table()[c].name);
    CHECK(fit.coefs[c] == doctest::Approx(t[c]).epsilon(0.05));
  }
  for (Coef c : {kGemmHalfDim, kAttnHalfSeqTokens, kAttnBwdHalfSeqTokens, kCollLatencyS, kCpuLaneFlopsPerS, kOptStepOverheadS,
                 kCpuOptStepOverheadS}) {
    CAPTURE(coef_table()[c].name);
    CHECK(fit.coefs[c] == doctest::Approx(t[c]).epsilon(0.30));
  }
  for (Coef c : component_coefs(micro)) {
    CAPTURE(coef_table()[c].name);
    CHECK(std::abs(fit.coefs[c] - t[c]) <= 5 * fit.std_errors[c] + 1e-3 * std::abs(t[c]));
  }
  CHECK(fit.model_error_frac < 0.03);  // 2 % noise
}

TEST_CASE("measured components: a host's planted ratios come back, and the profile takes them over its reference") {
  const HardwareProfile h200 = test::hardware("h200-sxm");
  const auto ref_micro = synthetic_micro(21);
  // Another host behind the same GPU kind: its CPU optimizer at half the rates per lane and its
  // PCIe copies at 80 % of the share (the planted ratios); its GPU exactly as the reference's.
  CoefVector slow = component_truth();
  slow[kCpuCoreBytesPerSPerLane] *= 0.5;
  slow[kCpuLaneFlopsPerS] *= 0.5;
  slow[kPcieEffFrac] *= 0.8;
  const MeasuredFit m = measure_components(synthetic_micro(22, slow), h200, ref_micro, h200);
  CHECK(m.measured.reference == "h200-sxm");
  // Only the host's components: on the reference's GPU kind its end-to-end fit stands.
  CHECK(m.coefs == std::vector<Coef>{kPcieEffFrac, kCpuCoreBytesPerSPerLane, kCpuLaneFlopsPerS, kCpuDramEffFrac});
  CHECK(std::find(m.same_gpu.begin(), m.same_gpu.end(), kGemmEffMaxFrac) != m.same_gpu.end());
  // Rates over a thread or size sweep: 5 % (2 % noise on each record); the lane rate, second
  // order where the memory bound dominates (as in the component fit's own test): 30 %.
  CHECK(m.measured.rel.at(kCpuCoreBytesPerSPerLane) == doctest::Approx(0.5).epsilon(0.05));
  CHECK(m.measured.rel.at(kPcieEffFrac) == doctest::Approx(0.8).epsilon(0.05));
  CHECK(m.measured.rel.at(kCpuDramEffFrac) == doctest::Approx(1.0).epsilon(0.05));
  CHECK(m.measured.rel.at(kCpuLaneFlopsPerS) == doctest::Approx(0.5).epsilon(0.30));

  // Applied: the reference's fitted value times the ratio, in [coefficients] and in each engine
  // section that sets the coefficient; the others untouched.
  HardwareProfile here = h200;
  here.measured = m.measured;
  apply_measured(here, h200);
  const double r = m.measured.rel.at(kCpuCoreBytesPerSPerLane);
  CHECK(here.coefs[kCpuCoreBytesPerSPerLane] == doctest::Approx(h200.coefs[kCpuCoreBytesPerSPerLane] * r).epsilon(1e-12));
  CHECK(here.engines.at("deepspeed").values.at(kCpuCoreBytesPerSPerLane) ==
        doctest::Approx(h200.engines.at("deepspeed").values.at(kCpuCoreBytesPerSPerLane) * r).epsilon(1e-12));
  CHECK(here.coefs[kGemmEffMaxFrac] == h200.coefs[kGemmEffMaxFrac]);
  // An efficiency stays inside its bound (1) however large its ratio; applying twice changes nothing.
  here = h200;
  here.measured.reference = "h200-sxm";
  here.measured.rel = {{kPcieEffFrac, 3.0}, {kCpuLaneFlopsPerS, 2.0}};
  apply_measured(here, h200);
  apply_measured(here, h200);
  CHECK(here.coefs[kPcieEffFrac] == 1.0);
  CHECK(here.coefs[kCpuLaneFlopsPerS] == doctest::Approx(2.0 * h200.coefs[kCpuLaneFlopsPerS]).epsilon(1e-12));

  // On another GPU kind the GPU's components are measured too: an A100's GEMMs at 90 % of the
  // reference's efficiency relative to its own datasheet peak come back as 0.9.
  const HardwareProfile a100 = test::hardware("a100-80gb-sxm");
  CoefVector other = component_truth();
  other[kGemmEffMaxFrac] *= 0.9;
  const MeasuredFit g = measure_components(synthetic_micro(23, other, a100), a100, ref_micro, h200);
  CHECK(g.same_gpu.empty());
  CHECK(g.measured.rel.at(kGemmEffMaxFrac) == doctest::Approx(0.9).epsilon(0.03));
  CHECK(g.measured.rel.at(kCpuCoreBytesPerSPerLane) == doctest::Approx(1.0).epsilon(0.05));

  // The layers' element-wise work carries to another GPU by the two GPUs' measurements, not by
  // their HBM rates. By hand: each GPU's component fit sets elementwise_bw_eff_frac to the step
  // model's element-wise time at factor 1 over the measured time, so the ratio it stores is
  // (HBM_ref / HBM_here) x (t_ref / t_here), and the applied profile's term, at the reference's
  // traffic multiplier, over the reference's is HBM_ref x 1 / (HBM_here x ratio) = t_here / t_ref.
  // Planted: the A100 runs the same layers 1.5 times as long as the H200, where the HBM rates
  // alone (4.8 / 2.04 TB/s) say 2.35 times.
  std::vector<MicroRecord> slower = synthetic_micro(23, component_truth(), a100);
  for (MicroRecord& rec : slower)
    if (rec.bench == MicroBench::kElementwise)
      for (const MicroRecord& on_ref : ref_micro)
        if (on_ref.bench == MicroBench::kElementwise && on_ref.bytes == rec.bytes) rec.seconds = 1.5 * on_ref.seconds;
  const MeasuredFit e = measure_components(slower, a100, ref_micro, h200);
  HardwareProfile carried = a100;
  carried.measured = e.measured;
  apply_measured(carried, h200);
  const double bytes = 1e9;
  const double term_ratio = elementwise_time_s(bytes, carried.gpu.memory_bytes_per_s, carried.coefs.data()) /
                            elementwise_time_s(bytes, h200.gpu.memory_bytes_per_s, h200.coefs.data());
  CHECK(carried.coefs[kElementwiseTrafficMult] == h200.coefs[kElementwiseTrafficMult]);
  CHECK(term_ratio == doctest::Approx(1.5).epsilon(0.03));
  CHECK(h200.gpu.memory_bytes_per_s / a100.gpu.memory_bytes_per_s > 2.0);  // the ratio it replaces

  // A GPU benchmark timed on the CPU measures nothing of the GPU: one line naming the record.
  std::vector<MicroRecord> on_cpu = synthetic_micro(24);
  on_cpu.front().device = "cpu";
  on_cpu.front().where = "m.jsonl:2";
  CHECK_THROWS_WITH_AS(measure_components(on_cpu, a100, ref_micro, h200),
                       doctest::Contains("m.jsonl:2: key \"bench\" = \"gemm\" was timed on device \"cpu\""), InputError);
  // Records of the GPU alone, on the reference's GPU kind, measure nothing this fit keeps.
  std::vector<MicroRecord> gemms;
  for (const MicroRecord& rec : ref_micro)
    if (rec.bench == MicroBench::kGemm) gemms.push_back(rec);
  CHECK_THROWS_WITH_AS(measure_components(gemms, h200, ref_micro, h200), doctest::Contains("time the host too"),
                       InputError);
}

TEST_CASE("two stages: component-fitted coefficients anchor the end-to-end fit") {
  // The synthetic step runs alone identify the link efficiency (0.6). A tight
  // component prior 10 % away from it wins over them: the prior is applied,
  // centred on the component value and not on the default (0.81).
  const auto obs = synthetic(31);
  FitOptions fo;
  fo.free = synthetic_free();
  const double component = 1.1 * truth()[kIntraBusEffFrac];
  fo.component_priors.push_back({kIntraBusEffFrac, component, 0.002});
  const FitResult anchored = fit_coefficients(obs, default_coefs(), fo);
  CHECK(anchored.coefs[kIntraBusEffFrac] == doctest::Approx(component).epsilon(0.01));
  // Its standard error is no wider than the prior's.
  CHECK(anchored.std_errors[kIntraBusEffFrac] <= 0.002 * component * 1.01);
  // A prior at the true value keeps every coefficient recoverable.
  fo.component_priors = {{kIntraBusEffFrac, truth()[kIntraBusEffFrac], 0.1}};
  check_recovered(fit_coefficients(obs, default_coefs(), fo));
}

TEST_CASE("micro-benchmark records: bad input names the file, line and key") {
  const fs::path p = fs::temp_directory_path() / "stepcast_bad_micro.jsonl";
  std::ofstream(p) << R"({"kind":"micro_env","device":"x"})" << "\n"
                   << R"({"kind":"micro","bench":"gemm","m":4,"n":4,"k":4,"seconds":1e-6})" << "\n"
                   << R"({"kind":"micro","bench":"all_reduce","bytes":-1,"world":2,"seconds":1e-3})" << "\n";
  try {
    load_micro({p});
    FAIL("no error");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find("stepcast_bad_micro.jsonl:3") != std::string::npos);
    CHECK(what.find("\"bytes\"") != std::string::npos);
  }
  std::ofstream(p) << R"({"kind":"micro","bench":"elementwise","model":"llama-2-7b","tokens":8192,"seconds":1e-3})"
                   << "\n";
  CHECK_THROWS_WITH_AS(load_micro({p}), doctest::Contains("key 'bytes' not found"), InputError);
  std::ofstream(p) << R"({"kind":"micro","bench":"elementwise","model":"llama-2-7b","tokens":0,"bytes":1,"seconds":1e-3})"
                   << "\n";
  CHECK_THROWS_WITH_AS(load_micro({p}), doctest::Contains("key \"tokens\" must be positive"), InputError);
  std::ofstream(p) << R"({"kind":"micro","bench":"fft","seconds":1})" << "\n";
  CHECK_THROWS_WITH_AS(load_micro({p}), doctest::Contains("unknown value \"fft\""), InputError);
  // DeepSpeed's staged cross-dtype copies carry the torch threads that converted them.
  std::ofstream(p) << R"({"kind":"micro","bench":"d2h_staged","bytes":268435456,"seconds":0.2})" << "\n";
  CHECK_THROWS_WITH_AS(load_micro({p}), doctest::Contains("key 'threads' not found"), InputError);
  fs::remove(p);
}

TEST_CASE("DeepSpeed's staged copies: read, fitted by nothing, predicted at the DeepSpeed section's rates") {
  const fs::path p = fs::temp_directory_path() / "stepcast_staged_micro.jsonl";
  std::ofstream(p) << R"({"kind":"micro","bench":"d2h_staged","bytes":268435456,"threads":16,"seconds":0.2})" << "\n"
                   << R"({"kind":"micro","bench":"h2d_staged","bytes":268435456,"threads":16,"seconds":0.1})" << "\n";
  const std::vector<MicroRecord> micro = load_micro({p});
  fs::remove(p);
  REQUIRE(micro.size() == 2);
  CHECK(micro[0].bench == MicroBench::kD2HStaged);
  CHECK(micro[1].bench == MicroBench::kH2DStaged);
  CHECK(micro[0].bytes == 268435456.0);
  CHECK(micro[0].threads == 16.0);
  CHECK(micro[0].label() == "d2h_staged 256 MiB x1");
  for (const MicroRecord& r : micro) CHECK(micro_coefs(r).empty());
  // By hand, at round rates: 256 MiB of 16-bit gradients at 1 GB/s take 0.268 s. The parameter
  // copy converts 3 x 256 MiB on 16 threads at 2 GB/s each (32 GB/s) against DRAM at 100 GB/s x
  // 0.5, a harmonic rate of 1 / (1/32 + 1/50) GB/s = 19.51 GB/s, and stages 256 MiB at 2 GB/s.
  HardwareProfile hw = test::hardware("h200-sxm");
  hw.host.dram_bytes_per_s = 100e9;
  CoefVector c = hw.coefs;
  c[kStagedCopyBytesPerS] = 1e9;
  c[kHostCopyBytesPerSPerThread] = 2e9;
  c[kCpuDramEffFrac] = 0.5;
  const double bytes = 268435456.0;
  CHECK(predict_micro(micro[0], hw, c.data()) == doctest::Approx(bytes / 1e9).epsilon(1e-12));
  const double stream_bps = 1.0 / (1.0 / 32e9 + 1.0 / 50e9);
  CHECK(predict_micro(micro[1], hw, c.data()) == doctest::Approx(3 * bytes / stream_bps + bytes / 2e9).epsilon(1e-12));
  // Neither counts as a pageable copy.
  CHECK(pageable_copy_bytes_per_s(micro) == 0.0);
}

TEST_CASE("a run list line's --emulate-nodes is read once, and kept among train's flags") {
  const std::filesystem::path list = std::filesystem::temp_directory_path() / "stepcast_emulate_list.txt";
  {
    std::ofstream out(list);
    out << "# comment\npythia-2.8b 2 --stage 2 --emulate-nodes 2\nllama-2-7b 4 --emulate-nodes=2 --stage 3\n"
           "llama-2-7b 1 --stage 0\n";
  }
  const std::vector<calibrate::RunListEntry> items = calibrate::read_run_list(list);
  REQUIRE(items.size() == 3);
  CHECK(items[0].emulated_nodes == 2);
  CHECK(items[0].flags == std::vector<std::string>{"--stage", "2", "--emulate-nodes", "2"});
  CHECK(items[1].emulated_nodes == 2);
  CHECK(items[2].emulated_nodes == 1);
  CHECK(items[0].planner_flags == std::vector<std::string>{"--stage", "2"});
  CHECK(items[1].planner_flags == std::vector<std::string>{"--stage", "3"});
  {
    std::ofstream out(list);
    out << "pythia-2.8b 2 --emulate-nodes 3\n";
  }
  CHECK_THROWS_AS(calibrate::read_run_list(list), InputError);
  std::filesystem::remove(list);
}

TEST_CASE("micro-benchmark records across emulated nodes take the inter-node link and its coefficients") {
  const fs::path p = fs::temp_directory_path() / "stepcast_micro_nodes.jsonl";
  // 1 GiB all-reduce among 4 ranks as 2 nodes of 2 (microbench --nproc 4 --emulate-nodes 2), and
  // the same within one node.
  std::ofstream(p) << R"({"kind":"micro","bench":"all_reduce","bytes":1073741824,"world":4,"nodes":2,"seconds":0.1})" << "\n"
                   << R"({"kind":"micro","bench":"all_reduce","bytes":1073741824,"world":4,"seconds":0.01})" << "\n";
  const auto micro = load_micro({p});
  REQUIRE(micro.size() == 2);
  CHECK(micro[0].nodes == 2);
  CHECK(micro[1].nodes == 1);
  const HardwareProfile hw = test::hardware("h200-sxm");
  const CoefVector c = hw.coefs;
  // By hand (model/hardware.h collective_link): across nodes the ring runs at the smaller of the
  // intra-node link and the node's NICs (inter_node_bytes_per_s x 2 GPUs), at the inter-node
  // efficiency, with the inter-node latency added; an all-reduce of 4 ranks moves 2 (4 - 1) / 4 of
  // the buffer.
  const double link = std::min(2 * hw.links.inter_node_bytes_per_s, hw.links.intra_node_bytes_per_s);
  const double across = c[kCollLatencyS] + hw.links.inter_node_latency_s +
                        1073741824.0 * 1.5 / (link * c[kInterBusEffFrac]);
  CHECK(predict_micro(micro[0], hw, c.data()) == doctest::Approx(across).epsilon(1e-12));
  const double within = c[kCollLatencyS] + 1073741824.0 * 1.5 / (hw.links.intra_node_bytes_per_s * c[kIntraBusEffFrac]);
  CHECK(predict_micro(micro[1], hw, c.data()) == doctest::Approx(within).epsilon(1e-12));
  // The component fit moves the inter-node efficiency for the first, the intra-node one for the second.
  const auto has = [](const std::vector<Coef>& v, Coef x) { return std::find(v.begin(), v.end(), x) != v.end(); };
  CHECK(has(micro_coefs(micro[0]), kInterBusEffFrac));
  CHECK_FALSE(has(micro_coefs(micro[0]), kIntraBusEffFrac));
  CHECK(has(micro_coefs(micro[1]), kIntraBusEffFrac));
  // Nodes that do not divide the ranks are bad input, named.
  std::ofstream(p) << R"({"kind":"micro","bench":"all_gather","bytes":1024,"world":4,"nodes":3,"seconds":0.1})" << "\n";
  CHECK_THROWS_WITH_AS(load_micro({p}), doctest::Contains("key \"nodes\" is 3"), InputError);
  fs::remove(p);
}

TEST_CASE("the committed h200-sxm profile is the fit of the committed runs") {
  // data/hardware/h200-sxm.toml was written by (in data/runs/h200-sxm)
  //   calibrate fit --runs 2026-11-30_calibration_v3_micro.jsonl 2026-11-29_backend_v1_b.jsonl
  //                        2026-11-29_backend_v1_c_gptj.jsonl 2026-11-30_validate_6b.jsonl
  //                        2026-11-30_calibration_v3.jsonl 2026-11-30_offload_overlap.jsonl
  //                        2026-12-01_validate_1gpu_pythia.jsonl 2026-12-01_validate_1gpu_llama.jsonl
  //                        2026-12-01_span_1gpu.jsonl 2026-12-01_span_1gpu_b.jsonl
  //                        2026-12-01_validate_1gpu_pythia_s11.jsonl 2026-12-01_validate_1gpu_llama_s11_s29.jsonl
  //                        2026-12-01_small_micro_1gpu.jsonl 2026-12-01_host_floor_1gpu.jsonl
  //                        2026-12-03_longseq_1gpu.jsonl 2026-12-03_stage1_offload_order_ab_new.jsonl
  //                        2026-12-03_validate_1gpu_llama_s26.jsonl 2026-12-03_validate_1gpu_pythia_s26.jsonl
  //                        2026-12-03_host_floor_stages_1gpu.jsonl 2026-12-03_host_floor_by_stage_1gpu.jsonl
  //                        2026-12-03_host_floor_same_machine_1gpu.jsonl 2026-12-03_interval_classes_1gpu.jsonl
  //                        2026-12-03_interval_classes_repeat_1gpu.jsonl 2026-12-04_peft_remeasure_1gpu.jsonl
  //                        2026-12-04_peft_holdout_1gpu.jsonl 2026-12-04_size_span_1gpu.jsonl
  //                        2026-12-04_dequant_slope_1gpu.jsonl 2026-12-04_qlora_remeasure_1gpu.jsonl
  //                        2026-12-04_nf4_kernel_ab_new.jsonl 2026-12-04_loss_reserve_holdout_1gpu.jsonl
  //                        2026-12-04_qlora_70b_remeasure_1gpu.jsonl 2026-12-04_fp32_span_1gpu.jsonl
  //                        2026-12-04_uploads_in_backward_1gpu.jsonl 2026-12-04_recompute_window_holdout_1gpu.jsonl
  //                        2026-12-04_two_gpu_holdout.jsonl 2026-12-04_stepcast_2gpu_recommend_6b.jsonl
  //                        2026-12-04_repeat_sample_1gpu.jsonl 2026-12-04_stepcast_1gpu_recommend_7b.jsonl
  //                        --hardware h200-sxm --holdout-frac 0
  // leaving out the records data/runs/h200-sxm/superseded.toml names
  // (every configuration: cross-validation is the held-out measure): the component fit on the
  // micro-benchmarks, then the end-to-end fit. The files are the ones its provenance names;
  // refit both stages from them and compare.
  const HardwareProfile committed = test::hardware("h200-sxm");
  REQUIRE(committed.coefs_calibrated);
  REQUIRE(committed.calibration_runs.size() == 38);
  std::vector<fs::path> files;
  for (const std::string& r : committed.calibration_runs) files.push_back(test::data_dir() / r);
  const auto runs = load_runs(files, test::data_dir());
  const auto micro = load_micro(files);
  REQUIRE(micro.size() > 100);
  std::vector<Observation> obs;
  for (const auto& r : runs) obs.push_back(observation_of(r, committed));
  const FitResult fit = calibrate_two_stage(obs, micro, committed).fit;
  for (const auto& info : coef_table()) {
    CAPTURE(info.name);
    CHECK(fit.coefs[info.id] == doctest::Approx(committed.coefs[info.id]).epsilon(1e-5));
  }
}

TEST_CASE("the committed engine sections are the fits of the committed peer runs") {
  // calibrate fit --engine deepspeed|fsdp2 --runs <the section's runs> --hardware h200-sxm --holdout-frac 0
  const HardwareProfile hw = test::hardware("h200-sxm");
  for (const std::string engine : {"deepspeed", "fsdp2"}) {
    CAPTURE(engine);
    const HardwareProfile committed = for_engine(hw, engine);
    REQUIRE(committed.coefs_calibrated);
    std::vector<fs::path> files;
    for (const std::string& r : committed.calibration_runs) files.push_back(test::data_dir() / r);
    const auto runs = runs_of_engine(load_runs(files, test::data_dir()), engine);
    REQUIRE(runs.size() >= 9);
    std::vector<Observation> obs;
    for (const auto& r : runs) obs.push_back(observation_of(r, committed));
    const FitResult fit = calibrate_for_engine(obs, {}, committed).fit;
    for (Coef c : engine_free_coefs()) {
      CAPTURE(coef_table()[c].name);
      CHECK(fit.coefs[c] == doctest::Approx(committed.coefs[c]).epsilon(1e-5));
    }
    // The section's expandable-segment share (fitted on paired runs, not by this fit) stays.
    CHECK(fit.coefs[kExpandableReserveFrac] == committed.coefs[kExpandableReserveFrac]);
    // The hardware's coefficients are the [coefficients] values, untouched by the engine.
    CHECK(committed.coefs[kGemmEffMaxFrac] == hw.coefs[kGemmEffMaxFrac]);
  }
}

TEST_CASE("cross-validation: a held-out run's prediction does not depend on its own measurement") {
  const fs::path runs_dir = test::data_dir() / "runs" / "h200-sxm";
  const std::vector<fs::path> files{runs_dir / "2026-11-30_calibration_v3.jsonl"};
  std::vector<RunRecord> runs = load_runs(files, test::data_dir());
  const std::vector<MicroRecord> micro = load_micro({runs_dir / "2026-11-30_calibration_v3_micro.jsonl"});
  REQUIRE(runs.size() >= 10);
  const HardwareProfile hw = test::hardware("h200-sxm");
  const auto key = [](const RunRecord& r) { return r.key; };
  const std::vector<CvPrediction> before = cross_validate(runs, micro, hw, key);
  REQUIRE(before.size() == runs.size());  // every configuration predicted once
  // Run 0 measured 50 % slower: its own fold never saw it, so its prediction stays.
  runs[0].step_s *= 1.5;
  const std::vector<CvPrediction> after = cross_validate(runs, micro, hw, key);
  CHECK(after[0].step_s == doctest::Approx(before[0].step_s).epsilon(1e-9));
  // The other folds fitted it: their predictions move (the check above could fail).
  double moved = 0;
  for (size_t i = 1; i < runs.size(); ++i) moved = std::max(moved, std::abs(after[i].step_s / before[i].step_s - 1));
  CHECK(moved > 1e-4);
  // The summary counts what it was given; coverage is a fraction.
  const nlohmann::json s = cv_summary(before);
  CHECK(s["configurations"] == runs.size());
  CHECK(s["coverage_95"].get<double>() >= 0.0);
  CHECK(s["coverage_95"].get<double>() <= 1.0);
  CHECK(s["step_time_max_abs_pct_error"].get<double>() >= s["step_time_p90_abs_pct_error"].get<double>());
  CHECK(s["step_time_p90_abs_pct_error"].get<double>() >= 0.0);
}

TEST_CASE("the coefficient report flags a coefficient on its bound and one few configurations inform") {
  const fs::path runs_dir = test::data_dir() / "runs" / "h200-sxm";
  const std::vector<RunRecord> runs = load_runs({runs_dir / "2026-11-30_calibration_v3.jsonl"}, test::data_dir());
  HardwareProfile hw = test::hardware("h200-sxm");
  const auto entry = [](const nlohmann::json& report, const std::string& name) {
    for (const auto& c : report)
      if (c["name"] == name) return c;
    return nlohmann::json();
  };
  hw.coefs[kGemmHalfDim] = coef_table()[kGemmHalfDim].lower;
  hw.coefs[kLayerOverheadS] = coef_table()[kLayerOverheadS].default_value;
  nlohmann::json report = coefficient_report(runs, {}, hw);
  CHECK(entry(report, "gemm_half_dim")["flag"] == "on a bound");
  CHECK(entry(report, "layer_overhead_s")["on_bound"] == false);
  // Only runs of one configuration: a coefficient that needs several is flagged as resting on few.
  const std::vector<RunRecord> one(runs.begin(), runs.begin() + 1);
  report = coefficient_report(one, {}, hw);
  CHECK(entry(report, "backward_slowdown_mult")["informing_configurations"] == 1);
  CHECK(entry(report, "backward_slowdown_mult")["flag"] == "fewer than 5 configurations");
}

TEST_CASE("the committed H200 profile names the runs it was fitted from: their bytes hash to its provenance") {
  const HardwareProfile hw = test::hardware("h200-sxm");
  REQUIRE(!hw.calibration_runs.empty());
  std::string all;
  for (const std::string& r : hw.calibration_runs) {
    std::ifstream in(test::data_dir() / r, std::ios::binary);
    REQUIRE(in);
    std::ostringstream s;
    s << in.rdbuf();
    all += s.str();
  }
  // The folder's superseded list decided which of those records the fit saw.
  std::vector<fs::path> files;
  for (const std::string& r : hw.calibration_runs) files.push_back(test::data_dir() / r);
  for (const fs::path& list : superseded_lists(files)) {
    std::ifstream in(list, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    all += s.str();
  }
  CHECK(hw.coefs_source.find("runs fnv1a64:" + fnv1a64_hex(all)) != std::string::npos);
}

namespace {

// The first measured (not warm-up) step record of the memory hold-out (2026-12-02_memory_v2_holdout_1gpu.jsonl).
nlohmann::json first_measured_step_of_memory_holdout() {
  std::ifstream in(test::data_dir() / "runs" / "h200-sxm" / "2026-12-02_memory_v2_holdout_1gpu.jsonl");
  std::string line;
  nlohmann::json step;
  while (std::getline(in, line)) {
    step = nlohmann::json::parse(line);
    if (!step.value("warmup", false)) break;
  }
  return step;
}

}  // namespace

TEST_CASE("run records: the peak allocated is read, and a capped run is a configuration of its own") {
  // One measured step of the memory hold-out, written three times: as measured, under a cap of
  // 100 GiB (train --gpu-mem-limit-gib), and without the peak allocated (records before it).
  nlohmann::json step = first_measured_step_of_memory_holdout();
  const double allocated = step["memory_bytes"]["gpu_peak_allocated"].get<double>();
  REQUIRE(allocated > 0);
  nlohmann::json capped = step, old = step;
  capped["memory_bytes"]["gpu_limit"] = 100.0 * 1024 * 1024 * 1024;
  old["model"] = "pythia-2.8b";
  old["memory_bytes"].erase("gpu_peak_allocated");
  const fs::path file = fs::temp_directory_path() / "stepcast_capped_runs.jsonl";
  {
    std::ofstream out(file);
    out << step.dump() << "\n" << capped.dump() << "\n" << old.dump() << "\n";
  }
  const std::vector<RunRecord> runs = load_runs({file}, test::data_dir());
  fs::remove(file);
  REQUIRE(runs.size() == 3);
  CHECK(runs[1].key == runs[0].key + " gpu-limit=100GiB");
  CHECK(runs[0].gpu_peak_allocated_bytes == allocated);
  CHECK(runs[1].gpu_peak_allocated_bytes == allocated);
  CHECK(runs[2].gpu_peak_allocated_bytes == 0.0);
  // Only our backend's runs are fitted on it (fit.h Observation).
  const HardwareProfile hw = test::hardware("h200-sxm");
  CHECK(observation_of(runs[0], hw).gpu_allocated_bytes == allocated);
}

TEST_CASE("run records: the host high-water mark is the largest over the steps, and fitted for every engine") {
  // Two steps of one configuration whose VmHWM grew between them (the mark only grows), and a
  // record without it (0: not measured, no residual).
  nlohmann::json step = first_measured_step_of_memory_holdout();
  nlohmann::json later = step, none = step;
  step["memory_bytes"]["host_peak_rss"] = 10.0e9;
  later["memory_bytes"]["host_peak_rss"] = 12.0e9;
  none["model"] = "pythia-2.8b";
  none["memory_bytes"].erase("host_peak_rss");
  const fs::path file = fs::temp_directory_path() / "stepcast_host_runs.jsonl";
  {
    std::ofstream out(file);
    out << later.dump() << "\n" << step.dump() << "\n" << step.dump() << "\n" << none.dump() << "\n";
  }
  const std::vector<RunRecord> runs = load_runs({file}, test::data_dir());
  fs::remove(file);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].host_peak_rss_bytes == 12.0e9);  // not the median of 12, 10, 10
  CHECK(runs[1].host_peak_rss_bytes == 0.0);
  const HardwareProfile hw = test::hardware("h200-sxm");
  CHECK(observation_of(runs[0], hw).host_bytes == 12.0e9);
  nlohmann::json bad = later;
  bad["memory_bytes"]["host_peak_rss"] = -1.0;
  {
    std::ofstream out(file);
    out << bad.dump() << "\n";
  }
  CHECK_THROWS_WITH_AS(load_runs({file}, test::data_dir()), doctest::Contains("memory_bytes.host_peak_rss"), InputError);
  fs::remove(file);
}

TEST_CASE("run records: a folder's superseded.toml leaves the records it names out, and rejects an entry that names none") {
  // Two configurations in one runs file (the memory hold-out's first step, and the same step
  // relabelled as pythia-2.8b); superseded.toml beside it names the second by file and key.
  const nlohmann::json step = first_measured_step_of_memory_holdout();
  nlohmann::json other = step;
  other["model"] = "pythia-2.8b";
  const fs::path folder = fs::temp_directory_path() / "stepcast_superseded_test";
  fs::remove_all(folder);
  fs::create_directories(folder);
  const fs::path file = folder / "runs.jsonl";
  {
    std::ofstream out(file);
    out << step.dump() << "\n" << other.dump() << "\n" << other.dump() << "\n";
  }
  const std::vector<RunRecord> all = load_runs({file}, test::data_dir());
  REQUIRE(all.size() == 2);
  const auto write_list = [&](const std::string& text) {
    std::ofstream out(folder / kSupersededFile);
    out << text;
  };
  write_list("[[superseded]]\nfile = \"runs.jsonl\"\nkey = \"" + all[1].key +
             "\"\nreason = \"measured before a fix\"\n");
  const std::vector<RunRecord> kept = load_runs({file}, test::data_dir());
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].key == all[0].key);
  // The same list for another file in the folder does not touch this one.
  write_list("[[superseded]]\nfile = \"other.jsonl\"\nkey = \"" + all[1].key + "\"\nreason = \"r\"\n");
  CHECK(load_runs({file}, test::data_dir()).size() == 2);
  // An entry for this file whose key matches no record: a typo, named with the key.
  write_list("[[superseded]]\nfile = \"runs.jsonl\"\nkey = \"pythia-2.8b g9\"\nreason = \"r\"\n");
  CHECK_THROWS_WITH_AS(load_runs({file}, test::data_dir()), doctest::Contains("pythia-2.8b g9"), InputError);
  // Bad input: an unknown key, a missing reason, a path instead of a file name.
  write_list("[[superseded]]\nfile = \"runs.jsonl\"\nkey = \"k\"\nreason = \"r\"\nwhen = 1\n");
  CHECK_THROWS_WITH_AS(load_runs({file}, test::data_dir()), doctest::Contains("when"), InputError);
  write_list("[[superseded]]\nfile = \"runs.jsonl\"\nkey = \"k\"\n");
  CHECK_THROWS_WITH_AS(load_runs({file}, test::data_dir()), doctest::Contains("superseded[0].reason"), InputError);
  write_list("[[superseded]]\nfile = \"../runs.jsonl\"\nkey = \"k\"\nreason = \"r\"\n");
  CHECK_THROWS_WITH_AS(load_runs({file}, test::data_dir()), doctest::Contains("superseded[0].file"), InputError);
  fs::remove_all(folder);
}

TEST_CASE("the committed superseded list names only records that exist, and each replacement file exists") {
  const fs::path folder = test::data_dir() / "runs" / "h200-sxm";
  const std::vector<SupersededRecord> entries = read_superseded(folder / kSupersededFile);
  REQUIRE(!entries.empty());
  for (const SupersededRecord& e : entries) {
    CAPTURE(e.file);
    CAPTURE(e.key);
    REQUIRE(fs::exists(folder / e.file));
    if (!e.by.empty()) CHECK(fs::exists(folder / e.by));
    // Loading the file alone throws if the entry's key matches none of its records.
    CHECK_NOTHROW(load_runs({folder / e.file}, test::data_dir()));
    // And the replacement holds that configuration, measured after the fix.
    if (!e.by.empty()) {
      bool found = false;
      for (const RunRecord& r : load_runs({folder / e.by}, test::data_dir())) found = found || r.key == e.key;
      CHECK(found);
    }
  }
}

TEST_CASE("interval quantiles by class: conformal ranks by hand, pooled under 19 launch-bound residuals") {
  // 40 GPU-bound predictions with |log error| 0.001 ... 0.040 and 20 launch-bound ones with
  // 0.01 ... 0.20, all inside their folds' regions. The conformal 95 % quantile of n scores is
  // the ceil(0.95 (n + 1))-th smallest: ceil(38.95) = 39th of 40 -> 0.039; ceil(19.95) = 20th of
  // 20 -> 0.20. With no unseen predictions the unseen quantile is the seen one.
  std::vector<RunRecord> runs(60);
  std::vector<CvPrediction> preds;
  for (int i = 0; i < 60; ++i) {
    const bool bound = i >= 40;
    const double err = bound ? 0.01 * (i - 39) : 0.001 * (i + 1);
    runs[i].step_s = 1.0;
    CvPrediction p;
    p.run = &runs[i];
    p.step_s = std::exp(i % 2 ? err : -err);  // either side: the score is |log|
    p.host_issue_ratio = bound ? 1.5 : 0.2;
    preds.push_back(p);
  }
  IntervalModel m;
  set_interval_quantiles(preds, m);
  REQUIRE(m.has_launch_bound_class());
  CHECK(m.log_q95_seen == doctest::Approx(0.039));
  CHECK(m.log_q95_unseen == doctest::Approx(0.039));
  CHECK(m.log_q95_seen_launch_bound == doctest::Approx(0.20));
  CHECK(m.seen_predictions == 40);
  CHECK(m.seen_launch_bound_predictions == 20);
  // The bound of the class: 0.75 counts as launch-bound, just below does not.
  preds[0].host_issue_ratio = kLaunchBoundIssueRatio;
  preds[40].host_issue_ratio = kLaunchBoundIssueRatio - 1e-9;  // 0.01 joins the GPU-bound pool
  set_interval_quantiles(preds, m);
  CHECK(m.seen_predictions == 40);
  CHECK(m.seen_launch_bound_predictions == 20);
  // 18 launch-bound (drop 0.19 and 0.20): too few for a 95 % quantile of their own. One pool of
  // 58: the ceil(0.95 x 59) = 57th smallest, the second largest, 0.17.
  preds[40].host_issue_ratio = 1.5;
  preds[0].host_issue_ratio = 0.2;
  preds.resize(58);
  set_interval_quantiles(preds, m);
  CHECK_FALSE(m.has_launch_bound_class());
  CHECK(m.log_q95_seen == doctest::Approx(0.17));
  CHECK(m.seen_predictions == 58);
  // A configuration measured by two runs files (two calls, two machines) scores each file's
  // measurement, not their median: 1.0 and exp(0.5) around a prediction of exp(0.25) score 0.25
  // twice, where the median (1.32, 0.03 from the prediction) would hide the spread.
  RunRecord twice;
  twice.step_s = (1.0 + std::exp(0.5)) / 2;
  twice.step_by_file = {{"a.jsonl", 1.0}, {"b.jsonl", std::exp(0.5)}};
  CvPrediction p;
  p.run = &twice;
  p.step_s = std::exp(0.25);
  p.host_issue_ratio = 0.2;
  IntervalModel one;
  set_interval_quantiles({p}, one);
  CHECK(one.seen_predictions == 2);
  CHECK(one.log_q95_seen == doctest::Approx(0.25));
  const nlohmann::json summary = cv_summary({p}, one);
  CHECK(summary["coverage_measurements"] == 2);
  CHECK(summary["coverage_95"].get<double>() == doctest::Approx(1.0));
}

TEST_CASE("the memory interval: conformal quantiles of |log| peak-memory errors, seen and unseen, and their coverage") {
  // 20 predictions inside their folds' regions with |log(measured / predicted)| of peak memory
  // 0.002 ... 0.040, and 5 outside it with 0.05 ... 0.09. Seen: the ceil(0.95 x 21) = 20th
  // smallest of 20, 0.040. Unseen: the 5th (ceil(0.95 x 6) = 6 is past the end: the largest),
  // 0.09.
  std::vector<RunRecord> runs(25);
  std::vector<CvPrediction> preds;
  for (int i = 0; i < 25; ++i) {
    const bool unseen = i >= 20;
    const double err = unseen ? 0.05 + 0.01 * (i - 20) : 0.002 * (i + 1);
    runs[i].step_s = 1.0;
    runs[i].gpu_peak_reserved_bytes = 40e9;
    CvPrediction p;
    p.run = &runs[i];
    p.step_s = 1.0;
    p.gpu_memory_bytes = 40e9 * std::exp(i % 2 ? err : -err);
    p.host_issue_ratio = 0.2;
    p.unseen_dims = unseen ? 1 : 0;
    preds.push_back(p);
  }
  IntervalModel m;
  set_interval_quantiles(preds, m);
  REQUIRE(m.has_memory());
  CHECK(m.memory_log_q95_seen == doctest::Approx(0.040));
  CHECK(m.memory_log_q95_unseen == doctest::Approx(0.09));
  CHECK(m.memory_seen_predictions == 20);
  CHECK(m.memory_unseen_predictions == 5);
  // Every score lies inside its own class's quantile: coverage 1. A prediction two dimensions
  // out widens by two steps: 0.040 + 2 x 0.05 = 0.14.
  CHECK(cv_summary(preds, m)["peak_memory_coverage_95"].get<double>() == doctest::Approx(1.0));
  CHECK(memory_interval_log_halfwidth(m, 2) == doctest::Approx(0.14));
  // Under 19 seen scores: no memory interval, and no coverage to report.
  preds.erase(preds.begin(), preds.begin() + 2);
  IntervalModel few;
  set_interval_quantiles(preds, few);
  CHECK_FALSE(few.has_memory());
  CHECK(cv_summary(preds, few)["peak_memory_coverage_95"].is_null());
}

TEST_CASE("run records: a configuration measured in two files keeps each file's median step") {
  // File a: steps 1.0, 1.2, 1.1 (median 1.1); file b: 1.5, 1.7, 1.6 (median 1.6). The median over
  // all six is 1.35; the two files' medians stay apart for the interval's scores.
  nlohmann::json step = first_measured_step_of_memory_holdout();
  const fs::path a = fs::temp_directory_path() / "stepcast_two_files_a.jsonl";
  const fs::path b = fs::temp_directory_path() / "stepcast_two_files_b.jsonl";
  for (const auto& [file, times] : {std::pair{a, std::vector<double>{1.0, 1.2, 1.1}},
                                    std::pair{b, std::vector<double>{1.5, 1.7, 1.6}}}) {
    std::ofstream out(file);
    for (double t : times) {
      step["time_s"]["step"] = t;
      out << step.dump() << "\n";
    }
  }
  const std::vector<RunRecord> runs = load_runs({a, b}, test::data_dir());
  fs::remove(a);
  fs::remove(b);
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].step_s == doctest::Approx(1.35));
  REQUIRE(runs[0].step_by_file.size() == 2);
  CHECK(runs[0].step_by_file[0].file == a.string());
  CHECK(runs[0].step_by_file[0].step_s == doctest::Approx(1.1));
  CHECK(runs[0].step_by_file[1].file == b.string());
  CHECK(runs[0].step_by_file[1].step_s == doctest::Approx(1.6));
  const std::vector<double> steps_s = step_measurements_s(runs[0]);
  REQUIRE(steps_s.size() == 2);
  CHECK(steps_s[1] == doctest::Approx(1.6));
}

TEST_CASE("test-retest: spreads and distances from the pooled median, by hand, by interval class") {
  // Three configurations (their keys tell the classes apart):
  //   A: files 1.0 and 1.2 s, pooled 1.1 s: spread 1.2 / 1.0 - 1 = 20 %; off pooled 1/11 and 1/11 (9.0909 %);
  //   B: files 2.0, 1.8 and 2.2 s, pooled 2.0 s: spread 2.2 / 1.8 - 1 = 22.222 %; off 0, 10 %, 10 %;
  //   C: one file only: not a repeat.
  // All: 2 configurations, 5 calls; spread mean 21.111 %, p90 (nearest rank: the 2nd of 2) 22.222 %,
  // max 22.222 %; off mean (2 x 9.0909 + 0 + 10 + 10) / 5 = 7.6364 %, max 10 %.
  // A is launch-bound, B is not.
  RunRecord a, b, c;
  a.key = "A";
  a.step_s = 1.1;
  a.step_by_file = {{"1.jsonl", 1.0}, {"2.jsonl", 1.2}};
  b.key = "B";
  b.step_s = 2.0;
  b.step_by_file = {{"1.jsonl", 2.0}, {"2.jsonl", 1.8}, {"3.jsonl", 2.2}};
  c.key = "C";
  c.step_s = 3.0;
  c.step_by_file = {{"1.jsonl", 3.0}};
  const nlohmann::json j =
      repeatability_report({a, b, c}, [](const RunRecord& r) { return r.key == "A"; });
  CHECK(j["configurations"].get<int>() == 2);
  CHECK(j["measurements"].get<int>() == 5);
  CHECK(j["step_time_spread_mean_pct"].get<double>() == doctest::Approx(21.1111).epsilon(1e-4));
  CHECK(j["step_time_spread_p90_pct"].get<double>() == doctest::Approx(22.2222).epsilon(1e-4));
  CHECK(j["step_time_spread_max_pct"].get<double>() == doctest::Approx(22.2222).epsilon(1e-4));
  CHECK(j["step_time_call_mean_abs_pct_dev"].get<double>() == doctest::Approx(7.63636).epsilon(1e-4));
  CHECK(j["step_time_call_max_abs_pct_dev"].get<double>() == doctest::Approx(10.0).epsilon(1e-6));
  CHECK(j["launch_bound"]["configurations"].get<int>() == 1);
  CHECK(j["launch_bound"]["step_time_spread_max_pct"].get<double>() == doctest::Approx(20.0).epsilon(1e-6));
  CHECK(j["gpu_bound"]["configurations"].get<int>() == 1);
  CHECK(j["gpu_bound"]["step_time_call_mean_abs_pct_dev"].get<double>() == doctest::Approx(20.0 / 3).epsilon(1e-4));
  // Largest spread first.
  REQUIRE(j["runs"].size() == 2);
  CHECK(j["runs"][0]["key"] == "B");
  CHECK(j["runs"][1]["launch_bound"].get<bool>());
  // None measured twice: zeros, no runs.
  const nlohmann::json none = repeatability_report({c}, [](const RunRecord&) { return false; });
  CHECK(none["configurations"].get<int>() == 0);
  CHECK(none["step_time_spread_max_pct"].get<double>() == 0.0);
  CHECK(none["runs"].empty());
}

TEST_CASE("report: the peak allocated's error over the runs that record it, by hand") {
  // Two runs with a recorded peak allocated (predicted 10 % high and 20 % low) and one without:
  // mean (10 + 20) / 2 = 15 %, max 20 %, over 2 runs.
  RunRecord a, b, c;
  a.gpu_peak_allocated_bytes = 100e9;
  b.gpu_peak_allocated_bytes = 50e9;
  a.step_s = b.step_s = c.step_s = 1.0;
  std::vector<Row> rows{{&a, false, 1.0, 0.1, 0.0, 0.0, 0.0, 0.0, 110e9},
                        {&b, false, 1.0, 0.1, 0.0, 0.0, 0.0, 0.0, 40e9},
                        {&c, false, 1.0, 0.1, 0.0, 0.0, 0.0, 0.0, 70e9}};
  const nlohmann::json s = summarize(rows, false);
  CHECK(s["peak_allocated_runs"].get<int>() == 2);
  CHECK(s["peak_allocated_mean_abs_pct_error"].get<double>() == doctest::Approx(15.0));
  CHECK(s["peak_allocated_max_abs_pct_error"].get<double>() == doctest::Approx(20.0));
}

TEST_CASE("one H100: the peers' plans that ran there fit or are tight; those that ran out of memory do not fit") {
  // Measured on one H100 80GB (data/runs/h100-sxm/2026-12-06_h100_tight_*_1gpu*.jsonl): five
  // DeepSpeed plans whose peak reserved on an H200 was 76-90 GiB ran; DeepSpeed stage 0 at 4 x 2048
  // (78.2 GiB allocated on the H200) and FSDP2 stage 2 at 4 x 2048 and stage 3 at 5 and 6 x 2048
  // (GAS 2) ran out of memory in their first step (the *_failed.jsonl records).
  const HardwareProfile h100 = test::hardware("h100-sxm");
  for (const std::string engine : {"deepspeed", "fsdp2"}) {
    CAPTURE(engine);
    const std::filesystem::path file =
        test::data_dir() / "runs" / "h100-sxm" / ("2026-12-06_h100_tight_" + engine + "_1gpu.jsonl");
    const std::vector<RunRecord> ran = load_runs({file}, test::data_dir());
    REQUIRE(ran.size() == (engine == "deepspeed" ? 5u : 1u));
    const HardwareProfile hw = for_engine(h100, engine);
    for (const RunRecord& r : ran) {
      CAPTURE(r.key);
      const Prediction p = evaluate(r.model, hw, r.config);
      CHECK((p.fits || p.tight));
    }
    // The plans that ran out of memory, as their run list gave them (same model, GAS and sequence).
    std::vector<std::pair<int, int64_t>> failed;  // (stage, micro-batch)
    if (engine == "deepspeed") failed = {{0, 4}};
    else failed = {{2, 4}, {3, 5}, {3, 6}};
    for (const auto& [stage, micro] : failed) {
      TrainConfig c = ran.front().config;
      c.zero_stage = stage;
      c.micro_batch = micro;
      c.gas = 2;
      c.seq_len = 2048;
      c.activation_checkpointing = false;
      CAPTURE(stage);
      CAPTURE(micro);
      const Prediction p = evaluate(ran.front().model, hw, c);
      CHECK(!p.fits);
      CHECK(!p.tight);
    }
  }
}

TEST_CASE("one H100, expandable segments: measured pairs against the model, and the FSDP2 plan they let run") {
  // data/runs/h100-sxm/2026-12-06_expandable_{stepcast,deepspeed,fsdp2}_1gpu.jsonl: each plan with
  // torch's default allocator and then with expandable segments, on one machine.
  const HardwareProfile h100 = test::hardware("h100-sxm");
  // The pairs the share was fitted on, then those held out from it (predicted before their call).
  for (const std::string set : {"expandable", "expandable_holdout"})
  for (const std::string engine : {"stepcast", "deepspeed"}) {
    CAPTURE(set);
    CAPTURE(engine);
    const bool held_out = set == "expandable_holdout";
    const std::vector<RunRecord> runs = load_runs(
        {test::data_dir() / "runs" / "h100-sxm" / ("2026-12-06_" + set + "_" + engine + "_1gpu.jsonl")}, test::data_dir());
    const HardwareProfile hw = engine == "stepcast" ? h100 : for_engine(h100, engine);
    int pairs = 0;
    for (const RunRecord& e : runs) {
      if (!e.config.gpu_expandable_segments) continue;
      CAPTURE(e.key);
      CHECK(e.key.find(" alloc=expandable") != std::string::npos);
      // Its twin with the default allocator: expandable segments never reserve more (measured),
      // and the model says the same.
      for (const RunRecord& d : runs) {
        TrainConfig twin = e.config;
        twin.gpu_expandable_segments = false;
        if (d.config.gpu_expandable_segments || d.key != config_key(e.model.name, twin)) continue;
        ++pairs;
        CHECK(e.gpu_peak_reserved_bytes <= d.gpu_peak_reserved_bytes + 0.1 * kBytesPerGiB);
        CHECK(evaluate(e.model, hw, e.config).memory.gpu_total_bytes <=
              evaluate(d.model, hw, d.config).memory.gpu_total_bytes);
      }
      // The peak reserved with expandable segments within 8 % of the measured where the share
      // was fitted (coefficients.cpp; +1.5 to +7.9 and -6.2 %), and within 2 % for our backend's
      // held-out pairs (+0.5 to +1.6 %). DeepSpeed's held-out stage 2 at 16 x 1, checkpointed, is
      // +14.8 %: the default allocator's prediction is +17 % there already (docs/figures).
      const double err = evaluate(e.model, hw, e.config).memory.gpu_total_bytes / e.gpu_peak_reserved_bytes - 1.0;
      if (!held_out) CHECK(std::abs(err) < 0.08);
      if (held_out && engine == "stepcast") CHECK(std::abs(err) < 0.02);
    }
    CHECK(pairs == (held_out ? (engine == "stepcast" ? 3 : 1) : (engine == "stepcast" ? 3 : 2)));
  }
  // The pairs measured for the peers' step-time cost (held out too): expandable segments never
  // reserved more, and the model says the same.
  for (const std::string file : {"cost_deepspeed", "cost_fsdp2", "fsdp2_room"}) {
    CAPTURE(file);
    const std::string engine = file.ends_with("deepspeed") ? "deepspeed" : "fsdp2";
    const std::vector<RunRecord> runs = load_runs(
        {test::data_dir() / "runs" / "h100-sxm" / ("2026-12-06_expandable_" + file + "_1gpu.jsonl")},
        test::data_dir());
    const HardwareProfile hw = for_engine(h100, engine);
    int pairs = 0;
    for (const RunRecord& e : runs)
      for (const RunRecord& d : runs) {
        TrainConfig twin = e.config;
        twin.gpu_expandable_segments = false;
        if (!e.config.gpu_expandable_segments || d.config.gpu_expandable_segments ||
            d.key != config_key(e.model.name, twin))
          continue;
        ++pairs;
        CHECK(e.gpu_peak_reserved_bytes < d.gpu_peak_reserved_bytes);
        CHECK(evaluate(e.model, hw, e.config).memory.gpu_total_bytes <
              evaluate(d.model, hw, d.config).memory.gpu_total_bytes);
      }
    CHECK(pairs == (file == "cost_fsdp2" ? 1 : 2));
  }
  // FSDP2 stage 2 at 4 x 2048, GAS 2, ran out of memory with the default allocator
  // (2026-12-06_h100_tight_fsdp2_1gpu_failed.jsonl) and ran with expandable segments (73.8 GiB
  // allocated): tight, not "does not fit".
  const std::vector<RunRecord> fsdp2 = load_runs(
      {test::data_dir() / "runs" / "h100-sxm" / "2026-12-06_expandable_fsdp2_1gpu.jsonl"}, test::data_dir());
  int stage2 = 0;
  for (const RunRecord& r : fsdp2) {
    if (r.config.zero_stage != 2) continue;
    ++stage2;
    CHECK(r.config.gpu_expandable_segments);
    const Prediction p = evaluate(r.model, for_engine(h100, "fsdp2"), r.config);
    CHECK((p.fits || p.tight));
    TrainConfig d = r.config;
    d.gpu_expandable_segments = false;
    CHECK_FALSE(evaluate(r.model, for_engine(h100, "fsdp2"), d).fits);
  }
  CHECK(stage2 == 1);
}

TEST_CASE("the host's pageable copy rate: the median over the pageable copies of 16 MiB and up") {
  // Rates 8, 10, 12 and 20 GB/s at 16 MiB and up (median (10 + 12) / 2 = 11 GB/s); a 4 MiB copy at
  // 1 GB/s and the pinned copies do not count.
  auto rec = [](MicroBench b, double mib, double bytes_per_s) {
    MicroRecord r;
    r.bench = b;
    r.bytes = mib * 1048576.0;
    r.seconds = r.bytes / bytes_per_s;
    return r;
  };
  const std::vector<MicroRecord> micro = {
      rec(MicroBench::kH2DPageable, 16, 8e9),  rec(MicroBench::kD2HPageable, 64, 10e9),
      rec(MicroBench::kH2DPageable, 256, 12e9), rec(MicroBench::kD2HPageable, 1024, 20e9),
      rec(MicroBench::kH2DPageable, 4, 1e9),    rec(MicroBench::kH2D, 1024, 50e9)};
  CHECK(pageable_copy_bytes_per_s(micro) == doctest::Approx(11e9).epsilon(1e-12));
  CHECK(pageable_copy_bytes_per_s({rec(MicroBench::kH2D, 1024, 50e9)}) == 0.0);
  // The record predicts its seconds at the profile's rate, and no coefficient reads it.
  HardwareProfile hw = test::hardware("h200-sxm");
  hw.host.pageable_bytes_per_s = 10e9;
  CHECK(predict_micro(micro[1], hw, hw.coefs.data()) == doctest::Approx(micro[1].seconds).epsilon(1e-12));
  CHECK(micro_coefs(MicroBench::kD2HPageable).empty());
}

