// calibrate report: predicted against measured for every run (fit and held-out
// apart) and every micro-benchmark against its formula, as a table, JSON and an
// SVG plot; and the helpers fit shares with it.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "calibrate/micro_record.h"
#include "calibrate/run_record.h"
#include "model/hardware.h"

namespace stepcast::calibrate {

// One run's measured and predicted figures.
struct Row {
  const RunRecord* run;
  bool holdout;
  double pred_step, pred_std, pred_mem, pred_fwd, pred_bwd, pred_opt;
  double pred_alloc;  // the caching allocator's peak allocated (live) bytes, predicted
  double step_err() const { return pred_step / run->step_s - 1; }
  double mem_err() const { return run->gpu_peak_reserved_bytes > 0 ? pred_mem / run->gpu_peak_reserved_bytes - 1 : 0; }
};

std::vector<Row> predict_rows(const std::vector<RunRecord>& runs, const HardwareProfile& hw, double holdout_frac,
                              uint64_t seed);
nlohmann::json summarize(const std::vector<Row>& rows, bool holdout);
// For a profile that is not calibrated, whose every run is out of sample: the 95 % split-conformal
// quantile of |log(measured / predicted)| over each runs file's median step of each run (0 under
// kConformalMinScores), the largest world size among them, and each file's coverage by the
// quantile of the others' (leave one file out). `runs` are one engine's, as load_runs pools them
// (RunRecord::step_by_file). The source of [coefficients.held_out].
nlohmann::json held_out_interval(const std::vector<RunRecord>& runs, const HardwareProfile& hw);
nlohmann::json micro_summary(const std::vector<MicroRecord>& micro, const HardwareProfile& hw);
std::string svg_plot(const std::vector<Row>& rows, const std::string& title);

// Test-retest: how far each configuration's step time moves between the runs files that measured
// it (each file one call, often on another machine of the kind), over the configurations that
// two or more files measured. Per configuration: the spread, largest file median over smallest,
// less 1; and each file median's distance from the configuration's pooled median (step_s), the
// error a model exact on that median makes against one call. Summaries (mean, p90, max in %) for
// all such configurations and for the launch-bound and GPU-bound ones apart (`launch_bound_of`,
// the interval's classes); "runs" lists each, largest spread first. The floor under the
// cross-validated errors of the same configurations.
nlohmann::json repeatability_report(const std::vector<RunRecord>& runs,
                                    const std::function<bool(const RunRecord&)>& launch_bound_of);

// --runs as paths; InputError when it names none.
std::vector<std::filesystem::path> to_paths(const std::vector<std::string>& v);

// A written profile's provenance: today's date (UTC, YYYY-MM-DD), and the fnv1a64 of the
// files' bytes, concatenated in the order given.
std::string utc_date_today();
std::string fnv1a64_of_files(const std::vector<std::filesystem::path>& files);

// Run files as a profile names them (its [coefficients] runs and component_runs): absolute, or
// relative to the data folder.
std::vector<std::filesystem::path> profile_run_paths(const std::vector<std::string>& named,
                                                     const std::filesystem::path& data_dir);

// What needs the fit (calibrate/cross_validate.h, Ceres): an object whose members ("cv",
// "coefficients") join the report.
using CrossValidator = std::function<nlohmann::json(const std::vector<RunRecord>&, const std::vector<MicroRecord>&,
                                                    const HardwareProfile&)>;

// `calibrate report`: prints the table (or JSON), writes the SVG when `svg` is given, and,
// given `cross_validator`, the cross-validated accuracy. Runs are labelled fitted or held out by
// `split`, or without it by the split the profile's fit recorded. Returns the exit status.
int run_report(const std::vector<std::string>& run_files, const std::string& hw_name,
               std::optional<HoldoutSplit> split, const std::string& dir, bool json, const std::string& svg,
               const CrossValidator& cross_validator = nullptr, const std::string& engine = "stepcast");

}  // namespace stepcast::calibrate
