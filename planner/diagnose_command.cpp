#include "planner/diagnose_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <sstream>

#include "calibrate/run_record.h"
#include "common/errors.h"
#include "common/units.h"
#include "planner/diagnose.h"
#include "planner/plan_search.h"
#include "planner/report.h"

namespace stepcast {

namespace {

// The configuration flags --run replaces with the records' configuration.
const char* const kConfigFlags[] = {"--stage",  "--offload-optimizer", "--offload-pipeline", "--engine",
                                    "--offload-params", "--optimizer", "--micro-batch", "--gas",
                                    "--checkpointing", "--grad-sync", "--model", "--gpus", "--nodes",
                                    "--seq", "--precision", "--attention", "--peft", "--lora-rank",
                                    "--lora-targets", "--gpu-allocator"};
const char* const kMeasuredFlags[] = {"--step-s", "--gas-s", "--opt-s", "--forward-s", "--backward-s", "--optimizer-s",
                                      "--peak-reserved-gib"};

std::optional<double> flag_value(const CLI::App& app, const char* flag, double v) {
  if (app.count(flag) == 0) return std::nullopt;
  if (!(v >= 0.0) || !std::isfinite(v) || v > 1e7)
    throw InputError(std::string(flag) + " " + std::to_string(v) + " is out of range [0, 1e7]");
  return v;
}

// What one resource's speed means in the machine's own units.
std::string speed_meaning(Resource r, double speed, const Diagnosis& d, const HardwareProfile& hw) {
  char buf[200];
  switch (r) {
    case Resource::kGpu:
      std::snprintf(buf, sizeof buf, "%.0f TFLOP/s dense bf16, %.2f TB/s (profile %.0f, %.2f)",
                    speed * hw.gpu.peak_bf16_flops_per_s / 1e12, speed * hw.gpu.memory_bytes_per_s / 1e12,
                    hw.gpu.peak_bf16_flops_per_s / 1e12, hw.gpu.memory_bytes_per_s / 1e12);
      break;
    case Resource::kCpuOptimizer:
      std::snprintf(buf, sizeof buf, "%.2f threads per rank of the profile's host (profile %.0f)",
                    speed * d.cpu_threads_per_rank_profile, d.cpu_threads_per_rank_profile);
      break;
    case Resource::kPcie:
      std::snprintf(buf, sizeof buf, "%.1f GB/s host to GPU (profile %.1f)", speed * hw.host.h2d_bytes_per_s / 1e9,
                    hw.host.h2d_bytes_per_s / 1e9);
      break;
    case Resource::kIntraNode:
      std::snprintf(buf, sizeof buf, "%.1f GB/s per GPU (profile %.1f, %s)", speed * hw.links.intra_node_bytes_per_s / 1e9,
                    hw.links.intra_node_bytes_per_s / 1e9, hw.links.intra_node.c_str());
      break;
    case Resource::kInterNode:
      std::snprintf(buf, sizeof buf, "%.1f GB/s per GPU (profile %.1f)", speed * hw.links.inter_node_bytes_per_s / 1e9,
                    hw.links.inter_node_bytes_per_s / 1e9);
      break;
    case Resource::kHostIssue:
      std::snprintf(buf, sizeof buf, "issues each layer's kernels and hooks in %.2fx the profile's time", 1.0 / speed);
      break;
  }
  return buf;
}

std::string fit_label(const ResourceFit& f) {
  std::string s;
  for (size_t i = 0; i < f.resources.size(); ++i) {
    char buf[120];
    std::snprintf(buf, sizeof buf, "%s%s x%.3g", i ? " and " : "", resource_name(f.resources[i]), f.speeds[i]);
    s += buf;
  }
  return s.empty() ? "nothing" : s;
}

nlohmann::json fit_json(const ResourceFit& f, const Diagnosis& d, const HardwareProfile& hw) {
  nlohmann::json j = {{"rms_log_error", f.rms_log_error}, {"at_search_bound", f.at_bound}};
  j["resources"] = nlohmann::json::array();
  for (size_t i = 0; i < f.resources.size(); ++i)
    j["resources"].push_back({{"resource", resource_key(f.resources[i])},
                              {"speed_frac", f.speeds[i]},
                              {"meaning", speed_meaning(f.resources[i], f.speeds[i], d, hw)}});
  nlohmann::json after = nlohmann::json::object();
  size_t k = 0;
  for (const PhaseRow& p : d.phases)  // an empty fit (nothing to explain) predicts nothing new
    if (p.fitted && k < f.predicted_s.size()) after[p.key + "_s"] = f.predicted_s[k++];
  j["predicted_after"] = after;
  if (f.resources.size() == 1 && f.resources[0] == Resource::kCpuOptimizer)
    j["cpu_threads_per_rank"] = f.speeds[0] * d.cpu_threads_per_rank_profile;
  return j;
}

struct Measurement {
  ModelSpec model;
  TrainConfig config;
  MeasuredStep measured;
  std::string hardware;  // the records' own, where they name one
  std::string source;
};

// The configuration and medians of the run records: one configuration (or the one --key names).
Measurement from_runs(const DiagnoseOptions& o) {
  std::vector<std::filesystem::path> files(o.runs.begin(), o.runs.end());
  std::vector<calibrate::RunRecord> runs = calibrate::load_runs(files, data_dir(o.common));
  if (!o.key.empty()) {
    std::vector<calibrate::RunRecord> keep;
    for (auto& r : runs)
      if (r.key == o.key) keep.push_back(r);
    if (keep.empty()) throw InputError("--key \"" + o.key + "\" names no configuration of " + o.runs.front());
    runs = keep;
  }
  if (runs.empty()) throw InputError(o.runs.front() + " holds no measured (non-warm-up) step");
  if (runs.size() > 1) {
    std::string keys;
    for (size_t i = 0; i < runs.size() && i < 16; ++i) keys += (i ? "; " : "") + runs[i].key;
    throw InputError(o.runs.front() + " holds " + std::to_string(runs.size()) + " configurations: name one with --key (" +
                     keys + (runs.size() > 16 ? "; ..." : "") + ")");
  }
  const calibrate::RunRecord& r = runs.front();
  Measurement m{r.model, r.config, {}, "", r.key + " in " + o.runs.front()};
  m.measured.step_s = r.step_s;
  if (r.config.gas > 1 && r.gas_s > 0) m.measured.gas_s = r.gas_s;
  if (r.opt_s > 0) m.measured.opt_s = r.opt_s;
  if (r.forward_s > 0) m.measured.forward_s = r.forward_s;
  if (r.backward_s > 0) m.measured.backward_s = r.backward_s;
  if (r.optimizer_total_s > 0) m.measured.optimizer_s = r.optimizer_total_s;
  if (r.gpu_peak_reserved_bytes > 0) m.measured.gpu_peak_reserved_bytes = r.gpu_peak_reserved_bytes;
  std::set<std::string> hw;
  calibrate::for_each_jsonl(files, "", [&](const std::filesystem::path&, const std::string&, const nlohmann::json& j) {
    if (j.contains("hardware") && j["hardware"].is_string()) hw.insert(j["hardware"].get<std::string>());
  });
  if (hw.size() == 1) m.hardware = *hw.begin();
  return m;
}

}  // namespace

void add_diagnose(CLI::App* app, DiagnoseOptions& d) {
  add_common(app, d.common);
  app->get_option("--model")->required(false);
  add_explain_config(app, d.config);
  app->add_option("--step-s", d.step_s, "measured time of one optimizer step (s)");
  app->add_option("--gas-s", d.gas_s, "measured GAS time: the GAS - 1 micro-batches before the last (s)");
  app->add_option("--opt-s", d.opt_s, "measured OPT time: the last micro-batch and everything after it (s)");
  app->add_option("--forward-s", d.forward_s, "measured forward time per step, all micro-batches (s)");
  app->add_option("--backward-s", d.backward_s, "measured backward time per step, recomputation included (s)");
  app->add_option("--optimizer-s", d.optimizer_s, "measured optimizer time per step (s)");
  app->add_option("--peak-reserved-gib", d.peak_reserved_gib, "measured peak reserved GPU memory per GPU (GiB)");
  app->add_option("--run", d.runs,
                  "JSONL run records (train --json-out, bench/peers/peer.py): the configuration and the medians of "
                  "its measured steps, instead of the flags");
  app->add_option("--key", d.key, "the configuration of the records to diagnose, where they hold several");
  app->add_option("--top", d.top, "plans to show for the machine as diagnosed")->capture_default_str();
}

int run_diagnose(const CLI::App& app, DiagnoseOptions o) {
  if (o.top < 1 || o.top > 100) throw InputError("--top " + std::to_string(o.top) + " is out of range [1, 100]");
  if (!o.common.deepspeed_config.empty() || !o.common.accelerate_config.empty() || !o.common.fsdp_config.empty())
    throw InputError("diagnose writes no launcher config: run recommend or explain with the plan it names");
  if (o.common.peft == "auto") throw InputError("--peft auto compares methods, which recommend does: diagnose takes none, lora or qlora");
  Measurement m;
  if (!o.runs.empty()) {
    for (const char* f : kConfigFlags)
      if (app.count(f) > 0)
        throw InputError(std::string(f) + " is not taken with --run: the configuration is the records' own");
    for (const char* f : kMeasuredFlags)
      if (app.count(f) > 0) throw InputError(std::string(f) + " is not taken with --run: the records' medians are");
    m = from_runs(o);
    if (app.count("--hardware") == 0 && !m.hardware.empty()) o.common.hardware = m.hardware;
  } else {
    if (o.common.model.empty()) throw InputError("--model is required (or --run with run records)");
    m.model = resolve_model(o.common.model, data_dir(o.common));
    m.config = explain_config(o.common, o.config, m.model);
    m.measured.step_s = flag_value(app, "--step-s", o.step_s);
    m.measured.gas_s = flag_value(app, "--gas-s", o.gas_s);
    m.measured.opt_s = flag_value(app, "--opt-s", o.opt_s);
    m.measured.forward_s = flag_value(app, "--forward-s", o.forward_s);
    m.measured.backward_s = flag_value(app, "--backward-s", o.backward_s);
    m.measured.optimizer_s = flag_value(app, "--optimizer-s", o.optimizer_s);
    if (auto g = flag_value(app, "--peak-reserved-gib", o.peak_reserved_gib)) m.measured.gpu_peak_reserved_bytes = *g * kBytesPerGiB;
    m.source = "the flags";
  }
  const HardwareProfile hw_profile = resolve_hardware(o.common.hardware, data_dir(o.common));
  // With --speed the run is compared with the machine those speeds describe (a diagnosis of
  // another run on it), and the speeds solved here are relative to that machine.
  const ScaledMachine given = machine_of(o.common, hw_profile, m.config);
  const HardwareProfile& hw = given.hardware;
  const ResourceLimits& limits = given.limits;
  const HardwareProfile hw_engine =
      hw.engine != "stepcast" || m.config.engine == Engine::kStepcast ? hw : for_engine(hw, engine_name(m.config.engine));
  // The model's own error on a phase where it knows the machine: this profile's, or for a
  // datasheet profile its reference's (engines_from), for the plan's class.
  const bool lb = launch_bound(evaluate(m.model, hw_engine, m.config, limits).time.host_issue_ratio);
  double noise = phase_noise_log(hw_engine, lb);
  if (noise <= 0 && !hw_profile.engines_from.empty()) {
    const HardwareProfile ref = resolve_hardware(hw_profile.engines_from, data_dir(o.common));
    noise = phase_noise_log(m.config.engine == Engine::kStepcast ? ref : for_engine(ref, engine_name(m.config.engine)), lb);
  }
  const Diagnosis d = diagnose(m.model, hw_engine, m.config, limits, m.measured, noise);

  // The machine as diagnosed: the explanation's speeds applied, the same job ranked on it.
  ResourceSpeeds speeds;
  for (size_t i = 0; i < d.explanation.resources.size(); ++i) speeds[d.explanation.resources[i]] = d.explanation.speeds[i];
  const ScaledMachine machine = scale_machine(hw_engine, m.config, limits, speeds);
  const Prediction measured_plan = evaluate(m.model, machine.hardware, m.config, machine.limits);
  SearchRequest req;
  req.model = m.model;
  req.hardware = machine.hardware;
  req.base = m.config;
  req.limits = machine.limits;
  req.global_batch = m.config.micro_batch * m.config.gas * m.config.world_size();
  req.overlap_forward = m.config.engine == Engine::kStepcast;
  const SearchResult res = search_plans(req);
  const double measured_tokens_per_s =
      m.measured.step_s && *m.measured.step_s > 0
          ? static_cast<double>(req.global_batch * m.config.seq_len) / *m.measured.step_s
          : 0.0;
  const size_t shown = std::min(res.ranked.size(), static_cast<size_t>(o.top));
  ReportContext ctx{&m.model, &hw_engine, 0.0};
  ReportContext mctx{&m.model, &machine.hardware, 0.0};

  const std::optional<double>& micro_meas = d.micro_batch_measured_s;
  const std::optional<double>& tail_meas = d.after_last_micro_batch_measured_s;
  const double micro_pred = d.micro_batch_predicted_s, tail_pred = d.after_last_micro_batch_predicted_s;

  if (o.common.json) {
    nlohmann::json j;
    j["model"] = model_to_json(m.model);
    j["hardware"] = hardware_to_json(hw_engine, m.config);
    j["measured_source"] = m.source;
    if (has_speeds(o.common)) {
      const ResourceSpeeds sp = speeds_of(o.common);
      nlohmann::json gj = nlohmann::json::object();
      for (int i = 0; i < kNumResources; ++i) gj[resource_key(static_cast<Resource>(i))] = sp.speed[i];
      j["given_speeds"] = gj;
    }
    j["plan"] = plan_to_json(d.predicted, ctx);
    j["phases"] = nlohmann::json::array();
    for (const PhaseRow& p : d.phases)
      j["phases"].push_back({{"phase", p.key}, {"measured_s", p.measured_s}, {"predicted_s", p.predicted_s},
                             {"ratio", p.predicted_s > 0 ? p.measured_s / p.predicted_s : 0.0}, {"fitted", p.fitted}});
    if (micro_meas)
      j["derived"] = {{"micro_batch_measured_s", *micro_meas}, {"micro_batch_predicted_s", micro_pred},
                      {"after_last_micro_batch_measured_s", *tail_meas},
                      {"after_last_micro_batch_predicted_s", tail_pred}};
    if (m.measured.gpu_peak_reserved_bytes)
      j["memory"] = {{"measured_peak_reserved_bytes", *m.measured.gpu_peak_reserved_bytes},
                     {"predicted_peak_reserved_bytes", d.predicted.memory.gpu_total_bytes},
                     {"predicted_interval_95", {d.predicted.gpu_memory_lo_bytes, d.predicted.gpu_memory_hi_bytes}}};
    j["rms_log_error_at_profile"] = d.rms_log_error;
    j["cpu_threads_per_rank_profile"] = d.cpu_threads_per_rank_profile;
    j["single_resources"] = nlohmann::json::array();
    for (const ResourceFit& f : d.singles) j["single_resources"].push_back(fit_json(f, d, hw_engine));
    j["no_bearing"] = nlohmann::json::array();
    for (Resource r : d.no_bearing) j["no_bearing"].push_back(resource_key(r));
    if (d.best_pair) j["best_pair"] = fit_json(*d.best_pair, d, hw_engine);
    j["explanation"] = fit_json(d.explanation, d, hw_engine);
    j["explanation"]["exactly_determined"] = d.exactly_determined;
    j["noise_log_q95"] = d.noise_log;
    j["within_noise"] = d.within_noise;
    nlohmann::json mj = {{"global_batch", req.global_batch},
                         {"measured_plan_predicted_tokens_per_s", measured_plan.throughput.tokens_per_s},
                         {"measured_tokens_per_s", measured_tokens_per_s},
                         {"fitting", res.ranked.size()}};
    mj["plans"] = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) mj["plans"].push_back(plan_to_json(res.ranked[i], mctx));
    j["machine_as_diagnosed"] = mj;
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  const TrainConfig& c = m.config;
  std::cout << context_line(d.predicted, ctx) << family_name(c) << ", micro-batch " << c.micro_batch << ", GAS " << c.gas
            << (c.activation_checkpointing ? ", checkpointing" : "") << "\nmeasured: " << m.source << "\n";
  if (has_speeds(o.common)) std::cout << speeds_note(o.common) << "; the speeds below are relative to them\n";
  std::cout << "\n";
  char line[400];
  std::cout << "Measured against predicted (per optimizer step)\n";
  std::snprintf(line, sizeof line, "%-46s %10s %10s %9s  %s\n", "phase", "measured", "predicted", "meas/pred", "fitted");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-46s %10s %10s\n", "", "s", "s");
  std::cout << line;
  for (const PhaseRow& p : d.phases) {
    std::snprintf(line, sizeof line, "%-46s %10.3f %10.3f %9.2f  %s\n", p.name.c_str(), p.measured_s, p.predicted_s,
                  p.predicted_s > 0 ? p.measured_s / p.predicted_s : 0.0, p.fitted ? "yes" : "");
    std::cout << line;
  }
  if (micro_meas) {
    std::snprintf(line, sizeof line, "%-46s %10.3f %10.3f %9.2f\n", "one micro-batch (GAS time / (GAS - 1))", *micro_meas,
                  micro_pred, *micro_meas / micro_pred);
    std::cout << line;
    std::snprintf(line, sizeof line, "%-46s %10.3f %10.3f %9.2f\n", "after the last micro-batch (OPT time - one)",
                  *tail_meas, tail_pred, tail_pred > 0 ? *tail_meas / tail_pred : 0.0);
    std::cout << line;
  }
  if (m.measured.gpu_peak_reserved_bytes) {
    std::snprintf(line, sizeof line, "%-46s %10.1f %10.1f %9.2f  (95 %%: %.1f-%.1f GiB)\n", "peak reserved GPU memory (GiB)",
                  *m.measured.gpu_peak_reserved_bytes / kBytesPerGiB, d.predicted.memory.gpu_total_bytes / kBytesPerGiB,
                  *m.measured.gpu_peak_reserved_bytes / d.predicted.memory.gpu_total_bytes,
                  d.predicted.gpu_memory_lo_bytes / kBytesPerGiB, d.predicted.gpu_memory_hi_bytes / kBytesPerGiB);
    std::cout << line;
  }
  std::string fitted_names;
  for (const PhaseRow& p : d.phases)
    if (p.fitted) fitted_names += (fitted_names.empty() ? "" : ", ") + p.name;
  std::cout << "rms error of the fitted phases at the profile's speeds: " << fmt("%.1f", 100.0 * std::expm1(d.rms_log_error))
            << " %\n\n";
  std::cout << "One resource at a time: its speed relative to the profile, solved on " << fitted_names << "\n";
  std::snprintf(line, sizeof line, "%-30s %8s  %-60s %9s\n", "resource", "speed", "what it means", "rms error");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-30s %8s  %-60s %9s\n", "", "x", "", "%");
  std::cout << line;
  for (const ResourceFit& f : d.singles) {
    std::snprintf(line, sizeof line, "%-30s %8.3g  %-60s %9.1f%s\n", resource_name(f.resources[0]), f.speeds[0],
                  speed_meaning(f.resources[0], f.speeds[0], d, hw_engine).c_str(),
                  100.0 * std::expm1(f.rms_log_error), f.at_bound ? "  (at the search's bound)" : "");
    std::cout << line;
  }
  if (!d.no_bearing.empty()) {
    std::cout << "no bearing on this run:";
    for (size_t i = 0; i < d.no_bearing.size(); ++i) std::cout << (i ? ", " : " ") << resource_name(d.no_bearing[i]);
    std::cout << "\n";
  }
  if (d.best_pair)
    std::cout << "best pair: " << fit_label(*d.best_pair) << ", rms error "
              << fmt("%.1f", 100.0 * std::expm1(d.best_pair->rms_log_error)) << " %\n";
  if (d.within_noise)
    std::cout << "explanation: none needed: every fitted phase lies within " << fmt("%.1f", 100.0 * std::expm1(d.noise_log))
              << " % of the prediction, the model's own 95 % error on a machine it was calibrated on\n";
  else
    std::cout << "explanation: " << fit_label(d.explanation)
            << (d.explanation.resources.size() == 2 ? " (the pair at least halves the best single resource's error)"
                                                    : "")
            << "\n";
  if (d.exactly_determined)
    std::cout << "  as many speeds as fitted phases: they meet the phases by construction, which is no evidence for "
                 "them; forward, backward and optimizer measured apart would test them\n";
  std::cout << "\n";
  std::cout << "On this machine as diagnosed, the same job (global batch " << req.global_batch << " sequences):\n";
  std::snprintf(line, sizeof line, "  the measured plan: predicted %.0f tokens/s", measured_plan.throughput.tokens_per_s);
  std::cout << line;
  if (measured_tokens_per_s > 0) std::cout << fmt(" (measured %.0f)", measured_tokens_per_s);
  std::cout << "\n";
  if (shown == 0) {
    std::cout << "  no plan fits\n";
  } else {
    std::cout << plans_table(std::vector<Prediction>(res.ranked.begin(), res.ranked.begin() + static_cast<long>(shown)), mctx);
    const Prediction& top = res.ranked.front();
    std::cout << "  top plan: " << family_name(top.config) << ", micro-batch " << top.config.micro_batch << ", GAS "
              << top.config.gas << (top.config.activation_checkpointing ? ", checkpointing" : "") << ": "
              << fmt("%.2f", top.throughput.tokens_per_s / measured_plan.throughput.tokens_per_s)
              << "x the measured plan's tokens/s on this machine\n";
  }
  return 0;
}

}  // namespace stepcast
