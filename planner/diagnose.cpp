#include "planner/diagnose.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "common/errors.h"
#include "model/coefficients.h"

namespace stepcast {

namespace {

// The search range of a speed: 1/64 to 64 times the profile's (log space).
constexpr double kLogSpeedBound = 4.1588830833596715;  // ln 64
// A resource bears on a run when a sixteenth or 16 times its speed moves a fitted phase by 1 % or
// more: a link whose collectives the compute hides at the profile's speed bears on the run when
// it is many times slower (NCCL over sockets instead of peer-to-peer).
constexpr double kBearingLogFrac = 0.00995033085;  // ln 1.01
constexpr double kBearingSpeedFactor = 16.0;
// The pair explains the run where it at least halves the best single resource's error (and that
// error is 2 % or more: below it one resource already meets the run within timing noise).
constexpr double kPairGainFrac = 0.5;
constexpr double kSingleEnoughRmsLog = 0.0198026273;  // ln 1.02
// Two fits whose errors differ by less than this (ln 1.005) meet the phases equally well.
constexpr double kTieRmsLog = 0.00498754151;

struct PhaseSpec {
  const char* name;
  const char* key;
  std::optional<double> MeasuredStep::*measured;
  double (*predicted)(const StepTime<double>&);
};

const PhaseSpec kPhases[] = {
    {"step", "step", &MeasuredStep::step_s, [](const StepTime<double>& t) { return t.step_s; }},
    {"GAS time", "gas", &MeasuredStep::gas_s, [](const StepTime<double>& t) { return t.gas_s; }},
    {"OPT time", "opt", &MeasuredStep::opt_s, [](const StepTime<double>& t) { return t.opt_s; }},
    {"forward", "forward", &MeasuredStep::forward_s, [](const StepTime<double>& t) { return t.forward_s; }},
    // The backward as an engine times it holds the checkpointed layers' recomputation.
    {"backward", "backward", &MeasuredStep::backward_s,
     [](const StepTime<double>& t) { return t.backward_s + t.recompute_s; }},
    // The optimizer's own time, exposed or hidden behind the backward (calibrate's "optimizer").
    {"optimizer", "optimizer", &MeasuredStep::optimizer_s,
     [](const StepTime<double>& t) { return t.optimizer_total_s; }},
};

bool given(const MeasuredStep& m, const PhaseSpec& p) { return (m.*p.measured).has_value(); }

// The phases the speeds are solved on: for our backend forward, backward and optimizer where all
// three are measured, with the step where it is; else GAS and OPT time (the step split in two);
// else the step; else whatever else is measured.
std::vector<const PhaseSpec*> fitted_phases(const MeasuredStep& m, Engine engine) {
  const auto by_key = [](const char* key) {
    for (const PhaseSpec& p : kPhases)
      if (std::string(p.key) == key) return &p;
    return static_cast<const PhaseSpec*>(nullptr);
  };
  const PhaseSpec *fwd = by_key("forward"), *bwd = by_key("backward"), *opt = by_key("optimizer");
  const PhaseSpec *gas = by_key("gas"), *optt = by_key("opt"), *step = by_key("step");
  // The step holds what those three do not: the collectives and copies an engine does not time
  // apart (the peers' run inside their hooks).
  // The peers time forward, backward and optimizer as their hooks fall (DeepSpeed copies each
  // gradient to the host inside the backward), not as the model books them: their GAS and OPT
  // time, cut at micro-batch boundaries, are what the model and the records share.
  if (engine == Engine::kStepcast && given(m, *fwd) && given(m, *bwd) && given(m, *opt)) {
    if (given(m, *step)) return {fwd, bwd, opt, step};
    return {fwd, bwd, opt};
  }
  // GAS time is 0 with GAS 1: the OPT time is then the step.
  if (given(m, *gas) && given(m, *optt) && *m.gas_s > 0) return {gas, optt};
  if (given(m, *step)) return {step};
  std::vector<const PhaseSpec*> out;  // whatever else was measured
  for (const PhaseSpec& p : kPhases)
    if (given(m, p) && *(m.*p.measured) > 0) out.push_back(&p);
  return out;
}

// The runs' fitted phases, concatenated: what the speeds are solved on.
struct Fitter {
  struct Run {
    const DiagnosedRun* run;
    std::vector<const PhaseSpec*> phases;
  };
  const HardwareProfile& hw;  // for the runs' engine
  std::vector<Run> runs;
  std::vector<double> log_measured;

  std::vector<double> predict(const ResourceSpeeds& s) const {
    std::vector<double> out;
    for (const Run& r : runs) {
      const ScaledMachine m = scale_machine(hw, r.run->config, r.run->limits, s);
      const Prediction p = evaluate(r.run->model, m.hardware, r.run->config, m.limits);
      for (const PhaseSpec* ph : r.phases) out.push_back(ph->predicted(p.time));
    }
    return out;
  }
  size_t num_phases() const { return log_measured.size(); }
  double rms_log(const std::vector<double>& predicted) const {
    double sum = 0;
    for (size_t i = 0; i < predicted.size(); ++i) {
      const double e = std::log(std::max(predicted[i], 1e-12)) - log_measured[i];
      sum += e * e;
    }
    return std::sqrt(sum / static_cast<double>(predicted.size()));
  }
  double objective(const ResourceSpeeds& s) const { return rms_log(predict(s)); }
};

// Golden-section search for the minimum of f on [a, b].
double golden_min(const std::function<double(double)>& f, double a, double b) {
  const double r = 0.6180339887498949;
  double c = b - r * (b - a), d = a + r * (b - a);
  double fc = f(c), fd = f(d);
  for (int i = 0; i < 48; ++i) {
    if (fc <= fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - r * (b - a);
      fc = f(c);
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + r * (b - a);
      fd = f(d);
    }
  }
  return 0.5 * (a + b);
}

// The log speed of one resource that minimises the error, the others held: a grid over the
// range (the error need not be unimodal far from the optimum), then golden section around the
// grid's best point.
double solve_one(const Fitter& fit, ResourceSpeeds s, Resource r) {
  const auto f = [&](double u) {
    s[r] = std::exp(u);
    return fit.objective(s);
  };
  constexpr int kGrid = 33;
  const double step = 2 * kLogSpeedBound / (kGrid - 1);
  int best = 0;
  double best_f = 0;
  for (int i = 0; i < kGrid; ++i) {
    const double v = f(-kLogSpeedBound + i * step);
    if (i == 0 || v < best_f - 1e-12) best = i, best_f = v;
  }
  const double lo = std::max(-kLogSpeedBound, -kLogSpeedBound + (best - 1) * step);
  const double hi = std::min(kLogSpeedBound, -kLogSpeedBound + (best + 1) * step);
  return golden_min(f, lo, hi);
}

ResourceFit finish(const Fitter& fit, const std::vector<Resource>& rs, const ResourceSpeeds& s) {
  ResourceFit out;
  out.resources = rs;
  for (Resource r : rs) {
    out.speeds.push_back(s[r]);
    if (std::abs(std::log(s[r])) > kLogSpeedBound * 0.99) out.at_bound = true;
  }
  out.predicted_s = fit.predict(s);
  out.rms_log_error = fit.rms_log(out.predicted_s);
  return out;
}

}  // namespace

const char* resource_name(Resource r) {
  switch (r) {
    case Resource::kGpu: return "GPU (compute and memory)";
    case Resource::kCpuOptimizer: return "CPU optimizer";
    case Resource::kPcie: return "PCIe (host <-> GPU)";
    case Resource::kIntraNode: return "link between the node's GPUs";
    case Resource::kInterNode: return "link between nodes";
    case Resource::kHostIssue: return "host issuing the kernels";
  }
  return "?";
}

const char* resource_key(Resource r) {
  switch (r) {
    case Resource::kGpu: return "gpu";
    case Resource::kCpuOptimizer: return "cpu_optimizer";
    case Resource::kPcie: return "pcie";
    case Resource::kIntraNode: return "intra_node_link";
    case Resource::kInterNode: return "inter_node_link";
    case Resource::kHostIssue: return "host_issue";
  }
  return "?";
}

double cpu_optimizer_threads_per_rank(const HardwareProfile& hw, const TrainConfig& config, const ResourceLimits& limits) {
  const double ranks = static_cast<double>(std::max(1, config.gpus_per_node));
  const double cores = node_cpu_cores(hw, config, limits);
  if (config.engine == Engine::kStepcast) return cores / ranks;
  return std::min(peer_cpu_optimizer_threads(config, limits, cores), cores / ranks);
}

ScaledMachine scale_machine(const HardwareProfile& hw_engine, const TrainConfig& config, const ResourceLimits& limits,
                            const ResourceSpeeds& speeds) {
  ScaledMachine m{hw_engine, limits};
  GpuSpec& g = m.hardware.gpu;
  const double gpu = speeds[Resource::kGpu];
  for (double* v : {&g.peak_bf16_flops_per_s, &g.peak_fp16_flops_per_s, &g.peak_tf32_flops_per_s,
                    &g.peak_fp32_flops_per_s, &g.memory_bytes_per_s})
    *v *= gpu;
  // The CPU optimizer: the threads each rank's optimizer runs on (the cores stay at least as many).
  const double threads = speeds[Resource::kCpuOptimizer] * cpu_optimizer_threads_per_rank(hw_engine, config, limits);
  const double ranks = static_cast<double>(std::max(1, config.gpus_per_node));
  if (config.engine == Engine::kStepcast) {
    m.limits.cpu_cores_node = threads * ranks;
  } else {
    m.limits.cpu_threads_per_rank = threads;
    m.limits.cpu_cores_node = std::max(node_cpu_cores(hw_engine, config, limits), threads * ranks);
  }
  m.hardware.host.h2d_bytes_per_s *= speeds[Resource::kPcie];
  m.hardware.host.d2h_bytes_per_s *= speeds[Resource::kPcie];
  m.hardware.host.pageable_bytes_per_s *= speeds[Resource::kPcie];  // the same copies, staged
  m.hardware.links.intra_node_bytes_per_s *= speeds[Resource::kIntraNode];
  m.hardware.links.inter_node_bytes_per_s *= speeds[Resource::kInterNode];
  // The host's issue times: per layer (the launch-bound floor), per hooked fetch and gradient hook
  // (the peers' Python), and the transformers layers' measured host times.
  const double host = speeds[Resource::kHostIssue];
  for (Coef c : {kHostLayerFwdS, kHostLayerBwdS, kParamFetchOverheadS, kGradHookOverheadS}) m.hardware.coefs[c] /= host;
  for (auto& [type, cost] : m.hardware.host.transformers_layer_s) {
    cost.fwd_s /= host;
    cost.bwd_s /= host;
  }
  return m;
}

double phase_noise_log(const HardwareProfile& hw_engine, bool launch_bound) {
  const IntervalModel& m = hw_engine.interval;
  if (launch_bound && m.log_q95_seen_launch_bound > 0) return m.log_q95_seen_launch_bound;
  if (m.log_q95_seen > 0) return m.log_q95_seen;
  return 1.96 * hw_engine.model_error_frac;
}

namespace {

// A run's phases against its prediction at the profile's speeds (`hw` for the engine), and the
// phases the speeds are solved on; InputError for a run without a usable time.
RunDiagnosis compare_run(const HardwareProfile& hw, const DiagnosedRun& run, std::vector<const PhaseSpec*>* fitted) {
  const MeasuredStep& measured = run.measured;
  const std::string who = run.label.empty() ? std::string() : run.label + ": ";
  bool any = false;
  for (const PhaseSpec& p : kPhases) {
    if (!given(measured, p)) continue;
    any = true;
    const double v = *(measured.*p.measured);
    if (!(v >= 0.0) || !std::isfinite(v))
      throw InputError(who + "measured " + p.name + " " + std::to_string(v) + " s is not a time (>= 0)");
  }
  if (!any) throw InputError(who + "no measured time: give at least one of step, GAS/OPT time, forward/backward/optimizer");
  *fitted = fitted_phases(measured, run.config.engine);
  if (fitted->empty()) throw InputError(who + "every measured time is 0 s: nothing to compare");
  for (const PhaseSpec* p : *fitted)
    if (!(*(measured.*p->measured) > 0.0)) throw InputError(who + "measured " + p->name + " is 0 s: nothing to compare");
  RunDiagnosis d;
  d.label = run.label;
  d.predicted = evaluate(run.model, hw, run.config, run.limits);
  d.cpu_threads_per_rank_profile = cpu_optimizer_threads_per_rank(hw, run.config, run.limits);
  for (const PhaseSpec& p : kPhases) {
    if (!given(measured, p)) continue;
    const bool is_fitted = std::find(fitted->begin(), fitted->end(), &p) != fitted->end();
    d.phases.push_back({p.name, p.key, *(measured.*p.measured), p.predicted(d.predicted.time), is_fitted});
  }
  const int64_t gas = run.config.gas;
  if (gas > 1) {
    d.micro_batch_predicted_s = d.predicted.time.gas_s / static_cast<double>(gas - 1);
    d.after_last_micro_batch_predicted_s = d.predicted.time.opt_s - d.micro_batch_predicted_s;
    if (measured.gas_s && measured.opt_s) {
      d.micro_batch_measured_s = *measured.gas_s / static_cast<double>(gas - 1);
      d.after_last_micro_batch_measured_s = *measured.opt_s - *d.micro_batch_measured_s;
    }
  }
  return d;
}

// The profile for the runs' engine (one engine for all); a profile already for it is taken as it is.
HardwareProfile engine_profile(const HardwareProfile& hw, const std::vector<DiagnosedRun>& runs) {
  if (runs.empty()) throw InputError("no run to diagnose");
  const Engine e = runs.front().config.engine;
  for (const DiagnosedRun& r : runs)
    if (r.config.engine != e)
      throw InputError("the runs to diagnose together have different engines (" + std::string(engine_name(e)) +
                       ", " + engine_name(r.config.engine) + "): one machine, one engine at a time");
  return e == Engine::kStepcast || hw.engine != "stepcast" ? hw : for_engine(hw, engine_name(e));
}

}  // namespace

Diagnosis diagnose(const ModelSpec& model, const HardwareProfile& hw, const TrainConfig& config,
                   const ResourceLimits& limits, const MeasuredStep& measured, double noise_log) {
  return diagnose(hw, {DiagnosedRun{"", model, config, limits, measured}}, noise_log);
}

Diagnosis diagnose(const HardwareProfile& hw, const std::vector<DiagnosedRun>& runs, double noise_log) {
  const HardwareProfile hw_engine = engine_profile(hw, runs);
  Diagnosis d;
  Fitter fit{hw_engine, {}, {}};
  for (const DiagnosedRun& r : runs) {
    std::vector<const PhaseSpec*> fitted;
    d.runs.push_back(compare_run(hw_engine, r, &fitted));
    for (const PhaseSpec* p : fitted) fit.log_measured.push_back(std::log(*(r.measured.*p->measured)));
    fit.runs.push_back({&r, fitted});
  }
  const ResourceSpeeds profile;
  const std::vector<double> at_profile = fit.predict(profile);
  d.rms_log_error = fit.rms_log(at_profile);
  d.noise_log = noise_log;
  d.within_noise = true;
  for (size_t i = 0; i < at_profile.size(); ++i)
    if (std::abs(std::log(at_profile[i]) - fit.log_measured[i]) > noise_log) d.within_noise = false;

  // The resources that bear on the fitted phases.
  std::vector<Resource> bearing;
  for (int i = 0; i < kNumResources; ++i) {
    const Resource r = static_cast<Resource>(i);
    double moved = 0;
    for (double s : {1.0 / kBearingSpeedFactor, kBearingSpeedFactor}) {
      ResourceSpeeds t;
      t[r] = s;
      const std::vector<double> p = fit.predict(t);
      for (size_t k = 0; k < p.size(); ++k) moved = std::max(moved, std::abs(std::log(p[k] / at_profile[k])));
    }
    (moved >= kBearingLogFrac ? bearing : d.no_bearing).push_back(r);
  }
  for (Resource r : bearing) {
    ResourceSpeeds s;
    s[r] = std::exp(solve_one(fit, s, r));
    d.singles.push_back(finish(fit, {r}, s));
  }
  std::stable_sort(d.singles.begin(), d.singles.end(),
                   [](const ResourceFit& a, const ResourceFit& b) { return a.rms_log_error < b.rms_log_error; });
  // Pairs: coordinate descent from each resource's own solution.
  for (size_t i = 0; i < bearing.size(); ++i)
    for (size_t j = i + 1; j < bearing.size(); ++j) {
      ResourceSpeeds s;
      for (int round = 0; round < 8; ++round) {
        s[bearing[i]] = std::exp(solve_one(fit, s, bearing[i]));
        s[bearing[j]] = std::exp(solve_one(fit, s, bearing[j]));
      }
      ResourceFit f = finish(fit, {bearing[i], bearing[j]}, s);
      // A pair at the search's bound ranks after every pair inside it.
      if (!d.best_pair || std::make_pair(f.at_bound, f.rms_log_error) <
                              std::make_pair(d.best_pair->at_bound, d.best_pair->rms_log_error))
        d.best_pair = f;
    }
  // The explanation: none where the run is within the model's own error; else the best single
  // resource that does not sit at the search's bound (a speed of 1/64 or 64 is a limit, not a
  // finding), or the pair where it at least halves that one's error and more phases than two
  // were fitted.
  if (!d.within_noise && !d.singles.empty()) {
    d.explanation = d.singles.front();
    for (const ResourceFit& f : d.singles)
      if (!f.at_bound) {
        d.explanation = f;
        break;
      }
    // Resources that meet the phases equally well (within kTieRmsLog; one phase is met by any
    // resource that bears on it): the one whose speed differs least from the profile's.
    for (const ResourceFit& f : d.singles)
      if (!f.at_bound && f.rms_log_error <= d.explanation.rms_log_error + kTieRmsLog &&
          std::abs(std::log(f.speeds[0])) < std::abs(std::log(d.explanation.speeds[0])))
        d.explanation = f;
    // A pair is chosen only where the phases outnumber it: two speeds always meet two phases.
    if (d.best_pair && !d.best_pair->at_bound && fit.num_phases() > 2 &&
        d.explanation.rms_log_error >= kSingleEnoughRmsLog &&
        d.best_pair->rms_log_error <= kPairGainFrac * d.explanation.rms_log_error)
      d.explanation = *d.best_pair;
    d.exactly_determined = d.explanation.resources.size() >= fit.num_phases();
  }
  return d;
}

std::vector<LeftOut> leave_one_out(const HardwareProfile& hw, const std::vector<DiagnosedRun>& runs, double noise_log) {
  const HardwareProfile hw_engine = engine_profile(hw, runs);
  std::vector<LeftOut> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<DiagnosedRun> others;
    for (size_t j = 0; j < runs.size(); ++j)
      if (j != i) others.push_back(runs[j]);
    LeftOut lo;
    std::vector<const PhaseSpec*> fitted;
    lo.at_profile = compare_run(hw_engine, runs[i], &fitted);
    ResourceSpeeds s;
    if (!others.empty()) {
      lo.from_others = diagnose(hw_engine, others, noise_log).explanation;
      for (size_t k = 0; k < lo.from_others.resources.size(); ++k) s[lo.from_others.resources[k]] = lo.from_others.speeds[k];
    }
    const ScaledMachine m = scale_machine(hw_engine, runs[i].config, runs[i].limits, s);
    const Prediction p = evaluate(runs[i].model, m.hardware, runs[i].config, m.limits);
    for (const PhaseRow& row : lo.at_profile.phases)
      for (const PhaseSpec& ph : kPhases)
        if (row.key == ph.key) lo.diagnosed_s.push_back(ph.predicted(p.time));
    out.push_back(lo);
  }
  return out;
}

}  // namespace stepcast
