#include "calibrate/fit_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "calibrate/cross_validate.h"
#include "calibrate/fit.h"
#include "calibrate/measured_fit.h"
#include "calibrate/micro_record.h"
#include "calibrate/report.h"
#include "calibrate/run_record.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/text_file.h"
#include "common/hash.h"
#include "model/hardware.h"
#include "stepcast_git_commit.h"  // generated at every build (cmake/GitCommit.cmake)

namespace stepcast::calibrate {

namespace fs = std::filesystem;

int run_fit(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
            double holdout_frac, uint64_t seed, const std::string& dir, bool json, const std::string& engine) {
  check_holdout_split(HoldoutSplit{holdout_frac, seed}, "--holdout-frac");
  const auto files = to_paths(run_files);
  parse_engine(engine, "--engine");
  HardwareProfile hw = for_engine(resolve_hardware(hw_name, resolve_data_dir(dir)), engine);
  check_output_path(out_path.empty() ? hw.path : out_path);  // before the fit, not after it
  const auto runs = runs_of_engine(load_runs(files, resolve_data_dir(dir)), engine);
  // Micro-benchmarks alone (microbench on hardware no step run calibrates): its measured components.
  if (runs.empty() && engine == "stepcast" && !load_micro(files).empty())
    return run_measured_fit(run_files, hw_name, out_path, dir, json);
  std::vector<Observation> obs;
  size_t held = 0;
  for (const auto& r : runs) {
    if (is_holdout(r.key, holdout_frac, seed)) {
      ++held;
      continue;
    }
    obs.push_back(observation_of(r, hw));
  }
  if (obs.empty()) throw InputError("no runs of engine " + engine + " left to fit after the hold-out split");
  // A peer engine's fit moves only its engine coefficients: the micro-benchmarks are the hardware's.
  const auto micro = engine == "stepcast" ? load_micro(files) : std::vector<MicroRecord>{};
  if (engine == "stepcast") check_identifiable(obs, micro, hw);
  const auto t0 = std::chrono::steady_clock::now();
  if (!micro.empty())
    std::fprintf(stderr, "calibrate: stage 1, component fit on %zu micro-benchmarks ...\n", micro.size());
  std::fprintf(stderr, "calibrate: %send-to-end fit on %zu runs (%zu held out) from %zu files ...\n",
               micro.empty() ? "" : "stage 2, ", obs.size(), held, files.size());
  const Calibration cal = calibrate_for_engine(obs, micro, hw);
  const std::optional<FitResult>& components = cal.components;
  const FitResult& fit = cal.fit;
  const FitOptions& fo = cal.options;
  const double fit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Data hash: every runs file's bytes, in the order given.
  // The folders' superseded lists decide which records the fit saw: they are data too.
  std::vector<fs::path> hashed(files.begin(), files.end());
  for (const fs::path& list : superseded_lists(files)) hashed.push_back(list);
  const std::string data_hash = fnv1a64_of_files(hashed);
  const std::string date = utc_date_today();

  CalibratedCoefficients cc;
  cc.holdout = HoldoutSplit{holdout_frac, seed};
  // The planner flags plans whose micro-batch x sequence lies beyond the fitted runs.
  for (const auto& r : runs)
    if (!is_holdout(r.key, holdout_frac, seed))
      cc.max_micro_tokens = std::max(cc.max_micro_tokens, static_cast<double>(r.config.micro_batch * r.config.seq_len));
 // The files, as a later `calibrate report` without --runs finds them again.
  const fs::path data_dir = fs::weakly_canonical(resolve_data_dir(dir));
  for (const auto& f : files) {
    const fs::path full = fs::weakly_canonical(fs::absolute(f));
    const fs::path rel = full.lexically_relative(data_dir);
    cc.runs.push_back(!rel.empty() && *rel.begin() != ".." ? rel.string() : full.string());
  }
  cc.source = "calibrate fit " + std::string(date) + ", git " + STEPCAST_GIT_COMMIT + ", runs fnv1a64:" +
              data_hash + " (" + std::to_string(obs.size()) + " fitted, " + std::to_string(held) +
              " held out, seed " + std::to_string(seed) + "; " + std::to_string(micro.size()) +
              " micro-benchmarks in the component fit); " + fit.summary;
  // The interval the profile will print: conformal quantiles of this fit's own cross-validation.
  {
    std::vector<RunRecord> fitted_runs;
    for (const auto& r : runs)
      if (!is_holdout(r.key, holdout_frac, seed)) fitted_runs.push_back(r);
    if (fitted_runs.size() >= 3) cc.interval = interval_model(fitted_runs, micro, hw);
    cc.std_errors = bootstrap_std_errors(fitted_runs, micro, hw);
  }
  const std::string text = fitted_profile_text(hw, read_text_file(hw.path), cal, cc);
  const std::string target = out_path.empty() ? hw.path : out_path;
  parse_hardware_profile(text, target);  // what we write must read back
  write_file_atomic(target, text);

  // Accuracy of the new profile, fit and held-out runs apart.
  HardwareProfile fitted = for_engine(parse_hardware_profile(text, target), engine);
  const auto rows = predict_rows(runs, fitted, holdout_frac, seed);
  nlohmann::json report = {{"profile", target},
                           {"fit_wall_s", fit_s},
                           {"converged", fit.converged},
                           {"initial_cost", fit.initial_cost},
                           {"final_cost", fit.final_cost},
                           {"summary", fit.summary},
                           {"fit", summarize(rows, false)},
                           {"holdout", summarize(rows, true)}};
  // How many fitted configurations and micro-benchmarks inform each coefficient.
  const std::vector<CoefSupport> support = coefficient_support(obs, micro, hw, fo.free, fit.coefs);
  const auto support_of = [&](Coef c) {
    for (const CoefSupport& s : support)
      if (s.coef == c) return s;
    return CoefSupport{c};
  };
  nlohmann::json coefs = nlohmann::json::object();
  for (Coef c : fo.free)
    coefs[std::string(coef_table()[c].name)] = {{"value", fit.coefs[c]},
                                                {"std_error", cc.std_errors.empty() ? fit.std_errors[c] : cc.std_errors[c]},
                                                {"covariance_std_error", fit.std_errors[c]},
                                                {"default", coef_table()[c].default_value},
                                                {"informing_configurations", support_of(c).configurations},
                                                {"informing_micro_records", support_of(c).micro_records}};
  report["coefficients"] = coefs;
  if (components) {
    nlohmann::json comp = nlohmann::json::object();
    for (Coef c : cal.component_free)
      comp[std::string(coef_table()[c].name)] = {{"value", components->coefs[c]}, {"std_error", components->std_errors[c]},
                                                 {"end_to_end", fit.coefs[c]}};
    report["components"] = {{"micro_benchmarks", micro.size()},
                            {"rms_log_error", components->model_error_frac},
                            {"summary", components->summary},
                            {"coefficients", comp},
                            {"by_bench", micro_summary(micro, fitted)}};
  }
  if (json) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::printf("calibrated profile written to %s (%.2f s, %s)\n", target.c_str(), fit_s, fit.summary.c_str());
    std::printf("(std error: over %d bootstrap refits; covariance: the fit's own, which understates it)\n",
                kBootstrapRefits);
    std::printf("%-28s %12s %12s %12s %12s %8s %8s\n", "coefficient", "default", "fitted", "std error", "covariance",
                "configs", "micro");
    for (Coef c : fo.free)
      std::printf("%-28s %12.4g %12.4g %12.3g %12.3g %8d %8d\n", std::string(coef_table()[c].name).c_str(),
                  coef_table()[c].default_value, fit.coefs[c], cc.std_errors.empty() ? 0.0 : cc.std_errors[c],
                  fit.std_errors[c], support_of(c).configurations, support_of(c).micro_records);
    if (components) {
      std::printf("stage 1 (components, %zu micro-benchmarks, RMS error %.1f %%): %s\n", micro.size(),
                  100 * components->model_error_frac, components->summary.c_str());
      std::printf("%-28s %12s %12s %12s\n", "coefficient", "micro fit", "std error", "end to end");
      for (Coef c : cal.component_free)
        std::printf("%-28s %12.4g %12.3g %12.4g\n", std::string(coef_table()[c].name).c_str(), components->coefs[c],
                    components->std_errors[c], fit.coefs[c]);
    }
    std::printf("fit runs: %s\nheld out: %s\n", report["fit"].dump().c_str(), report["holdout"].dump().c_str());
  }
  return 0;
}

}  // namespace stepcast::calibrate
