#include "calibrate/published.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/join.h"
#include "common/stats.h"
#include "common/text_file.h"
#include "common/units.h"
#include "model/hardware.h"
#include "model/prediction.h"
#include "model/toml_reader.h"

namespace stepcast::calibrate {

namespace fs = std::filesystem;

namespace {

PublishedRow parse_row(const TomlReader& t, const std::string& engine, bool grad_sync_each, const fs::path& data_dir) {
  t.reject_unknown_keys({"where", "model", "hardware", "gpus", "seq", "micro_batch", "gas", "precision",
                         "checkpointing", "stage", "offload_optimizer", "offload_params", "optimizer",
                         "tokens_per_s_per_gpu", "step_s", "gas_time_s", "opt_time_s", "peak_memory_gib",
                         "cpu_cores_per_node", "cpu_mem_gib_per_node", "cpu_threads_per_rank", "attention",
                         "offload_pin_memory"});
  PublishedRow r;
  r.where = t.get_string("where");
  r.model_name = t.get_string("model");
  r.hardware_name = t.get_string("hardware");
  try {
    r.model = resolve_model(r.model_name, data_dir);
  } catch (const InputError& e) {
    throw InputError(t.origin() + ": " + t.key_path("model") + ": " + e.what());
  }
  HardwareProfile hw;
  try {
    hw = resolve_hardware(r.hardware_name, data_dir);
  } catch (const InputError& e) {
    throw InputError(t.origin() + ": " + t.key_path("hardware") + ": " + e.what());
  }
  TrainConfig& c = r.config;
  c.engine = parse_engine(engine, t.origin() + ": source.engine");
  const int64_t gpus = t.get_int("gpus", 1, 100000);
  const int per_node = std::max(hw.links.gpus_per_node_max, 1);
  if (gpus <= per_node) {
    c.gpus_per_node = static_cast<int>(gpus);
  } else {
    if (gpus % per_node != 0)
      throw InputError(t.origin() + ": " + t.key_path("gpus") + " = " + std::to_string(gpus) + " is not a whole number of " +
                       std::to_string(per_node) + "-GPU nodes of " + hw.name);
    c.gpus_per_node = per_node;
    c.nodes = static_cast<int>(gpus / per_node);
  }
  c.seq_len = t.get_int("seq", 1, 1 << 20);
  c.micro_batch = t.get_int("micro_batch", 1, 1 << 16);
  c.gas = t.get_int("gas", 1, 1 << 16);
  c.precision = parse_precision(t.get_string_or("precision", "bf16"), t.origin() + ": " + t.key_path("precision"));
  c.activation_checkpointing = t.get_bool_or("checkpointing", false);
  // The peers' sharded data parallelism defaults to full sharding (ZeRO-3, FULL_SHARD).
  c.zero_stage = static_cast<int>(t.get_int_or("stage", 3, 0, 3));
  c.offload_optimizer = parse_offload(t.get_string_or("offload_optimizer", "none"),
                                      t.origin() + ": " + t.key_path("offload_optimizer"));
  c.offload_params = parse_offload(t.get_string_or("offload_params", "none"), t.origin() + ": " + t.key_path("offload_params"));
  c.optimizer = parse_optimizer(t.get_string_or("optimizer", "adamw"), t.origin() + ": " + t.key_path("optimizer"));
  // The attention the source's code ran: flash (fused SDPA kernels) unless the row says its
  // transformers version computed the softmax eagerly (math).
  c.attention = parse_attention(t.get_string_or("attention", "flash"), t.origin() + ": " + t.key_path("attention"));
  // DeepSpeed runs its CPU optimizer after the backward, then the uploads.
  if (c.engine == Engine::kDeepSpeed) c.offload_pipeline = false;
  c.grad_sync_each_micro = grad_sync_each && c.gas > 1;
  // DeepSpeed's offload_optimizer.pin_memory as the source's config set it (absent: pinned).
  c.offload_pinned = t.get_bool_or("offload_pin_memory", true);
  validate_config(c, json_config_names(t.origin() + ": " + t.key_path("")));
  r.tokens_per_s_per_gpu = t.get_double("tokens_per_s_per_gpu", 1e-6, 1e12);
  r.step_s = t.get_double_or("step_s", 0.0, 0.0, 1e7);
  r.gas_time_s = t.get_double_or("gas_time_s", 0.0, 0.0, 1e7);
  r.opt_time_s = t.get_double_or("opt_time_s", 0.0, 0.0, 1e7);
  r.peak_memory_bytes = t.get_double_or("peak_memory_gib", 0.0, 0.0, 1e6) * kBytesPerGiB;
  r.limits.cpu_cores_node = static_cast<double>(t.get_int_or("cpu_cores_per_node", 0, 0, 4096));
  r.limits.host_memory_bytes_node = t.get_double_or("cpu_mem_gib_per_node", 0.0, 0.0, 1e5) * kBytesPerGiB;
  r.limits.cpu_threads_per_rank = static_cast<double>(t.get_int_or("cpu_threads_per_rank", 0, 0, 4096));
  return r;
}

struct Predicted {
  const PublishedSource* source;
  const PublishedRow* row;
  Prediction p;
  std::string coefficients;  // coefficient_status
  double tokens_per_s_per_gpu;
  double error() const { return tokens_per_s_per_gpu / row->tokens_per_s_per_gpu - 1; }
};

struct Summary {
  int rows = 0, not_fitting = 0, tight = 0;
  double sum = 0, max = 0;
  void add(const Predicted& x) {
    ++rows;
    sum += std::abs(x.error());
    max = std::max(max, std::abs(x.error()));
    if (x.p.tight) ++tight;
    else if (!x.p.fits) ++not_fitting;
  }
  double mean() const { return rows ? sum / rows : 0.0; }
  nlohmann::json to_json() const {
    return {{"rows", rows},
            {"tokens_per_s_mean_abs_pct_error", 100 * mean()},
            {"tokens_per_s_max_abs_pct_error", 100 * max},
            {"called_does_not_fit", not_fitting},
            {"called_tight", tight}};
  }
};

}  // namespace

std::string coefficient_status(const HardwareProfile& hw, const std::string& engine) {
  const HardwareProfile e = for_engine(hw, engine);
  if (e.coefs_calibrated) return "calibrated";
  const auto it = hw.engines.find(engine);
  const bool transferred = it != hw.engines.end() && !it->second.calibrated && !hw.engines_from.empty();
  if (hw.coefs_calibrated) return "hardware calibrated, engine not";
  const std::string measured = hw.measured.empty() ? "" : ", components measured";
  return (transferred ? "engine from " + hw.engines_from + ", hardware uncalibrated" : "uncalibrated") + measured;
}

namespace {

// The coefficients a source's [source.memory_habits] may set, in the table's order.
std::string memory_coef_names() {
  std::vector<std::string> names;
  for (const CoefInfo& info : coef_table())
    if (is_memory_coef(info.id)) names.emplace_back(info.name);
  return join_names(names);
}

}  // namespace

PublishedSource load_published(const fs::path& file, const fs::path& data_dir) {
  const std::string origin = file.string();
  const toml::table root = TomlReader::parse(read_text_file(file), origin);
  const TomlReader t(root, origin);
  t.reject_unknown_keys({"source", "rows"});
  PublishedSource s;
  s.file = origin;
  const TomlReader src = t.subtable("source");
  src.reject_unknown_keys({"id", "title", "url", "retrieved", "engine", "notes", "memory_habits", "grad_sync"});
  s.id = src.get_string("id");
  s.title = src.get_string("title");
  s.url = src.get_string("url");
  s.retrieved = src.get_string("retrieved");
  s.engine = src.get_string("engine");
  s.notes = src.get_string_or("notes", "");
  parse_engine(s.engine, origin + ": source.engine");
  // FSDP2 sources: whether the gradients are reduce-scattered after every micro-batch ("each")
  // or held whole until the last ("last", the default; TrainConfig::grad_sync_each_micro).
  const std::string sync = src.get_string_or("grad_sync", "last");
  if (sync != "last" && sync != "each")
    throw InputError(origin + ": source.grad_sync = \"" + sync + "\" is not valid (valid: last, each)");
  if (sync == "each" && s.engine != "fsdp2")
    throw InputError(origin + ": source.grad_sync = \"each\" is an FSDP2 setting (source.engine is " + s.engine + ")");
  s.grad_sync_each = sync == "each";
  if (auto habits = src.subtable_opt("memory_habits")) {
    for (const auto& [key, node] : habits->table()) {
      const std::string name(key.str());
      const auto id = coef_by_name(name);
      if (!id || !is_memory_coef(*id))
        throw InputError(origin + ": key 'source.memory_habits." + name +
                         "' is not a memory coefficient (valid: " + memory_coef_names() + ")");
      const CoefInfo& info = coef_table()[*id];
      s.memory_habits[*id] = habits->get_double(name, info.lower, info.upper);
    }
  }
  const toml::array* rows = root["rows"].as_array();
  if (!rows || rows->empty()) throw InputError(origin + ": rows: needs at least one [[rows]] table");
  for (size_t i = 0; i < rows->size(); ++i) {
    const toml::table* row = (*rows)[i].as_table();
    const std::string path = "rows[" + std::to_string(i) + "]";
    if (!row) throw InputError(origin + ": " + path + " is not a table");
    s.rows.push_back(parse_row(TomlReader(*row, origin, path), s.engine, s.grad_sync_each, data_dir));
  }
  return s;
}

std::vector<fs::path> published_files(const fs::path& data_dir) {
  std::vector<fs::path> out;
  const fs::path d = data_dir / "published";
  if (!fs::is_directory(d)) throw InputError(d.string() + ": no such folder (published throughputs)");
  for (const auto& e : fs::directory_iterator(d))
    if (e.path().extension() == ".toml") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// The row's prediction: the engine's view of the profile with the source's memory habits.
Prediction predict_row(const PublishedSource& s, const PublishedRow& row, const HardwareProfile& hw) {
  HardwareProfile e = for_engine(hw, s.engine);
  for (const auto& [c, v] : s.memory_habits) e.coefs[c] = v;
  return evaluate(row.model, e, row.config, row.limits);
}

namespace {

// Every row's prediction, each profile read once.
std::vector<Predicted> predict_all(const std::vector<PublishedSource>& sources, const fs::path& data_dir) {
  std::map<std::string, HardwareProfile> profiles;
  std::vector<Predicted> out;
  for (const auto& s : sources)
    for (const auto& r : s.rows) {
      auto it = profiles.find(r.hardware_name);
      if (it == profiles.end()) it = profiles.emplace(r.hardware_name, resolve_hardware(r.hardware_name, data_dir)).first;
      const HardwareProfile& hw = it->second;
      Prediction p = predict_row(s, r, hw);
      out.push_back({&s, &r, p, coefficient_status(hw, s.engine), p.throughput.tokens_per_s / r.config.world_size()});
    }
  return out;
}

// The split-conformal 95 % quantile of |log(published / predicted)| (published_log_q95), over
// every row and over the rows without CPU offload.
PublishedLogQ95 conformal_log_q95(const std::vector<Predicted>& predicted) {
  std::vector<double> all, without_offload;
  for (const auto& x : predicted) {
    const double score = std::abs(std::log(x.row->tokens_per_s_per_gpu / x.tokens_per_s_per_gpu));
    all.push_back(score);
    if (!offloads(x.row->config)) without_offload.push_back(score);
  }
  return {conformal_q95(all), conformal_q95(without_offload)};
}

}  // namespace

PublishedLogQ95 published_log_q95(const std::vector<PublishedSource>& sources, const fs::path& data_dir) {
  return conformal_log_q95(predict_all(sources, data_dir));
}

int run_published_report(const std::vector<std::string>& files, const std::string& data_dir_flag, bool json) {
  const fs::path data_dir = resolve_data_dir(data_dir_flag);
  std::vector<fs::path> paths;
  for (const auto& f : files)
    if (!f.empty()) paths.emplace_back(f);
  if (paths.empty()) paths = published_files(data_dir);
  std::vector<PublishedSource> sources;
  for (const auto& p : paths) sources.push_back(load_published(p, data_dir));
  const std::vector<Predicted> out = predict_all(sources, data_dir);
  const PublishedLogQ95 quantiles = conformal_log_q95(out);
  const double q95 = quantiles.all, q95_no_offload = quantiles.without_offload;
  const auto no_offload_rows = std::count_if(out.begin(), out.end(), [](const Predicted& x) { return !offloads(x.row->config); });
  int covered = 0, with_interval = 0;
  for (const auto& x : out)
    if (x.p.step_std_s > 0) {
      ++with_interval;
      // The step-time interval, in tokens/s: inside when the published rate is within it.
      const double half = 1.96 * x.p.step_std_s / x.p.time.step_s;
      covered += std::abs(std::log(x.row->tokens_per_s_per_gpu / x.tokens_per_s_per_gpu)) <= std::log1p(half) + 1e-12;
    }
  Summary all;
  std::map<std::string, Summary> by_source, by_hardware;
  for (const auto& x : out) {
    all.add(x);
    by_source[x.source->id].add(x);
    by_hardware[x.row->hardware_name].add(x);
  }
  if (json) {
    nlohmann::json j;
    j["sources"] = nlohmann::json::array();
    for (const auto& s : sources)
      j["sources"].push_back({{"id", s.id}, {"title", s.title}, {"url", s.url}, {"retrieved", s.retrieved},
                              {"engine", s.engine}, {"file", s.file}, {"summary", by_source[s.id].to_json()}});
    j["rows"] = nlohmann::json::array();
    for (const auto& x : out) {
      const TrainConfig& c = x.row->config;
      nlohmann::json r = {{"source", x.source->id},
                          {"where", x.row->where},
                          {"model", x.row->model_name},
                          {"hardware", x.row->hardware_name},
                          {"gpus", c.world_size()},
                          {"nodes", c.nodes},
                          {"seq_len", c.seq_len},
                          {"micro_batch", c.micro_batch},
                          {"gas", c.gas},
                          {"activation_checkpointing", c.activation_checkpointing},
                          {"engine", engine_name(c.engine)},
                          {"coefficients", x.coefficients},
                          {"published_tokens_per_s_per_gpu", x.row->tokens_per_s_per_gpu},
                          {"predicted_tokens_per_s_per_gpu", x.tokens_per_s_per_gpu},
                          {"tokens_per_s_error_pct", 100 * x.error()},
                          {"predicted_gpu_memory_bytes", x.p.memory.gpu_total_bytes},
                          {"fits", x.p.fits},
                          {"tight", x.p.tight},
                          {"does_not_fit_reason", x.p.fits || x.p.tight ? nlohmann::json(nullptr) : nlohmann::json(x.p.reason)},
                          {"tight_reason", x.p.tight ? nlohmann::json(x.p.reason) : nlohmann::json(nullptr)}};
      if (x.row->step_s > 0)
        r["phases_s"] = {{"published", {{"step", x.row->step_s}, {"gas", x.row->gas_time_s}, {"opt", x.row->opt_time_s}}},
                         {"predicted", {{"step", x.p.time.step_s}, {"gas", x.p.time.gas_s}, {"opt", x.p.time.opt_s}}}};
      j["rows"].push_back(r);
    }
    j["by_hardware"] = nlohmann::json::object();
    for (const auto& [h, s] : by_hardware) j["by_hardware"][h] = s.to_json();
    j["overall"] = all.to_json();
    j["fitted_on_published"] = false;
    j["interval_log_q95"] = q95;
    j["interval_log_q95_no_offload"] = q95_no_offload;
    j["rows_without_offload"] = no_offload_rows;
    j["inside_95_interval"] = {{"rows", with_interval}, {"inside", covered}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("published training throughputs against the cost model (tokens/s per GPU; error = predicted / published - 1)\n");
  std::printf("%-16s %-46s %-12s %-14s %5s %6s %5s %4s %4s %9s %9s %7s  %s\n", "source", "row", "model", "hardware", "GPUs",
              "seq", "micro", "GAS", "ckpt", "published", "predicted", "error", "coefficients");
  for (const auto& x : out) {
    const TrainConfig& c = x.row->config;
    std::string where = x.row->where.size() > 46 ? x.row->where.substr(0, 45) + "~" : x.row->where;
    std::printf("%-16s %-46s %-12s %-14s %5d %6lld %5lld %4lld %4s %9.0f %9.0f %+6.1f%%  %s%s\n", x.source->id.c_str(),
                where.c_str(), x.row->model_name.c_str(), x.row->hardware_name.c_str(), c.world_size(),
                static_cast<long long>(c.seq_len), static_cast<long long>(c.micro_batch), static_cast<long long>(c.gas),
                c.activation_checkpointing ? "on" : "off", x.row->tokens_per_s_per_gpu, x.tokens_per_s_per_gpu,
                100 * x.error(), x.coefficients.c_str(),
                x.p.fits ? "" : ("; called " + std::string(x.p.tight ? "tight" : "\"does not fit\"") + ": " + x.p.reason).c_str());
  }
  bool phases = false;
  for (const auto& x : out)
    if (x.row->step_s > 0) {
      if (!phases) {
        std::printf("\nphases where the source gives them (s, published / predicted)\n");
        std::printf("%-16s %-24s %9s %9s %9s %9s %9s %9s\n", "source", "row", "step", "", "GAS", "", "OPT", "");
        phases = true;
      }
      std::printf("%-16s %-24s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", x.source->id.c_str(), x.row->where.c_str(),
                  x.row->step_s, x.p.time.step_s, x.row->gas_time_s, x.p.time.gas_s, x.row->opt_time_s, x.p.time.opt_s);
    }
  // "does not fit": the prediction passes the card; "tight": it passes the planner's headroom only.
  std::printf("\n%-16s %-14s %5s %10s %10s %14s %6s\n", "by source", "engine", "rows", "mean |err|", "max |err|",
              "does not fit", "tight");
  for (const auto& s : sources) {
    const Summary& m = by_source[s.id];
    std::printf("%-16s %-14s %5d %9.1f%% %9.1f%% %14d %6d\n", s.id.c_str(), s.engine.c_str(), m.rows, 100 * m.mean(),
                100 * m.max, m.not_fitting, m.tight);
  }
  std::printf("%-16s %-14s %5s %10s %10s %14s %6s\n", "by hardware", "", "rows", "mean |err|", "max |err|", "does not fit",
              "tight");
  for (const auto& [h, m] : by_hardware)
    std::printf("%-16s %-14s %5d %9.1f%% %9.1f%% %14d %6d\n", h.c_str(), "", m.rows, 100 * m.mean(), 100 * m.max,
                m.not_fitting, m.tight);
  std::printf("%-16s %-14s %5d %9.1f%% %9.1f%% %14d %6d\n", "all", "", all.rows, 100 * all.mean(), 100 * all.max,
              all.not_fitting, all.tight);
  std::printf("No coefficient is fitted on these rows: every row is out of sample (leaving a source out changes nothing).\n");
  std::printf("95 %% conformal quantile of |log(published / predicted)|: %.4f (±%.1f %%) over all rows, %.4f (±%.1f %%) "
              "over the %lld without CPU offload; the profiles' intervals (transferred_log_q95, "
              "transferred_log_q95_no_offload) hold %d of %d rows\n",
              q95, 100 * std::expm1(q95), q95_no_offload, 100 * std::expm1(q95_no_offload),
              static_cast<long long>(no_offload_rows), covered, with_interval);
  for (const auto& s : sources) std::printf("  %s: %s, %s (retrieved %s)\n", s.id.c_str(), s.title.c_str(), s.url.c_str(), s.retrieved.c_str());
  return 0;
}

}  // namespace stepcast::calibrate
