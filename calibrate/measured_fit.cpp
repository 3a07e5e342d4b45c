#include "calibrate/measured_fit.h"

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "calibrate/report.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/text_file.h"
#include "model/model_spec.h"
#include "model/toml_edit.h"
#include "stepcast_git_commit.h"  // generated at every build (cmake/GitCommit.cmake)

namespace stepcast::calibrate {

namespace fs = std::filesystem;

void check_micro_devices(const std::vector<MicroRecord>& micro) {
  for (const MicroRecord& r : micro)
    if (times_gpu(r.bench) && r.device == "cpu")
      throw InputError(r.where + ": key \"bench\" = \"" + micro_bench_name(r.bench) +
                       "\" was timed on device \"cpu\" (its micro_env line): it measures nothing of a GPU; run "
                       "microbench on the GPU host (--device cuda), or keep only --suite optimizer");
}

bool is_host_component(Coef c) {
  return c == kPcieEffFrac || c == kCpuCoreBytesPerSPerLane || c == kCpuLaneFlopsPerS || c == kCpuDramEffFrac;
}

MeasuredFit measure_components(const std::vector<MicroRecord>& micro, const HardwareProfile& hw,
                               const std::vector<MicroRecord>& ref_micro, const HardwareProfile& ref) {
  check_micro_devices(micro);
  check_micro_devices(ref_micro);
  MeasuredFit out;
  const std::vector<Coef> here = component_rate_coefs(micro), there = component_rate_coefs(ref_micro);
  // On the reference's GPU kind the GPU's components differ between hosts by the micro fits'
  // noise (GEMM +2.8 % on one H200 host against the reference's: the step error of its runs
  // 2.6 -> 3.8 %; docs/calibration.md): the reference's end-to-end fit of them stands.
  const bool same_gpu = hw.gpu.name == ref.gpu.name;
  for (Coef c : here) {
    if (same_gpu && !is_host_component(c))
      out.same_gpu.push_back(c);
    else
      (std::find(there.begin(), there.end(), c) != there.end() ? out.coefs : out.only_here).push_back(c);
  }
  if (out.coefs.empty() && !out.same_gpu.empty())
    throw InputError("--runs: the micro-benchmarks time only the GPU, which is " + ref.name + "'s kind (" +
                     ref.gpu.name + "): time the host too (microbench --suite optimizer,offload)");
  if (out.coefs.empty())
    throw InputError("--runs: the micro-benchmarks measure no component that " + ref.name +
                     "'s micro-benchmarks measure too (its [coefficients] runs), so no ratio can be taken");
  // The reference's component fit from the defaults, as the two-stage fit does; then this
  // hardware's rates from there, its shapes and fixed costs held at the reference's. A host
  // unlike the reference may run at several times or a fraction of its rates: the rates' prior
  // is a factor of several wide (sigma 5), there only to hold a rate no record reads.
  const FitOptions options;
  out.reference = fit_components(ref_micro, ref, default_coefs(), options);
  FitOptions rate_options;
  rate_options.sigma_prior = 5.0;
  out.here = fit_component_rates(micro, hw, out.reference.coefs, out.coefs, rate_options);
  out.measured.reference = ref.name;
  for (Coef c : out.coefs) out.measured.rel[c] = out.here.coefs[c] / out.reference.coefs[c];
  return out;
}

namespace {

// A file as the profile names it: relative to the data folder where inside it (as fit_command does).
std::string as_named(const fs::path& file, const fs::path& data_dir) {
  const fs::path full = fs::weakly_canonical(fs::absolute(file));
  const fs::path rel = full.lexically_relative(fs::weakly_canonical(data_dir));
  return !rel.empty() && *rel.begin() != ".." ? rel.string() : full.string();
}

int records_reading(const std::vector<MicroRecord>& micro, Coef c) {
  int n = 0;
  for (const MicroRecord& r : micro) {
    const std::vector<Coef> cs = micro_coefs(r);
    n += std::find(cs.begin(), cs.end(), c) != cs.end();
  }
  return n;
}

}  // namespace

int run_measured_fit(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
                     const std::string& dir, bool json) {
  const fs::path data_dir = resolve_data_dir(dir);
  const auto files = to_paths(run_files);
  const HardwareProfile hw = resolve_hardware(hw_name, data_dir);
  check_output_path(out_path.empty() ? hw.path : out_path);  // before the fit, not after it
  const std::vector<MicroRecord> micro = load_micro(files);
  // The reference: this profile where its end-to-end fit is its own, else the calibrated one it
  // takes its engines from.
  // Both as their files hold them: an earlier [coefficients.measured] does not enter the base.
  const HardwareProfile ref = hw.coefs_calibrated ? load_hardware_profile(hw.path) : [&] {
    if (hw.engines_from.empty())
      throw InputError(hw.path + ": key 'coefficients.engines_from' is missing: a profile that is not calibrated "
                       "needs a calibrated reference to take its measured components against");
    return load_hardware_profile(data_dir / "hardware" / (hw.engines_from + ".toml"));
  }();
  if (ref.calibration_runs.empty())
    throw InputError(ref.path + ": [coefficients] names no runs (key 'runs'): its micro-benchmarks cannot be found");
  std::vector<fs::path> ref_files = profile_run_paths(ref.calibration_runs, data_dir);
  for (const fs::path& p : profile_run_paths(ref.component_runs, data_dir)) ref_files.push_back(p);
  const std::vector<MicroRecord> ref_micro = load_micro(ref_files);
  if (ref_micro.empty())
    throw InputError(ref.path + ": the runs its [coefficients] name hold no micro-benchmarks to compare with");
  // Two component fits of a few hundred records: well under a second, no progress to show.
  MeasuredFit m = measure_components(micro, hw, ref_micro, ref);

  char fit_text[160];
  std::snprintf(fit_text, sizeof fit_text, "component fit RMS %.1f %% here, %.1f %% on %zu of %s's", 100 * m.here.model_error_frac,
                100 * m.reference.model_error_frac, ref_micro.size(), ref.name.c_str());
  m.measured.source = "calibrate fit " + utc_date_today() + ", git " + STEPCAST_GIT_COMMIT + ", " +
                      std::to_string(micro.size()) + " micro-benchmarks fnv1a64:" + fnv1a64_of_files(files) + "; " + fit_text;
  for (const auto& f : files) m.measured.runs.push_back(as_named(f, data_dir));
  const std::string target = out_path.empty() ? hw.path : out_path;
  std::string text = with_measured_components(read_text_file(hw.path), m.measured);
  // The host's pageable copy rate is the host's own number, measured here, not a ratio.
  const double pageable_bps = pageable_copy_bytes_per_s(micro);
  if (pageable_bps > 0.0) {
    // The files that hold pageable copies, by name (a record's `where` is "file:line").
    std::string holding;
    for (const auto& f : files) {
      const std::string prefix = f.string() + ":";
      std::vector<MicroRecord> of_file;
      std::copy_if(micro.begin(), micro.end(), std::back_inserter(of_file),
                   [&](const MicroRecord& r) { return r.where.starts_with(prefix); });
      if (pageable_copy_bytes_per_s(of_file) > 0.0) holding += (holding.empty() ? "" : ", ") + as_named(f, data_dir);
    }
    char value[640];
    std::snprintf(value, sizeof value,
                  "{ value = %.4g, source = \"microbench --suite offload: median of the h2d_pageable and d2h_pageable "
                  "records of 16 MiB and up in %s (calibrate fit %s)\" }",
                  pageable_bps, holding.c_str(), utc_date_today().c_str());
    upsert_toml_key(text, "host", "pageable_bytes_per_s", value, hw.path);
  }
  parse_hardware_profile(text, target);  // what we write must read back
  write_file_atomic(target, text);

  if (json) {
    nlohmann::json coefs = nlohmann::json::object();
    for (Coef c : m.coefs)
      coefs[std::string(coef_table()[c].name)] = {{"here", m.here.coefs[c]},
                                                  {"reference", m.reference.coefs[c]},
                                                  {"rel", m.measured.rel.at(c)},
                                                  {"reference_profile_value", ref.coefs[c]},
                                                  {"informing_micro_records", records_reading(micro, c)}};
    nlohmann::json left = nlohmann::json::array(), same = nlohmann::json::array();
    for (Coef c : m.only_here) left.push_back(coef_table()[c].name);
    for (Coef c : m.same_gpu) same.push_back(coef_table()[c].name);
    const nlohmann::json report = {{"profile", target},
                                   {"reference", ref.name},
                                   {"micro_records", micro.size()},
                                   {"reference_micro_records", ref_micro.size()},
                                   {"rms_log_error", m.here.model_error_frac},
                                   {"reference_rms_log_error", m.reference.model_error_frac},
                                   {"coefficients", coefs},
                                   {"not_on_reference", left},
                                   {"same_gpu_as_reference", same}};
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  std::printf("measured components written to %s ([coefficients.measured], against %s)\n", target.c_str(), ref.name.c_str());
  std::printf("%s\n", fit_text);
  std::printf("%-32s %12s %12s %8s %14s %8s\n", "coefficient", "here", "reference", "ratio", "used (x ratio)", "records");
  for (Coef c : m.coefs)
    std::printf("%-32s %12.4g %12.4g %8.3f %14.4g %8d\n", std::string(coef_table()[c].name).c_str(), m.here.coefs[c],
                m.reference.coefs[c], m.measured.rel.at(c),
                std::clamp(ref.coefs[c] * m.measured.rel.at(c), coef_table()[c].lower, coef_table()[c].upper),
                records_reading(micro, c));
  for (Coef c : m.only_here)
    std::printf("%-32s not measured on %s: left at its value\n", std::string(coef_table()[c].name).c_str(), ref.name.c_str());
  for (Coef c : m.same_gpu)
    std::printf("%-32s the reference's GPU kind (%s): its end-to-end fit stands\n", std::string(coef_table()[c].name).c_str(),
                ref.gpu.name.c_str());
  return 0;
}

}  // namespace stepcast::calibrate
