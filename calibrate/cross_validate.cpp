#include "calibrate/cross_validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <random>

#include "calibrate/fit.h"
#include "common/parallel.h"
#include "common/progress.h"
#include "common/stats.h"
#include "common/text_file.h"
#include "model/prediction.h"

namespace stepcast::calibrate {

namespace {

// The profile as `calibrate fit` would write it from `cal` (values, covariance, model error).
HardwareProfile fold_profile(const HardwareProfile& hw, const std::string& base_text, const Calibration& cal,
                             const std::vector<RunRecord>& fitted_runs) {
  CalibratedCoefficients cc;
  for (const RunRecord& r : fitted_runs)
    cc.max_micro_tokens = std::max(cc.max_micro_tokens, static_cast<double>(r.config.micro_batch * r.config.seq_len));
  cc.source = "cross-validation fold";
  return fitted_profile(hw, base_text, cal, cc);
}

nlohmann::json error_stats(const std::vector<double>& abs_frac) {
  const MeanP90Max s = mean_p90_max(abs_frac, 100.0);
  return {{"mean", s.mean}, {"p90", s.p90}, {"max", s.max}};
}

std::string offload_of(const RunRecord& r) { return offload_label(r.config); }

}  // namespace

IntervalModel region_of(const std::vector<RunRecord>& runs) {
  IntervalModel m;
  m.pefts.clear();
  const auto add = [](auto& values, const auto& v) {
    if (std::find(values.begin(), values.end(), v) == values.end()) values.push_back(v);
  };
  for (const RunRecord& r : runs) {
    add(m.models, r.model.name);
    add(m.zero_stages, static_cast<int64_t>(r.config.zero_stage));
    add(m.offloads, offload_of(r));
    add(m.precisions, std::string(precision_name(r.config.precision)));
    add(m.attentions, std::string(attention_name(r.config.attention)));
    add(m.pefts, std::string(peft_name(r.config.peft)));
    add(m.world_sizes, static_cast<int64_t>(r.config.world_size()));
    const double seq = static_cast<double>(r.config.seq_len);
    m.seq_min = m.seq_min == 0 ? seq : std::min(m.seq_min, seq);
    m.seq_max = std::max(m.seq_max, seq);
    m.micro_tokens_max = std::max(m.micro_tokens_max, static_cast<double>(r.config.micro_batch) * seq);
  }
  std::sort(m.models.begin(), m.models.end());
  std::sort(m.zero_stages.begin(), m.zero_stages.end());
  std::sort(m.offloads.begin(), m.offloads.end());
  std::sort(m.precisions.begin(), m.precisions.end());
  std::sort(m.attentions.begin(), m.attentions.end());
  std::sort(m.pefts.begin(), m.pefts.end());
  std::sort(m.world_sizes.begin(), m.world_sizes.end());
  return m;
}

std::vector<CvPrediction> cross_validate(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                         const HardwareProfile& hw,
                                         const std::function<std::string(const RunRecord&)>& fold_of,
                                         const std::string& progress) {
  const std::string base_text = read_text_file(hw.path);
  std::map<std::string, std::vector<size_t>> folds;
  for (size_t i = 0; i < runs.size(); ++i) folds[fold_of(runs[i])].push_back(i);
  // Named work shows its progress (common/progress.h); unnamed work (a fold inside a fold) is silent.
  std::optional<Progress> shown;
  if (!progress.empty()) shown.emplace("calibrate", progress, folds.size(), "refit", false);
  std::vector<CvPrediction> out(runs.size());
  // The folds are independent fits: in parallel, each writing only its own members' predictions.
  const std::vector<std::pair<std::string, std::vector<size_t>>> fold_list(folds.begin(), folds.end());
  parallel_for(fold_list.size(), [&](size_t f) {
    const auto& [value, members] = fold_list[f];
    if (shown) shown->next();
    std::vector<Observation> obs;
    std::vector<RunRecord> fitted;
    for (size_t i = 0; i < runs.size(); ++i)
      if (fold_of(runs[i]) != value) {
        obs.push_back(observation_of(runs[i], hw));
        fitted.push_back(runs[i]);
      }
    if (obs.empty()) return;  // one fold holds everything: nothing to fit it from
    const HardwareProfile fold_hw = fold_profile(hw, base_text, calibrate_for_engine(obs, micro, hw), fitted);
    const IntervalModel region = region_of(fitted);
    for (size_t i : members) {
      const Prediction p = evaluate(runs[i].model, fold_hw, runs[i].config);
      const TimedPhases<double> ph = timed_phases(p.time, runs[i].config.engine != Engine::kStepcast);
      out[i] = {&runs[i],       p.time.step_s, p.step_std_s, p.memory.gpu_total_bytes, p.memory.host_per_rank_bytes,
                ph.forward_s,   ph.backward_s, ph.optimizer_s,
                unseen_dimensions(region, runs[i].model.name, runs[i].config), p.time.host_issue_ratio};
    }
  });
  out.erase(std::remove_if(out.begin(), out.end(), [](const CvPrediction& p) { return p.run == nullptr; }), out.end());
  return out;
}

namespace {

// A prediction's score for the memory interval: |log(measured / predicted)| of the peak reserved.
double memory_log_error(const CvPrediction& p) {
  return std::abs(std::log(p.run->gpu_peak_reserved_bytes / p.gpu_memory_bytes));
}

}  // namespace

nlohmann::json cv_summary(const std::vector<CvPrediction>& predictions, const IntervalModel& interval) {
  std::vector<double> step, mem, host, fwd, bwd, opt;
  double host_max_bytes = 0;  // the largest host miss in bytes: a percentage of a small process says little
  int inside = 0, measurements = 0, memory_inside = 0;
  for (const CvPrediction& p : predictions) {
    const RunRecord& r = *p.run;
    step.push_back(std::abs(p.step_s / r.step_s - 1));
    // The profile's interval model (with the run's distance from its fold's region), else the
    // fold's own band; for each runs file's measurement of the configuration.
    for (const double measured_s : step_measurements_s(r)) {
      ++measurements;
      if (!interval.empty() ? std::abs(std::log(measured_s / p.step_s)) <=
                                  interval_log_halfwidth(interval, p.unseen_dims, launch_bound(p.host_issue_ratio))
                            : std::abs(p.step_s - measured_s) <= 1.96 * p.step_std_s)
        ++inside;
    }
    if (r.gpu_peak_reserved_bytes > 0) {
      mem.push_back(std::abs(p.gpu_memory_bytes / r.gpu_peak_reserved_bytes - 1));
      if (interval.has_memory() && memory_log_error(p) <= memory_interval_log_halfwidth(interval, p.unseen_dims))
        ++memory_inside;
    }
    if (r.host_peak_rss_bytes > 0) {
      host.push_back(std::abs(p.host_memory_bytes / r.host_peak_rss_bytes - 1));
      host_max_bytes = std::max(host_max_bytes, std::abs(p.host_memory_bytes - r.host_peak_rss_bytes));
    }
    if (r.forward_s > 0) fwd.push_back(std::abs(p.forward_s / r.forward_s - 1));
    if (r.backward_s > 0) bwd.push_back(std::abs(p.backward_s / r.backward_s - 1));
    if (r.optimizer_total_s > 0) opt.push_back(std::abs(p.optimizer_s / r.optimizer_total_s - 1));
  }
  const nlohmann::json s = error_stats(step), m = error_stats(mem), h = error_stats(host);
  const ProportionInterval coverage_ci = wilson_interval(inside, measurements);
  return {{"configurations", predictions.size()},
          {"step_time_mean_abs_pct_error", s["mean"]},
          {"step_time_p90_abs_pct_error", s["p90"]},
          {"step_time_max_abs_pct_error", s["max"]},
          {"peak_memory_mean_abs_pct_error", m["mean"]},
          {"peak_memory_p90_abs_pct_error", m["p90"]},
          {"peak_memory_max_abs_pct_error", m["max"]},
          {"peak_memory_coverage_95", !interval.has_memory() || mem.empty()
                                          ? nlohmann::json(nullptr)
                                          : nlohmann::json(static_cast<double>(memory_inside) / static_cast<double>(mem.size()))},
          {"host_memory_configurations", host.size()},
          {"host_memory_mean_abs_pct_error", h["mean"]},
          {"host_memory_max_abs_pct_error", h["max"]},
          {"host_memory_max_abs_error_bytes", host_max_bytes},
          {"phases_abs_pct_error", {{"forward", error_stats(fwd)}, {"backward", error_stats(bwd)}, {"optimizer", error_stats(opt)}}},
          {"coverage_95", measurements == 0 ? 0.0 : static_cast<double>(inside) / static_cast<double>(measurements)},
          {"coverage_measurements", measurements},
          // What so few measurements say of the interval's true coverage: the Wilson 95 % interval
          // of inside / measurements, and whether it excludes the level (too narrow or too wide).
          {"coverage_95_wilson_95", {coverage_ci.lo, coverage_ci.hi}},
          {"coverage_95_verdict", measurements == 0     ? "none"
                                  : coverage_ci.hi < 0.95 ? "below"
                                  : coverage_ci.lo > 0.95 ? "above"
                                                          : "consistent"}};
}

namespace {

// The regimes a user asks about, held out whole.
const std::vector<std::pair<std::string, std::function<std::string(const RunRecord&)>>>& regime_groupings() {
  static const std::vector<std::pair<std::string, std::function<std::string(const RunRecord&)>>> kGroups = {
      {"model", [](const RunRecord& r) { return r.model.name; }},
      {"zero_stage", [](const RunRecord& r) { return std::to_string(r.config.zero_stage); }},
      {"offload", offload_of},
      {"seq_len", [](const RunRecord& r) { return std::to_string(r.config.seq_len); }},
      {"gpus", [](const RunRecord& r) { return std::to_string(r.config.world_size()); }},
  };
  return kGroups;
}

// Each LOCO prediction: the configuration, measured and predicted step and memory, signed
// errors, and how many regime dimensions the fold had not seen; largest |step error| first.
nlohmann::json loco_rows(std::vector<CvPrediction> predictions) {
  const auto step_err = [](const CvPrediction& p) { return p.step_s / p.run->step_s - 1; };
  std::sort(predictions.begin(), predictions.end(), [&](const CvPrediction& a, const CvPrediction& b) {
    return std::abs(step_err(a)) > std::abs(step_err(b));
  });
  nlohmann::json rows = nlohmann::json::array();
  for (const CvPrediction& p : predictions) {
    const RunRecord& r = *p.run;
    rows.push_back({{"key", r.key},
                    {"file", r.source},
                    {"measured_step_s", r.step_s},
                    {"predicted_step_s", p.step_s},
                    {"step_error_pct", 100 * step_err(p)},
                    {"measured_peak_memory_bytes", r.gpu_peak_reserved_bytes},
                    {"predicted_peak_memory_bytes", p.gpu_memory_bytes},
                    {"memory_error_pct",
                     r.gpu_peak_reserved_bytes > 0 ? 100 * (p.gpu_memory_bytes / r.gpu_peak_reserved_bytes - 1) : 0.0},
                    {"measured_host_memory_bytes", r.host_peak_rss_bytes},
                    {"predicted_host_memory_bytes", p.host_memory_bytes},
                    {"host_memory_error_pct",
                     r.host_peak_rss_bytes > 0 ? 100 * (p.host_memory_bytes / r.host_peak_rss_bytes - 1) : 0.0},
                    {"unseen_dimensions", p.unseen_dims},
                    {"host_issue_ratio", p.host_issue_ratio}});
  }
  return rows;
}

}  // namespace

void set_interval_quantiles(const std::vector<CvPrediction>& predictions, IntervalModel& m) {
  // |log(measured / predicted)| by class: [launch-bound][outside the fold's region].
  std::vector<double> scores[2][2];
  // One score per runs file that measured the configuration: the interval answers for one run
  // on one machine, not for the median over machines.
  for (const CvPrediction& p : predictions)
    for (const double measured_s : step_measurements_s(*p.run))
      scores[launch_bound(p.host_issue_ratio)][p.unseen_dims > 0].push_back(std::abs(std::log(measured_s / p.step_s)));
  const auto set_pair = [](const std::vector<double>& seen, const std::vector<double>& unseen, double& q_seen,
                           double& q_unseen, int& n_seen, int& n_unseen) {
    n_seen = static_cast<int>(seen.size());
    n_unseen = static_cast<int>(unseen.size());
    q_seen = std::max(conformal_q95(seen), 1e-6);
    q_unseen = std::max(conformal_q95(unseen), q_seen);
  };
  // The peak reserved memory: one score per configuration (its largest peak over the files).
  std::vector<double> memory[2];
  for (const CvPrediction& p : predictions)
    if (p.run->gpu_peak_reserved_bytes > 0 && p.gpu_memory_bytes > 0)
      memory[p.unseen_dims > 0].push_back(memory_log_error(p));
  m.memory_log_q95_seen = m.memory_log_q95_unseen = 0;
  m.memory_seen_predictions = m.memory_unseen_predictions = 0;
  if (memory[0].size() >= kConformalMinScores)
    set_pair(memory[0], memory[1], m.memory_log_q95_seen, m.memory_log_q95_unseen, m.memory_seen_predictions,
             m.memory_unseen_predictions);
  m.log_q95_seen_launch_bound = m.log_q95_unseen_launch_bound = 0;
  m.seen_launch_bound_predictions = m.unseen_launch_bound_predictions = 0;
  if (scores[1][0].size() >= kConformalMinScores) {  // a launch-bound class of its own
    set_pair(scores[0][0], scores[0][1], m.log_q95_seen, m.log_q95_unseen, m.seen_predictions, m.unseen_predictions);
    set_pair(scores[1][0], scores[1][1], m.log_q95_seen_launch_bound, m.log_q95_unseen_launch_bound,
             m.seen_launch_bound_predictions, m.unseen_launch_bound_predictions);
    return;
  }
  // Too few launch-bound residuals for a 95 % quantile of their own: one pair for all.
  for (int side = 0; side < 2; ++side)
    scores[0][side].insert(scores[0][side].end(), scores[1][side].begin(), scores[1][side].end());
  set_pair(scores[0][0], scores[0][1], m.log_q95_seen, m.log_q95_unseen, m.seen_predictions, m.unseen_predictions);
}

IntervalModel interval_model(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                             const HardwareProfile& hw) {
  std::vector<CvPrediction> preds = cross_validate(runs, micro, hw, [](const RunRecord& r) { return r.key; },
                                                   "the interval: leave one configuration out");
  for (const auto& [name, fold_of] : regime_groupings()) {
    const std::vector<CvPrediction> group =
        cross_validate(runs, micro, hw, fold_of, "the interval: leave one " + name + " out");
    preds.insert(preds.end(), group.begin(), group.end());
  }
  IntervalModel m = region_of(runs);
  set_interval_quantiles(preds, m);
  return m;
}

nlohmann::json cross_validation_report(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                       const HardwareProfile& hw) {
  nlohmann::json cv;
  const std::vector<CvPrediction> loco = cross_validate(runs, micro, hw, [](const RunRecord& r) { return r.key; },
                                                        "cross-validation: leave one configuration out");
  cv["loco"] = cv_summary(loco, hw.interval);
  cv["loco"]["runs"] = loco_rows(loco);
  cv["interval"] = {{"source", hw.interval.empty() ? "coefficient covariance and model error" : "cross-validated (conformal)"},
                    {"log_q95_seen", hw.interval.log_q95_seen},
                    {"log_q95_unseen", hw.interval.log_q95_unseen},
                    {"log_q95_seen_launch_bound", hw.interval.log_q95_seen_launch_bound},
                    {"log_q95_unseen_launch_bound", hw.interval.log_q95_unseen_launch_bound},
                    {"memory_log_q95_seen", hw.interval.memory_log_q95_seen},
                    {"memory_log_q95_unseen", hw.interval.memory_log_q95_unseen},
                    {"launch_bound_issue_ratio", kLaunchBoundIssueRatio}};
  // Coverage and error within each interval class (leave one configuration out).
  for (const bool bound : {false, true}) {
    std::vector<CvPrediction> members;
    for (const CvPrediction& p : loco)
      if (launch_bound(p.host_issue_ratio) == bound) members.push_back(p);
    cv["loco"][bound ? "launch_bound" : "gpu_bound"] = cv_summary(members, hw.interval);
  }
  std::vector<std::pair<std::string, std::function<std::string(const RunRecord&)>>> groupings = regime_groupings();
  groupings.emplace_back("file", [](const RunRecord& r) { return r.source; });
  cv["groups"] = nlohmann::json::array();
  for (const auto& [name, fold_of] : groupings) {
    const std::vector<CvPrediction> preds =
        cross_validate(runs, micro, hw, fold_of, "cross-validation: leave one " + name + " out");
    std::map<std::string, std::vector<CvPrediction>> by_value;
    for (const CvPrediction& p : preds) by_value[fold_of(*p.run)].push_back(p);
    if (by_value.size() < 2) continue;  // one value only: the group cannot be held out
    for (const auto& [value, members] : by_value) {
      nlohmann::json g = cv_summary(members, hw.interval);
      g["name"] = name + "=" + value;
      g["runs"] = loco_rows(members);  // which held-out runs make the group's error, largest first
      cv["groups"].push_back(g);
    }
  }
  return cv;
}

std::vector<double> bootstrap_std_errors(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                         const HardwareProfile& hw) {
  if (runs.size() < 3) return {};
  std::vector<Observation> obs;
  for (const RunRecord& r : runs) obs.push_back(observation_of(r, hw));
  std::vector<std::vector<double>> draws(kNumCoefs);
  std::mt19937_64 gen(20261201);
  std::uniform_int_distribution<size_t> pick(0, runs.size() - 1);
  // The resamples are drawn in order, fitted in parallel, and read back in order: the same
  // draws and sums as one thread.
  std::vector<std::vector<Observation>> samples(kBootstrapRefits);
  for (auto& sample : samples)
    for (size_t i = 0; i < runs.size(); ++i) sample.push_back(obs[pick(gen)]);
  std::vector<Calibration> fits(kBootstrapRefits);
  Progress shown("calibrate", "the coefficients' standard errors by bootstrap", kBootstrapRefits, "refit", false);
  parallel_for(samples.size(), [&](size_t b) {
    shown.next();
    fits[b] = calibrate_for_engine(samples[b], micro, hw);
  });
  for (const Calibration& cal : fits)
    for (Coef c : cal.options.free) draws[c].push_back(cal.fit.coefs[c]);
  std::vector<double> out(kNumCoefs, 0.0);
  for (int c = 0; c < kNumCoefs; ++c) {
    const std::vector<double>& v = draws[c];
    if (v.size() < 2) continue;
    double mean = 0, ss = 0;
    for (double x : v) mean += x / static_cast<double>(v.size());
    for (double x : v) ss += (x - mean) * (x - mean);
    out[c] = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return out;
}

nlohmann::json coefficient_report(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                  const HardwareProfile& hw) {
  std::vector<Coef> free = hw.engine == "stepcast" ? default_free_coefs() : engine_free_coefs();
  for (Coef c : component_coefs(micro))
    if (std::find(free.begin(), free.end(), c) == free.end()) free.push_back(c);
  std::vector<Observation> obs;
  for (const RunRecord& r : runs) obs.push_back(observation_of(r, hw));
  const std::vector<double> boot = bootstrap_std_errors(runs, micro, hw);
  const auto spread = [&](Coef c) { return boot.empty() ? 0.0 : boot[c]; };
  nlohmann::json out = nlohmann::json::array();
  for (const CoefSupport& s : coefficient_support(obs, micro, hw, free, hw.coefs)) {
    const CoefInfo& info = coef_table()[s.coef];
    const double v = hw.coefs[s.coef], span = info.upper - info.lower;
    const bool on_bound = std::abs(v - info.lower) <= 1e-3 * span || std::abs(info.upper - v) <= 1e-3 * span;
    std::string flag;
    if (on_bound) flag = "on a bound";
    else if (s.configurations < 5 && s.micro_records == 0) flag = "fewer than 5 configurations";
    out.push_back({{"name", std::string(info.name)},
                   {"value", v},
                   {"informing_configurations", s.configurations},
                   {"informing_micro_records", s.micro_records},
                   {"on_bound", on_bound},
                   {"std_error", hw.coef_std_errors.empty() ? 0.0 : hw.coef_std_errors[s.coef]},
                   {"bootstrap_std", spread(s.coef)},
                   {"bootstrap_refits", boot.empty() ? 0 : kBootstrapRefits},
                   {"flag", flag}});
  }
  return out;
}

nlohmann::json fit_analyses(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                            const HardwareProfile& hw) {
  return {{"cv", cross_validation_report(runs, micro, hw)}, {"coefficients", coefficient_report(runs, micro, hw)}};
}

}  // namespace stepcast::calibrate
