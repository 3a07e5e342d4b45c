// planner: rank training configurations for a model and a budget with the
// analytic cost model, or explain one configuration.
//
//   planner recommend --model 6b --gpus 2 [--json] [--deepspeed-config FILE]
//   planner explain --model llama-2-7b --gpus 2 --stage 2 --micro-batch 4 --gas 4
//   planner models [--json]      planner hardware [--json]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "common/atomic_file.h"
#include "common/cli.h"
#include "common/errors.h"
#include "common/run_main.h"
#include "common/units.h"
#include "planner/compare.h"
#include "planner/compare_command.h"
#include "planner/options.h"
#include "planner/deepspeed_config.h"
#include "planner/diagnose_command.h"
#include "planner/k8s_manifest.h"
#include "planner/plan_search.h"
#include "planner/report.h"
#include "planner/validate.h"

namespace stepcast {
namespace {


// The best-ranked plan with CPU optimizer offload, if any fits.
const Prediction* best_offload(const SearchResult& res) {
  for (const Prediction& p : res.ranked)
    if (p.config.offload_optimizer == OffloadDevice::kCpu) return &p;
  return nullptr;
}

// (CommonOptions, base_config, limits_of: planner/options.h; run_compare: planner/compare_command.cpp)

// What expandable segments cost a peer engine, measured and not in its predicted step time: on
// one H100 DeepSpeed's ZeRO-3 ran 13-19 % slower with them (its per-module gathers and frees)
// and its ZeRO-2 at micro-batch 3, filling the card, 12 %; ZeRO-1/2 elsewhere and FSDP2 with room
// within 2 % (docs/cost_model.md, Memory); our backend within 0.5 %.
const char* kPeerExpandableCaveat =
    "expandable segments: DeepSpeed's ZeRO-3 ran 13-19 % slower with them on one H100 (ZeRO-2 "
    "filling the card 12 %; ZeRO-1/2 elsewhere and FSDP2 within 2 %); the predicted step time does "
    "not include it";

// Writes the launcher configs for `plan`, atomically; returns the notes to print.
std::vector<std::string> write_launchers(const CommonOptions& o, const ModelSpec& model, const HardwareProfile& hw,
                                         const ResourceLimits& limits, const Prediction& plan) {
  std::vector<std::string> notes;
  if (plan.config.gpu_expandable_segments && plan.config.engine != Engine::kStepcast &&
      (!o.fsdp_config.empty() || !o.deepspeed_config.empty()))
    notes.push_back("launch with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in every rank's environment: the "
                    "plan's memory is predicted for expandable segments (--gpu-allocator expandable)");
  if (!o.fsdp_config.empty()) {
    write_file_atomic(o.fsdp_config, accelerate_fsdp_yaml(model, plan.config));
    notes.push_back("Accelerate FSDP2 config written to " + o.fsdp_config + " (micro-batch " +
                    std::to_string(plan.config.micro_batch) + ", gradient accumulation " +
                    std::to_string(plan.config.gas) + ": set them in the training script" +
                    (plan.config.gas > 1
                         ? plan.config.grad_sync_each_micro
                               ? "; this plan reduces after every micro-batch: GradientAccumulationPlugin(num_steps=" +
                                     std::to_string(plan.config.gas) + ", sync_each_batch=True)"
                               : "; this plan reduces after the last micro-batch only (Accelerate's default), "
                                 "holding each parameter's whole fp32 gradient until then"
                         : std::string()) +
                    ")");
  }
  if (o.deepspeed_config.empty()) return notes;
  // DeepSpeed runs its (fp32) CPU Adam after the whole backward, not pipelined with it as the
  // Stepcast backend does: what the written config will run at.
  std::string under_deepspeed;
  if (plan.config.offload_optimizer == OffloadDevice::kCpu && plan.config.offload_pipeline) {
    TrainConfig ds = plan.config;
    ds.offload_pipeline = false;
    ds.offload_overlap_forward = false;
    ds.optimizer = OptimizerKind::kAdamW;
    const Prediction d = evaluate(model, hw, ds, limits);
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "under DeepSpeed (its CPU Adam runs after the backward%s): predicted %.0f tokens/s, %.1f %% below "
                  "this plan's %.0f on the Stepcast backend (planner explain ... --offload-pipeline off)",
                  plan.config.optimizer == OptimizerKind::kAdamW8bit ? ", with fp32 states" : "",
                  d.throughput.tokens_per_s, 100.0 * (1.0 - d.throughput.tokens_per_s / plan.throughput.tokens_per_s),
                  plan.throughput.tokens_per_s);
    under_deepspeed = buf;
  }
  LauncherConfig lc = deepspeed_config(model, plan.config);
  // Build every output before writing any, so a failure leaves nothing half-done.
  const std::string ds_text = lc.deepspeed.dump(2) + "\n";
  std::string yaml;
  if (!o.accelerate_config.empty()) yaml = accelerate_yaml(plan.config, o.deepspeed_config);
  std::vector<std::pair<std::filesystem::path, std::string>> files{{o.deepspeed_config, ds_text}};
  if (!yaml.empty()) files.emplace_back(o.accelerate_config, yaml);
  write_files_atomic(files);  // both or neither
  notes.push_back("DeepSpeed config written to " + o.deepspeed_config);
  if (!yaml.empty()) notes.push_back("Accelerate config written to " + o.accelerate_config);
  for (const auto& n : lc.notes) notes.push_back(n);
  if (!under_deepspeed.empty()) notes.push_back(under_deepspeed);
  return notes;
}

std::vector<OptimizerKind> parse_optimizer_list(const std::string& list) {
  std::vector<OptimizerKind> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    out.push_back(parse_optimizer(item, "--optimizers item"));
  }
  if (out.empty()) throw InputError("--optimizers \"" + list + "\" names no optimizer (valid: adamw, adamw8bit)");
  return out;
}

// The search both recommend and validate run, from the common flags.
SearchRequest make_request(const CommonOptions& o, Engine engine, int64_t global_batch, const std::string& optimizers) {
  SearchRequest req;
  req.model = resolve_model(o.model, data_dir(o));
  req.base = base_config(o, req.model, engine);
  req.hardware = resolve_hardware(o.hardware, data_dir(o));
  req.limits = limits_of(o);
  if (global_batch < 0 || global_batch > (int64_t{1} << 30))
    throw InputError("--global-batch " + std::to_string(global_batch) + " is out of range [0, 2^30] (0: GAS ranges over 1..32)");
  req.global_batch = global_batch;
  req.optimizers = parse_optimizer_list(optimizers);
  if (o.peft == "auto") req.pefts = {PeftKind::kNone, PeftKind::kLora, PeftKind::kQlora};
  return req;
}

// recommend's and validate's --offload-pipeline: whether Stepcast offload plans overlap
// their last updates with the next forward (full) or not (on).
bool ranking_overlaps_forward(const std::string& pipeline, const char* command) {
  if (pipeline != "on" && pipeline != "full")
    throw InputError("--offload-pipeline \"" + pipeline + "\" is not valid for " + command +
                     " (valid: on, full; --engine deepspeed ranks DeepSpeed's serial order)");
  return pipeline == "full";
}

// recommend --peft auto: the best plan of each fine-tuning method (full, LoRA, QLoRA) for the
// same model, batch and GPUs, or the least memory one of its plans needs where none fits.
struct PeftRow {
  PeftKind peft = PeftKind::kNone;
  const Prediction* best = nullptr;
  double least_gpu_bytes = 0;  // where nothing fits: the least GPU memory of its plans
  std::string why;             // and why that plan does not fit
  double trainable_params = 0;
};

std::vector<PeftRow> peft_comparison(const SearchRequest& req, const SearchResult& res) {
  std::vector<PeftRow> rows;
  for (PeftKind k : req.pefts) {
    PeftRow r;
    r.peft = k;
    TrainConfig c = req.base;
    c.peft = k;
    r.trainable_params = k == PeftKind::kNone ? static_cast<double>(req.model.total_params()) : lora_params(req.model, c);
    for (const Prediction& p : res.ranked)
      if (p.config.peft == k) {
        r.best = &p;
        break;
      }
    if (!r.best) {
      r.least_gpu_bytes = std::numeric_limits<double>::infinity();
      for (const FamilyOutcome& f : res.families)
        if (f.smallest_memory && f.smallest_memory->config.peft == k &&
            f.smallest_memory->memory.gpu_required_bytes < r.least_gpu_bytes) {
          r.least_gpu_bytes = f.smallest_memory->memory.gpu_required_bytes;
          r.why = f.smallest_memory->reason;
        }
    }
    rows.push_back(r);
  }
  return rows;
}

std::string peft_label(const TrainConfig& c) {
  if (!c.peft_enabled()) return "full fine-tuning";
  return std::string(c.peft == PeftKind::kLora ? "LoRA" : "QLoRA") + " r" + std::to_string(c.lora_rank) + " " +
         lora_targets_name(c.lora_targets);
}

int run_recommend(const CommonOptions& o, int64_t global_batch, const std::string& optimizers,
                  int top_k, bool no_offload, const std::string& engine, const std::string& pipeline) {
  if (top_k < 1) throw InputError("--top " + std::to_string(top_k) + " must be at least 1");
  const Engine eng = parse_engine(engine, "--engine");
  const bool overlap_forward = ranking_overlaps_forward(pipeline, "recommend");
  SearchRequest req = make_request(o, eng, global_batch, optimizers);
  const TrainConfig& base = req.base;
  req.allow_offload = !no_offload;
  req.overlap_forward = overlap_forward;
  // The same job on the Stepcast backend, for a peer engine's user: its best plan and the ratio.
  // The backend trains bf16 or fp32: an fp16 job runs there in bf16 where the GPU has it.
  std::optional<Prediction> ours;
  CommonOptions ours_options = o;
  if (ours_options.precision == "fp16") ours_options.precision = "bf16";
  const bool backend_runs_it = ours_options.precision != "bf16" || req.hardware.gpu.peak_bf16_flops_per_s > 0;
  if (eng != Engine::kStepcast && backend_runs_it) {
    SearchRequest sreq = req;
    sreq.base = base_config(ours_options, req.model, Engine::kStepcast);
    const ScaledMachine smc = machine_of(o, req.hardware, sreq.base);
    sreq.hardware = smc.hardware;
    sreq.limits = smc.limits;
    const SearchResult sres = search_plans(sreq);
    if (!sres.ranked.empty()) ours = sres.ranked.front();
  }
  req.hardware = for_engine(req.hardware, engine);
  if (has_speeds(o)) {
    const ScaledMachine mc = scale_machine(req.hardware, req.base, req.limits, speeds_of(o));
    req.hardware = mc.hardware;
    req.limits = mc.limits;
  }
  SearchResult res = search_plans(req);
  if (has_speeds(o)) res.notes.push_back(speeds_note(o));
  // The same search with expandable segments, where the job runs torch's default allocator: what
  // the cache they leave out would let fit, and how much faster its top plan is.
  std::optional<SearchResult> expandable;
  if (!base.gpu_expandable_segments) {
    SearchRequest ereq = req;
    ereq.base.gpu_expandable_segments = true;
    expandable = search_plans(ereq);
  }
  double expandable_gain_frac = 0.0;
  if (expandable && !expandable->ranked.empty()) {
    const double top_now = res.ranked.empty() ? 0.0 : res.ranked.front().throughput.tokens_per_s;
    const Prediction& etop = expandable->ranked.front();
    expandable_gain_frac = top_now > 0 ? etop.throughput.tokens_per_s / top_now - 1.0 : 0.0;
    // Said only where it changes the answer: a plan where none fits, or a faster top plan.
    if (res.ranked.empty() || expandable_gain_frac >= 0.01) {
      char gain[64] = "";
      if (top_now > 0) std::snprintf(gain, sizeof gain, ", %+.1f %% against this top plan", 100.0 * expandable_gain_frac);
      char buf[480];
      std::snprintf(buf, sizeof buf,
                    "with expandable segments (--gpu-allocator expandable; %s) %zu plans fit instead of %zu (the "
                    "caching allocator keeps less cache above the live bytes); their top plan (%s, micro-batch %lld, "
                    "GAS %lld%s) is predicted at %.0f tokens/s%s",
                    eng == Engine::kStepcast ? "train --gpu-allocator expandable"
                                             : "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                    expandable->ranked.size(), res.ranked.size(), family_name(etop.config).c_str(),
                    static_cast<long long>(etop.config.micro_batch), static_cast<long long>(etop.config.gas),
                    etop.config.activation_checkpointing ? ", checkpointing" : "", etop.throughput.tokens_per_s, gain);
      res.notes.push_back(buf);
      if (eng != Engine::kStepcast) res.notes.push_back(kPeerExpandableCaveat);
    }
  }
  if (!req.hardware.coefs_calibrated && req.hardware.engines.count(engine) == 0 && eng != Engine::kStepcast)
    res.notes.push_back("engine " + engine + " is not calibrated on " + req.hardware.name +
                        " (no [engines." + engine + "] section): its predictions use the Stepcast backend's "
                        "engine coefficients");
  if (ours && !res.ranked.empty()) {
    const Prediction& top = res.ranked.front();
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "on the Stepcast backend the same job's best plan (%s, micro-batch %lld, GAS %lld%s%s) is predicted "
                  "at %.0f tokens/s: %.2fx this %s plan's %.0f",
                  family_name(ours->config).c_str(), static_cast<long long>(ours->config.micro_batch),
                  static_cast<long long>(ours->config.gas), ours->config.activation_checkpointing ? ", checkpointing" : "",
                  o.precision == "fp16" ? ", in bf16" : "",
                  ours->throughput.tokens_per_s, ours->throughput.tokens_per_s / top.throughput.tokens_per_s,
                  engine.c_str(), top.throughput.tokens_per_s);
    res.notes.push_back(buf);
  }
  ReportContext ctx{&req.model, &req.hardware, o.train_tokens};

  std::vector<std::string> notes;
  if (!res.ranked.empty()) notes = write_launchers(o, req.model, req.hardware, req.limits, res.ranked.front());

  const size_t shown = std::min(res.ranked.size(), static_cast<size_t>(top_k));
  if (o.json) {
    nlohmann::json j;
    j["model"] = model_to_json(req.model);
    j["hardware"] = hardware_to_json(req.hardware, base);
    j["request"] = {{"global_batch", global_batch},
                    {"seq_len", base.seq_len},
                    {"engine", engine},
                    {"offload_pipeline", req.peer_engine() ? "off" : pipeline},
                    {"precision", precision_name(base.precision)}, {"top", top_k}};
    j["evaluated"] = res.evaluated;
    j["fitting"] = res.ranked.size();
    j["plans"] = nlohmann::json::array();
    for (size_t i = 0; i < shown; ++i) j["plans"].push_back(plan_to_json(res.ranked[i], ctx));
    j["families"] = nlohmann::json::array();
    for (const auto& f : res.families) {
      nlohmann::json fj = {{"family", f.family}, {"fits", f.any_fits}, {"why", f.why}};
      if (f.best) {
        fj["best_tokens_per_s"] = f.best->throughput.tokens_per_s;
        fj["loss_frac"] = f.loss_frac;
        fj["best"] = plan_to_json(*f.best, ctx);
      }
      j["families"].push_back(fj);
    }
    if (const Prediction* off = best_offload(res)) {
      nlohmann::json lj = {{"plan", plan_to_json(*off, ctx)}, {"levers", nlohmann::json::array()}};
      for (const Lever& l : offload_levers(req, *off))
        lj["levers"].push_back({{"lever", l.name}, {"tokens_per_s", l.result.throughput.tokens_per_s},
                                {"gain_frac", l.gain_frac}, {"fits", l.result.fits},
                                {"gpu_memory_bytes", l.result.memory.gpu_total_bytes}});
      j["offload_levers"] = lj;
    }
    if (!req.pefts.empty()) {
      j["peft_comparison"] = nlohmann::json::array();
      for (const PeftRow& r : peft_comparison(req, res)) {
        nlohmann::json pj = {{"peft", peft_name(r.peft)}, {"trainable_params", r.trainable_params},
                             {"fits", r.best != nullptr}};
        if (r.best) {
          pj["plan"] = plan_to_json(*r.best, ctx);
          pj["tokens_per_s"] = r.best->throughput.tokens_per_s;
          pj["step_time_s"] = r.best->time.step_s;
          pj["gpu_memory_bytes"] = r.best->memory.gpu_total_bytes;
          pj["host_memory_bytes_node"] = r.best->memory.host_node_total_bytes;
        } else if (std::isfinite(r.least_gpu_bytes)) {
          pj["least_gpu_memory_bytes"] = r.least_gpu_bytes;
          pj["why"] = r.why;
        }
        j["peft_comparison"].push_back(pj);
      }
    }
    j["suggestions"] = res.suggestions;
    j["ranking"] = {{"typical_error_frac", res.typical_error_frac}, {"tied_with_top", res.tied_with_top}};
    // What the text prints as "note:" lines, then the launchers' notes.
    nlohmann::json all_notes = res.notes;
    for (const auto& n : notes) all_notes.push_back(n);
    j["notes"] = all_notes;
    if (res.best_tight) j["best_tight"] = plan_to_json(*res.best_tight, ctx);
    // The same search with expandable segments: how many plans fit, its top plan and the gain.
    if (expandable) {
      nlohmann::json ej = {{"fitting", expandable->ranked.size()}};
      if (!expandable->ranked.empty()) {
        ej["plan"] = plan_to_json(expandable->ranked.front(), ctx);
        ej["tokens_per_s"] = expandable->ranked.front().throughput.tokens_per_s;
        ej["gain_frac"] = expandable_gain_frac;
      }
      j["expandable_segments"] = ej;
    }
    // A peer engine's user: the same job's best plan on the Stepcast backend, and the ratio.
    if (ours && !res.ranked.empty())
      j["stepcast_backend"] = {{"plan", plan_to_json(*ours, ctx)},
                               {"tokens_per_s", ours->throughput.tokens_per_s},
                               {"ratio_to_top_plan", ours->throughput.tokens_per_s / res.ranked.front().throughput.tokens_per_s}};
    std::cout << j.dump(2) << "\n";
  } else {
    const Prediction& any = res.ranked.empty() ? *res.smallest_memory : res.ranked.front();
    std::cout << context_line(any, ctx);
    std::cout << "global batch " << (global_batch > 0 ? std::to_string(global_batch) + " sequences" : "free (GAS 1..32)")
              << "; " << res.evaluated
              << " configurations evaluated, " << res.ranked.size() << " fit, " << res.dropped
              << " dropped (memory)\n\n";
    if (!res.ranked.empty()) {
      std::vector<Prediction> top(res.ranked.begin(), res.ranked.begin() + static_cast<long>(shown));
      std::cout << "Top " << shown << " (ranked by predicted tokens/s less a " << handicap_range_text()
                << " handicap per added mechanism)\n" << plans_table(top, ctx) << "\n";
      std::cout << "Top plan: " << family_name(res.ranked.front().config) << ", micro-batch "
                << res.ranked.front().config.micro_batch << ", GAS " << res.ranked.front().config.gas
                << (res.ranked.front().config.activation_checkpointing ? ", checkpointing" : "") << "\n";
      std::cout << breakdown_text(res.ranked.front(), ctx) << "\n";
    }
    std::cout << "Why the others lose (best member of each family)\n";
    for (const auto& f : res.families) std::cout << "  " << f.family << ": " << f.why << "\n";
    if (const Prediction* off = best_offload(res)) {
      std::cout << "\nWhat each lever would buy the best offload plan (" << family_name(off->config) << ", micro-batch "
                << off->config.micro_batch << ", GAS " << off->config.gas << ": "
                << fmt("%.0f", off->throughput.tokens_per_s) << " tokens/s)\n";
      for (const Lever& l : offload_levers(req, *off))
        std::cout << "  " << l.name << ": " << fmt("%+.0f", 100.0 * l.gain_frac) << " % tokens/s ("
                  << fmt("%.0f", l.result.throughput.tokens_per_s) << ")"
                  << (l.result.fits ? "" : ", " + fit_verdict(l.result)) << "\n";
    }
    if (!req.pefts.empty()) {
      std::cout << "\nfull fine-tuning against LoRA and QLoRA (--peft auto; best plan of each on " << base.world_size()
                << " GPU" << (base.world_size() > 1 ? "s" : "") << "):\n";
      char line[400];
      std::snprintf(line, sizeof line, "  %-24s %12s %10s %9s %9s %9s  %s\n", "method", "trainable", "tokens/s",
                    "step s", "GPU GiB", "host GiB", "plan");
      std::cout << line;
      for (const PeftRow& r : peft_comparison(req, res)) {
        TrainConfig c = base;
        c.peft = r.peft;
        if (r.best) {
          const Prediction& p = *r.best;
          std::snprintf(line, sizeof line, "  %-24s %12.4g %10.0f %9.3f %9.1f %9.1f  ", peft_label(c).c_str(),
                        r.trainable_params, p.throughput.tokens_per_s, p.time.step_s,
                        p.memory.gpu_total_bytes / kBytesPerGiB, p.memory.host_node_total_bytes / kBytesPerGiB);
          std::cout << line << family_name(p.config) << ", micro-batch " << p.config.micro_batch << ", GAS "
                    << p.config.gas << (p.config.activation_checkpointing ? ", checkpointing" : "") << "\n";
        } else {
          std::snprintf(line, sizeof line, "  %-24s %12.4g %10s %9s %9s %9s  ", peft_label(c).c_str(),
                        r.trainable_params, "-", "-",
                        std::isfinite(r.least_gpu_bytes) ? fmt("%.1f", r.least_gpu_bytes / kBytesPerGiB).c_str() : "-",
                        "-");
          std::cout << line << "does not fit; its plan of least GPU memory: " << r.why << "\n";
        }
      }
    }
    for (const auto& n : res.notes) std::cout << "note: " << n << "\n";
    for (const auto& n : notes) std::cout << n << "\n";
  }
  if (res.ranked.empty()) {
    std::cerr << "planner: nothing fits";
    for (const auto& s : res.suggestions) std::cerr << "; " << s;
    std::cerr << "\n";
    return 1;
  }
  return 0;
}

int run_explain(const CommonOptions& o, const ExplainOptions& e) {
  if (o.peft == "auto")
    throw InputError("--peft auto compares methods, which recommend does: explain takes none, lora or qlora");
  const ModelSpec model = resolve_model(o.model, data_dir(o));
  const TrainConfig c = explain_config(o, e, model);
  HardwareProfile hw = resolve_hardware(o.hardware, data_dir(o));
  const ScaledMachine mc = machine_of(o, hw, c);
  Prediction p = evaluate(model, mc.hardware, c, mc.limits);
  ReportContext ctx{&model, &hw, o.train_tokens};
  std::vector<std::string> notes = write_launchers(o, model, mc.hardware, mc.limits, p);
  if (p.config.gpu_expandable_segments && p.config.engine != Engine::kStepcast) notes.push_back(kPeerExpandableCaveat);
  if (has_speeds(o)) notes.push_back("note: " + speeds_note(o));
  if (o.json) {
    nlohmann::json j;
    j["model"] = model_to_json(model);
    j["hardware"] = hardware_to_json(hw, c);
    j["plans"] = nlohmann::json::array({plan_to_json(p, ctx)});
    j["notes"] = notes;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << context_line(p, ctx) << family_name(c) << ", micro-batch " << c.micro_batch << ", GAS "
              << c.gas << (c.activation_checkpointing ? ", checkpointing" : "") << "\n\n";
    std::cout << plans_table({p}, ctx) << "\n" << breakdown_text(p, ctx);
    for (const auto& n : notes) std::cout << n << "\n";
  }
  return 0;
}

// planner validate: runs the top-K plans on the backend (`train --plan`) for a
// few steps and prints predicted against measured, and the regret of the top
// plan against the best measured one.
int run_validate(const CommonOptions& o, int64_t global_batch, const std::string& optimizers, ValidateOptions v) {
  if (v.top < 1) throw InputError("--top " + std::to_string(v.top) + " must be at least 1");
  if (v.sample < 0 || v.sample > 1000) throw InputError("--sample " + std::to_string(v.sample) + " is out of range [0, 1000]");
  if (v.steps < 2) throw InputError("--steps " + std::to_string(v.steps) + " must be at least 2 (the first is warm-up)");
  if (has_speeds(o))
    throw InputError("validate measures this machine: --speed, the speeds of another machine, does not apply");
  SearchRequest req = make_request(o, Engine::kStepcast, global_batch, optimizers);
  req.overlap_forward = ranking_overlaps_forward(v.pipeline, "validate");
  const SearchResult res = search_plans(req);
  if (res.ranked.empty()) throw InputError("nothing fits: no plan to validate");
  v.model = o.model;
  v.hardware = o.hardware;
  v.data_dir = o.data_dir;
  v.json = o.json;
  return validate_plans(req, res, v);
}

int run_models(const std::string& dir_flag, bool json) {
  CommonOptions o;
  o.data_dir = dir_flag;
  nlohmann::json arr = nlohmann::json::array();
  std::ostringstream text;
  text << "name            aliases           type      params\n";
  text << "--------------  ----------------  --------  --------------\n";
  for (const auto& entry : list_model_catalog(data_dir(o))) {
    ModelSpec m = load_model_card(entry.path);
    nlohmann::json j = model_to_json(m);
    j["aliases"] = entry.aliases;
    arr.push_back(j);
    std::string aliases;
    for (const auto& a : entry.aliases) aliases += (aliases.empty() ? "" : ",") + a;
    char buf[200];
    std::snprintf(buf, sizeof buf, "%-14s  %-16s  %-8s  %14lld\n", m.name.c_str(), aliases.c_str(),
                  m.model_type.c_str(), static_cast<long long>(m.total_params()));
    text << buf;
  }
  std::cout << (json ? arr.dump(2) + "\n" : text.str());
  return 0;
}

int run_hardware(const std::string& dir_flag, bool json) {
  CommonOptions o;
  o.data_dir = dir_flag;
  nlohmann::json arr = nlohmann::json::array();
  std::ostringstream text;
  text << "name            GPU                      memory  bf16 peak  HBM     link    calibrated  $/GPU-h  provider\n";
  text << "                                         GiB     TFLOP/s    TB/s\n";
  text << "--------------  -----------------------  ------  ---------  ------  ------  ----------  -------  ---------\n";
  for (const auto& name : list_hardware(data_dir(o))) {
    HardwareProfile hw = resolve_hardware(name, data_dir(o));
    arr.push_back({{"name", hw.name},
                   {"gpu", hw.gpu.name},
                   {"memory_bytes", hw.gpu.memory_bytes},
                   {"peak_bf16_flops_per_s", hw.gpu.peak_bf16_flops_per_s},
                   {"memory_bytes_per_s", hw.gpu.memory_bytes_per_s},
                   {"intra_node", hw.links.intra_node},
                   {"calibrated", hw.coefs_calibrated}});
    nlohmann::json prices = nlohmann::json::array();
    for (const PriceOffer& p : hw.prices)
      prices.push_back({{"provider", p.provider}, {"usd_per_gpu_hour", p.usd_per_gpu_hour}, {"kubernetes", p.kubernetes},
                        {"includes_host", p.includes_host}, {"vcpus_per_gpu", p.vcpus_per_gpu},
                        {"memory_bytes_per_gpu", p.memory_bytes_per_gpu}, {"source", p.source}, {"date", p.date}});
    arr.back()["prices"] = prices;
    char buf[240];
    std::snprintf(buf, sizeof buf, "%-14s  %-23s  %6.1f  %9.0f  %6.2f  %-6s  %-10s  %7s  %s\n", hw.name.c_str(),
                  hw.gpu.name.c_str(), hw.gpu.memory_bytes / kBytesPerGiB, hw.gpu.peak_bf16_flops_per_s / 1e12,
                  hw.gpu.memory_bytes_per_s / 1e12, hw.links.intra_node.c_str(),
                  hw.coefs_calibrated ? "yes" : "no",
                  hw.prices.empty() ? "-" : fmt("%.2f", hw.prices.front().usd_per_gpu_hour).c_str(),
                  hw.prices.empty() ? "-" : hw.prices.front().provider.c_str());
    text << buf;
  }
  std::cout << (json ? arr.dump(2) + "\n" : text.str());
  return 0;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"Stepcast planner: predicts step time and memory of LLM fine-tuning configurations "
               "(ZeRO stage, offload, GAS, micro-batch, optimizer, checkpointing) and ranks them."};
  app.require_subcommand(1);

  CommonOptions rec_opts;
  int64_t global_batch = 64;
  std::string optimizers = "adamw,adamw8bit";
  int top_k = 5;
  bool no_offload = false;
  CLI::App* rec = app.add_subcommand("recommend", "rank the configurations that fit");
  add_common(rec, rec_opts);
  rec->add_option("--global-batch", global_batch,
                  "sequences per optimizer step across all ranks (fixes micro-batch x GAS x ranks); "
                  "0 lets GAS range over 1..32")
      ->capture_default_str();
  rec->add_option("--optimizers", optimizers, "comma-separated: adamw (fp32 states), adamw8bit (block-wise 8-bit states)")
      ->capture_default_str();
  rec->add_option("--top", top_k, "plans to show")->capture_default_str();
  rec->add_flag("--no-offload", no_offload, "exclude CPU offload from the search");
  std::string engine = "stepcast";
  rec->add_option("--engine", engine,
                  "stepcast: rank for the Stepcast backend (pipelined offload, 8-bit offloaded states); "
                  "deepspeed: for DeepSpeed (serial fp32 CPU Adam)")
      ->capture_default_str();
  std::string rec_pipeline = "full";
  rec->add_option("--offload-pipeline", rec_pipeline,
                  "Stepcast offload plans: on (CPU updates pipelined with the backward) or full (the last ones "
                  "also overlap the next forward)")
      ->capture_default_str();

  CommonOptions exp_opts;
  ExplainOptions e;
  CLI::App* exp = app.add_subcommand("explain", "predict one configuration");
  add_common(exp, exp_opts);
  add_explain_config(exp, e);

  CommonOptions val_opts;
  ValidateOptions vo;
  int64_t val_global_batch = 64;
  std::string val_optimizers = "adamw,adamw8bit";
  CLI::App* val = app.add_subcommand("validate", "run the top plans on the backend and compare with the prediction");
  add_common(val, val_opts);
  val->add_option("--global-batch", val_global_batch, "sequences per optimizer step across all ranks")->capture_default_str();
  val->add_option("--optimizers", val_optimizers, "comma-separated: adamw, adamw8bit")->capture_default_str();
  val->add_option("--top", vo.top, "plans to run")->capture_default_str();
  val->add_option("--sample", vo.sample,
                  "further plans to run for the ranking's quality (Kendall's tau): half spread over the rest of "
                  "the ranking, half random fitting plans")
      ->capture_default_str();
  val->add_option("--seed", vo.seed, "seed of --sample's random plans")->capture_default_str();
  val->add_option("--steps", vo.steps, "steps per plan (the first is warm-up)")->capture_default_str();
  val->add_option("--train", vo.train, "path of the train binary");
  val->add_option("--device", vo.device, "auto | cpu | cuda")->capture_default_str();
  val->add_option("--append", vo.append, "append the runs to this JSONL (calibration data for a refit)");
  val->add_option("--offload-pipeline", vo.pipeline, "offload plans: full or on, as in recommend")->capture_default_str();

  DiagnoseOptions diag;
  CLI::App* diagc = app.add_subcommand(
      "diagnose", "a measured run against its prediction, phase by phase, and which resource of the machine explains the gap");
  add_diagnose(diagc, diag);

  CompareOptions cmp;
  CLI::App* cmpc = app.add_subcommand("compare", "best plan, wall-clock and cost of a whole fine-tune per GPU kind and count");
  cmpc->add_option("--model", cmp.common.model, "catalog name or alias, a .toml card or a Hugging Face config.json")->required();
  cmpc->add_option("--train-tokens", cmp.common.train_tokens, "tokens of the whole fine-tune (e.g. 1e9)")->required();
  cmpc->add_option("--hardware", cmp.hardware_list,
                   "comma-separated profiles to compare (default: every profile with a price; see `planner hardware`)");
  cmpc->add_option("--max-gpus", cmp.max_gpus, "most GPUs per plan (1, 2, 4, ... in a node, then whole nodes)")->capture_default_str();
  cmpc->add_option("--deadline-hours", cmp.deadline_hours, "name the cheapest plan that finishes within this many hours");
  cmpc->add_option("--budget-usd", cmp.budget_usd, "name the fastest plan that costs at most this much");
  cmpc->add_option("--price", cmp.prices, "KIND=USD per GPU-hour, overriding the profile's price (repeatable)");
  cmpc->add_option("--provider", cmp.provider, "price every kind with this provider's offer (coreweave, lambda, runpod, ...)");
  cmpc->add_option("--engine", cmp.engine, "stepcast | deepspeed | fsdp2")->capture_default_str();
  cmpc->add_option("--global-batch", cmp.global_batch, "sequences per optimizer step across all ranks")->capture_default_str();
  cmpc->add_option("--seq", cmp.common.seq, "sequence length in tokens")->capture_default_str();
  cmpc->add_option("--precision", cmp.common.precision, "fp32 | bf16 | fp16")->capture_default_str();
  cmpc->add_option("--peft", cmp.common.peft,
                   "none | lora | qlora | auto: full fine-tuning, LoRA or QLoRA adapters, or the best of the three "
                   "per row")
      ->capture_default_str();
  cmpc->add_option("--lora-rank", cmp.common.lora_rank, "LoRA rank r")->capture_default_str();
  cmpc->add_option("--lora-targets", cmp.common.lora_targets, "attention | mlp | all")->capture_default_str();
  cmpc->add_option("--data-dir", cmp.common.data_dir, "folder with models/ and hardware/ (default: the build's data/)");
  cmpc->add_option("--svg", cmp.svg, "write the cost-against-time plot with its Pareto front to FILE");
  cmpc->add_flag("--json", cmp.common.json, "print one JSON object instead of the table");
  cmpc->add_option("--k8s-manifest", cmp.k8s_manifest,
                   "write a Kubernetes manifest (ConfigMap with the plan + Kubeflow PyTorchJob) for the chosen plan: "
                   "the cheapest within --deadline-hours, else the fastest within --budget-usd, else the cheapest");
  cmpc->add_option("--image", cmp.manifest.image, "the manifest's container image (with train, or your DeepSpeed script)")
      ->capture_default_str();
  cmpc->add_option("--job-name", cmp.manifest.job_name, "the manifest's job name")->capture_default_str();
  cmpc->add_option("--data-claim", cmp.manifest.data_claim,
                   "the manifest's PersistentVolumeClaim with train.txt (default: JOB-NAME-data)");

  std::string list_dir;
  bool list_json = false;
  CLI::App* models = app.add_subcommand("models", "list the model catalog");
  models->add_flag("--json", list_json, "print JSON");
  models->add_option("--data-dir", list_dir, "folder with models/ and hardware/");
  CLI::App* hardware = app.add_subcommand("hardware", "list the hardware profiles");
  hardware->add_flag("--json", list_json, "print JSON");
  hardware->add_option("--data-dir", list_dir, "folder with models/ and hardware/");

  if (const auto status = parse_cli(app, argc, argv, "planner")) return *status;
  // A global batch left at its default fits the ranks; one the user gives must divide them.
  if (rec->count("--global-batch") == 0)
    global_batch = default_batch_for_ranks(global_batch, int64_t{rec_opts.gpus} * rec_opts.nodes);
  if (val->count("--global-batch") == 0)
    val_global_batch = default_batch_for_ranks(val_global_batch, int64_t{val_opts.gpus} * val_opts.nodes);
  if (rec->parsed()) return run_recommend(rec_opts, global_batch, optimizers, top_k, no_offload, engine, rec_pipeline);
  if (exp->parsed()) return run_explain(exp_opts, e);
  if (val->parsed()) return run_validate(val_opts, val_global_batch, val_optimizers, vo);
  if (cmpc->parsed()) return run_compare(cmp);
  if (diagc->parsed()) return run_diagnose(*diagc, diag);
  if (models->parsed()) return run_models(list_dir, list_json);
  if (hardware->parsed()) return run_hardware(list_dir, list_json);
  return 2;
}

}  // namespace
}  // namespace stepcast

int main(int argc, char** argv) {
  return stepcast::run_main("planner", [&] { return stepcast::main_impl(argc, argv); });
}
