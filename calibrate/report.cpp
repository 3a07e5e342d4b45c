#include "calibrate/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/stats.h"
#include "common/text_file.h"
#include "common/units.h"
#include "model/prediction.h"

namespace stepcast::calibrate {

namespace fs = std::filesystem;

// The text table lists this many of the worst leave-one-configuration-out predictions.
constexpr size_t kLocoRowsShown = 10;
// ... and this many of the configurations whose calls disagree most.
constexpr size_t kRepeatRowsShown = 5;

std::vector<Row> predict_rows(const std::vector<RunRecord>& runs, const HardwareProfile& hw, double holdout_frac,
                              uint64_t seed) {
  std::vector<Row> rows;
  for (const auto& r : runs) {
    Prediction p = evaluate(r.model, hw, r.config);
    const TimedPhases<double> ph = timed_phases(p.time, r.config.engine != Engine::kStepcast);
    rows.push_back({&r, is_holdout(r.key, holdout_frac, seed), p.time.step_s, p.step_std_s, p.memory.gpu_total_bytes,
                    ph.forward_s, ph.backward_s, ph.optimizer_s, p.memory.gpu_allocated_bytes});
  }
  return rows;
}

nlohmann::json summarize(const std::vector<Row>& rows, bool holdout) {
  double sum = 0, mx = 0, msum = 0, mmx = 0, inside = 0, asum = 0, amx = 0;
  int n = 0, nm = 0, na = 0;
  for (const auto& r : rows) {
    if (r.holdout != holdout) continue;
    ++n;
    sum += std::abs(r.step_err());
    mx = std::max(mx, std::abs(r.step_err()));
    if (r.pred_std > 0 && std::abs(r.pred_step - r.run->step_s) <= 1.96 * r.pred_std) ++inside;
    if (r.run->gpu_peak_reserved_bytes > 0) {
      ++nm;
      msum += std::abs(r.mem_err());
      mmx = std::max(mmx, std::abs(r.mem_err()));
    }
    if (r.run->gpu_peak_allocated_bytes > 0 && r.pred_alloc > 0) {
      const double e = std::abs(r.pred_alloc / r.run->gpu_peak_allocated_bytes - 1);
      ++na;
      asum += e;
      amx = std::max(amx, e);
    }
  }
  return {{"runs", n},
          {"step_time_mean_abs_pct_error", n ? 100 * sum / n : 0.0},
          {"step_time_max_abs_pct_error", 100 * mx},
          {"peak_memory_mean_abs_pct_error", nm ? 100 * msum / nm : 0.0},
          {"peak_memory_max_abs_pct_error", 100 * mmx},
          // The caching allocator's peak allocated (live) bytes, where the records hold it: the
          // peers are fitted on the reserved peak alone, so for them this is a prediction.
          {"peak_allocated_runs", na},
          {"peak_allocated_mean_abs_pct_error", na ? 100 * asum / na : 0.0},
          {"peak_allocated_max_abs_pct_error", 100 * amx},
          {"inside_95_interval_frac", n ? inside / n : 0.0}};
}

// Micro-benchmarks against their component formulas, by benchmark kind.
nlohmann::json micro_summary(const std::vector<MicroRecord>& micro, const HardwareProfile& hw) {
  nlohmann::json out = nlohmann::json::object();
  for (int b = 0; b < kNumMicroBenches; ++b) {
    double sum = 0, mx = 0;
    int n = 0;
    for (const auto& r : micro) {
      if (static_cast<int>(r.bench) != b) continue;
      const double predicted = predict_micro(r, hw, hw.coefs.data());
      if (!std::isfinite(predicted)) continue;  // a rate the profile does not give (pageable copies)
      const double e = std::abs(predicted / r.seconds - 1);
      sum += e;
      mx = std::max(mx, e);
      ++n;
    }
    if (n)
      out[micro_bench_name(static_cast<MicroBench>(b))] = {
          {"records", n}, {"mean_abs_pct_error", 100 * sum / n}, {"max_abs_pct_error", 100 * mx}};
  }
  return out;
}

// Predicted against measured step time, log-log, fit and held-out runs marked.
std::string svg_plot(const std::vector<Row>& rows, const std::string& title) {
  double lo = 1e300, hi = 0;
  for (const auto& r : rows) {
    lo = std::min({lo, r.run->step_s, r.pred_step});
    hi = std::max({hi, r.run->step_s, r.pred_step});
  }
  // load_runs admits only positive, finite step times; the model predicts positive ones.
  STEPCAST_ASSERT(lo > 0 && std::isfinite(hi) && lo <= hi);
  lo = std::log10(lo) - 0.1;
  hi = std::log10(hi) + 0.1;
  const double W = 520, H = 520, M = 60;
  auto px = [&](double v) { return M + (std::log10(v) - lo) / (hi - lo) * (W - 2 * M); };
  auto py = [&](double v) { return H - M - (std::log10(v) - lo) / (hi - lo) * (H - 2 * M); };
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>\n";
  s << "<rect width='100%' height='100%' fill='white'/>\n";
  s << "<text x='" << W / 2 << "' y='20' text-anchor='middle'>" << title << "</text>\n";
  s << "<line x1='" << px(std::pow(10, lo)) << "' y1='" << py(std::pow(10, lo)) << "' x2='" << px(std::pow(10, hi))
    << "' y2='" << py(std::pow(10, hi)) << "' stroke='#888' stroke-dasharray='4'/>\n";
  for (int e = static_cast<int>(std::ceil(lo)); e <= static_cast<int>(std::floor(hi)); ++e) {
    const double v = std::pow(10, e);
    s << "<text x='" << px(v) << "' y='" << H - M + 18 << "' text-anchor='middle'>" << v << " s</text>\n";
    s << "<text x='" << M - 6 << "' y='" << py(v) + 4 << "' text-anchor='end'>" << v << " s</text>\n";
  }
  s << "<text x='" << W / 2 << "' y='" << H - 12 << "' text-anchor='middle'>measured step time</text>\n";
  s << "<text x='14' y='" << H / 2 << "' transform='rotate(-90 14 " << H / 2 << ")' text-anchor='middle'>predicted step time</text>\n";
  for (const auto& r : rows) {
    s << "<circle cx='" << px(r.run->step_s) << "' cy='" << py(r.pred_step) << "' r='5' fill='"
      << (r.holdout ? "#d62728" : "#1f77b4") << "'><title>" << r.run->key << "</title></circle>\n";
  }
  s << "<circle cx='" << M + 10 << "' cy='40' r='5' fill='#1f77b4'/><text x='" << M + 20 << "' y='44'>fit</text>\n";
  s << "<circle cx='" << M + 60 << "' cy='40' r='5' fill='#d62728'/><text x='" << M + 70 << "' y='44'>held out</text>\n";
  s << "</svg>\n";
  return s.str();
}

nlohmann::json repeatability_report(const std::vector<RunRecord>& runs,
                                    const std::function<bool(const RunRecord&)>& launch_bound_of) {
  struct Repeat {
    const RunRecord* run;
    bool launch_bound;
    double spread_frac;
    std::vector<double> steps_s;   // each file's median step
    std::vector<double> dev_frac;  // |file median / pooled median - 1|, one per file
  };
  std::vector<Repeat> repeats;
  for (const RunRecord& r : runs) {
    if (r.step_by_file.size() < 2 || !(r.step_s > 0)) continue;
    std::vector<double> steps_s = step_measurements_s(r);
    const auto [lo, hi] = std::minmax_element(steps_s.begin(), steps_s.end());
    if (!(*lo > 0)) continue;
    Repeat rep{&r, launch_bound_of(r), *hi / *lo - 1, {}, {}};
    for (double m : steps_s) rep.dev_frac.push_back(std::abs(m / r.step_s - 1));
    rep.steps_s = std::move(steps_s);
    repeats.push_back(std::move(rep));
  }
  const auto summary = [&](int cls) {  // cls: -1 all, 0 GPU-bound, 1 launch-bound
    std::vector<double> spread, dev;
    for (const Repeat& rep : repeats) {
      if (cls >= 0 && rep.launch_bound != (cls == 1)) continue;
      spread.push_back(rep.spread_frac);
      dev.insert(dev.end(), rep.dev_frac.begin(), rep.dev_frac.end());
    }
    const MeanP90Max s = mean_p90_max(spread, 100.0), d = mean_p90_max(dev, 100.0);
    return nlohmann::json{{"configurations", spread.size()},
                          {"measurements", dev.size()},
                          {"step_time_spread_mean_pct", s.mean},
                          {"step_time_spread_p90_pct", s.p90},
                          {"step_time_spread_max_pct", s.max},
                          {"step_time_call_mean_abs_pct_dev", d.mean},
                          {"step_time_call_max_abs_pct_dev", d.max}};
  };
  nlohmann::json out = summary(-1);
  out["gpu_bound"] = summary(0);
  out["launch_bound"] = summary(1);
  std::stable_sort(repeats.begin(), repeats.end(),
                   [](const Repeat& a, const Repeat& b) { return a.spread_frac > b.spread_frac; });
  out["runs"] = nlohmann::json::array();
  for (const Repeat& rep : repeats)
    out["runs"].push_back({{"key", rep.run->key},
                           {"launch_bound", rep.launch_bound},
                           {"step_s", rep.run->step_s},
                           {"step_s_by_file", rep.steps_s},
                           {"spread_pct", 100 * rep.spread_frac}});
  return out;
}

std::vector<fs::path> to_paths(const std::vector<std::string>& v) {
  std::vector<fs::path> out(v.begin(), v.end());
  if (out.empty()) throw InputError("--runs names no file");
  return out;
}

std::string utc_date_today() {
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
  return date;
}

std::string fnv1a64_of_files(const std::vector<fs::path>& files) {
  std::string all;
  for (const auto& f : files) all += read_text_file(f);
  return fnv1a64_hex(all);
}

std::vector<fs::path> profile_run_paths(const std::vector<std::string>& named, const fs::path& data_dir) {
  std::vector<fs::path> out;
  for (const std::string& r : named) out.push_back(fs::path(r).is_absolute() ? fs::path(r) : data_dir / r);
  return out;
}


nlohmann::json held_out_interval(const std::vector<RunRecord>& runs, const HardwareProfile& hw) {
  // Each runs file is one call: its configurations' median steps, each a prediction made before
  // it ran (the profile is not fitted on any run). Files in the order they were loaded.
  std::vector<std::string> file_order;
  std::map<std::string, std::vector<double>> scores_of;
  int64_t world_size_max = 0;
  for (const RunRecord& r : runs) {
    const double predicted_s = evaluate(r.model, hw, r.config).time.step_s;
    world_size_max = std::max<int64_t>(world_size_max, r.config.world_size());
    for (const RunRecord::FileStep& f : r.step_by_file) {
      auto [it, added] = scores_of.try_emplace(f.file);
      if (added) file_order.push_back(f.file);
      it->second.push_back(std::abs(std::log(f.step_s / predicted_s)));
    }
  }
  std::vector<std::vector<double>> by_file;
  for (const std::string& f : file_order) by_file.push_back(std::move(scores_of[f]));
  std::vector<double> all;
  for (const auto& s : by_file) all.insert(all.end(), s.begin(), s.end());
  const bool enough = all.size() >= kConformalMinScores;
  // Leave one file out: each call's predictions against the quantile of the others'.
  int tested = 0, covered = 0, files_tested = 0;
  for (size_t i = 0; i < by_file.size(); ++i) {
    std::vector<double> rest;
    for (size_t k = 0; k < by_file.size(); ++k)
      if (k != i) rest.insert(rest.end(), by_file[k].begin(), by_file[k].end());
    if (by_file[i].empty() || rest.size() < kConformalMinScores) continue;
    const double q = conformal_q95(rest);
    ++files_tested;
    for (double v : by_file[i]) {
      ++tested;
      covered += v <= q ? 1 : 0;
    }
  }
  return {{"predictions", all.size()},
          {"files", by_file.size()},
          {"log_q95", enough ? conformal_q95(all) : 0.0},
          {"world_size_max", world_size_max},
          {"leave_one_file_out", {{"files", files_tested}, {"predictions", tested},
                                  {"coverage_95", tested ? static_cast<double>(covered) / tested : 0.0}}}};
}

int run_report(const std::vector<std::string>& run_files, const std::string& hw_name,
               std::optional<HoldoutSplit> split, const std::string& dir, bool json, const std::string& svg,
               const CrossValidator& cross_validator, const std::string& engine) {
  if (split) check_holdout_split(*split, "--holdout-frac");
  if (!svg.empty()) check_output_path(svg);
  parse_engine(engine, "--engine");
  HardwareProfile hw = for_engine(resolve_hardware(hw_name, resolve_data_dir(dir)), engine);
  // The "fit"/"held" labels: the split given, else the one the profile's fit recorded, else the
  // fit's default for a profile written before the split was recorded.
  if (!split) split = hw.calibration_holdout.frac >= 0 ? hw.calibration_holdout : kDefaultHoldoutSplit;
  const double holdout_frac = split->frac;
  const uint64_t seed = split->seed;
  // Without --runs: the runs the profile says it was fitted from.
  if (run_files.empty() && hw.calibration_runs.empty())
    throw InputError(hw.path + ": " + (engine == "stepcast" ? "[coefficients]" : "[engines." + engine + "]") +
                     " names no runs (key 'runs'); give --runs FILE...");
  const auto files =
      run_files.empty() ? profile_run_paths(hw.calibration_runs, resolve_data_dir(dir)) : to_paths(run_files);
  const auto runs = runs_of_engine(load_runs(files, resolve_data_dir(dir)), engine);
  // Our engine's components are the micro-benchmarks; DeepSpeed's own are its staged copies
  // (predicted at its section's rates); FSDP2 has none.
  std::vector<MicroRecord> micro;
  if (engine != "fsdp2")
    for (const MicroRecord& r : load_micro(files))
      if (is_staged_copy(r.bench) == (engine == "deepspeed")) micro.push_back(r);
  if (runs.empty() && micro.empty())
    throw InputError("--runs: no step runs of engine " + engine + " and no micro-benchmarks in the files given");
  const auto rows = predict_rows(runs, hw, holdout_frac, seed);
  if (!svg.empty() && !rows.empty())
    write_file_atomic(svg, svg_plot(rows, hw.name + (hw.coefs_calibrated ? " (calibrated)" : " (not calibrated)") +
                                              ": predicted vs measured step time"));
  nlohmann::json j = {{"hardware", hw.name},
                      {"engine", engine},
                      {"calibrated", hw.coefs_calibrated},
                      {"holdout_frac", holdout_frac},
                      {"holdout_seed", seed},
                      {"fit", summarize(rows, false)},
                      {"holdout", summarize(rows, true)},
                      {"runs", nlohmann::json::array()},
                      {"micro", {{"by_bench", micro_summary(micro, hw)}, {"records", nlohmann::json::array()}}}};
  if (!hw.coefs_calibrated) j["held_out_interval"] = held_out_interval(runs, hw);
  j["repeatability"] = repeatability_report(
      runs, [&](const RunRecord& r) { return launch_bound(evaluate(r.model, hw, r.config).time.host_issue_ratio); });
  if (cross_validator && runs.size() >= 2) j.update(cross_validator(runs, micro, hw));
  for (const auto& r : micro)
    j["micro"]["records"].push_back({{"bench", micro_bench_name(r.bench)},
                                     {"label", r.label()},
                                     {"measured_s", r.seconds},
                                     {"predicted_s", predict_micro(r, hw, hw.coefs.data())}});
  for (const auto& r : rows) {
    j["runs"].push_back({{"key", r.run->key},
                         {"holdout", r.holdout},
                         {"steps", r.run->steps},
                         {"measured", {{"step_s", r.run->step_s}, {"forward_s", r.run->forward_s},
                                       {"backward_s", r.run->backward_s}, {"optimizer_s", r.run->optimizer_total_s},
                                       {"gpu_peak_reserved_bytes", r.run->gpu_peak_reserved_bytes},
                                       {"gpu_peak_allocated_bytes", r.run->gpu_peak_allocated_bytes}}},
                         {"predicted", {{"step_s", r.pred_step}, {"step_std_s", r.pred_std}, {"forward_s", r.pred_fwd},
                                        {"backward_s", r.pred_bwd}, {"optimizer_s", r.pred_opt},
                                        {"gpu_memory_bytes", r.pred_mem}, {"gpu_peak_allocated_bytes", r.pred_alloc}}},
                         {"step_error_pct", 100 * r.step_err()},
                         {"memory_error_pct", 100 * r.mem_err()}});
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s (%s): predicted vs measured, %zu runs; set: the fit's hash split, %g held out (seed %llu)\n",
              hw.name.c_str(), hw.coefs_calibrated ? "calibrated" : "not calibrated", rows.size(), holdout_frac,
              static_cast<unsigned long long>(seed));
  std::printf("%-62s %4s %8s %8s %6s %8s %8s %8s %6s\n", "run", "set", "meas", "pred", "±95%", "err", "mem", "pred", "err");
  std::printf("%-62s %4s %8s %8s %6s %8s %8s %8s %6s\n", "", "", "s", "s", "s", "%", "GiB", "GiB", "%");
  for (const auto& r : rows)
    std::printf("%-62s %4s %8.3f %8.3f %6.3f %+8.1f %8.1f %8.1f %+6.1f\n", r.run->key.c_str(), r.holdout ? "held" : "fit",
                r.run->step_s, r.pred_step, 1.96 * r.pred_std, 100 * r.step_err(), r.run->gpu_peak_reserved_bytes / kBytesPerGiB,
                r.pred_mem / kBytesPerGiB, 100 * r.mem_err());
  std::printf("fit:      %s\nheld out: %s\n", j["fit"].dump().c_str(), j["holdout"].dump().c_str());
  if (j.contains("held_out_interval")) {
    // Not calibrated: every run here was predicted without it, so each is out of sample.
    const nlohmann::json& h = j["held_out_interval"];
    const double q = h["log_q95"].get<double>();
    const nlohmann::json& lofo = h["leave_one_file_out"];
    std::printf("\nnot calibrated, so every run is out of sample: %d predictions from %d files, world size <= %d;\n",
                h["predictions"].get<int>(), h["files"].get<int>(), h["world_size_max"].get<int>());
    if (q > 0)
      std::printf("95 %% conformal quantile of |log(measured / predicted)| %.4f (±%.1f %%); each file against the "
                  "others' quantile: %.0f %% of %d predictions inside (%d files)\n",
                  q, 100 * std::expm1(q), 100 * lofo["coverage_95"].get<double>(), lofo["predictions"].get<int>(),
                  lofo["files"].get<int>());
    else
      std::printf("fewer than %zu predictions: no 95 %% conformal quantile\n", kConformalMinScores);
  }
  if (j.contains("cv")) {
    const nlohmann::json& cv = j["cv"];
    std::printf("\ncross-validated (each fold refitted without the runs it predicts):\n");
    // The first column is as wide as the longest group's name (file= groups run past 34).
    int name_w = 34;
    for (const auto& g : cv["groups"]) name_w = std::max(name_w, static_cast<int>(g["name"].get<std::string>().size()));
    std::printf("%-*s %7s %9s %9s %9s %9s %9s %9s %9s %9s %11s\n", name_w, "held out", "configs", "step mean", "step p90",
                "step max", "mem mean", "mem max", "host mean", "host max", "cover 95", "its 95 %");
    std::printf("%-*s %7s %9s %9s %9s %9s %9s %9s %9s %9s %11s\n", name_w, "", "", "%", "%", "%", "%", "%", "%", "%", "%",
                "(Wilson) %");
    const auto line = [name_w](const std::string& name, const nlohmann::json& s) {
      const nlohmann::json& ci = s["coverage_95_wilson_95"];
      const std::string verdict = s["coverage_95_verdict"].get<std::string>();
      std::printf("%-*s %7d %9.1f %9.1f %9.1f %9.2f %9.2f %9.2f %9.2f %9.0f %5.0f-%-5.0f%s\n", name_w, name.c_str(),
                  s["configurations"].get<int>(), s["step_time_mean_abs_pct_error"].get<double>(),
                  s["step_time_p90_abs_pct_error"].get<double>(), s["step_time_max_abs_pct_error"].get<double>(),
                  s["peak_memory_mean_abs_pct_error"].get<double>(), s["peak_memory_max_abs_pct_error"].get<double>(),
                  s["host_memory_mean_abs_pct_error"].get<double>(), s["host_memory_max_abs_pct_error"].get<double>(),
                  100 * s["coverage_95"].get<double>(), 100 * ci[0].get<double>(), 100 * ci[1].get<double>(),
                  verdict == "below" ? " below 95" : verdict == "above" ? " above 95" : "");
    };
    line("each configuration (LOCO)", cv["loco"]);
    // The interval's two classes (Mondrian conformal): host issue time >= kLaunchBoundIssueRatio x GPU time, or not.
    line("  of them GPU-bound", cv["loco"]["gpu_bound"]);
    line("  of them launch-bound", cv["loco"]["launch_bound"]);
    for (const auto& g : cv["groups"]) line(g["name"].get<std::string>(), g);
    // A group's coverage rests on its few measurements: below the level means its Wilson interval
    // excludes 95 %, not only that the measured share is under it.
    int below = 0, above = 0, groups = 0;
    for (const auto& g : cv["groups"]) {
      ++groups;
      below += g["coverage_95_verdict"] == "below";
      above += g["coverage_95_verdict"] == "above";
    }
    std::printf("groups whose coverage excludes 95 %% (Wilson 95 %% interval): %d of %d below, %d above\n", below, groups,
                above);
    const nlohmann::json& lo = cv["loco"];
    if (lo["host_memory_configurations"].get<int>() > 0)
      std::printf("host memory (rank 0's high-water mark), each configuration left out: %d configurations, mean %.2f %%, "
                  "max %.2f %%, largest miss %.2f GiB\n",
                  lo["host_memory_configurations"].get<int>(), lo["host_memory_mean_abs_pct_error"].get<double>(),
                  lo["host_memory_max_abs_pct_error"].get<double>(),
                  lo["host_memory_max_abs_error_bytes"].get<double>() / kBytesPerGiB);
    const nlohmann::json& worst = cv["loco"]["runs"];
    const size_t shown = std::min<size_t>(worst.size(), kLocoRowsShown);
    std::printf("\nthe %zu configurations predicted worst when left out (all of them under --json: cv.loco.runs)\n", shown);
    std::printf("%-62s %8s %8s %8s %8s %8s %7s\n", "run", "meas", "pred", "err", "mem err", "host err", "unseen");
    std::printf("%-62s %8s %8s %8s %8s %8s %7s\n", "", "s", "s", "%", "%", "%", "dims");
    for (size_t i = 0; i < shown; ++i) {
      const nlohmann::json& r = worst[i];
      char host_err[16] = "-";
      if (r["measured_host_memory_bytes"].get<double>() > 0)
        std::snprintf(host_err, sizeof host_err, "%+.1f", r["host_memory_error_pct"].get<double>());
      std::printf("%-62s %8.3f %8.3f %+8.1f %+8.1f %8s %7d\n", r["key"].get<std::string>().c_str(),
                  r["measured_step_s"].get<double>(), r["predicted_step_s"].get<double>(), r["step_error_pct"].get<double>(),
                  r["memory_error_pct"].get<double>(), host_err, r["unseen_dimensions"].get<int>());
    }
  }
  if (const nlohmann::json& rep = j["repeatability"]; rep["configurations"].get<int>() > 0) {
    std::printf("\ntest-retest: configurations measured by two or more runs files (calls, often other machines);\n"
                "spread: largest file median over smallest, less 1; off pooled: a file median's distance from the\n"
                "configuration's median over all its steps (the error of a model exact on it, against one call)\n");
    std::printf("%-34s %7s %7s %11s %11s %11s %11s %11s\n", "configurations", "configs", "calls", "spread mean",
                "spread p90", "spread max", "off mean", "off max");
    std::printf("%-34s %7s %7s %11s %11s %11s %11s %11s\n", "", "", "", "%", "%", "%", "%", "%");
    const auto line = [](const char* name, const nlohmann::json& s) {
      std::printf("%-34s %7d %7d %11.1f %11.1f %11.1f %11.1f %11.1f\n", name, s["configurations"].get<int>(),
                  s["measurements"].get<int>(), s["step_time_spread_mean_pct"].get<double>(),
                  s["step_time_spread_p90_pct"].get<double>(), s["step_time_spread_max_pct"].get<double>(),
                  s["step_time_call_mean_abs_pct_dev"].get<double>(), s["step_time_call_max_abs_pct_dev"].get<double>());
    };
    line("all", rep);
    line("  GPU-bound", rep["gpu_bound"]);
    line("  launch-bound", rep["launch_bound"]);
    const size_t shown = std::min<size_t>(rep["runs"].size(), kRepeatRowsShown);
    std::printf("the %zu that moved most (all of them under --json: repeatability.runs)\n", shown);
    for (size_t i = 0; i < shown; ++i) {
      const nlohmann::json& r = rep["runs"][i];
      std::string by_file;
      for (const auto& m : r["step_s_by_file"]) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%s%.3f", by_file.empty() ? "" : " ", m.get<double>());
        by_file += buf;
      }
      std::printf("%-62s %7.1f %%  %s s%s\n", r["key"].get<std::string>().c_str(), r["spread_pct"].get<double>(),
                  by_file.c_str(), r["launch_bound"].get<bool>() ? "  (launch-bound)" : "");
    }
  }
  if (j.contains("coefficients")) {
    std::printf("\ncoefficients the fit moves: what informs them in these runs\n");
    std::printf("(std error: the profile's; bootstrap: the spread over refits on these runs resampled by configuration)\n");
    std::printf("%-30s %12s %10s %10s %8s %8s  %s\n", "coefficient", "value", "std error", "bootstrap", "configs",
                "micro", "flag");
    for (const auto& c : j["coefficients"])
      std::printf("%-30s %12.4g %10.3g %10.3g %8d %8d  %s\n", c["name"].get<std::string>().c_str(),
                  c["value"].get<double>(), c["std_error"].get<double>(), c["bootstrap_std"].get<double>(),
                  c["informing_configurations"].get<int>(), c["informing_micro_records"].get<int>(),
                  c["flag"].get<std::string>().c_str());
  }
  if (!rows.empty()) {
    std::printf("\nphases, measured / predicted (s, as the run's harness times them: our backend's optimizer is its own\n"
                "time, hidden or not; a peer's backward holds its reductions and host copies, its optimizer the tail)\n");
    std::printf("%-62s %17s %17s %17s\n", "run", "forward", "backward", "optimizer");
    for (const auto& r : rows)
      std::printf("%-62s %8.3f %8.3f %8.3f %8.3f %8.3f %8.3f\n", r.run->key.c_str(), r.run->forward_s, r.pred_fwd,
                  r.run->backward_s, r.pred_bwd, r.run->optimizer_total_s, r.pred_opt);
  }
  if (!micro.empty()) {
    std::printf("\nmicro-benchmarks against their component formulas (%zu):\n", micro.size());
    std::printf("%-16s %8s %12s %12s\n", "bench", "records", "mean |err| %", "max |err| %");
    for (const auto& [name, v] : j["micro"]["by_bench"].items())
      std::printf("%-16s %8d %12.1f %12.1f\n", name.c_str(), v["records"].get<int>(), v["mean_abs_pct_error"].get<double>(),
                  v["max_abs_pct_error"].get<double>());
  }
  return 0;
}

}  // namespace stepcast::calibrate
