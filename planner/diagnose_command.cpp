#include "planner/diagnose_command.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <set>
#include <sstream>

#include "calibrate/published.h"
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
                                    "--lora-targets", "--gpu-allocator", "--from-deepspeed",
                                    "--offload-pin-memory"};
const char* const kMeasuredFlags[] = {"--step-s", "--gas-s", "--opt-s", "--forward-s", "--backward-s", "--optimizer-s",
                                      "--peak-reserved-gib"};

std::optional<double> flag_value(const CLI::App& app, const char* flag, double v) {
  if (app.count(flag) == 0) return std::nullopt;
  if (!(v >= 0.0) || !std::isfinite(v) || v > 1e7)
    throw InputError(std::string(flag) + " " + std::to_string(v) + " is out of range [0, 1e7]");
  return v;
}

// A rate at `speed` times the profile's, beside the profile's: "3.2 GB/s host to GPU (profile 25.0)".
std::string rate_meaning(const char* what, double bytes_per_s, double speed, const std::string& extra) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.1f GB/s %s (profile %.1f%s)", speed * bytes_per_s / 1e9, what, bytes_per_s / 1e9,
                extra.c_str());
  return buf;
}

// What one resource's speed means in the machine's own units.
std::string speed_meaning(Resource r, double speed, const Diagnosis& d, const HardwareProfile& hw) {
  char buf[200];
  switch (r) {
    case Resource::kGpu: {
      // The dense peak of the precision the run computes in (an fp16 run: fp16's).
      const Precision p = d.runs.front().predicted.config.precision;
      const double peak = hw.gpu.peak_flops_per_s(p);
      std::snprintf(buf, sizeof buf, "%.0f TFLOP/s dense %s, %.2f TB/s (profile %.0f, %.2f)", speed * peak / 1e12,
                    precision_name(p), speed * hw.gpu.memory_bytes_per_s / 1e12, peak / 1e12,
                    hw.gpu.memory_bytes_per_s / 1e12);
      break;
    }
    case Resource::kCpuOptimizer:
      std::snprintf(buf, sizeof buf, "%.2f threads per rank of the profile's host (profile %.0f)",
                    speed * d.runs.front().cpu_threads_per_rank_profile, d.runs.front().cpu_threads_per_rank_profile);
      break;
    case Resource::kPcie:
      return rate_meaning("host to GPU", hw.host.h2d_bytes_per_s, speed, "");
    case Resource::kIntraNode:
      return rate_meaning("per GPU", hw.links.intra_node_bytes_per_s, speed, ", " + hw.links.intra_node);
    case Resource::kInterNode:
      return rate_meaning("per GPU", hw.links.inter_node_bytes_per_s, speed, "");
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
  // Each run's fitted phases on the machine the fit describes (an empty fit predicts nothing new).
  nlohmann::json after = nlohmann::json::array();
  size_t k = 0;
  for (const RunDiagnosis& r : d.runs) {
    nlohmann::json a = nlohmann::json::object();
    for (const PhaseRow& p : r.phases)
      if (p.fitted && k < f.predicted_s.size()) a[p.key + "_s"] = f.predicted_s[k++];
    after.push_back(a);
  }
  j["predicted_after"] = after;
  if (f.resources.size() == 1 && f.resources[0] == Resource::kCpuOptimizer)
    j["cpu_threads_per_rank"] = f.speeds[0] * d.runs.front().cpu_threads_per_rank_profile;
  return j;
}

struct Measurement {
  std::vector<DiagnosedRun> runs;
  std::string hardware;  // the records' or rows' own, where they name one
  std::string source;
};

MeasuredStep measured_of(const calibrate::RunRecord& r) {
  MeasuredStep m;
  m.step_s = r.step_s;
  if (r.config.gas > 1 && r.gas_s > 0) m.gas_s = r.gas_s;
  if (r.opt_s > 0) m.opt_s = r.opt_s;
  if (r.forward_s > 0) m.forward_s = r.forward_s;
  if (r.backward_s > 0) m.backward_s = r.backward_s;
  if (r.optimizer_total_s > 0) m.optimizer_s = r.optimizer_total_s;
  if (r.gpu_peak_reserved_bytes > 0) m.gpu_peak_reserved_bytes = r.gpu_peak_reserved_bytes;
  return m;
}

// The configurations and medians of the run records: one (or the one --key names), or with
// --all every one of them.
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
  if (runs.size() > 1 && !o.all) {
    std::string keys;
    for (size_t i = 0; i < runs.size() && i < 16; ++i) keys += (i ? "; " : "") + runs[i].key;
    throw InputError(o.runs.front() + " holds " + std::to_string(runs.size()) +
                     " configurations: name one with --key, or --all for all together (" + keys +
                     (runs.size() > 16 ? "; ..." : "") + ")");
  }
  Measurement m;
  for (const calibrate::RunRecord& r : runs) m.runs.push_back({r.key, r.model, r.config, {}, measured_of(r)});
  m.source = runs.size() == 1 ? runs.front().key + " in " + o.runs.front()
                              : std::to_string(runs.size()) + " configurations of " + o.runs.front() +
                                    (o.runs.size() > 1 ? " and " + std::to_string(o.runs.size() - 1) + " more files" : "");
  std::set<std::string> hw;
  calibrate::for_each_jsonl(files, "", [&](const std::filesystem::path&, const std::string&, const nlohmann::json& j) {
    if (j.contains("hardware") && j["hardware"].is_string()) hw.insert(j["hardware"].get<std::string>());
  });
  if (hw.size() == 1) m.hardware = *hw.begin();
  return m;
}

// The rows of a published source that give a step, GAS or OPT time (the founding report's), or
// those whose row name holds --row.
Measurement from_published(const DiagnoseOptions& o) {
  const calibrate::PublishedSource src = calibrate::load_published(o.published, data_dir(o.common));
  Measurement m;
  std::set<std::string> hw;
  for (const calibrate::PublishedRow& r : src.rows) {
    if (!o.row.empty() && r.where.find(o.row) == std::string::npos) continue;
    MeasuredStep ms;
    if (r.step_s > 0) ms.step_s = r.step_s;
    if (r.gas_time_s > 0) ms.gas_s = r.gas_time_s;
    if (r.opt_time_s > 0) ms.opt_s = r.opt_time_s;
    if (!ms.step_s && !ms.gas_s && !ms.opt_s) continue;  // a throughput alone: no phase to read
    if (r.peak_memory_bytes > 0) ms.gpu_peak_reserved_bytes = r.peak_memory_bytes;
    m.runs.push_back({src.id + ": " + r.where, r.model, r.config, r.limits, ms});
    hw.insert(r.hardware_name);
  }
  if (m.runs.empty())
    throw InputError(o.published + ": no row" + (o.row.empty() ? "" : " named like \"" + o.row + "\"") +
                     " gives a step, GAS or OPT time");
  if (hw.size() > 1) throw InputError(o.published + ": its rows ran on several GPU kinds: name one row with --row");
  m.hardware = *hw.begin();
  m.source = std::to_string(m.runs.size()) + " row" + (m.runs.size() > 1 ? "s" : "") + " of " + src.id + " (" + o.published + ")";
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
  app->add_flag("--all", d.all, "every configuration of the records, diagnosed together (the speeds they share)");
  app->add_option("--published", d.published,
                  "a data/published/*.toml source: its rows that give a step, GAS or OPT time (the founding "
                  "report's), diagnosed together");
  app->add_option("--row", d.row, "with --published: the rows whose name holds this text");
  app->add_flag("--leave-one-out", d.leave_one_out,
                "with several runs: predict each on the machine diagnosed from the others");
  app->add_option("--top", d.top, "plans to show for the machine as diagnosed")->capture_default_str();
}

namespace {

nlohmann::json phases_json(const RunDiagnosis& r) {
  nlohmann::json out = nlohmann::json::array();
  for (const PhaseRow& p : r.phases)
    out.push_back({{"phase", p.key}, {"measured_s", p.measured_s}, {"predicted_s", p.predicted_s},
                   {"ratio", p.predicted_s > 0 ? p.measured_s / p.predicted_s : 0.0}, {"fitted", p.fitted}});
  return out;
}

nlohmann::json derived_json(const RunDiagnosis& r) {
  if (!r.micro_batch_measured_s) return nullptr;
  return {{"micro_batch_measured_s", *r.micro_batch_measured_s}, {"micro_batch_predicted_s", r.micro_batch_predicted_s},
          {"after_last_micro_batch_measured_s", *r.after_last_micro_batch_measured_s},
          {"after_last_micro_batch_predicted_s", r.after_last_micro_batch_predicted_s}};
}

void print_run_rows(const RunDiagnosis& r, bool several) {
  char line[400];
  const std::string prefix = several ? r.label.substr(0, 44) : "";
  const auto row = [&](const std::string& name, double meas, double pred, const char* tail) {
    std::snprintf(line, sizeof line, "%-*s%-44s %10.3f %10.3f %9.2f  %s\n", several ? 46 : 0,
                  several ? prefix.c_str() : "", name.c_str(), meas, pred, pred > 0 ? meas / pred : 0.0, tail);
    std::cout << line;
  };
  for (const PhaseRow& p : r.phases) row(p.name, p.measured_s, p.predicted_s, p.fitted ? "yes" : "");
  if (r.micro_batch_measured_s) {
    row("one micro-batch (GAS time / (GAS - 1))", *r.micro_batch_measured_s, r.micro_batch_predicted_s, "");
    row("after the last micro-batch (OPT time - one)", *r.after_last_micro_batch_measured_s,
        r.after_last_micro_batch_predicted_s, "");
  }
}

}  // namespace

int run_diagnose(const CLI::App& app, DiagnoseOptions o) {
  if (o.top < 1 || o.top > 100) throw InputError("--top " + std::to_string(o.top) + " is out of range [1, 100]");
  if (!o.common.deepspeed_config.empty() || !o.common.accelerate_config.empty() || !o.common.fsdp_config.empty())
    throw InputError("diagnose writes no launcher config: run recommend or explain with the plan it names");
  if (o.common.peft == "auto") throw InputError("--peft auto compares methods, which recommend does: diagnose takes none, lora or qlora");
  if (!o.runs.empty() && !o.published.empty()) throw InputError("--run and --published: diagnose one or the other");
  if (o.all && o.runs.empty()) throw InputError("--all takes every configuration of --run's records: give --run");
  if (!o.row.empty() && o.published.empty()) throw InputError("--row names rows of --published: give --published");
  Measurement m;
  if (!o.runs.empty() || !o.published.empty()) {
    const char* what = o.runs.empty() ? "--published" : "--run";
    for (const char* f : kConfigFlags)
      if (app.count(f) > 0)
        throw InputError(std::string(f) + " is not taken with " + what + ": the configuration is the records' own");
    for (const char* f : kMeasuredFlags)
      if (app.count(f) > 0) throw InputError(std::string(f) + " is not taken with " + what + ": the records' times are");
    m = o.runs.empty() ? from_published(o) : from_runs(o);
    if (app.count("--hardware") == 0 && !m.hardware.empty()) o.common.hardware = m.hardware;
  } else {
    if (o.common.model.empty()) throw InputError("--model is required (or --run with run records)");
    DiagnosedRun r;
    r.model = resolve_model(o.common.model, data_dir(o.common));
    r.config = explain_config(o.common, o.config, r.model);
    r.measured.step_s = flag_value(app, "--step-s", o.step_s);
    r.measured.gas_s = flag_value(app, "--gas-s", o.gas_s);
    r.measured.opt_s = flag_value(app, "--opt-s", o.opt_s);
    r.measured.forward_s = flag_value(app, "--forward-s", o.forward_s);
    r.measured.backward_s = flag_value(app, "--backward-s", o.backward_s);
    r.measured.optimizer_s = flag_value(app, "--optimizer-s", o.optimizer_s);
    if (auto g = flag_value(app, "--peak-reserved-gib", o.peak_reserved_gib)) r.measured.gpu_peak_reserved_bytes = *g * kBytesPerGiB;
    m.runs.push_back(r);
    m.source = "the flags";
  }
  if (o.leave_one_out && m.runs.size() < 2) throw InputError("--leave-one-out needs several runs (--run ... --all, --published)");
  const bool several = m.runs.size() > 1;
  const HardwareProfile hw_profile = resolve_hardware(o.common.hardware, data_dir(o.common));
  // Each run's limits: the flags' (--cpu-cores, ...) where its source names none.
  const ResourceLimits flag_limits = limits_of(o.common);
  for (DiagnosedRun& r : m.runs)
    if (r.limits.cpu_cores_node == 0 && r.limits.cpu_threads_per_rank == 0 && r.limits.gpu_memory_bytes == 0 &&
        r.limits.host_memory_bytes_node == 0)
      r.limits = flag_limits;
  const TrainConfig& c = m.runs.front().config;
  // The profile for the runs' engine; with --speed, the machine those speeds describe (a diagnosis
  // of another run on it): the speeds solved here are then relative to it.
  const HardwareProfile hw_base = c.engine == Engine::kStepcast ? hw_profile : for_engine(hw_profile, engine_name(c.engine));
  HardwareProfile hw_engine = hw_base;
  if (has_speeds(o.common)) {
    const ResourceSpeeds sp = speeds_of(o.common);
    for (DiagnosedRun& r : m.runs) {
      const ScaledMachine sm = scale_machine(hw_base, r.config, r.limits, sp);
      r.limits = sm.limits;
      hw_engine = sm.hardware;
    }
  }
  // The model's own error on a phase where it knows the machine: this profile's, or for a
  // datasheet profile its reference's (engines_from), for the first run's class.
  const bool lb = launch_bound(evaluate(m.runs.front().model, hw_engine, c, m.runs.front().limits).time.host_issue_ratio);
  double noise = phase_noise_log(hw_engine, lb);
  if (noise <= 0 && !hw_profile.engines_from.empty()) {
    const HardwareProfile ref = resolve_hardware(hw_profile.engines_from, data_dir(o.common));
    noise = phase_noise_log(c.engine == Engine::kStepcast ? ref : for_engine(ref, engine_name(c.engine)), lb);
  }
  const Diagnosis d = diagnose(hw_engine, m.runs, noise);
  std::vector<LeftOut> loo;
  if (o.leave_one_out) loo = leave_one_out(hw_engine, m.runs, noise);

  // One run: the machine as diagnosed, the explanation's speeds applied, the same job ranked on it.
  const DiagnosedRun& first = m.runs.front();
  ResourceSpeeds speeds;
  for (size_t i = 0; i < d.explanation.resources.size(); ++i) speeds[d.explanation.resources[i]] = d.explanation.speeds[i];
  const ScaledMachine machine = scale_machine(hw_engine, first.config, first.limits, speeds);
  std::optional<Prediction> measured_plan;
  std::optional<SearchResult> res;
  SearchRequest req;
  double measured_tokens_per_s = 0;
  if (!several) {
    measured_plan = evaluate(first.model, machine.hardware, first.config, machine.limits);
    req.model = first.model;
    req.hardware = machine.hardware;
    req.base = first.config;
    req.limits = machine.limits;
    req.global_batch = first.config.micro_batch * first.config.gas * first.config.world_size();
    req.overlap_forward = first.config.engine == Engine::kStepcast;
    res = search_plans(req);
    if (first.measured.step_s && *first.measured.step_s > 0)
      measured_tokens_per_s = static_cast<double>(req.global_batch * first.config.seq_len) / *first.measured.step_s;
  }
  const size_t shown = res ? std::min(res->ranked.size(), static_cast<size_t>(o.top)) : 0;
  const RunDiagnosis& r0 = d.runs.front();
  ReportContext ctx{&first.model, &hw_engine, 0.0};
  ReportContext mctx{&first.model, &machine.hardware, 0.0};

  if (o.common.json) {
    nlohmann::json j;
    j["model"] = model_to_json(first.model);
    j["hardware"] = hardware_to_json(hw_engine, c);
    j["measured_source"] = m.source;
    if (has_speeds(o.common)) {
      const ResourceSpeeds sp = speeds_of(o.common);
      nlohmann::json gj = nlohmann::json::object();
      for (int i = 0; i < kNumResources; ++i) gj[resource_key(static_cast<Resource>(i))] = sp.speed[i];
      j["given_speeds"] = gj;
    }
    j["runs"] = nlohmann::json::array();
    for (size_t i = 0; i < d.runs.size(); ++i)
      j["runs"].push_back({{"label", d.runs[i].label}, {"plan", plan_to_json(d.runs[i].predicted, ctx)},
                           {"phases", phases_json(d.runs[i])}, {"derived", derived_json(d.runs[i])},
                           {"cpu_threads_per_rank_profile", d.runs[i].cpu_threads_per_rank_profile}});
    // One run: its plan, phases and derived phases at the top level too.
    if (!several) {
      j["plan"] = plan_to_json(r0.predicted, ctx);
      j["phases"] = phases_json(r0);
      if (r0.micro_batch_measured_s) j["derived"] = derived_json(r0);
      if (first.measured.gpu_peak_reserved_bytes)
        j["memory"] = {{"measured_peak_reserved_bytes", *first.measured.gpu_peak_reserved_bytes},
                       {"predicted_peak_reserved_bytes", r0.predicted.memory.gpu_total_bytes},
                       {"predicted_interval_95", {r0.predicted.gpu_memory_lo_bytes, r0.predicted.gpu_memory_hi_bytes}},
                       {"predicted_peak_allocated_bytes", r0.predicted.memory.gpu_allocated_bytes}};
    }
    j["rms_log_error_at_profile"] = d.rms_log_error;
    j["cpu_threads_per_rank_profile"] = r0.cpu_threads_per_rank_profile;
    j["single_resources"] = nlohmann::json::array();
    for (const ResourceFit& f : d.singles) j["single_resources"].push_back(fit_json(f, d, hw_engine));
    j["no_bearing"] = nlohmann::json::array();
    for (Resource r : d.no_bearing) j["no_bearing"].push_back(resource_key(r));
    if (d.best_pair) j["best_pair"] = fit_json(*d.best_pair, d, hw_engine);
    j["explanation"] = fit_json(d.explanation, d, hw_engine);
    j["explanation"]["exactly_determined"] = d.exactly_determined;
    j["noise_log_q95"] = d.noise_log;
    j["within_noise"] = d.within_noise;
    if (!loo.empty()) {
      j["leave_one_out"] = nlohmann::json::array();
      for (const LeftOut& l : loo) {
        nlohmann::json lj = {{"label", l.at_profile.label}, {"from_others", fit_json(l.from_others, d, hw_engine)}};
        lj["phases"] = nlohmann::json::array();
        for (size_t k = 0; k < l.at_profile.phases.size(); ++k) {
          const PhaseRow& p = l.at_profile.phases[k];
          lj["phases"].push_back({{"phase", p.key}, {"measured_s", p.measured_s}, {"profile_s", p.predicted_s},
                                  {"diagnosed_s", l.diagnosed_s.at(k)}});
        }
        j["leave_one_out"].push_back(lj);
      }
    }
    if (res) {
      nlohmann::json mj = {{"global_batch", req.global_batch},
                           {"measured_plan_predicted_tokens_per_s", measured_plan->throughput.tokens_per_s},
                           {"measured_tokens_per_s", measured_tokens_per_s},
                           {"fitting", res->ranked.size()}};
      mj["plans"] = nlohmann::json::array();
      for (size_t i = 0; i < shown; ++i) mj["plans"].push_back(plan_to_json(res->ranked[i], mctx));
      j["machine_as_diagnosed"] = mj;
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::cout << context_line(r0.predicted, ctx);
  if (!several)
    std::cout << family_name(c) << ", micro-batch " << c.micro_batch << ", GAS " << c.gas
              << (c.activation_checkpointing ? ", checkpointing" : "") << "\n";
  std::cout << "measured: " << m.source << "\n";
  if (has_speeds(o.common)) std::cout << speeds_note(o.common) << "; the speeds below are relative to them\n";
  std::cout << "\n";
  char line[400];
  std::cout << "Measured against predicted (per optimizer step)\n";
  std::snprintf(line, sizeof line, "%-*s%-44s %10s %10s %9s  %s\n", several ? 46 : 0, several ? "run" : "", "phase",
                "measured", "predicted", "meas/pred", "fitted");
  std::cout << line;
  std::snprintf(line, sizeof line, "%-*s%-44s %10s %10s\n", several ? 46 : 0, "", "", "s", "s");
  std::cout << line;
  for (const RunDiagnosis& r : d.runs) print_run_rows(r, several);
  if (!several && first.measured.gpu_peak_reserved_bytes) {
    std::snprintf(line, sizeof line, "%-44s %10.1f %10.1f %9.2f  (95 %%: %.1f-%.1f GiB)\n", "peak reserved GPU memory (GiB)",
                  *first.measured.gpu_peak_reserved_bytes / kBytesPerGiB, r0.predicted.memory.gpu_total_bytes / kBytesPerGiB,
                  *first.measured.gpu_peak_reserved_bytes / r0.predicted.memory.gpu_total_bytes,
                  r0.predicted.gpu_memory_lo_bytes / kBytesPerGiB, r0.predicted.gpu_memory_hi_bytes / kBytesPerGiB);
    std::cout << line;
    // Above the interval, the usual cause is the caching allocator's cache above the live bytes.
    if (r0.predicted.gpu_memory_hi_bytes > 0 && *first.measured.gpu_peak_reserved_bytes > r0.predicted.gpu_memory_hi_bytes)
      std::cout << "  above the 95 % interval: the caching allocator keeps more cache above the live bytes than the model "
                   "says (" << format_gib(r0.predicted.memory.gpu_allocated_bytes)
                << " GiB predicted allocated); expandable segments (--gpu-allocator expandable) keep less\n";
  }
  std::set<std::string> fitted_names;
  for (const RunDiagnosis& r : d.runs)
    for (const PhaseRow& p : r.phases)
      if (p.fitted) fitted_names.insert(p.name);
  std::string names;
  for (const std::string& n : fitted_names) names += (names.empty() ? "" : ", ") + n;
  std::cout << "rms error of the fitted phases at the profile's speeds: " << fmt("%.1f", 100.0 * std::expm1(d.rms_log_error))
            << " %\n\n";
  std::cout << "One resource at a time: its speed relative to the profile, solved on " << names
            << (several ? " of every run together" : "") << "\n";
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
    std::cout << "no bearing on " << (several ? "these runs" : "this run") << ":";
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
  if (!loo.empty()) {
    std::cout << "\nEach run predicted on the machine diagnosed from the others (leave one out)\n";
    std::snprintf(line, sizeof line, "%-46s%-10s %10s %10s %8s %10s %8s  %s\n", "run", "phase", "measured", "profile", "err",
                  "diagnosed", "err", "the others' explanation");
    std::cout << line;
    std::snprintf(line, sizeof line, "%-46s%-10s %10s %10s %8s %10s %8s\n", "", "", "s", "s", "%", "s", "%");
    std::cout << line;
    for (const LeftOut& l : loo)
      for (size_t k = 0; k < l.at_profile.phases.size(); ++k) {
        const PhaseRow& p = l.at_profile.phases[k];
        std::snprintf(line, sizeof line, "%-46s%-10s %10.3f %10.3f %+8.1f %10.3f %+8.1f  %s\n",
                      k == 0 ? l.at_profile.label.substr(0, 44).c_str() : "", p.name.c_str(), p.measured_s, p.predicted_s,
                      100.0 * (p.predicted_s / p.measured_s - 1.0), l.diagnosed_s[k],
                      100.0 * (l.diagnosed_s[k] / p.measured_s - 1.0), k == 0 ? fit_label(l.from_others).c_str() : "");
        std::cout << line;
      }
  }
  std::cout << "\n";
  if (!res) {
    std::cout << "planner recommend --speed RESOURCE=X ... ranks a job's plans on the machine as diagnosed\n";
    return 0;
  }
  std::cout << "On this machine as diagnosed, the same job (global batch " << req.global_batch << " sequences):\n";
  std::snprintf(line, sizeof line, "  the measured plan: predicted %.0f tokens/s", measured_plan->throughput.tokens_per_s);
  std::cout << line;
  if (measured_tokens_per_s > 0) std::cout << fmt(" (measured %.0f)", measured_tokens_per_s);
  std::cout << "\n";
  if (shown == 0) {
    std::cout << "  no plan fits\n";
  } else {
    std::cout << plans_table(std::vector<Prediction>(res->ranked.begin(), res->ranked.begin() + static_cast<long>(shown)), mctx);
    const Prediction& top = res->ranked.front();
    std::cout << "  top plan: " << family_name(top.config) << ", micro-batch " << top.config.micro_batch << ", GAS "
              << top.config.gas << (top.config.activation_checkpointing ? ", checkpointing" : "") << ": "
              << fmt("%.2f", top.throughput.tokens_per_s / measured_plan->throughput.tokens_per_s)
              << "x the measured plan's tokens/s on this machine\n";
  }
  return 0;
}

}  // namespace stepcast
