// planner diagnose: a run that was measured against the prediction for it, phase by phase, and
// which resource of the machine, slower or faster than the profile says, would explain the
// difference: GPU, CPU optimizer, PCIe, the links between GPUs and nodes, the host that issues
// the kernels. Each is a factor on one input of the same cost model (model/step_features.cpp),
// solved so that the model meets the measured phases; the best one, or pair, is then applied to
// rank the plans for the same job on that machine.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "model/prediction.h"

namespace stepcast {

// What a run measured, per optimizer step (seconds) and its peak reserved GPU memory; any
// subset, at least one time. GAS time and OPT time are the founding report's columns (GAS − 1
// micro-batches; the last micro-batch and everything after it: model/step_time.h).
struct MeasuredStep {
  std::optional<double> step_s, gas_s, opt_s, forward_s, backward_s, optimizer_s;
  std::optional<double> gpu_peak_reserved_bytes;
};

enum class Resource { kGpu, kCpuOptimizer, kPcie, kIntraNode, kInterNode, kHostIssue };
inline constexpr int kNumResources = 6;
const char* resource_name(Resource r);   // "GPU", "CPU optimizer", ...
const char* resource_key(Resource r);    // "gpu", "cpu_optimizer", ... (JSON)

// Each resource's speed relative to the profile's: 0.5 = half as fast. For the CPU optimizer it
// scales the threads each rank's optimizer runs on (a peer's OpenMP threads, the backend's cores).
struct ResourceSpeeds {
  std::array<double, kNumResources> speed{1, 1, 1, 1, 1, 1};
  double& operator[](Resource r) { return speed[static_cast<int>(r)]; }
  double operator[](Resource r) const { return speed[static_cast<int>(r)]; }
};

// The profile (already for the configuration's engine: for_engine) and limits with the speeds
// applied: GPU peaks and memory bandwidth, CPU optimizer threads, PCIe rates, link rates, and
// the host's per-layer issue times (coefficients and the transformers table).
struct ScaledMachine {
  HardwareProfile hardware;
  ResourceLimits limits;
};
ScaledMachine scale_machine(const HardwareProfile& hw_engine, const TrainConfig& config, const ResourceLimits& limits,
                            const ResourceSpeeds& speeds);

// The CPU optimizer threads per rank the prediction assumes at speed 1 (the launcher's default
// for a peer, or the limit given; the backend's cores per rank).
double cpu_optimizer_threads_per_rank(const HardwareProfile& hw, const TrainConfig& config, const ResourceLimits& limits);

struct PhaseRow {
  std::string name;          // "step", "GAS time", ...
  std::string key;           // "step", "gas", ... (JSON)
  double measured_s = 0;
  double predicted_s = 0;
  bool fitted = false;       // one of the phases the resources are solved on
};

struct ResourceFit {
  std::vector<Resource> resources;  // one or two
  std::vector<double> speeds;       // each one's speed relative to the profile
  double rms_log_error = 0;         // over the fitted phases, after
  std::vector<double> predicted_s;  // the fitted phases, after (PhaseRow order of the fitted ones)
  bool at_bound = false;            // a speed sits at the search's bound (1/64 or 64): only a limit
};

// One measured run to diagnose: its job, its launch's limits (0: the profile's) and what it measured.
struct DiagnosedRun {
  std::string label;
  ModelSpec model;
  TrainConfig config;
  ResourceLimits limits;
  MeasuredStep measured;
};

// One run against its prediction at the profile's speeds.
struct RunDiagnosis {
  std::string label;
  Prediction predicted;
  std::vector<PhaseRow> phases;
  // With GAS > 1 and GAS and OPT time measured: one micro-batch (GAS time / (GAS - 1)) and what
  // follows the last one (OPT time less one micro-batch: the optimizer, its copies, its syncs),
  // measured and predicted.
  std::optional<double> micro_batch_measured_s, after_last_micro_batch_measured_s;
  double micro_batch_predicted_s = 0, after_last_micro_batch_predicted_s = 0;
  double cpu_threads_per_rank_profile = 0;  // the CPU optimizer's threads at speed 1
};

struct Diagnosis {
  std::vector<RunDiagnosis> runs;
  double rms_log_error = 0;         // the fitted phases at the profile's speeds
  std::vector<ResourceFit> singles; // one per resource that bears on the fitted phases, best first
  std::vector<Resource> no_bearing; // resources whose speed (1/16 or 16x) moves no fitted phase by 1 %
  std::optional<ResourceFit> best_pair;
  ResourceFit explanation;          // the pair where it halves the best single's error, else the single
  // The explanation has as many speeds as fitted phases: it meets them exactly by construction,
  // which is no evidence for it (a third phase measured would test it).
  bool exactly_determined = false;
  double noise_log = 0;             // the model's own error (phase_noise_log)
  bool within_noise = false;        // every fitted phase within it: nothing to explain
};

// The model's own error on a phase, as a 95 % half-width of log(measured / predicted), on a
// machine it was calibrated on: the engine's cross-validated quantile inside the calibrated region
// (the launch-bound class's for a launch-bound plan), else 1.96 x its fit's RMS error; 0 where the
// profile has neither (a datasheet profile: take its engines_from reference's).
double phase_noise_log(const HardwareProfile& hw_engine, bool launch_bound);

// Diagnoses runs measured on one machine, `hw` (a profile, whose engine section is taken here,
// or one already for the engine: for_engine, scale_machine), solving speeds they share; every
// run has the same engine. Each run's fitted phases: for our backend forward, backward and
// optimizer where all three are given (with the step where it is); else GAS and OPT time where
// both are (GAS > 1, the peers' boundaries, which their phase timers do not share with the
// model); else the step; else whatever else is given. Where every fitted phase lies within `noise_log` of
// the prediction (phase_noise_log) no resource needs to differ: the explanation is then empty
// (speeds 1). InputError where a run gives no time, a fitted phase is 0 s, or engines differ.
Diagnosis diagnose(const HardwareProfile& hw, const std::vector<DiagnosedRun>& runs, double noise_log = 0.0);

// One run, as above.
Diagnosis diagnose(const ModelSpec& model, const HardwareProfile& hw, const TrainConfig& config,
                   const ResourceLimits& limits, const MeasuredStep& measured, double noise_log = 0.0);

// The diagnosis put to the test: each run predicted on the machine diagnosed from the others
// (leave one run out), beside its prediction at the profile's speeds.
struct LeftOut {
  RunDiagnosis at_profile;          // measured and predicted at the profile's speeds
  ResourceFit from_others;          // the others' explanation (empty: nothing to explain)
  std::vector<double> diagnosed_s;  // its phases (at_profile.phases order) on that machine
};
std::vector<LeftOut> leave_one_out(const HardwareProfile& hw, const std::vector<DiagnosedRun>& runs, double noise_log);

}  // namespace stepcast
