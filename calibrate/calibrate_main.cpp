// calibrate: fits the cost model to measured runs and reports its accuracy.
//
//   calibrate fit    --runs data/runs/h200-sxm/*.jsonl --hardware h200-sxm [--out FILE] [--holdout-frac 0.25]
//   calibrate report --runs ... --hardware h200-sxm [--json] [--svg FILE]
//   calibrate measure --list bench/runlists/calibration.txt --out DIR   (on a GPU host:
//                     micro-benchmarks, then the designed step runs)
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <algorithm>
#include <sys/wait.h>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#ifdef STEPCAST_HAVE_CERES
#include "calibrate/fit.h"
#endif
#include "calibrate/measure.h"
#include "calibrate/micro_record.h"
#include "calibrate/run_record.h"
#include "common/atomic_file.h"
#include "common/cli.h"
#include "common/errors.h"
#include "common/hash.h"
#include "common/process.h"
#include "common/run_main.h"
#include "common/units.h"
#include "model/prediction.h"

#include "stepcast_git_commit.h"  // generated at every build (cmake/GitCommit.cmake)

namespace stepcast::calibrate {
namespace {

namespace fs = std::filesystem;

std::filesystem::path data_dir(const std::string& flag) { return resolve_data_dir(flag); }

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw InputError(p.string() + ": cannot open file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}



struct Row {
  const RunRecord* run;
  bool holdout;
  double pred_step, pred_std, pred_mem, pred_fwd, pred_bwd, pred_opt;
  double step_err() const { return pred_step / run->step_s - 1; }
  double mem_err() const { return run->gpu_peak_reserved_bytes > 0 ? pred_mem / run->gpu_peak_reserved_bytes - 1 : 0; }
};

std::vector<Row> predict_rows(const std::vector<RunRecord>& runs, const HardwareProfile& hw, double holdout_frac,
                              uint64_t seed) {
  std::vector<Row> rows;
  for (const auto& r : runs) {
    Prediction p = evaluate(r.model, hw, r.config);
    rows.push_back({&r, is_holdout(r.key, holdout_frac, seed), p.time.step, p.step_std_s, p.memory.gpu_total,
                    p.time.forward, p.time.backward + p.time.recompute, p.time.optimizer_total});
  }
  return rows;
}

nlohmann::json summarize(const std::vector<Row>& rows, bool holdout) {
  double sum = 0, mx = 0, msum = 0, mmx = 0, inside = 0;
  int n = 0, nm = 0;
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
  }
  return {{"runs", n},
          {"step_time_mean_abs_pct_error", n ? 100 * sum / n : 0.0},
          {"step_time_max_abs_pct_error", 100 * mx},
          {"peak_memory_mean_abs_pct_error", nm ? 100 * msum / nm : 0.0},
          {"peak_memory_max_abs_pct_error", 100 * mmx},
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
      const double e = std::abs(predict_micro(r, hw, hw.coefs.data()) / r.seconds - 1);
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

std::vector<fs::path> to_paths(const std::vector<std::string>& v) {
  std::vector<fs::path> out(v.begin(), v.end());
  if (out.empty()) throw InputError("--runs names no file");
  return out;
}

#ifdef STEPCAST_HAVE_CERES
int run_fit(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
            double holdout_frac, uint64_t seed, const std::string& dir, bool json) {
  if (!(holdout_frac >= 0 && holdout_frac < 1))
    throw InputError("--holdout-frac " + std::to_string(holdout_frac) + " must lie in [0, 1)");
  const auto files = to_paths(run_files);
  HardwareProfile hw = resolve_hardware(hw_name, data_dir(dir));
  const auto runs = load_runs(files, data_dir(dir));
  std::vector<Observation> obs;
  size_t held = 0;
  for (const auto& r : runs) {
    if (is_holdout(r.key, holdout_frac, seed)) {
      ++held;
      continue;
    }
    obs.push_back(observation_of(r, hw));
  }
  if (obs.empty()) throw InputError("no runs left to fit after the hold-out split");
  const auto micro = load_micro(files);
  const auto t0 = std::chrono::steady_clock::now();
  if (!micro.empty())
    std::fprintf(stderr, "calibrate: stage 1, component fit on %zu micro-benchmarks ...\n", micro.size());
  std::fprintf(stderr, "calibrate: %send-to-end fit on %zu runs (%zu held out) from %zu files ...\n",
               micro.empty() ? "" : "stage 2, ", obs.size(), held, files.size());
  const Calibration cal = calibrate_two_stage(obs, micro, hw);
  const std::optional<FitResult>& components = cal.components;
  const FitResult& fit = cal.fit;
  const FitOptions& fo = cal.options;
  const double fit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // Data hash: every runs file's bytes, in the order given.
  std::string all;
  for (const auto& f : files) all += read_text(f);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));

  CalibratedCoefficients cc;
  cc.values = fit.coefs;
  cc.std_errors = fit.std_errors;
  cc.model_error_frac = fit.model_error_frac;
  if (fit.covariance_ok) {
    cc.free = fo.free;
    cc.covariance = fit.covariance;
  }
  // The planner flags plans whose micro-batch x sequence lies beyond the fitted runs.
  for (const auto& r : runs)
    if (!is_holdout(r.key, holdout_frac, seed))
      cc.max_micro_tokens = std::max(cc.max_micro_tokens, static_cast<double>(r.config.micro_batch * r.config.seq_len));
  cc.source = "calibrate fit " + std::string(date) + ", git " + STEPCAST_GIT_COMMIT + ", runs fnv1a64:" +
              fnv1a64_hex(all) + " (" + std::to_string(obs.size()) + " fitted, " + std::to_string(held) +
              " held out, seed " + std::to_string(seed) + "; " + std::to_string(micro.size()) +
              " micro-benchmarks in the component fit); " + fit.summary;
  const std::string text = with_calibrated_coefficients(read_text(hw.path), cc);
  const std::string target = out_path.empty() ? hw.path : out_path;
  parse_hardware_profile(text, target);  // what we write must read back
  write_file_atomic(target, text);

  // Accuracy of the new profile, fit and held-out runs apart.
  HardwareProfile fitted = parse_hardware_profile(text, target);
  const auto rows = predict_rows(runs, fitted, holdout_frac, seed);
  nlohmann::json report = {{"profile", target},
                           {"fit_wall_s", fit_s},
                           {"converged", fit.converged},
                           {"initial_cost", fit.initial_cost},
                           {"final_cost", fit.final_cost},
                           {"summary", fit.summary},
                           {"fit", summarize(rows, false)},
                           {"holdout", summarize(rows, true)}};
  nlohmann::json coefs = nlohmann::json::object();
  for (Coef c : fo.free) coefs[std::string(coef_table()[c].name)] = {{"value", fit.coefs[c]}, {"std_error", fit.std_errors[c]}, {"default", coef_table()[c].default_value}};
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
    std::printf("%-28s %12s %12s %12s\n", "coefficient", "default", "fitted", "std error");
    for (Coef c : fo.free)
      std::printf("%-28s %12.4g %12.4g %12.3g\n", std::string(coef_table()[c].name).c_str(), coef_table()[c].default_value,
                  fit.coefs[c], fit.std_errors[c]);
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

#endif  // STEPCAST_HAVE_CERES

// calibrate measure: runs a designed list of configurations with `train`,
// appending every step to OUT/runs.jsonl. A configuration already present with
// enough measured steps is skipped, so an interrupted run resumes where it
// stopped. Progress and an ETA go to stderr.
int run_measure(const std::string& list, const std::string& out_dir, const std::string& train_flag, int64_t steps,
                double budget_min, const std::string& device, const std::string& dir, bool micro,
                const std::string& micro_flags) {
  const std::vector<RunListEntry> items = read_run_list(list);
  if (steps < 2) throw InputError("--steps " + std::to_string(steps) + " must be at least 2 (the first is warm-up)");
  fs::create_directories(out_dir);
  const fs::path runs = fs::path(out_dir) / "runs.jsonl";
  const std::string log = (fs::path(out_dir) / "train.log").string();
  const std::string train = sibling_binary(train_flag, "backend", "train");
  // What is already measured: steps per configuration key.
  std::map<std::string, int> have;
  if (fs::exists(runs))
    for (const auto& r : load_runs({runs}, data_dir(dir))) have[r.key] = r.steps;
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0, skipped = 0, failed = 0;
  // The micro-benchmarks first (OUT/micro.jsonl, skipped once a run of them has completed).
  if (micro) {
    const fs::path micro_out = fs::path(out_dir) / "micro.jsonl";
    const bool complete = fs::exists(micro_out) && read_text(micro_out).find("\"micro_done\"") != std::string::npos;
    if (complete) {
      std::fprintf(stderr, "calibrate: micro-benchmarks already in %s\n", micro_out.string().c_str());
    } else {
      int nproc = 1;
      for (const auto& it : items) nproc = std::max(nproc, it.nproc);
      const fs::path bench = fs::path(train).parent_path() / "microbench";
      if (!fs::exists(bench)) throw InputError(bench.string() + ": no microbench binary beside train (build the backend)");
      std::fprintf(stderr, "calibrate: micro-benchmarks on %d rank(s) -> %s\n", nproc, micro_out.string().c_str());
      std::vector<std::string> argv{bench.string(), "--out", micro_out.string(), "--nproc", std::to_string(nproc),
                                    "--device", device};
      if (!dir.empty()) argv.insert(argv.end(), {"--data-dir", dir});
      for (const std::string& w : split_words(micro_flags)) argv.push_back(w);
      const SpawnResult r = spawn_and_wait(argv);
      if (r.exit_status != 0) {
        std::fprintf(stderr, "calibrate: microbench failed (exit %d); the step runs go on\n", r.exit_status);
        ++failed;
      }
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const RunListEntry& it = items[i];
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (budget_min > 0 && elapsed > 60.0 * budget_min) {
      std::fprintf(stderr, "calibrate: budget of %.1f min spent; %zu configurations left (rerun to resume)\n", budget_min,
                   items.size() - i);
      break;
    }
    std::string marker = it.model + " " + std::to_string(it.nproc);
    for (const std::string& w : it.flags) marker += " " + w;
    const double eta = done > 0 ? elapsed / done * static_cast<double>(items.size() - i) : 0.0;
    const int width = 30, filled = static_cast<int>(width * static_cast<double>(i) / items.size());
    std::fprintf(stderr, "\r[%s%s] %zu/%zu  %s  ETA %.0f s          ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), i, items.size(), marker.substr(0, 50).c_str(), eta);
    const fs::path mine = fs::path(out_dir) / ".current.jsonl";
    fs::remove(mine);
    TrainLaunch launch;
    launch.train = train;
    launch.model = it.model;
    launch.nproc = it.nproc;
    launch.steps = steps;
    launch.device = device;
    launch.data_dir = dir;
    launch.flags = it.flags;
    launch.json_out = mine.string();
    // Resume: a configuration whose key already has enough measured steps in runs.jsonl is skipped.
    const std::string key = planned_config_key(launch, out_dir);
    if (have.count(key) && have[key] >= steps - 1) {
      ++skipped;
      continue;
    }
    if (run_train(launch, log).exit_status != 0) ++failed;
    if (fs::exists(mine)) {
      const auto recs = load_runs({mine}, data_dir(dir));
      std::ifstream src(mine, std::ios::binary);
      std::ofstream(runs, std::ios::app) << src.rdbuf();
      for (const auto& r : recs) have[r.key] += r.steps;
      fs::remove(mine);
    }
    ++done;
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\rcalibrate: %d run, %d skipped (already measured), %d failed, %.0f s; steps in %s\n", done,
               skipped, failed, total, runs.string().c_str());
  return failed ? 1 : 0;
}

int run_report(const std::vector<std::string>& run_files, const std::string& hw_name, double holdout_frac,
               uint64_t seed, const std::string& dir, bool json, const std::string& svg) {
  const auto files = to_paths(run_files);
  HardwareProfile hw = resolve_hardware(hw_name, data_dir(dir));
  const auto runs = load_runs(files, data_dir(dir));
  const auto micro = load_micro(files);
  if (runs.empty() && micro.empty()) throw InputError("--runs: no step runs and no micro-benchmarks in the files given");
  const auto rows = predict_rows(runs, hw, holdout_frac, seed);
  if (!svg.empty() && !rows.empty())
    write_file_atomic(svg, svg_plot(rows, hw.name + (hw.coefs_calibrated ? " (calibrated)" : " (not calibrated)") +
                                              ": predicted vs measured step time"));
  nlohmann::json j = {{"hardware", hw.name},
                      {"calibrated", hw.coefs_calibrated},
                      {"fit", summarize(rows, false)},
                      {"holdout", summarize(rows, true)},
                      {"runs", nlohmann::json::array()},
                      {"micro", {{"by_bench", micro_summary(micro, hw)}, {"records", nlohmann::json::array()}}}};
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
                                       {"gpu_peak_reserved_bytes", r.run->gpu_peak_reserved_bytes}}},
                         {"predicted", {{"step_s", r.pred_step}, {"step_std_s", r.pred_std}, {"forward_s", r.pred_fwd},
                                        {"backward_s", r.pred_bwd}, {"optimizer_s", r.pred_opt},
                                        {"gpu_memory_bytes", r.pred_mem}}},
                         {"step_error_pct", 100 * r.step_err()},
                         {"memory_error_pct", 100 * r.mem_err()}});
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("%s (%s): predicted vs measured, %zu runs\n", hw.name.c_str(),
              hw.coefs_calibrated ? "calibrated" : "not calibrated", rows.size());
  std::printf("%-62s %4s %8s %8s %6s %8s %8s %8s %6s\n", "run", "set", "meas", "pred", "±95%", "err", "mem", "pred", "err");
  std::printf("%-62s %4s %8s %8s %6s %8s %8s %8s %6s\n", "", "", "s", "s", "s", "%", "GiB", "GiB", "%");
  for (const auto& r : rows)
    std::printf("%-62s %4s %8.3f %8.3f %6.3f %+8.1f %8.1f %8.1f %+6.1f\n", r.run->key.c_str(), r.holdout ? "held" : "fit",
                r.run->step_s, r.pred_step, 1.96 * r.pred_std, 100 * r.step_err(), r.run->gpu_peak_reserved_bytes / kBytesPerGiB,
                r.pred_mem / kBytesPerGiB, 100 * r.mem_err());
  std::printf("fit:      %s\nheld out: %s\n", j["fit"].dump().c_str(), j["holdout"].dump().c_str());
  if (!rows.empty()) {
    std::printf("\nphases, measured / predicted (s; optimizer: its own time, hidden or not)\n");
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

int main_impl(int argc, char** argv) {
  CLI::App app{"Stepcast calibrate: fits the cost model's coefficients to measured runs (Ceres) and reports accuracy."};
  app.require_subcommand(1);
  std::vector<std::string> runs;
  std::string hardware = "h200-sxm", out, dir, svg;
  double holdout = 0.25;
  uint64_t seed = 1;
  bool json = false;
  for (CLI::App* sub : {app.add_subcommand("fit", "fit the coefficients and write a calibrated profile"),
                        app.add_subcommand("report", "predicted vs measured for every run")}) {
    sub->add_option("--runs", runs, "JSONL files written by train --json-out")->required();
    sub->add_option("--hardware", hardware, "hardware profile name or .toml")->capture_default_str();
    sub->add_option("--holdout-frac", holdout, "share of configurations the fit never sees")->capture_default_str();
    sub->add_option("--seed", seed, "hold-out split seed")->capture_default_str();
    sub->add_option("--data-dir", dir, "folder with models/ and hardware/");
    sub->add_flag("--json", json, "print JSON");
  }
  app.get_subcommand("fit")->add_option("--out", out, "calibrated profile to write (default: the profile itself)");
  app.get_subcommand("report")->add_option("--svg", svg, "write a predicted-vs-measured plot");
  std::string list, out_dir = "calibration", train, device = "auto";
  int64_t steps = 4;
  double budget = 0;
  CLI::App* measure = app.add_subcommand("measure", "run a designed list of configurations with train (GPU host)");
  measure->add_option("--list", list, "run list: MODEL NPROC [train flags] per line")->required();
  measure->add_option("--out", out_dir, "folder for runs.jsonl and train.log")->capture_default_str();
  measure->add_option("--steps", steps, "steps per configuration (the first is warm-up)")->capture_default_str();
  measure->add_option("--budget-min", budget, "stop starting new configurations after this many minutes (0 = no limit)");
  measure->add_option("--train", train, "path of the train binary");
  measure->add_option("--device", device, "auto | cpu | cuda")->capture_default_str();
  measure->add_option("--data-dir", dir, "folder with models/ and hardware/");
  bool no_micro = false;
  measure->add_flag("--no-micro", no_micro, "skip the micro-benchmarks (microbench) before the step runs");
  std::string micro_flags;
  measure->add_option("--micro-flags", micro_flags, "extra flags for microbench (e.g. --quick)");
  if (const auto status = parse_cli(app, argc, argv, "calibrate")) return *status;
  if (app.got_subcommand("measure")) return run_measure(list, out_dir, train, steps, budget, device, dir, !no_micro, micro_flags);
#ifdef STEPCAST_HAVE_CERES
  if (app.got_subcommand("fit")) return run_fit(runs, hardware, out, holdout, seed, dir, json);
#else
  if (app.got_subcommand("fit")) throw InputError("this build has no Ceres: fit on a machine with libceres-dev");
#endif
  return run_report(runs, hardware, holdout, seed, dir, json, svg);
}

}  // namespace
}  // namespace stepcast::calibrate

int main(int argc, char** argv) {
  return stepcast::run_main("calibrate", [&] { return stepcast::calibrate::main_impl(argc, argv); });
}
