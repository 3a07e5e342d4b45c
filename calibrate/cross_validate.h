// Cross-validation of the two-stage fit (fit.h): each fold refits the coefficients
// without a set of configurations and predicts them, so that the errors and interval
// coverage reported are those of configurations the fit has not seen.
//  - leave-one-configuration-out (LOCO): every configuration key is a fold;
//  - leave-one-group-out: every value of a grouping (model, ZeRO stage, offload,
//    sequence length, GPU count, runs file) is a fold, so a whole regime is unseen.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibrate/micro_record.h"
#include "calibrate/run_record.h"
#include "model/hardware.h"

namespace stepcast::calibrate {

// A run predicted by the fit of its fold.
struct CvPrediction {
  const RunRecord* run = nullptr;
  double step_s = 0, step_std_s = 0, gpu_memory_bytes = 0;
  double host_memory_bytes = 0;  // one rank process's host memory (the records hold rank 0's)
  double forward_s = 0, backward_s = 0, optimizer_s = 0;
  int unseen_dims = 0;  // regime dimensions of the run outside its fold's fitted runs (unseen_dimensions)
  double host_issue_ratio = 0;  // the fold's StepTime::host_issue_ratio: which interval class it falls in
};

// Standard errors of the fitted coefficients (hw.engine's fit) as the data give them: the
// standard deviation of each over kBootstrapRefits refits on configurations drawn with
// replacement (a fixed generator: reproducible). kNumCoefs values, 0 for fixed ones; empty
// under 3 runs. `calibrate fit` stores these in the profile; the fit's own covariance
// understates them (tens to hundreds of times for some coefficients on the H200 data).
inline constexpr int kBootstrapRefits = 100;
std::vector<double> bootstrap_std_errors(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                         const HardwareProfile& hw);

// The region a set of runs covers (IntervalModel's value lists and ranges; no quantiles).
IntervalModel region_of(const std::vector<RunRecord>& runs);

// The conformal 95 % quantiles of cross-validated predictions (the ceil(0.95 (n + 1))-th
// smallest |log(measured / predicted)| of each pool, the largest where n < 19; one score per
// runs file that measured the configuration), pooled by whether the held-out run lay inside its
// fold's region, and by whether it was launch-bound where at least kConformalMinScores
// launch-bound scores lay inside (else one pair for all). The *_predictions counts are scores.
void set_interval_quantiles(const std::vector<CvPrediction>& predictions, IntervalModel& m);

// The interval model of a fit to `runs` (hw.engine's fit): set_interval_quantiles over its
// cross-validated residuals, leave one configuration out and leave one group out (model, ZeRO
// stage, offload, sequence, GPU count), and the region of all runs.
IntervalModel interval_model(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                             const HardwareProfile& hw);

// Predicts every run from a fit without the runs that share its `fold_of` value. The micro-
// benchmarks (the component stage) stay in every fold: they measure kernels, not configurations.
// With `progress`, stderr names it and its number of refits, and on a terminal counts them with an
// ETA (a log gets the one line, the same every time).
std::vector<CvPrediction> cross_validate(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                         const HardwareProfile& hw,
                                         const std::function<std::string(const RunRecord&)>& fold_of,
                                         const std::string& progress = "");

// Mean, p90 and max absolute percent errors of step time, each phase, peak GPU memory and host
// memory (over the runs whose records hold their host high-water mark), and
// the fraction of measured step times inside the 95 % interval (coverage_95, over
// coverage_measurements: each runs file's median of a configuration counts once).
// Coverage counts a measurement inside `interval`'s band (at its unseen dimensions and class) where
// the model has one, else inside 1.96 of its fold's step_std_s.
nlohmann::json cv_summary(const std::vector<CvPrediction>& predictions, const IntervalModel& interval = {});

// The report's "cv" object: {loco: summary + configurations + runs (each configuration's
// held-out prediction, largest step error first), groups: [{name, configurations,
// step_time_mean_abs_pct_error, coverage_95, ..., runs: the group's held-out predictions in
// the same form}]}. Progress to stderr.
nlohmann::json cross_validation_report(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                       const HardwareProfile& hw);

// Per coefficient the fit moves: its value in `hw`, how many of the runs' configurations
// and micro-benchmarks inform it (fit.h: coefficient_support), whether it sits on a bound,
// and a flag when it rests on fewer than 5 configurations without micro-benchmarks, or on a
// bound. The report's "coefficients" array.
nlohmann::json coefficient_report(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                                  const HardwareProfile& hw);

// What `calibrate report` adds with Ceres: {"cv": cross_validation_report, "coefficients": coefficient_report}.
nlohmann::json fit_analyses(const std::vector<RunRecord>& runs, const std::vector<MicroRecord>& micro,
                            const HardwareProfile& hw);

}  // namespace stepcast::calibrate
