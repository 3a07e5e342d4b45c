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
  double step_std_s = 0;  // from the profile's coefficient covariance; 0 when not calibrated
  bool fits = false;
  std::string reason;  // why it does not fit; empty when it fits
};

// A plan fits when its predicted peak stays this far under the GPU's memory:
// the memory model's largest error on the H200 runs is 1.2 %, and a run that
// sits at 99.9 % of the device fails on the first allocator hiccup.
inline constexpr double kGpuMemoryHeadroomFrac = 0.03;

// Evaluates `config`. Limits of 0 take the profile's figures.
Prediction evaluate(const ModelSpec& spec, const HardwareProfile& hw, const TrainConfig& config,
                    const ResourceLimits& limits = {});

// Standard deviation of the predicted step time from a coefficient
// covariance (first-order propagation; gradient by central differences).
double step_time_std_s(const StepFeatures& f, const CoefVector& coefs,
                       const std::vector<std::vector<double>>& covariance);

// Parameter uncertainty and the fit's model error, combined: sqrt(sp^2 + (e step)^2).
double step_interval_std_s(const StepFeatures& f, const HardwareProfile& hw, double step_s);

// Same with precomputed features (the planner's hot loop) and a coefficient vector.
Prediction evaluate_features(const Features& features, const TrainConfig& config,
                             const HardwareProfile& hw, const CoefVector& coefs,
                             const ResourceLimits& limits);

}  // namespace stepcast
