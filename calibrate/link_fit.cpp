#include "calibrate/link_fit.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

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

namespace {

bool is_collective(MicroBench b) {
  return b == MicroBench::kAllReduce || b == MicroBench::kReduceScatter || b == MicroBench::kAllGather;
}

// The minimum of f on [lo, hi] by golden-section search (f unimodal there).
double golden_min(const std::function<double(double)>& f, double lo, double hi, int iterations) {
  const double g = (std::sqrt(5.0) - 1.0) / 2.0;
  double a = lo, b = hi, c = b - g * (b - a), d = a + g * (b - a);
  double fc = f(c), fd = f(d);
  for (int i = 0; i < iterations; ++i) {
    if (fc <= fd) {
      b = d, d = c, fd = fc;
      c = b - g * (b - a), fc = f(c);
    } else {
      a = c, c = d, fc = fd;
      d = a + g * (b - a), fd = f(d);
    }
  }
  return fc <= fd ? c : d;
}

}  // namespace

LinkFit fit_inter_node_link(const std::vector<MicroRecord>& micro, const HardwareProfile& hw) {
  LinkFit out;
  for (const MicroRecord& r : micro)
    if (is_collective(r.bench) && r.nodes > 1) out.records.push_back(r);
  if (out.records.empty())
    throw InputError("--runs: no collective micro-benchmark across nodes (records with \"nodes\" > 1: microbench "
                     "--suite collectives --nproc N --emulate-nodes K)");
  // The search space: the rates and latencies the profile loader accepts for these keys
  // (model/hardware.cpp: inter_node_bytes_per_s in [1e8, 1e13] B/s, inter_node_latency_s >= 0);
  // a latency longer than the quickest record cannot fit it.
  double quickest_s = out.records.front().seconds;
  for (const MicroRecord& r : out.records) quickest_s = std::min(quickest_s, r.seconds);
  HardwareProfile probe = hw;
  const auto predicted = [&](const MicroRecord& r, double bytes_per_s, double latency_s) {
    probe.links.inter_node_bytes_per_s = bytes_per_s;
    probe.links.inter_node_latency_s = latency_s;
    return predict_micro(r, probe, hw.coefs.data());
  };
  // Squared log errors: a 1 MiB record weighs what a 1 GiB one does.
  const auto cost = [&](double bytes_per_s, double latency_s) {
    double sum = 0;
    for (const MicroRecord& r : out.records) {
      const double e = std::log(predicted(r, bytes_per_s, latency_s) / r.seconds);
      sum += e * e;
    }
    return sum;
  };
  // For a rate, the latency is one unimodal search; the rate's is a grid over its range, then a
  // refinement between the best point's neighbours (beyond the intra-node link the rate no longer
  // moves a prediction, collective_link, so the cost is flat there and the grid finds its edge).
  const auto best_latency = [&](double bytes_per_s) {
    return golden_min([&](double lat) { return cost(bytes_per_s, lat); }, 0.0, quickest_s, 80);
  };
  const auto profile_cost = [&](double log_bps) {
    const double bps = std::exp(log_bps);
    return cost(bps, best_latency(bps));
  };
  const double lo = std::log(1e8), hi = std::log(1e13);
  const int grid = 200;
  int best = 0;
  double best_cost = profile_cost(lo);
  for (int i = 1; i <= grid; ++i) {
    const double c = profile_cost(lo + (hi - lo) * i / grid);
    if (c < best_cost) best = i, best_cost = c;
  }
  const double step = (hi - lo) / grid;
  const double log_bps = golden_min(profile_cost, std::max(lo, lo + step * (best - 1)), std::min(hi, lo + step * (best + 1)), 60);
  out.inter_node_bytes_per_s = std::exp(log_bps);
  out.inter_node_latency_s = best_latency(out.inter_node_bytes_per_s);
  double sum = 0;
  for (const MicroRecord& r : out.records) {
    out.predicted_s.push_back(predicted(r, out.inter_node_bytes_per_s, out.inter_node_latency_s));
    const double e = std::log(out.predicted_s.back() / r.seconds);
    sum += e * e;
  }
  out.rms_log_error = std::sqrt(sum / static_cast<double>(out.records.size()));
  return out;
}

std::string with_inter_node_link(const std::string& profile_text, const std::string& origin, const std::string& name,
                                 double bytes_per_s, double latency_s, const std::string& source) {
  const auto value = [&](double v) {
    std::ostringstream o;
    o.precision(9);
    o << "{ value = " << v << ", source = \"" << source << "\" }";
    return o.str();
  };
  std::string text = profile_text;
  set_toml_key(text, "", "name", "\"" + name + "\"", origin);
  set_toml_key(text, "links", "inter_node_bytes_per_s", value(bytes_per_s), origin);
  set_toml_key(text, "links", "inter_node_latency_s", value(latency_s), origin);
  return text;
}

int run_link(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
             const std::string& dir, bool json) {
  if (out_path.empty())
    throw InputError("--out is required: the profile with the measured link is written beside the one it comes from, "
                     "never over it");
  const fs::path target(out_path);
  if (target.extension() != ".toml") throw InputError("--out \"" + out_path + "\": expected a .toml file");
  check_output_path(target);
  const fs::path data_dir = resolve_data_dir(dir);
  const HardwareProfile hw = resolve_hardware(hw_name, data_dir);
  const auto files = to_paths(run_files);
  const LinkFit fit = fit_inter_node_link(load_micro(files), hw);

  char fit_text[200];
  std::snprintf(fit_text, sizeof fit_text, "%zu collectives across %.0f nodes, RMS log error %.3f", fit.records.size(),
                fit.records.front().nodes, fit.rms_log_error);
  const std::string source = "calibrate link " + utc_date_today() + ", git " + STEPCAST_GIT_COMMIT + ", " + fit_text +
                             ", micro-benchmarks fnv1a64:" + fnv1a64_of_files(files) + " (the link the model's collective " +
                             "formula reads, with " + hw.name + "'s coefficients)";
  const std::string name = target.stem().string();
  const std::string text = with_inter_node_link(read_text_file(hw.path), hw.path, name, fit.inter_node_bytes_per_s,
                                                fit.inter_node_latency_s, source);
  parse_hardware_profile(text, target.string());  // what we write must read back
  write_file_atomic(target, text);

  if (json) {
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < fit.records.size(); ++i) {
      const MicroRecord& r = fit.records[i];
      rows.push_back({{"bench", micro_bench_name(r.bench)},
                      {"bytes", r.bytes},
                      {"world", r.world},
                      {"nodes", r.nodes},
                      {"measured_s", r.seconds},
                      {"predicted_s", fit.predicted_s[i]},
                      {"where", r.where}});
    }
    const nlohmann::json report = {{"profile", target.string()},
                                   {"name", name},
                                   {"from", hw.name},
                                   {"inter_node_bytes_per_s", fit.inter_node_bytes_per_s},
                                   {"inter_node_latency_s", fit.inter_node_latency_s},
                                   {"rms_log_error", fit.rms_log_error},
                                   {"records", rows}};
    std::cout << report.dump(2) << "\n";
    return 0;
  }
  std::printf("inter-node link written to %s (profile \"%s\", %s's otherwise)\n", target.string().c_str(), name.c_str(),
              hw.name.c_str());
  std::printf("inter_node_bytes_per_s %.4g (was %.4g), inter_node_latency_s %.3g (was %.3g); %s\n",
              fit.inter_node_bytes_per_s, hw.links.inter_node_bytes_per_s, fit.inter_node_latency_s,
              hw.links.inter_node_latency_s, fit_text);
  std::printf("%-16s %14s %6s %6s %12s %12s %8s\n", "collective", "bytes", "ranks", "nodes", "measured s", "predicted s",
              "err %");
  for (size_t i = 0; i < fit.records.size(); ++i) {
    const MicroRecord& r = fit.records[i];
    std::printf("%-16s %14.0f %6.0f %6.0f %12.4g %12.4g %+8.1f\n", micro_bench_name(r.bench), r.bytes, r.world, r.nodes,
                r.seconds, fit.predicted_s[i], 100.0 * (fit.predicted_s[i] / r.seconds - 1.0));
  }
  return 0;
}

}  // namespace stepcast::calibrate
