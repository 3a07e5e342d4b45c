// One evaluation of the cost model in double precision: what the planner,
// `train` (predicted beside measured) and the reports print.
#pragma once

#include <string>

#include "model/step_features.h"
#include "model/memory_model.h"
#include "model/step_time.h"

namespace stepcast {

struct Throughput {
  double tokens_per_s = 0;
  double world_samples_per_s = 0;
  double rank_samples_per_s = 0;
  double mfu = 0;  // model FLOPs (6N + attention, no recompute) / (time x GPUs x dense peak)
};

struct Prediction {
  TrainConfig config;
  StepTime<double> time;
  MemoryEstimate<double> memory;
  Throughput throughput;
  double gpu_memory_limit_bytes = 0;
  double host_memory_limit_bytes = 0;  // per node
  // The 95 % step-time interval as a standard deviation (half-width / 1.96): from the profile's
  // cross-validated interval model where it has one, else its coefficient covariance and model
  // error; 0 when not calibrated.
  double step_std_s = 0;
  int unseen_dims = -1;  // regime dimensions outside the fitted runs (interval model); -1: none
  // The 95 % interval of the peak reserved GPU memory (the interval model's memory quantiles,
  // symmetric in log); both 0 where the profile has none.
  double gpu_memory_lo_bytes = 0, gpu_memory_hi_bytes = 0;
  // fits: the planner ranks it (its predicted need stays inside the card less the headroom, and
  // the host holds it). tight: its predicted need passes the headroom but not the card itself:
  // not ranked, yet not "does not fit" either, for the prediction says the card holds it.
  bool fits = false;
  bool tight = false;
  std::string reason;  // why it does not fit, or why it is tight; empty when it fits
};

// The verdict on a plan that the planner does not rank: "tight" or "does not fit", with its reason.
std::string fit_verdict(const Prediction& p);

// A plan fits when its predicted peak stays this far under the GPU's memory.
// The memory model's largest error on the calibration runs is 1.2 %, but
// `planner validate` on 2 x H200 found gpt-j-6b at micro-batch 16 (beyond the
// calibrated micro-batches, <= 8) out of memory at 139.8 GiB where 135.5 GiB
// was predicted: under-prediction of at least 3.2 % when extrapolating. 5 %.
inline constexpr double kGpuMemoryHeadroomFrac = 0.05;

// Evaluates `config`. Limits of 0 take the profile's figures.
Prediction evaluate(const ModelSpec& spec, const HardwareProfile& hw, const TrainConfig& config,
                    const ResourceLimits& limits = {});

// Standard deviation of the predicted step time from a coefficient
// covariance (first-order propagation; gradient by central differences).
double step_time_std_s(const StepFeatures& f, const CoefVector& coefs,
                       const std::vector<std::vector<double>>& covariance);

// Parameter uncertainty and the fit's model error, combined: sqrt(sp^2 + (e step)^2).
double step_interval_std_s(const StepFeatures& f, const HardwareProfile& hw, double step_s);

// One regime dimension of a configuration outside an interval model's region, as the planner
// names it: "<name> <value> (<calibrated>)".
struct OutsideDimension {
  std::string name;        // "ZeRO stage", "sequence", ...
  std::string value;       // the configuration's
  std::string calibrated;  // "calibrated: 1/2", "not one of the 6 calibrated", ...
  bool widens_interval = true;  // counted by unseen_dimensions (the node count is not: no fitted
                                // run is on several nodes, and GPUs already names the world size)
};

// The regime dimensions of a configuration that lie outside an interval model's region: model,
// ZeRO stage, offload, precision, attention, world size (each a value the fitted runs did not
// have), nodes beyond one, sequence length outside their range, micro-batch x sequence beyond
// their largest.
std::vector<OutsideDimension> outside_dimensions(const IntervalModel& m, const std::string& model, const TrainConfig& c);

// How many of those widen the interval (all but the node count).
int unseen_dimensions(const IntervalModel& m, const std::string& model, const TrainConfig& c);

// Half-width of the 95 % interval of log(step time): the seen quantile, plus the step to the
// unseen one for each dimension outside the region; a launch-bound prediction's own pair where
// the model has one.
double interval_log_halfwidth(const IntervalModel& m, int unseen_dims, bool launch_bound);

// The same for log(peak reserved GPU memory): the memory quantiles, one class.
double memory_interval_log_halfwidth(const IntervalModel& m, int unseen_dims);

// What a plan needs to fit at its memory interval's upper edge: the edge less the cache a
// smaller card does without (as gpu_required_bytes is to gpu_total_bytes); 0 without an interval.
// A plan that fits by its prediction may still run out of memory where this passes the card.
double gpu_memory_hi_required_bytes(const Prediction& p);

// Whether a prediction is launch-bound (host_issue_ratio at least kLaunchBoundIssueRatio).
inline bool launch_bound(double host_issue_ratio) { return host_issue_ratio >= kLaunchBoundIssueRatio; }

// Sets p.step_std_s and p.unseen_dims for `model` on `hw` (features f).
void set_interval(Prediction& p, const StepFeatures& f, const HardwareProfile& hw, const std::string& model);

// Same with precomputed features (the planner's hot loop) and a coefficient vector.
Prediction evaluate_features(const Features& features, const TrainConfig& config,
                             const HardwareProfile& hw, const CoefVector& coefs,
                             const ResourceLimits& limits);

}  // namespace stepcast
