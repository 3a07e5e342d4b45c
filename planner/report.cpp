#include "common/units.h"
#include "planner/report.h"

#include "model/train_config_json.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>

namespace stepcast {

namespace {


std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// A text table with a header row and a units row, columns right-aligned.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<std::string> units)
      : rows_{std::move(header), std::move(units)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str() const {
    std::vector<size_t> width(rows_[0].size(), 0);
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
    std::ostringstream out;
    for (size_t ri = 0; ri < rows_.size(); ++ri) {
      const auto& r = rows_[ri];
      for (size_t i = 0; i < r.size(); ++i) {
        out << (i ? "  " : "") << std::string(width[i] - r[i].size(), ' ') << r[i];
      }
      out << "\n";
      if (ri == 1) {
        for (size_t i = 0; i < width.size(); ++i) out << (i ? "  " : "") << std::string(width[i], '-');
        out << "\n";
      }
    }
    return out.str();
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

// The 95 % step-time interval, seconds. Every interval the profile gives is symmetric in
// log(step time) and step_std_s holds its upper side, so the lower side divides by the factor
// the upper side multiplies by: positive however wide the interval.
std::array<double, 2> step_interval_95_s(const Prediction& p) {
  if (!(p.time.step_s > 0)) return {p.time.step_s, p.time.step_s};
  const double factor = 1.0 + 1.96 * p.step_std_s / p.time.step_s;
  return {p.time.step_s / factor, p.time.step_s * factor};
}

}  // namespace

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The regime dimensions of a plan outside a calibrated profile's fitted runs (its interval
// model's region), each as "name value (calibrated range)": what the prediction extrapolates
// in. Empty for profiles without an interval model (uncalibrated ones say so in their header).
static std::vector<std::string> extrapolated_dimensions(const HardwareProfile& hw, const std::string& model,
                                                        const TrainConfig& c) {
  std::vector<std::string> out;
  if (hw.interval.empty() || !hw.coefs_calibrated) return out;
  for (const OutsideDimension& d : outside_dimensions(hw.interval, model, c))
    out.push_back(d.name + " " + d.value + " (" + d.calibrated + ")");
  return out;
}

// What the ±95% column means for this profile.
std::string interval_legend(const HardwareProfile& hw) {
  if (hw.interval.empty()) return "parameter and model error";
  const double seen = 100 * std::expm1(hw.interval.log_q95_seen);
  const double step = 100 * (std::expm1(hw.interval.log_q95_unseen) - std::expm1(hw.interval.log_q95_seen));
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "cross-validated (conformal): ±%.1f %% inside the calibrated runs' region, about +%.1f %% per "
                "dimension outside it",
                seen, step);
  std::string out = buf;
  if (hw.interval.has_launch_bound_class()) {
    std::snprintf(buf, sizeof buf, "; launch-bound plans (the host issues their kernels in %.0f %% or more of the "
                  "GPU's time) ±%.1f %%, +%.1f %% per dimension",
                  100 * kLaunchBoundIssueRatio, 100 * std::expm1(hw.interval.log_q95_seen_launch_bound),
                  100 * (std::expm1(hw.interval.log_q95_unseen_launch_bound) -
                         std::expm1(hw.interval.log_q95_seen_launch_bound)));
    out += buf;
  }
  return out;
}

std::string format_gib(double bytes) { return fmt("%.1f", bytes / kBytesPerGiB); }

nlohmann::json model_to_json(const ModelSpec& m) {
  return {{"name", m.name},
          {"model_type", m.model_type},
          {"params", m.total_params()},
          {"params_per_layer", m.params_per_layer()},
          {"num_layers", m.num_layers},
          {"hidden_size", m.hidden_size},
          {"num_heads", m.num_heads},
          {"num_kv_heads", m.num_kv_heads},
          {"intermediate_size", m.intermediate_size},
          {"vocab_size", m.vocab_size},
          {"source", m.source}};
}

// [coefficients.measured] (model/hardware.h); null when the profile has none.
static nlohmann::json measured_to_json(const MeasuredComponents& m) {
  if (m.empty()) return nullptr;
  nlohmann::json rel = nlohmann::json::object();
  for (const auto& [c, ratio] : m.rel) rel[std::string(coef_table()[c].name)] = ratio;
  return {{"reference", m.reference}, {"source", m.source}, {"runs", m.runs}, {"rel", rel}};
}

nlohmann::json hardware_to_json(const HardwareProfile& hw, const TrainConfig& base) {
  return {{"name", hw.name},
          {"gpu", hw.gpu.name},
          {"gpus_per_node", base.gpus_per_node},
          {"nodes", base.nodes},
          {"coefficients_calibrated", hw.coefs_calibrated},
          {"coefficients_source", hw.coefs_source},
          {"measured_components", measured_to_json(hw.measured)}};
}

nlohmann::json plan_to_json(const Prediction& p, const ReportContext& ctx) {
  const auto& c = p.config;
  const auto& t = p.time;
  nlohmann::json j;
  j["config"] = train_config_to_json(c);
  j["family"] = family_name(c);
  j["fits"] = p.fits;
  j["tight"] = p.tight;
  j["launch_bound"] = launch_bound(t.host_issue_ratio);
  // Micro-batch x sequence beyond the calibrated profile's fitted runs: extrapolated.
  j["extrapolated"] = ctx.hardware && beyond_calibration(*ctx.hardware, c.micro_batch, c.seq_len);
  // Every regime dimension outside the calibrated runs, with the calibrated range.
  j["extrapolated_dimensions"] = ctx.hardware && ctx.model
                                     ? extrapolated_dimensions(*ctx.hardware, ctx.model->name, c)
                                     : std::vector<std::string>{};
  // A sequence longer than the model was trained on (config.json's max_position_embeddings):
  // the step's cost is the same, but a rotary model needs its positions scaled (rope_scaling)
  // to learn at that length; nothing of the plan changes with it.
  j["beyond_trained_context"] = ctx.model && ctx.model->beyond_trained_context(c.seq_len);
  if (!p.fits) j["reason"] = p.reason;
  // The founding report's split is undefined with GAS = 1: null, not 0.
  nlohmann::json gas_time = c.gas > 1 ? nlohmann::json(t.gas_s) : nlohmann::json(nullptr);
  j["time_s"] = {{"step", t.step_s},
                 {"step_std", p.step_std_s},
                 {"step_interval_95", step_interval_95_s(p)},
                 // Host issue time over GPU time of the passes: launch-bound from kLaunchBoundIssueRatio.
                 {"host_issue_ratio", t.host_issue_ratio},
                 {"gas", gas_time},
                 {"opt", t.opt_s},
                 {"forward", t.forward_s},
                 {"backward", t.backward_s},
                 {"recompute", t.recompute_s},
                 {"grad_comm", t.grad_comm_s},
                 {"param_gather", t.param_gather_s},
                 {"offload_transfer", t.offload_transfer_s},
                 {"optimizer", t.optimizer_s},
                 {"grad_comm_total", t.grad_comm_total_s},
                 {"param_gather_total", t.param_gather_total_s},
                 {"offload_transfer_total", t.offload_transfer_total_s},
                 {"optimizer_total", t.optimizer_total_s}};
  // How the ranking weighs the plan: the mechanisms it turns on, their handicap, its score.
  nlohmann::json mechanisms = nlohmann::json::array();
  for (const Mechanism& mech : complexity_mechanisms())
    if (mech.on(c)) mechanisms.push_back(mech.name);
  j["ranking"] = {{"mechanisms", mechanisms},
                  {"handicap_frac", kHandicapPerComplexity * complexity(c)},
                  {"score_tokens_per_s", ranking_score(p)}};
  j["throughput"] = {{"tokens_per_s", p.throughput.tokens_per_s},
                     {"world_samples_per_s", p.throughput.world_samples_per_s},
                     {"rank_samples_per_s", p.throughput.rank_samples_per_s},
                     {"mfu", p.throughput.mfu}};
  const auto& m = p.memory;
  j["gpu_memory_bytes"] = {{"params", m.gpu_params_bytes},
                           {"grads", m.gpu_grads_bytes},
                           {"optimizer_states", m.gpu_opt_states_bytes},
                           {"activations", m.gpu_activations_bytes},
                           {"buffers", m.gpu_buffers_bytes},
                           {"workspace", m.gpu_workspace_bytes},
                           {"backward_accumulators", m.gpu_backward_bytes},
                           {"step_buffers", m.gpu_step_bytes},
                           {"peak_allocated", m.gpu_allocated_bytes},
                           {"allocator_reserve", m.gpu_reserve_bytes},
                           {"total", m.gpu_total_bytes},
                           {"required", m.gpu_required_bytes},
                           {"limit", p.gpu_memory_limit_bytes},
                           {"total_interval_95", p.gpu_memory_hi_bytes > 0
                                                     ? nlohmann::json::array({p.gpu_memory_lo_bytes, p.gpu_memory_hi_bytes})
                                                     : nlohmann::json(nullptr)}};
  j["cpu_memory_bytes"] = {{"total", m.host_node_total_bytes},
                           {"per_rank", m.host_per_rank_bytes},
                           {"buffers_per_rank", m.host_buffers_bytes},
                           {"placement_per_rank", m.host_placement_bytes},
                           {"limit", p.host_memory_limit_bytes}};
  if (ctx.train_tokens > 0) {
    const double seconds = ctx.train_tokens / p.throughput.tokens_per_s;
    j["train"] = {{"tokens", ctx.train_tokens}, {"time_s", seconds}};
    if (ctx.hardware && ctx.hardware->price_per_gpu_hour > 0)
      j["train"]["cost_usd"] = seconds / 3600.0 * c.world_size() * ctx.hardware->price_per_gpu_hour;
  }
  return j;
}

namespace {
// An FSDP2 plan that reduces after every micro-batch of its accumulation (the table marks its GAS).
bool syncs_each_micro(const TrainConfig& c) {
  return c.engine == Engine::kFsdp2 && c.gas > 1 && c.grad_sync_each_micro;
}
}  // namespace

std::string plans_table(const std::vector<Prediction>& plans, const ReportContext& ctx) {
  std::vector<std::string> header = {"#",        "stage",     "offload", "optim",      "ckpt",
                                     "micro",    "GAS",       "GAS time", "OPT time",  "step", "±95%",
                                     "world",    "rank",      "tokens/s", "MFU",       "GPU mem",
                                     "host mem"};
  std::vector<std::string> units = {"",  "",    "opt/par", "",     "",      "seq", "", "s", "s", "s", "s",
                                    "samples/s", "samples/s", "",   "%",   "GiB", "GiB/node"};
  if (ctx.train_tokens > 0) {
    header.push_back("train time");
    units.push_back("h");
    header.push_back("cost");
    units.push_back("USD");
  }
  Table table(header, units);
  int rank = 0;
  for (const auto& p : plans) {
    const auto& c = p.config;
    std::vector<std::string> row = {
        std::to_string(++rank),
        std::to_string(c.zero_stage),
        std::string(offload_name(c.offload_optimizer)) + "/" + offload_name(c.offload_params),
        optimizer_name(c.optimizer),
        c.activation_checkpointing ? "on" : "off",
        std::to_string(c.micro_batch) +
            (ctx.hardware && beyond_calibration(*ctx.hardware, c.micro_batch, c.seq_len) ? "!" : ""),
        std::to_string(c.gas) + (syncs_each_micro(c) ? "e" : ""),
        c.gas > 1 ? fmt("%.3f", p.time.gas_s) : "n/a*",
        fmt("%.3f", p.time.opt_s),
        fmt("%.3f", p.time.step_s),
        p.step_std_s > 0 ? fmt("%.3f", 1.96 * p.step_std_s) : "?",
        fmt("%.2f", p.throughput.world_samples_per_s),
        fmt("%.2f", p.throughput.rank_samples_per_s),
        fmt("%.0f", p.throughput.tokens_per_s),
        fmt("%.1f", 100.0 * p.throughput.mfu),
        format_gib(p.memory.gpu_total_bytes),
        format_gib(p.memory.host_node_total_bytes)};
    if (ctx.train_tokens > 0) {
      const double seconds = ctx.train_tokens / p.throughput.tokens_per_s;
      row.push_back(fmt("%.1f", seconds / 3600.0));
      row.push_back(ctx.hardware && ctx.hardware->price_per_gpu_hour > 0
                        ? fmt("%.0f", seconds / 3600.0 * c.world_size() * ctx.hardware->price_per_gpu_hour)
                        : "?");
    }
    table.add(row);
  }
  std::string out = table.str();
  bool any_gas1 = false;
  for (const auto& p : plans) any_gas1 |= p.config.gas == 1;
  if (any_gas1) out += "* GAS = 1: the GAS/OPT split is undefined; the whole step is OPT time.\n";
  bool any_each = false;
  for (const auto& p : plans) any_each |= syncs_each_micro(p.config);
  if (any_each)
    out += "e: FSDP2 reduce-scatters the gradients after every micro-batch (--grad-sync each); without the e, "
           "after the last one only (--grad-sync last)\n";
  bool any_unknown = false;
  for (const auto& p : plans) any_unknown |= p.step_std_s <= 0;
  if (any_unknown) out += "±95%: ? = no coefficient covariance (profile not calibrated)\n";
  bool any_beyond = false;
  for (const auto& p : plans)
    any_beyond |= ctx.hardware && beyond_calibration(*ctx.hardware, p.config.micro_batch, p.config.seq_len);
  if (any_beyond)
    out += "! micro-batch x sequence beyond the calibration runs (<= " + fmt("%.0f", ctx.hardware->max_micro_tokens) +
           " tokens): time and memory extrapolated (validate before a long run)\n";
  if (ctx.hardware && ctx.model) {
    // One line per distinct set of dimensions, naming the plans that share it, in table order.
    std::vector<std::pair<std::string, std::string>> groups;  // dimensions, plan numbers
    for (size_t i = 0; i < plans.size(); ++i) {
      const auto dims = extrapolated_dimensions(*ctx.hardware, ctx.model->name, plans[i].config);
      if (dims.empty()) continue;
      std::string text;
      for (size_t k = 0; k < dims.size(); ++k) text += (k ? ", " : "") + dims[k];
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == text; });
      if (it == groups.end()) groups.emplace_back(text, "#" + std::to_string(i + 1));
      else it->second += ", #" + std::to_string(i + 1);
    }
    for (const auto& [text, which] : groups)
      out += "! " + which + " extrapolate" + (which.find(',') == std::string::npos ? "s" : "") +
             " beyond the calibrated runs in: " + text + "\n";
  }
  return out;
}

std::string context_line(const Prediction& any, const ReportContext& ctx) {
  std::ostringstream out;
  const auto& c = any.config;
  out << ctx.model->name << " (" << with_commas(ctx.model->total_params()) << " parameters) on "
      << c.gpus_per_node << (c.nodes > 1 ? " x " + std::to_string(c.nodes) + " nodes" : "")
      << " x " << ctx.hardware->name << " (" << ctx.hardware->gpu.name << ", "
      << format_gib(any.gpu_memory_limit_bytes) << " GiB), seq " << c.seq_len << ", "
      << precision_name(c.precision) << "\n";
  if (ctx.model->beyond_trained_context(c.seq_len))
    out << "note: seq " << c.seq_len << " is beyond " << ctx.model->name << "'s trained context (max_position_embeddings "
        << ctx.model->max_position_embeddings << "): the time and memory below hold, but "
        << (ctx.model->rotary_dim > 0 ? "its rotary positions need scaling (rope_scaling) for the model to learn at that length"
                                      : "its learned position table needs that many rows, which the job must add")
        << "\n";
  const HardwareProfile& hw = *ctx.hardware;
  if (hw.coefs_calibrated) {
    std::string src = hw.coefs_source.substr(0, hw.coefs_source.find(';'));
    out << "profile '" << hw.name << "' calibrated (" << src << "); ±95% = " << interval_legend(hw) << "\n";
  } else {
    const std::string engine = engine_name(c.engine);
    const double held_q = hw.held_out.log_q95_for(engine, c.world_size(), c.nodes);
    if (held_q > 0 || hw.transferred_log_q95 > 0) {
      out << "note: profile '" << hw.name << "' is not calibrated: datasheet figures"
          << (hw.engines_from.empty() ? "" : ", engine behaviour from " + hw.engines_from) << "; ±95% = ";
      if (held_q > 0) {
        out << fmt("%.0f", 100 * std::expm1(held_q)) << " %, the model's error on this GPU kind's own runs of " << engine
            << " on up to " << hw.held_out.world_size_max << " GPU" << (hw.held_out.world_size_max > 1 ? "s" : "")
            << ", each predicted before it ran ([coefficients.held_out])\n";
      } else {
        if (hw.transferred_log_q95_no_offload > 0)
          out << fmt("%.0f", 100 * std::expm1(hw.transferred_log_q95_no_offload)) << " % without CPU offload, ";
        out << fmt("%.0f", 100 * std::expm1(hw.transferred_log_q95))
            << (hw.transferred_log_q95_no_offload > 0 ? " % with it" : " %")
            << ", the model's error on published throughputs of uncalibrated GPUs (calibrate report --published)\n";
      }
    } else {
      out << "note: profile '" << hw.name
          << "' is not calibrated: efficiencies are first estimates (run `calibrate` on this hardware)\n";
    }
  }
  const MeasuredComponents& m = ctx.hardware->measured;
  if (!m.empty()) {
    out << "measured on this hardware by microbench, as ratios to " << m.reference << "'s components:";
    for (const auto& [c, ratio] : m.rel) out << " " << coef_table()[c].name << " x" << fmt("%.3f", ratio);
    out << " (" << m.source.substr(0, m.source.find(';')) << ")\n";
  }
  return out.str();
}

std::string breakdown_text(const Prediction& p, const ReportContext& ctx) {
  const auto& t = p.time;
  const auto& m = p.memory;
  std::ostringstream out;
  out << "Step time (per rank, one optimizer step of GAS " << p.config.gas << " x micro-batch "
      << p.config.micro_batch << ")\n";
  Table tt({"phase", "exposed", "total", "share"}, {"", "s", "s", "%"});
  auto row = [&](const char* name, double exposed, double total) {
    tt.add({name, fmt("%.4f", exposed), fmt("%.4f", total), fmt("%.1f", 100.0 * exposed / t.step_s)});
  };
  row("forward", t.forward_s, t.forward_s);
  row("backward", t.backward_s, t.backward_s);
  row("recompute", t.recompute_s, t.recompute_s);
  row("gradient reduction", t.grad_comm_s, t.grad_comm_total_s);
  row("parameter gathering", t.param_gather_s, t.param_gather_total_s);
  row("offload copies (PCIe)", t.offload_transfer_s, t.offload_transfer_total_s);
  row("optimizer", t.optimizer_s, t.optimizer_total_s);
  tt.add({"GAS time", p.config.gas > 1 ? fmt("%.4f", t.gas_s) : "n/a", "", ""});
  tt.add({"OPT time", fmt("%.4f", t.opt_s), "", ""});
  tt.add({"step", fmt("%.4f", t.step_s), "", "100.0"});
  out << tt.str();
  out << "throughput: " << fmt("%.0f", p.throughput.tokens_per_s) << " tokens/s, "
      << fmt("%.3f", p.throughput.world_samples_per_s) << " world samples/s, "
      << fmt("%.3f", p.throughput.rank_samples_per_s) << " rank samples/s, MFU "
      << fmt("%.1f", 100.0 * p.throughput.mfu) << " %\n";
  // FSDP2 with parameter offload on one rank uploads each unit's parameters with a blocking copy
  // (model/step_features.cpp, param_h2d_blocking): say what it costs and what avoids it.
  if (fsdp2_uploads_block(p.config))
    out << "note: FSDP2 on one GPU uploads each layer's parameters with a blocking copy (torch's one-rank "
           "path, pytorch/pytorch#160135), "
        << fmt("%.3f", p.time.param_gather_s) << " s of this step; on two or more GPUs, or a torch with "
           "pytorch/pytorch#178861, they overlap the layers\n";
  out << "\n";

  out << "Memory\n";
  Table mt({"where", "item", "size"}, {"", "", "GiB"});
  mt.add({"GPU", "parameters", format_gib(m.gpu_params_bytes)});
  mt.add({"GPU", "gradients", format_gib(m.gpu_grads_bytes)});
  mt.add({"GPU", "master weights + optimizer states", format_gib(m.gpu_opt_states_bytes)});
  mt.add({"GPU", "buckets and gather buffers", format_gib(m.gpu_buffers_bytes)});
  mt.add({"GPU", "library workspaces", format_gib(m.gpu_workspace_bytes)});
  if (m.gpu_backward_bytes > 0)
    mt.add({"GPU", "backward: gradient accumulators", format_gib(m.gpu_backward_bytes)});
  mt.add({"GPU", "backward: activations, logits, loss", format_gib(m.gpu_live_bytes)});
  const bool phases = m.gpu_step_bytes > 0;
  if (phases) mt.add({"GPU", "step: its own fp32 buffers (after the backward)", format_gib(m.gpu_step_bytes)});
  mt.add({"GPU", phases ? "peak allocated (the backward's or the step's)" : "peak allocated",
          format_gib(m.gpu_allocated_bytes)});
  mt.add({"GPU",
          p.config.gpu_expandable_segments ? "allocator's cache above it (expandable segments)"
                                           : "allocator's cache above it",
          format_gib(m.gpu_reserve_bytes)});
  mt.add({"GPU", "peak reserved per GPU (limit " + format_gib(p.gpu_memory_limit_bytes) + ")", format_gib(m.gpu_total_bytes)});
  if (p.gpu_memory_hi_bytes > 0)
    mt.add({"GPU", "peak reserved, 95 % interval", format_gib(p.gpu_memory_lo_bytes) + "-" + format_gib(p.gpu_memory_hi_bytes)});
  if (m.gpu_required_bytes < m.gpu_total_bytes)
    mt.add({"GPU", "needed to fit (without the cache a smaller card does without)", format_gib(m.gpu_required_bytes)});
  if (m.host_buffers_bytes > 0) mt.add({"host", "offloaded states and pinned buffers", format_gib(m.host_buffers_bytes)});
  if (m.host_placement_bytes > 0)
    mt.add({"host", "while the engine places the model", format_gib(m.host_placement_bytes)});
  const bool host_parts = m.host_buffers_bytes > 0 || m.host_placement_bytes > 0;
  mt.add({"host", host_parts ? "per rank (the larger of those, and the process)" : "per rank",
          format_gib(m.host_per_rank_bytes)});
  mt.add({"host", "per node (limit " + format_gib(p.host_memory_limit_bytes) + ")", format_gib(m.host_node_total_bytes)});
  out << mt.str();
  if (!p.fits) out << fit_verdict(p) << "\n";
  // Fits by the point prediction, but not at the interval's upper edge: the memory model's own
  // misses say it may not.
  const double hi_required_bytes = gpu_memory_hi_required_bytes(p);
  if (p.fits && hi_required_bytes > p.gpu_memory_limit_bytes)
    out << "may run out of GPU memory: the 95 % interval reaches " << format_gib(hi_required_bytes) << " GiB of "
        << format_gib(p.gpu_memory_limit_bytes) << " GiB\n";
  (void)ctx;
  return out.str();
}

}  // namespace stepcast
