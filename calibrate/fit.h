// The Ceres fit of the cost model's coefficients to measured runs: the same
// templated step-time and memory formulas the planner evaluates, here on
// ceres::Jet. Residuals are log ratios (a 5 ms phase and a 5 s step weigh the
// same), a Cauchy loss tames stragglers, each coefficient stays within its
// physical bounds and is pulled weakly toward its prior (default) value so
// that directions the data cannot see stay where they were.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/coefficients.h"
#include "calibrate/micro_record.h"
#include "calibrate/run_record.h"
#include "model/hardware.h"
#include "model/step_features.h"

namespace stepcast::calibrate {

struct Observation {
  std::string key;
  Features features;
  // Measured; a value <= 0 means "not measured" and adds no residual.
  double step_s = 0, forward_s = 0, backward_s = 0, optimizer_s = 0, gpu_memory_bytes = 0;
  // The caching allocator's peak allocated, fitted beside the peak reserved where the features
  // count real allocations: our backend's runs. A peer's static terms hold its allocator's
  // reserve too (step_features.cpp: DeepSpeed's ZeRO-1/2 partition buffers), so its runs leave it 0.
  double gpu_allocated_bytes = 0;
  double host_bytes = 0;     // the rank-0 process's host high-water mark (RunRecord::host_peak_rss_bytes)
  bool peer_phases = false;  // timed by a peer engine's harness (step_time.h timed_phases)
};

// A measured run as the fit sees it (medians of its steps, features on `hw`).
Observation observation_of(const RunRecord& run, const HardwareProfile& hw);

// A coefficient measured by the component fit: the end-to-end fit keeps it near
// that value (relative width sigma) instead of near its default.
struct ComponentPrior {
  Coef coef;
  double value;
  double sigma;
};

struct FitOptions {
  std::vector<Coef> free;         // coefficients the fit may move; the rest stay fixed
  double sigma_step = 0.02;       // expected relative error of a step-time measurement
  double sigma_phase = 0.05;      // of a phase (forward, backward, optimizer)
  double sigma_memory = 0.02;     // of peak memory
  double sigma_prior = 0.5;       // width of the prior around the default value (relative)
  double sigma_micro = 0.03;      // expected relative error of a micro-benchmark against its formula
  // A kernel inside a training step runs beside other streams (NCCL, copies) and
  // on other data than alone: the end-to-end fit may move a component-fitted
  // coefficient by about this much (relative).
  double sigma_component = 0.1;
  std::vector<ComponentPrior> component_priors;
  double cauchy_scale = 2.0;      // robust loss scale, in units of sigma
  int max_iterations = 200;
};

struct FitResult {
  CoefVector coefs{};
  std::vector<double> std_errors;              // kNumCoefs, 0 for fixed coefficients
  std::vector<std::vector<double>> covariance; // kNumCoefs x kNumCoefs, 0 rows/columns for fixed
  bool covariance_ok = false;
  double model_error_frac = 0;  // RMS relative step-time residual on the fitted runs
  double initial_cost = 0, final_cost = 0;
  int iterations = 0;
  bool converged = false;
  std::string summary;  // Ceres' brief report
};

// The coefficients the H200 step runs identify; the default free set. The
// NVLink bus efficiency is not in it: step runs hide most communication and
// leave it unidentified (std error 0.36 on 0.81), so it keeps the value
// derived from nccl-tests (coefficients.cpp).
std::vector<Coef> default_free_coefs();

// Stage 1: the coefficients of each component (GEMM, attention, collectives,
// PCIe, CPU and GPU optimizers) from the micro-benchmarks alone, with the
// formulas of model/step_time.h. Free: every coefficient some record's formula
// reads (micro_coefs). `options.free` is ignored.
FitResult fit_components(const std::vector<MicroRecord>& micro, const HardwareProfile& hw, const CoefVector& start,
                         const FitOptions& options);

// The coefficients that set a component's speed (an efficiency, a bus or memory share, a
// per-lane rate) among those these records read: not its shape (a half-efficiency point) nor
// its fixed costs (a latency, a per-call overhead), which a few records place poorly and a
// ratio of two such fits magnifies (a half point near its bound).
std::vector<Coef> component_rate_coefs(const std::vector<MicroRecord>& micro);

// Stage 1 over `free` alone, every other coefficient held at `start`; each free coefficient's
// prior is centred on its start (options.sigma_prior wide).
FitResult fit_component_rates(const std::vector<MicroRecord>& micro, const HardwareProfile& hw, const CoefVector& start,
                              const std::vector<Coef>& free, const FitOptions& options);

// The coefficients stage 1 can measure from these records.
std::vector<Coef> component_coefs(const std::vector<MicroRecord>& micro);

// Stage 2 (end to end): the step runs; component-fitted coefficients enter
// through options.component_priors.
FitResult fit_coefficients(const std::vector<Observation>& observations, const CoefVector& start,
                           const FitOptions& options);

// The calibration: stage 1 on the micro-benchmarks (when there are any), then
// stage 2 on the step runs, with every component-fitted coefficient free and
// held near its component value (options.sigma_component); both from the
// default coefficients, so that the result depends on the data alone.
struct Calibration {
  std::optional<FitResult> components;  // stage 1
  std::vector<Coef> component_free;     // what stage 1 measured
  FitResult fit;                        // stage 2: the profile's coefficients
  FitOptions options;                   // as stage 2 ran (free set, priors)
};
// How many fitted configurations (and micro-benchmark records) inform each coefficient:
// those whose predicted step time, phases or memory move by more than 0.5 % when the
// coefficient doubles from `at` (or, where it is 0 there, goes to a fifth of its upper
// bound). A coefficient that moves no output this much is left to its prior.
struct CoefSupport {
  Coef coef;
  int configurations = 0;
  int micro_records = 0;
};
std::vector<CoefSupport> coefficient_support(const std::vector<Observation>& observations,
                                             const std::vector<MicroRecord>& micro, const HardwareProfile& hw,
                                             const std::vector<Coef>& free, const CoefVector& at);

// Coefficients that only runs in one regime inform (the host floor: launch-bound passes at
// small micro-batches; the fp32 GEMMs' efficiency: fp32 runs). Where no fitted run reaches that regime the prior holds them at
// their default, and check_identifiable does not ask for such runs; calibrate report
// shows how many configurations inform each coefficient.
bool is_regime_coef(Coef c);

// Throws InputError when the data cannot determine the coefficients the two-stage fit
// would move: a coefficient no configuration or micro-benchmark informs, or fewer
// configurations than the coefficients only the end-to-end fit determines. The message
// names them.
void check_identifiable(const std::vector<Observation>& observations, const std::vector<MicroRecord>& micro,
                        const HardwareProfile& hw);

Calibration calibrate_two_stage(const std::vector<Observation>& observations, const std::vector<MicroRecord>& micro,
                                const HardwareProfile& hw, FitOptions options = {});

// The engine coefficients a peer engine's runs identify (a subset of engine_coefs()): its
// model implementation's element-wise work, launch overheads and backward, its host copies and
// their overlap, its CPU optimizer's rate and fixed time, and its memory habits.
std::vector<Coef> engine_free_coefs();

// The fit of a profile for its engine (hw.engine): the two-stage hardware fit for Stepcast;
// for a peer engine only engine_free_coefs(), from the profile's values (the hardware's,
// under any earlier engine section), each pulled weakly toward the hardware's value.
Calibration calibrate_for_engine(const std::vector<Observation>& observations, const std::vector<MicroRecord>& micro,
                                 const HardwareProfile& hw);

// The profile that `cal` makes of `hw` (parsed back from the text a fit writes): its
// [coefficients] for Stepcast, its [engines.NAME] section for a peer, seen through for_engine.
HardwareProfile fitted_profile(const HardwareProfile& hw, const std::string& base_text, const Calibration& cal,
                               const CalibratedCoefficients& provenance);
std::string fitted_profile_text(const HardwareProfile& hw, const std::string& base_text, const Calibration& cal,
                                CalibratedCoefficients provenance);

}  // namespace stepcast::calibrate
