#include "calibrate/fit.h"

#include <algorithm>
#include <array>

#include <ceres/ceres.h>

#include <cmath>

#include "common/errors.h"
#include "model/memory_model.h"
#include "model/step_time.h"

namespace stepcast::calibrate {

namespace {

// The solver works on u = c / scale (scale = the default value, or the
// bounds' span where the default is 0), so that a latency of 1e-5 s and a
// workspace of 1e9 B are both of order one: better conditioned steps and a
// covariance that a rank-revealing decomposition does not truncate.
using Scales = std::array<double, kNumCoefs>;

Scales coef_scales() {
  Scales s{};
  for (const auto& info : coef_table())
    s[info.id] = info.default_value != 0.0 ? std::abs(info.default_value) : (info.upper - info.lower);
  return s;
}

// One run: up to seven residuals (step, forward, backward, optimizer, peak reserved, peak allocated,
// host memory).
struct RunResidual {
  static constexpr int kResiduals = 7;
  RunResidual(const Observation& o, const FitOptions& opt, const Scales& sc) : obs_(o), opt_(opt), scales_(sc) {}

  template <class T>
  bool operator()(const T* u, T* r) const {
    T coefs[kNumCoefs];
    for (int i = 0; i < kNumCoefs; ++i) coefs[i] = u[i] * scales_[static_cast<size_t>(i)];
    const StepTime<T> t = predict_step_time(obs_.features.step, coefs);
    const MemoryEstimate<T> m = predict_memory(obs_.features.memory, coefs);
    r[0] = log_ratio(t.step_s, obs_.step_s, opt_.sigma_step);
    // The phases as the run's harness times them (the optimizer's exposure is in the step residual).
    const TimedPhases<T> ph = timed_phases(t, obs_.peer_phases);
    r[1] = log_ratio(ph.forward_s, obs_.forward_s, opt_.sigma_phase);
    r[2] = log_ratio(ph.backward_s, obs_.backward_s, opt_.sigma_phase);
    r[3] = log_ratio(ph.optimizer_s, obs_.optimizer_s, opt_.sigma_phase);
    r[4] = log_ratio(m.gpu_total_bytes, obs_.gpu_memory_bytes, opt_.sigma_memory);
    r[5] = log_ratio(m.gpu_allocated_bytes, obs_.gpu_allocated_bytes, opt_.sigma_memory);
    r[6] = log_ratio(m.host_per_rank_bytes, obs_.host_bytes, opt_.sigma_memory);
    return true;
  }

  template <class T>
  static T log_ratio(const T& pred, double meas, double sigma) {
    if (meas <= 0.0) return T(0.0);
    using std::log;
    return log(pred / meas) / sigma;
  }

  static ceres::CostFunction* Create(const Observation& o, const FitOptions& opt, const Scales& sc) {
    return new ceres::AutoDiffCostFunction<RunResidual, kResiduals, kNumCoefs>(new RunResidual(o, opt, sc));
  }

  Observation obs_;
  FitOptions opt_;
  Scales scales_;
};

// One micro-benchmark: the log ratio of its component formula to its time.
struct MicroResidual {
  MicroResidual(const MicroRecord& r, const HardwareProfile& hw, double sigma, const Scales& sc)
      : rec_(r), hw_(hw), sigma_(sigma), scales_(sc) {}
  template <class T>
  bool operator()(const T* u, T* r) const {
    T coefs[kNumCoefs];
    for (int i = 0; i < kNumCoefs; ++i) coefs[i] = u[i] * scales_[static_cast<size_t>(i)];
    using std::log;
    r[0] = log(predict_micro(rec_, hw_, coefs) / rec_.seconds) / sigma_;
    return true;
  }
  static ceres::CostFunction* Create(const MicroRecord& r, const HardwareProfile& hw, double sigma, const Scales& sc) {
    return new ceres::AutoDiffCostFunction<MicroResidual, 1, kNumCoefs>(new MicroResidual(r, hw, sigma, sc));
  }
  MicroRecord rec_;
  const HardwareProfile& hw_;
  double sigma_;
  Scales scales_;
};

// A weak prior: (c - c0) / (sigma * |c0|) for each free coefficient.
struct PriorResidual {
  PriorResidual(int index, double c0, double sigma) : index_(index), c0_(c0), sigma_(sigma) {}
  template <class T>
  bool operator()(const T* coefs, T* r) const {
    r[0] = (coefs[index_] - c0_) / (sigma_ * std::max(std::abs(c0_), 1e-12));
    return true;
  }
  static ceres::CostFunction* Create(int index, double c0, double sigma) {
    return new ceres::AutoDiffCostFunction<PriorResidual, 1, kNumCoefs>(new PriorResidual(index, c0, sigma));
  }
  int index_;
  double c0_, sigma_;
};

}  // namespace

Observation observation_of(const RunRecord& r, const HardwareProfile& hw) {
  Observation o;
  o.key = r.key;
  o.features = make_features(r.model, hw, r.config);
  o.step_s = r.step_s;
  o.forward_s = r.forward_s;
  o.backward_s = r.backward_s;
  o.optimizer_s = r.optimizer_total_s;
  o.gpu_memory_bytes = r.gpu_peak_reserved_bytes;
  if (r.config.engine == Engine::kStepcast) o.gpu_allocated_bytes = r.gpu_peak_allocated_bytes;
  o.host_bytes = r.host_peak_rss_bytes;
  o.peer_phases = r.config.engine != Engine::kStepcast;
  return o;
}

std::vector<Coef> default_free_coefs() {
  return {kGemmEffMaxFrac, kGemmHalfDim,         kFp32GemmEffMaxFrac, kBackwardSlowdownMult, kWeightGradGemmMult, kElementwiseTrafficMult,
          kLayerOverheadS, kGpuOptBwEffFrac,     kCpuCoreBytesPerSPerLane, kCpuDramEffFrac,
          kActBytesMult,   kGpuWorkspaceBytes,   kGpuFragFrac,          kCkptReserveMult,
          kCollLatencyS,   kCpuOptOverlapFrac,
          kCpuLaneFlopsPerS, kHostLayerFwdS,     kHostLayerBwdS,       kLossExtraBytesPerLogit, kLossReserveBytesPerLogit,
          kHostBytesPerRank, kGradHookOverheadS, kParamFetchOverheadS, kCommInterferenceFrac};
}

namespace {

// Bounds, priors, solve and covariance, shared by both stages; the caller has
// added its data residuals to `problem` over x = u.data().
FitResult solve(ceres::Problem& problem, CoefVector& u, const Scales& scales, const std::vector<Coef>& free,
                const FitOptions& opt) {
  FitResult result;
  double* x = u.data();
  std::vector<bool> is_free(kNumCoefs, false);
  for (Coef c : free) is_free[c] = true;
  // The prior is centred on the coefficient's default (its physical estimate), whatever
  // the start, or on its component-fitted value.
  for (Coef c : free) {
    double center = coef_table()[c].default_value, sigma = opt.sigma_prior;
    for (const auto& p : opt.component_priors)
      if (p.coef == c) {
        center = p.value;
        sigma = p.sigma;
      }
    problem.AddResidualBlock(PriorResidual::Create(c, center / scales[c], sigma), nullptr, x);
  }
  std::vector<int> fixed;
  for (int i = 0; i < kNumCoefs; ++i)
    if (!is_free[i]) fixed.push_back(i);
  if (!fixed.empty()) problem.SetManifold(x, new ceres::SubsetManifold(kNumCoefs, fixed));
  for (int i = 0; i < kNumCoefs; ++i) {
    if (!is_free[i]) continue;
    const CoefInfo& info = coef_table()[i];
    // Keep strictly inside the bounds so that logs and divisions stay finite.
    const double lo = (info.lower + 1e-9 * (info.upper - info.lower)) / scales[i], hi = info.upper / scales[i];
    problem.SetParameterLowerBound(x, i, lo);
    problem.SetParameterUpperBound(x, i, hi);
    x[i] = std::clamp(x[i], lo, hi);
  }

  ceres::Solver::Options so;
  so.linear_solver_type = ceres::DENSE_QR;
  so.max_num_iterations = opt.max_iterations;
  so.function_tolerance = 1e-12;
  so.parameter_tolerance = 1e-12;
  so.gradient_tolerance = 1e-14;
  ceres::Solver::Summary summary;
  ceres::Solve(so, &problem, &summary);
  result.summary = summary.BriefReport();
  result.initial_cost = summary.initial_cost;
  result.final_cost = summary.final_cost;
  result.iterations = static_cast<int>(summary.iterations.size());
  result.converged = summary.termination_type == ceres::CONVERGENCE;
  for (int i = 0; i < kNumCoefs; ++i) result.coefs[i] = u[i] * scales[i];

  // Covariance of the free coefficients (in the tangent space of the subset manifold).
  result.std_errors.assign(kNumCoefs, 0.0);
  result.covariance.assign(kNumCoefs, std::vector<double>(kNumCoefs, 0.0));
  ceres::Covariance::Options co;
  co.algorithm_type = ceres::DENSE_SVD;
  co.null_space_rank = -1;
  ceres::Covariance cov(co);
  std::vector<std::pair<const double*, const double*>> blocks = {{x, x}};
  if (cov.Compute(blocks, &problem)) {
    std::vector<double> full(kNumCoefs * kNumCoefs);
    if (cov.GetCovarianceBlock(x, x, full.data())) {
      result.covariance_ok = true;
      for (int i = 0; i < kNumCoefs; ++i) {
        for (int j = 0; j < kNumCoefs; ++j)
          result.covariance[i][j] = full[static_cast<size_t>(i * kNumCoefs + j)] * scales[i] * scales[j];
        result.std_errors[i] = std::sqrt(std::max(0.0, result.covariance[i][i]));
      }
    }
  }
  return result;
}

}  // namespace

std::vector<Coef> component_coefs(const std::vector<MicroRecord>& micro) {
  std::vector<bool> seen(kNumCoefs, false);
  for (const auto& r : micro)
    for (Coef c : micro_coefs(r)) seen[c] = true;
  std::vector<Coef> out;
  for (int i = 0; i < kNumCoefs; ++i)
    if (seen[i]) out.push_back(static_cast<Coef>(i));
  return out;
}

namespace {

// Stage 1's solve over `free`, from `start`, with `priors` (empty: each centred on its default),
// and the records' RMS log error.
FitResult solve_micro(const std::vector<MicroRecord>& micro, const HardwareProfile& hw, const CoefVector& start,
                      const std::vector<Coef>& free, std::vector<ComponentPrior> priors, const FitOptions& opt) {
  const Scales scales = coef_scales();
  CoefVector u{};
  for (int i = 0; i < kNumCoefs; ++i) u[i] = start[i] / scales[i];
  ceres::Problem problem;
  // Records no coefficient reads (the pageable copies) inform nothing here.
  std::vector<const MicroRecord*> fitted;
  for (const auto& r : micro)
    if (!micro_coefs(r).empty()) fitted.push_back(&r);
  for (const MicroRecord* r : fitted)
    problem.AddResidualBlock(MicroResidual::Create(*r, hw, opt.sigma_micro, scales),
                             new ceres::CauchyLoss(opt.cauchy_scale), u.data());
  FitOptions o = opt;
  o.component_priors = std::move(priors);
  FitResult result = solve(problem, u, scales, free, o);
  double ss = 0;
  for (const MicroRecord* r : fitted) ss += std::pow(std::log(predict_micro(*r, hw, result.coefs.data()) / r->seconds), 2);
  result.model_error_frac = fitted.empty() ? 0.0 : std::sqrt(ss / static_cast<double>(fitted.size()));
  return result;
}

}  // namespace

FitResult fit_components(const std::vector<MicroRecord>& micro, const HardwareProfile& hw, const CoefVector& start,
                         const FitOptions& opt) {
  return solve_micro(micro, hw, start, component_coefs(micro), {}, opt);
}

std::vector<Coef> component_rate_coefs(const std::vector<MicroRecord>& micro) {
  static const std::vector<Coef> kRates = {kGemmEffMaxFrac,    kAttnEffMaxFrac, kAttnBwdEffMaxFrac,
                                           kIntraBusEffFrac,   kInterBusEffFrac, kPcieEffFrac,
                                           kGpuOptBwEffFrac,   kGpuOptFlopsPerS, kCpuCoreBytesPerSPerLane,
                                           kElementwiseBwEffFrac,
                                           kCpuLaneFlopsPerS,  kCpuDramEffFrac};
  std::vector<Coef> out;
  for (Coef c : component_coefs(micro))
    if (std::find(kRates.begin(), kRates.end(), c) != kRates.end()) out.push_back(c);
  return out;
}

FitResult fit_component_rates(const std::vector<MicroRecord>& micro, const HardwareProfile& hw, const CoefVector& start,
                              const std::vector<Coef>& free, const FitOptions& opt) {
  std::vector<ComponentPrior> priors;
  for (Coef c : free) priors.push_back({c, start[c], opt.sigma_prior});
  return solve_micro(micro, hw, start, free, std::move(priors), opt);
}

FitResult fit_coefficients(const std::vector<Observation>& obs, const CoefVector& start, const FitOptions& opt) {
  const Scales scales = coef_scales();
  CoefVector u{};
  for (int i = 0; i < kNumCoefs; ++i) u[i] = start[i] / scales[i];
  ceres::Problem problem;
  for (const auto& o : obs)
    problem.AddResidualBlock(RunResidual::Create(o, opt, scales), new ceres::CauchyLoss(opt.cauchy_scale), u.data());
  FitResult result = solve(problem, u, scales, opt.free, opt);

  // Model error: RMS of the step-time log ratios on the fitted runs; added to
  // the parameter uncertainty in prediction intervals.
  double ss = 0;
  int n = 0;
  for (const auto& o : obs) {
    if (o.step_s <= 0) continue;
    const double pred = predict_step_time(o.features.step, result.coefs.data()).step_s;
    ss += std::pow(std::log(pred / o.step_s), 2);
    ++n;
  }
  result.model_error_frac = n ? std::sqrt(ss / n) : 0.0;
  return result;
}

std::vector<CoefSupport> coefficient_support(const std::vector<Observation>& obs, const std::vector<MicroRecord>& micro,
                                             const HardwareProfile& hw, const std::vector<Coef>& free,
                                             const CoefVector& at) {
  const auto outputs = [](const Observation& o, const CoefVector& c) {
    const StepTime<double> t = predict_step_time(o.features.step, c.data());
    const MemoryEstimate<double> m = predict_memory(o.features.memory, c.data());
    return std::array<double, 6>{t.step_s, t.forward_s, t.backward_s + t.recompute_s, t.optimizer_total_s,
                                 m.gpu_total_bytes, m.host_per_rank_bytes};
  };
  const auto moved = [](double a, double b) { return std::abs(a - b) > 0.005 * std::max(std::abs(a), 1e-300); };
  std::vector<CoefSupport> out;
  for (Coef c : free) {
    CoefSupport s{c};
    CoefVector up = at;
    up[c] = at[c] != 0.0 ? 2.0 * at[c] : 0.2 * coef_table()[c].upper;
    for (const Observation& o : obs) {
      const auto a = outputs(o, at), b = outputs(o, up);
      bool any = false;
      for (size_t k = 0; k < a.size(); ++k) any = any || moved(a[k], b[k]);
      s.configurations += any;
    }
    for (const MicroRecord& r : micro) s.micro_records += moved(predict_micro(r, hw, at.data()), predict_micro(r, hw, up.data()));
    out.push_back(s);
  }
  return out;
}

// The host-floor terms, which only launch-bound runs inform, and the fp32 GEMMs' efficiency,
// which only fp32 runs inform.
bool is_regime_coef(Coef c) {
  return c == kHostLayerFwdS || c == kHostLayerBwdS || c == kGradHookOverheadS || c == kParamFetchOverheadS ||
         c == kFp32GemmEffMaxFrac;
}

void check_identifiable(const std::vector<Observation>& obs, const std::vector<MicroRecord>& micro,
                        const HardwareProfile& hw) {
  std::vector<Coef> free = default_free_coefs();
  for (Coef c : component_coefs(micro))
    if (std::find(free.begin(), free.end(), c) == free.end()) free.push_back(c);
  const std::vector<CoefSupport> support = coefficient_support(obs, micro, hw, free, default_coefs());
  std::string blind;
  int end_to_end_only = 0;
  for (const CoefSupport& s : support) {
    if (is_regime_coef(s.coef)) continue;  // held at its prior where no run reaches its regime
    if (s.micro_records == 0) ++end_to_end_only;
    if (s.configurations + s.micro_records == 0) blind += (blind.empty() ? "" : ", ") + std::string(coef_table()[s.coef].name);
  }
  if (!blind.empty())
    throw InputError("the runs cannot determine " + blind +
                     ": no fitted configuration or micro-benchmark depends on it (add runs that exercise it)");
  if (static_cast<int>(obs.size()) < end_to_end_only)
    throw InputError(std::to_string(obs.size()) + " fitted configuration" + (obs.size() == 1 ? "" : "s") + " for " +
                     std::to_string(end_to_end_only) +
                     " coefficients that only whole runs determine: give at least as many distinct configurations");
}

Calibration calibrate_two_stage(const std::vector<Observation>& obs, const std::vector<MicroRecord>& micro,
                                const HardwareProfile& hw, FitOptions options) {
  Calibration out;
  if (options.free.empty()) options.free = default_free_coefs();
  CoefVector start = default_coefs();
  if (!micro.empty()) {
    out.components = fit_components(micro, hw, start, options);
    out.component_free = component_coefs(micro);
    for (Coef c : out.component_free) {
      options.component_priors.push_back({c, out.components->coefs[c], options.sigma_component});
      if (std::find(options.free.begin(), options.free.end(), c) == options.free.end()) options.free.push_back(c);
      start[c] = out.components->coefs[c];
    }
  }
  out.fit = fit_coefficients(obs, start, options);
  out.options = options;
  return out;
}

std::vector<Coef> engine_free_coefs() {
  // The host floors: a peer runs a transformers model from Python, whose passes take longer to
  // issue than our backend's (pythia-2.8b at micro-batch 1 under DeepSpeed ZeRO-0: 0.283 s a step
  // of two micro-batches, against 0.20 s from our backend's floors). The GPU optimizer's
  // bandwidth: DeepSpeed's step is several kernels per tensor (deepspeed_gpu_step_bytes), FSDP2's
  // torch's fused AdamW over the sharded DTensors; the harnesses time it on its own.
  return {kBackwardSlowdownMult, kElementwiseTrafficMult, kLayerOverheadS, kParamFetchOverheadS, kGradHookOverheadS, kParamFetchBytesPerS,
          kHostLayerFwdS,        kHostLayerBwdS,           kPcieEffFrac,
          kOffloadOverlapFrac,   kStagedCopyBytesPerS,     kHostCopyBytesPerSPerThread, kCpuCoreBytesPerSPerLane,
          kCpuOptStepOverheadS,  kGpuFragFrac,             kCkptReserveMult,   kActBytesMult,      kLossExtraBytesPerLogit, kLossReserveBytesPerLogit,
          kGpuWorkspaceBytes,    kGpuOptBwEffFrac,         kHostBytesPerRank};
}

Calibration calibrate_for_engine(const std::vector<Observation>& obs, const std::vector<MicroRecord>& micro,
                                 const HardwareProfile& hw) {
  if (hw.engine == "stepcast") return calibrate_two_stage(obs, micro, hw);
  Calibration out;
  FitOptions options;
  options.free = engine_free_coefs();
  // Start and prior: the hardware's values (what the engine would run at if it behaved as ours),
  // not an earlier engine section's, so that a refit on the same runs gives the same section.
  for (Coef c : options.free) options.component_priors.push_back({c, hw.hardware_coefs[c], options.sigma_prior});
  // The section's expandable-segment share comes from paired runs this fit does not see
  // (coefficients.cpp): it stays.
  CoefVector start = hw.hardware_coefs;
  start[kExpandableReserveFrac] = hw.coefs[kExpandableReserveFrac];
  out.fit = fit_coefficients(obs, start, options);
  out.options = options;
  return out;
}

std::string fitted_profile_text(const HardwareProfile& hw, const std::string& base_text, const Calibration& cal,
                                CalibratedCoefficients cc) {
  cc.values = cal.fit.coefs;
  if (cc.std_errors.empty()) cc.std_errors = cal.fit.std_errors;  // the caller's bootstrap errors win
  cc.model_error_frac = cal.fit.model_error_frac;
  if (cal.fit.covariance_ok && hw.engine == "stepcast") {
    cc.free = cal.options.free;
    cc.covariance = cal.fit.covariance;
  }
  return hw.engine == "stepcast" ? with_calibrated_coefficients(base_text, cc)
                                 : with_engine_section(base_text, hw.engine, cc);
}

HardwareProfile fitted_profile(const HardwareProfile& hw, const std::string& base_text, const Calibration& cal,
                               const CalibratedCoefficients& provenance) {
  return for_engine(parse_hardware_profile(fitted_profile_text(hw, base_text, cal, provenance), hw.path), hw.engine);
}

}  // namespace stepcast::calibrate
