#include "model/hardware.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/errors.h"
#include "common/join.h"
#include "common/text_file.h"
#include "common/units.h"
#include "model/toml_edit.h"
#include "model/toml_reader.h"
#include "model/train_config.h"

namespace stepcast {

void check_holdout_split(const HoldoutSplit& split, const char* flag) {
  if (!(split.frac >= 0 && split.frac < 1))
    throw InputError(std::string(flag) + " " + std::to_string(split.frac) + " must lie in [0, 1)");
}

namespace fs = std::filesystem;

double GpuSpec::peak_flops_per_s(Precision p) const {
  switch (p) {
    case Precision::kBf16: return peak_bf16_flops_per_s;
    case Precision::kFp16: return peak_fp16_flops_per_s;
    case Precision::kFp32: return peak_fp32_flops_per_s;
  }
  STEPCAST_ASSERT(false);
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  STEPCAST_ASSERT(false);
}

Precision parse_precision(const std::string& text, const std::string& what) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  if (text == "fp16") return Precision::kFp16;
  throw InputError(what + " = \"" + text + "\" is not a precision (valid: fp32, bf16, fp16)");
}

namespace {

IntervalModel parse_interval(const TomlReader& t) {
  t.reject_unknown_keys({"log_q95_seen", "log_q95_unseen", "seen_predictions", "unseen_predictions",
                         "log_q95_seen_launch_bound", "log_q95_unseen_launch_bound", "seen_launch_bound_predictions",
                         "unseen_launch_bound_predictions", "memory_log_q95_seen", "memory_log_q95_unseen",
                         "memory_seen_predictions", "memory_unseen_predictions", "models",
                         "offloads", "precisions", "attentions", "pefts", "zero_stages", "world_sizes", "seq_min", "seq_max",
                         "micro_tokens_max"});
  IntervalModel m;
  m.log_q95_seen = t.get_double("log_q95_seen", 1e-6, 10.0);
  m.log_q95_unseen = t.get_double("log_q95_unseen", m.log_q95_seen, 10.0);
  m.seen_predictions = static_cast<int>(t.get_int_or("seen_predictions", 0, 0, 1 << 30));
  m.unseen_predictions = static_cast<int>(t.get_int_or("unseen_predictions", 0, 0, 1 << 30));
  if (t.table().contains("log_q95_seen_launch_bound") || t.table().contains("log_q95_unseen_launch_bound")) {
    m.log_q95_seen_launch_bound = t.get_double("log_q95_seen_launch_bound", 1e-6, 10.0);
    m.log_q95_unseen_launch_bound = t.get_double("log_q95_unseen_launch_bound", m.log_q95_seen_launch_bound, 10.0);
    m.seen_launch_bound_predictions = static_cast<int>(t.get_int_or("seen_launch_bound_predictions", 0, 0, 1 << 30));
    m.unseen_launch_bound_predictions =
        static_cast<int>(t.get_int_or("unseen_launch_bound_predictions", 0, 0, 1 << 30));
  }
  if (t.table().contains("memory_log_q95_seen") || t.table().contains("memory_log_q95_unseen")) {
    m.memory_log_q95_seen = t.get_double("memory_log_q95_seen", 1e-6, 10.0);
    m.memory_log_q95_unseen = t.get_double("memory_log_q95_unseen", m.memory_log_q95_seen, 10.0);
    m.memory_seen_predictions = static_cast<int>(t.get_int_or("memory_seen_predictions", 0, 0, 1 << 30));
    m.memory_unseen_predictions = static_cast<int>(t.get_int_or("memory_unseen_predictions", 0, 0, 1 << 30));
  }
  m.models = t.get_string_array_or("models");
  m.offloads = t.get_string_array_or("offloads");
  m.precisions = t.get_string_array_or("precisions");
  m.attentions = t.get_string_array_or("attentions");
  if (t.table().contains("pefts")) m.pefts = t.get_string_array_or("pefts");
  for (const auto& [key, target] : {std::pair<const char*, std::vector<int64_t>*>{"zero_stages", &m.zero_stages},
                                    {"world_sizes", &m.world_sizes}}) {
    if (const toml::array* a = t.table().get_as<toml::array>(key)) {
      for (const auto& node : *a) {
        const auto v = node.value<int64_t>();
        if (!v || *v < 0 || *v > (int64_t{1} << 30))
          throw InputError(t.origin() + ": key '" + t.key_path(key) + "' must hold non-negative integers");
        target->push_back(*v);
      }
    }
  }
  m.seq_min = t.get_double("seq_min", 1.0, 1e9);
  m.seq_max = t.get_double("seq_max", m.seq_min, 1e9);
  m.micro_tokens_max = t.get_double("micro_tokens_max", 1.0, 1e12);
  return m;
}

std::string toml_string_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i ? ", \"" : "\"");
    for (char ch : items[i]) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    out += '"';
  }
  return out + "]";
}

std::string interval_text(const std::string& header, const IntervalModel& m) {
  if (m.empty()) return "";
  std::ostringstream o;
  o.precision(9);
  const auto ints = [](const std::vector<int64_t>& v) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
    return out + "]";
  };
  o << "\n[" << header << "]\n"
    << "log_q95_seen = " << m.log_q95_seen << "\nlog_q95_unseen = " << m.log_q95_unseen
    << "\nseen_predictions = " << m.seen_predictions << "\nunseen_predictions = " << m.unseen_predictions;
  if (m.has_launch_bound_class())
    o << "\nlog_q95_seen_launch_bound = " << m.log_q95_seen_launch_bound
      << "\nlog_q95_unseen_launch_bound = " << m.log_q95_unseen_launch_bound
      << "\nseen_launch_bound_predictions = " << m.seen_launch_bound_predictions
      << "\nunseen_launch_bound_predictions = " << m.unseen_launch_bound_predictions;
  if (m.has_memory())
    o << "\nmemory_log_q95_seen = " << m.memory_log_q95_seen << "\nmemory_log_q95_unseen = " << m.memory_log_q95_unseen
      << "\nmemory_seen_predictions = " << m.memory_seen_predictions
      << "\nmemory_unseen_predictions = " << m.memory_unseen_predictions;
  o << "\nmodels = " << toml_string_array(m.models) << "\noffloads = " << toml_string_array(m.offloads)
    << "\nprecisions = " << toml_string_array(m.precisions) << "\nattentions = " << toml_string_array(m.attentions)
    << (m.pefts == std::vector<std::string>{"none"} ? "" : "\npefts = " + toml_string_array(m.pefts))
    << "\nzero_stages = " << ints(m.zero_stages) << "\nworld_sizes = " << ints(m.world_sizes)
    << "\nseq_min = " << m.seq_min << "\nseq_max = " << m.seq_max << "\nmicro_tokens_max = " << m.micro_tokens_max
    << "\n";
  return o.str();
}

}  // namespace

HardwareProfile parse_hardware_profile(const std::string& text, const std::string& origin) {
  toml::table table = TomlReader::parse(text, origin);
  TomlReader r(table, origin);
  r.reject_unknown_keys({"name", "description", "gpu", "host", "links", "prices",
                         "coefficients", "engines"});
  HardwareProfile hw;
  hw.path = origin;
  hw.name = r.get_string("name");
  hw.description = r.get_string_or("description", "");

  auto sourced = [&](const TomlReader& t, const std::string& key, double lo, double hi) {
    std::string src;
    double v = t.get_sourced(key, lo, hi, &src);
    hw.sources[t.key_path(key)] = src;
    return v;
  };

  TomlReader g = r.subtable("gpu");
  g.reject_unknown_keys({"name", "memory_bytes", "memory_bytes_per_s", "peak_bf16_flops_per_s",
                         "peak_fp16_flops_per_s", "peak_tf32_flops_per_s",
                         "peak_fp32_flops_per_s", "matmul_eff_rel_h200", "attention_head_dim_s"});
  hw.gpu.name = g.get_string("name");
  hw.gpu.memory_bytes = sourced(g, "memory_bytes", 1e8, 1e13);
  hw.gpu.memory_bytes_per_s = sourced(g, "memory_bytes_per_s", 1e9, 1e14);
  hw.gpu.peak_bf16_flops_per_s = sourced(g, "peak_bf16_flops_per_s", 1e11, 1e17);
  hw.gpu.peak_fp16_flops_per_s = sourced(g, "peak_fp16_flops_per_s", 1e11, 1e17);
  hw.gpu.peak_tf32_flops_per_s = sourced(g, "peak_tf32_flops_per_s", 1e11, 1e17);
  hw.gpu.peak_fp32_flops_per_s = sourced(g, "peak_fp32_flops_per_s", 1e11, 1e17);
  if (g.has("matmul_eff_rel_h200")) hw.gpu.matmul_eff_rel_h200 = sourced(g, "matmul_eff_rel_h200", 0.2, 5.0);
  if (const auto t = g.subtable_opt("attention_head_dim_s")) {
    hw.gpu.attention_head_dim_source = t->get_string("source");
    for (const auto& [key, node] : t->table()) {
      const std::string name(key.str());
      if (name == "source") continue;
      int dim = 0;
      const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), dim);
      if (ec != std::errc() || end != name.data() + name.size() || dim < 8 || dim > 1024)
        throw InputError(origin + ": key '" + t->key_path(name) +
                         "' is not a head dimension (valid: an integer 8-1024, or source)");
      const TomlReader c = t->subtable(name);
      c.reject_unknown_keys({"fwd_s", "bwd_s"});
      hw.gpu.attention_head_dim_s[dim] = {c.get_double("fwd_s", 1e-9, 100.0), c.get_double("bwd_s", 1e-9, 100.0)};
    }
    if (!hw.gpu.attention_head_dim_s.contains(128))
      throw InputError(origin + ": " + t->key_path("128") +
                       ": missing (the head dimension the attention coefficients are fitted at)");
  }

  TomlReader h = r.subtable("host");
  h.reject_unknown_keys({"pcie_gen", "h2d_bytes_per_s", "d2h_bytes_per_s", "pageable_bytes_per_s", "cpu_cores_per_gpu",
                         "simd", "dram_bytes_per_s", "memory_bytes_per_gpu", "transformers_layer_s"});
  hw.host.pcie_gen = static_cast<int>(h.get_int("pcie_gen", 3, 7));
  hw.host.h2d_bytes_per_s = sourced(h, "h2d_bytes_per_s", 1e8, 1e13);
  hw.host.d2h_bytes_per_s = sourced(h, "d2h_bytes_per_s", 1e8, 1e13);
  if (h.has("pageable_bytes_per_s")) hw.host.pageable_bytes_per_s = sourced(h, "pageable_bytes_per_s", 1e8, 1e13);
  hw.host.cpu_cores_per_gpu = sourced(h, "cpu_cores_per_gpu", 1, 1024);
  hw.host.simd = h.get_string("simd");
  if (hw.host.simd == "avx2") {
    hw.host.simd_fp32_lanes = 8;
  } else if (hw.host.simd == "avx512") {
    hw.host.simd_fp32_lanes = 16;
  } else if (hw.host.simd == "neon") {
    hw.host.simd_fp32_lanes = 4;
  } else {
    throw InputError(origin + ": key 'host.simd' = \"" + hw.host.simd +
                     "\" is not valid (valid: avx2, avx512, neon)");
  }
  hw.host.dram_bytes_per_s = sourced(h, "dram_bytes_per_s", 1e9, 1e13);
  hw.host.memory_bytes_per_gpu = sourced(h, "memory_bytes_per_gpu", 1e9, 1e14);
  if (const auto t = h.subtable_opt("transformers_layer_s")) {
    hw.host.transformers_layer_source = t->get_string("source");
    for (const auto& [key, node] : t->table()) {
      const std::string type(key.str());
      if (type == "source") continue;
      if (std::find(kPeerModelTypes.begin(), kPeerModelTypes.end(), type) == kPeerModelTypes.end()) {
        throw InputError(origin + ": key '" + t->key_path(type) + "' is not a model_type the peers run (valid: " +
                         join_names(kPeerModelTypes) + ", source)");
      }
      const TomlReader c = t->subtable(type);
      c.reject_unknown_keys({"fwd_s", "bwd_s"});
      hw.host.transformers_layer_s[type] = {c.get_double("fwd_s", 0.0, 0.1), c.get_double("bwd_s", 0.0, 0.1)};
    }
    relate_layer_costs(hw.host);
  }

  TomlReader l = r.subtable("links");
  l.reject_unknown_keys({"intra_node", "intra_node_bytes_per_s", "inter_node_bytes_per_s",
                         "inter_node_latency_s", "gpus_per_node_max"});
  hw.links.intra_node = l.get_string("intra_node");
  if (hw.links.intra_node != "nvlink" && hw.links.intra_node != "pcie")
    throw InputError(origin + ": key 'links.intra_node' = \"" + hw.links.intra_node +
                     "\" is not valid (valid: nvlink, pcie)");
  hw.links.intra_node_bytes_per_s = sourced(l, "intra_node_bytes_per_s", 1e8, 1e13);
  hw.links.inter_node_bytes_per_s = sourced(l, "inter_node_bytes_per_s", 1e8, 1e13);
  hw.links.inter_node_latency_s = sourced(l, "inter_node_latency_s", 0, 1);
  hw.links.gpus_per_node_max = static_cast<int>(l.get_int("gpus_per_node_max", 1, 1024));

  if (r.has("prices")) {
    const toml::array* offers = table["prices"].as_array();
    if (!offers) throw InputError(origin + ": key 'prices' is not an array of [[prices]] tables");
    for (size_t i = 0; i < offers->size(); ++i) {
      const toml::table* t = (*offers)[i].as_table();
      const std::string path = "prices[" + std::to_string(i) + "]";
      if (!t) throw InputError(origin + ": " + path + " is not a table");
      const TomlReader o(*t, origin, path);
      o.reject_unknown_keys({"provider", "usd_per_gpu_hour", "kubernetes", "includes_host", "vcpus_per_gpu",
                             "memory_gib_per_gpu", "source", "date"});
      PriceOffer p;
      p.provider = o.get_string("provider");
      p.usd_per_gpu_hour = o.get_double("usd_per_gpu_hour", 0.01, 1e3);
      p.kubernetes = o.get_bool_or("kubernetes", false);
      p.includes_host = o.get_bool_or("includes_host", false);
      p.vcpus_per_gpu = o.get_double_or("vcpus_per_gpu", 0, 1, 1024);
      p.memory_bytes_per_gpu = o.get_double_or("memory_gib_per_gpu", 0, 1, 1e5) * kBytesPerGiB;
      p.source = o.get_string("source");
      p.date = o.get_string("date");
      if (p.date.size() != 10 || p.date[4] != '-' || p.date[7] != '-')
        throw InputError(origin + ": key '" + path + ".date' = \"" + p.date + "\" is not a date (YYYY-MM-DD)");
      hw.prices.push_back(std::move(p));
    }
    if (!hw.prices.empty()) hw.price_per_gpu_hour = hw.prices.front().usd_per_gpu_hour;
  }

  hw.coefs = default_coefs();
  if (auto c = r.subtable_opt("coefficients")) {
    hw.coefs_calibrated = c->get_bool_or("calibrated", false);
    hw.coefs_source = c->get_string_or("source", "");
    for (const auto& [key, node] : c->table()) {
      std::string name(key.str());
      if (name == "calibrated" || name == "source" || name == "std_errors" || name == "covariance" ||
          name == "interval" || name == "measured" || name == "held_out")
        continue;
      if (name == "model_error_frac") {
        hw.model_error_frac = c->get_double(name, 0.0, 5.0);
        continue;
      }
      if (name == "max_micro_tokens") {
        hw.max_micro_tokens = c->get_double(name, 0.0, 1e9);
        continue;
      }
      if (name == "runs") {
        hw.calibration_runs = c->get_string_array_or(name);
        continue;
      }
      if (name == "component_runs") {
        hw.component_runs = c->get_string_array_or(name);
        continue;
      }
      if (name == "holdout_frac") {
        hw.calibration_holdout.frac = c->get_double(name, 0.0, 0.999999);
        continue;
      }
      if (name == "holdout_seed") {
        hw.calibration_holdout.seed = static_cast<uint64_t>(c->get_int(name, 0, int64_t{1} << 62));
        continue;
      }
      if (name == "engines_from") {
        hw.engines_from = c->get_string(name);
        continue;
      }
      if (name == "transferred_log_q95") {
        hw.transferred_log_q95 = c->get_double(name, 0.0, 5.0);
        continue;
      }
      if (name == "transferred_log_q95_no_offload") {
        hw.transferred_log_q95_no_offload = c->get_double(name, 0.0, 5.0);
        continue;
      }
      auto id = coef_by_name(name);
      if (!id) {
        throw InputError(origin + ": key 'coefficients." + name + "' is not a cost-model coefficient (valid: " +
                         join_names(coef_table(), [](const auto& info) { return info.name; }) + ")");
      }
      const CoefInfo& info = coef_table()[*id];
      hw.coefs[*id] = c->get_double(name, info.lower, info.upper);
      hw.coefs_in_file[*id] = true;
    }
    if (auto se = c->subtable_opt("std_errors")) {
      hw.coef_std_errors.assign(kNumCoefs, 0.0);
      for (const auto& [key, node] : se->table()) {
        auto id = coef_by_name(std::string(key.str()));
        if (!id)
          throw InputError(origin + ": key 'coefficients.std_errors." + std::string(key.str()) +
                           "' is not a cost-model coefficient");
        hw.coef_std_errors[*id] = se->get_double(std::string(key.str()), 0.0, 1e30);
      }
    }
    if (auto iv = c->subtable_opt("interval")) hw.interval = parse_interval(*iv);
    if (auto h = c->subtable_opt("held_out")) {
      h->reject_unknown_keys({"source", "runs", "world_size_max", "log_q95"});
      if (hw.coefs_calibrated)
        throw InputError(origin + ": key 'coefficients.held_out' is for a profile that is not calibrated (a "
                         "calibrated one has [coefficients.interval])");
      hw.held_out.source = h->get_string("source");
      hw.held_out.runs = h->get_string_array_or("runs");
      if (hw.held_out.runs.empty()) throw InputError(origin + ": key 'coefficients.held_out.runs' names no runs file");
      hw.held_out.world_size_max = h->get_int("world_size_max", 1, 1 << 20);
      const TomlReader q = h->subtable("log_q95");
      for (const auto& [key, node] : q.table()) {
        const std::string engine(key.str());
        parse_engine(engine, origin + ": key 'coefficients.held_out.log_q95' names engine");
        hw.held_out.log_q95[engine] = q.get_double(engine, 1e-6, 5.0);
      }
      if (hw.held_out.log_q95.empty())
        throw InputError(origin + ": key 'coefficients.held_out.log_q95' holds no engine");
    }
    if (auto m = c->subtable_opt("measured")) {
      m->reject_unknown_keys({"reference", "source", "runs", "rel"});
      hw.measured.reference = m->get_string("reference");
      hw.measured.source = m->get_string("source");
      hw.measured.runs = m->get_string_array_or("runs");
      const TomlReader rel = m->subtable("rel");
      for (const auto& [key, node] : rel.table()) {
        const std::string name(key.str());
        const auto id = coef_by_name(name);
        if (!id)
          throw InputError(origin + ": key 'coefficients.measured.rel." + name + "' is not a cost-model coefficient");
        // A component a hundred times faster or slower than on the reference is a broken record.
        hw.measured.rel[*id] = rel.get_double(name, 0.01, 100.0);
      }
      if (hw.measured.rel.empty())
        throw InputError(origin + ": key 'coefficients.measured.rel' holds no coefficient");
    }
    if (auto cv = c->subtable_opt("covariance")) {
      // names = [free coefficients], values = [[row], ...] in that order.
      const auto names = cv->get_string_array_or("names");
      const toml::array* rows = cv->table().get_as<toml::array>("values");
      if (!rows || rows->size() != names.size())
        throw InputError(origin + ": key 'coefficients.covariance.values' must hold one row per name (" +
                         std::to_string(names.size()) + ")");
      std::vector<int> ids;
      for (const auto& n : names) {
        auto id = coef_by_name(n);
        if (!id) throw InputError(origin + ": key 'coefficients.covariance.names' has unknown coefficient \"" + n + "\"");
        ids.push_back(*id);
      }
      hw.coef_covariance.assign(kNumCoefs, std::vector<double>(kNumCoefs, 0.0));
      for (size_t i = 0; i < ids.size(); ++i) {
        const toml::array* row = (*rows)[i].as_array();
        if (!row || row->size() != ids.size())
          throw InputError(origin + ": key 'coefficients.covariance.values' row " + std::to_string(i) +
                           " must hold " + std::to_string(ids.size()) + " numbers");
        for (size_t j = 0; j < ids.size(); ++j) {
          auto v = (*row)[j].value<double>();
          if (!v || !std::isfinite(*v))
            throw InputError(origin + ": key 'coefficients.covariance.values' row " + std::to_string(i) +
                             " has a non-number");
          hw.coef_covariance[ids[i]][ids[j]] = *v;
        }
      }
    }
  }
  if (auto engines = r.subtable_opt("engines")) {
    for (const auto& [ekey, enode] : engines->table()) {
      const std::string engine(ekey.str());
      if (engine != "deepspeed" && engine != "fsdp2")
        throw InputError(origin + ": key 'engines." + engine + "' is not a peer engine (valid: deepspeed, fsdp2)");
      const TomlReader e = engines->subtable(engine);
      EngineSection sec;
      sec.calibrated = e.get_bool_or("calibrated", false);
      sec.source = e.get_string_or("source", "");
      sec.runs = e.get_string_array_or("runs");
      sec.model_error_frac = e.get_double_or("model_error_frac", 0.0, 0.0, 5.0);
      if (e.table().contains("holdout_frac")) sec.holdout.frac = e.get_double("holdout_frac", 0.0, 0.999999);
      sec.holdout.seed = static_cast<uint64_t>(e.get_int_or("holdout_seed", 0, 0, int64_t{1} << 62));
      for (const auto& [key, node] : e.table()) {
        const std::string name(key.str());
        if (name == "calibrated" || name == "source" || name == "runs" || name == "model_error_frac" ||
            name == "holdout_frac" || name == "holdout_seed")
          continue;
        if (name == "interval") {
          sec.interval = parse_interval(e.subtable("interval"));
          continue;
        }
        const auto id = coef_by_name(name);
        if (!id || !is_engine_coef(*id)) {
          throw InputError(origin + ": key 'engines." + engine + "." + name + "' is not an engine coefficient (valid: " +
                           join_names(engine_coefs(), [](Coef c) { return coef_table()[c].name; }) + ")");
        }
        const CoefInfo& info = coef_table()[*id];
        sec.values[*id] = e.get_double(name, info.lower, info.upper);
      }
      hw.engines[engine] = sec;
    }
  }
  return hw;
}

HardwareProfile for_engine(const HardwareProfile& hw, const std::string& engine) {
  if (engine == "stepcast") return hw;
  HardwareProfile out = hw;
  out.engine = engine;
  out.hardware_coefs = hw.coefs;
  out.coef_covariance.clear();
  out.coef_std_errors.clear();
  out.calibration_runs.clear();
  out.calibration_holdout = HoldoutSplit{};
  const auto it = hw.engines.find(engine);
  if (it == hw.engines.end()) {
    out.coefs_calibrated = false;
    out.coefs_source = "no [engines." + engine + "] section: the hardware's Stepcast-fitted engine coefficients";
    out.model_error_frac = 0;
    out.interval = IntervalModel{};
    return out;
  }
  const EngineSection& sec = it->second;
  for (const auto& [c, v] : sec.values) out.coefs[c] = v;
  out.coefs_calibrated = hw.coefs_calibrated && sec.calibrated;
  out.coefs_source = sec.source;
  out.model_error_frac = sec.model_error_frac;
  out.calibration_runs = sec.runs;
  out.calibration_holdout = sec.holdout;
  out.interval = sec.interval;
  return out;
}

std::string with_engine_section(const std::string& profile_text, const std::string& engine,
                                const CalibratedCoefficients& c) {
  std::ostringstream sec;
  sec.precision(9);
  sec << "[engines." << engine << "]\ncalibrated = true\n";
  sec << "model_error_frac = " << c.model_error_frac << "\n";
  sec << "source = \"" << c.source << "\"\n";
  if (!c.runs.empty()) sec << "runs = " << toml_string_array(c.runs) << "\n";
  if (c.holdout.frac >= 0.0) sec << "holdout_frac = " << c.holdout.frac << "\nholdout_seed = " << c.holdout.seed << "\n";
  for (Coef id : engine_coefs()) sec << coef_table()[id].name << " = " << c.values[id] << "\n";
  sec << interval_text("engines." + engine + ".interval", c.interval) << "\n";
  std::string text = profile_text;
  erase_toml_table(text, "engines." + engine);
  // Engine sections sit before [coefficients], which a hardware fit rewrites with all after it.
  const size_t coefs = text.find("\n[coefficients]");
  if (coefs == std::string::npos) return text + (text.empty() || text.back() == '\n' ? "" : "\n") + sec.str();
  return text.substr(0, coefs + 1) + sec.str() + text.substr(coefs + 1);
}

HardwareProfile load_hardware_profile(const fs::path& path) {
  return parse_hardware_profile(read_text_file(path), path.string());
}

std::vector<std::string> list_hardware(const fs::path& data_dir) {
  std::vector<std::string> out;
  const fs::path dir = data_dir / "hardware";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(dir.string() + ": hardware folder not found");
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".toml") out.push_back(entry.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> hardware_for_device(const std::string& device_name, const fs::path& data_dir) {
  for (const auto& name : list_hardware(data_dir))
    if (load_hardware_profile(data_dir / "hardware" / (name + ".toml")).gpu.name == device_name) return name;
  return std::nullopt;
}

void transfer_engine_sections(HardwareProfile& hw, const HardwareProfile& ref) {
  for (const auto& [engine, sec] : ref.engines) {
    if (hw.engines.count(engine)) continue;
    EngineSection t;
    t.calibrated = false;
    t.source = "transferred from " + ref.name + "'s [engines." + engine +
               "] (its time coefficients; memory habits are this profile's)";
    for (const auto& [c, v] : sec.values)
      if (!is_memory_coef(c)) t.values[c] = v;
    hw.engines[engine] = t;
  }
}

void transfer_reference_coefficients(HardwareProfile& hw, const HardwareProfile& ref) {
  if (hw.coefs_calibrated || !ref.coefs_calibrated) return;
  for (int c = 0; c < kNumCoefs; ++c)
    if (!hw.coefs_in_file[c]) hw.coefs[c] = ref.coefs[c];
  hw.coefs_source += (hw.coefs_source.empty() ? "" : "; ") + std::string("the coefficients it does not set: ") +
                     ref.name + "'s fit";
}

AttnHeadDimRel attention_head_dim_rel(const GpuSpec& gpu, double head_dim) {
  const auto& t = gpu.attention_head_dim_s;
  if (t.empty()) return {};
  // Outside the table the nearest dimension's ratio; between measured dimensions the time is linear.
  const double d = std::clamp(head_dim, static_cast<double>(t.begin()->first), static_cast<double>(t.rbegin()->first));
  const auto hi = t.lower_bound(static_cast<int>(std::ceil(d)));
  GpuSpec::AttnHeadDimCost cost = hi->second;
  if (hi->first != d) {
    const auto lo = std::prev(hi);
    const double w = (d - lo->first) / static_cast<double>(hi->first - lo->first);
    cost = {lo->second.fwd_s + w * (hi->second.fwd_s - lo->second.fwd_s),
            lo->second.bwd_s + w * (hi->second.bwd_s - lo->second.bwd_s)};
  }
  const GpuSpec::AttnHeadDimCost& ref = t.at(128);
  return {cost.fwd_s / ref.fwd_s * 128.0 / d, cost.bwd_s / ref.bwd_s * 128.0 / d};
}

void transfer_measured_tables(HardwareProfile& hw, const HardwareProfile& ref) {
  // The flash kernels are the same code on every GPU the profiles describe (FlashAttention-2 in
  // torch's SDPA): how their time grows with the head dimension transfers with the engine.
  if (hw.gpu.attention_head_dim_s.empty() && !ref.gpu.attention_head_dim_s.empty()) {
    hw.gpu.attention_head_dim_s = ref.gpu.attention_head_dim_s;
    hw.gpu.attention_head_dim_source = "transferred from " + ref.name + ": " + ref.gpu.attention_head_dim_source;
  }
  if (!hw.host.transformers_layer_s.empty() || ref.host.transformers_layer_s.empty()) return;
  hw.host.transformers_layer_s = ref.host.transformers_layer_s;
  hw.host.transformers_layer_source = "transferred from " + ref.name + ": " + ref.host.transformers_layer_source;
  relate_layer_costs(hw.host);
}

void relate_layer_costs(HostSpec& host) {
  host.transformers_layer_rel.clear();
  const auto& costs = host.transformers_layer_s;
  if (costs.empty()) return;
  double mean_fwd_s = 0, mean_bwd_s = 0;
  for (const auto& [type, cost] : costs) {
    mean_fwd_s += cost.fwd_s / static_cast<double>(costs.size());
    mean_bwd_s += cost.bwd_s / static_cast<double>(costs.size());
  }
  for (const auto& [type, cost] : costs)
    host.transformers_layer_rel[type] = {cost.fwd_s / mean_fwd_s, cost.bwd_s / mean_bwd_s};
}

HardwareProfile resolve_hardware(const std::string& name, const fs::path& data_dir) {
  std::error_code ec;
  const bool is_path = name.ends_with(".toml") || name.find('/') != std::string::npos;
  const fs::path file = is_path ? fs::path(name) : data_dir / "hardware" / (name + ".toml");
  if (!fs::exists(file, ec)) {
    if (is_path) throw InputError(name + ": no such hardware profile file");
    throw InputError("unknown hardware '" + name + "' (known: " + join_names(list_hardware(data_dir)) + ")");
  }
  HardwareProfile hw = load_hardware_profile(file);
  // A profile file outside the data folder (calibrate fit --out) takes its reference from it too.
  std::optional<HardwareProfile> engines_ref;
  if (!hw.engines_from.empty()) {
    const fs::path ref_file = data_dir / "hardware" / (hw.engines_from + ".toml");
    if (hw.engines_from == hw.name || !fs::exists(ref_file, ec))
      throw InputError(file.string() + ": key 'coefficients.engines_from' = \"" + hw.engines_from +
                       "\" names no other profile in " + (data_dir / "hardware").string());
    engines_ref = load_hardware_profile(ref_file);
    transfer_reference_coefficients(hw, *engines_ref);
    transfer_engine_sections(hw, *engines_ref);
    transfer_measured_tables(hw, *engines_ref);
  }
  if (!hw.measured.empty()) {
    const std::string& ref_name = hw.measured.reference;
    if (ref_name == hw.name) {
      const HardwareProfile self = hw;
      apply_measured(hw, self);
    } else if (engines_ref && ref_name == hw.engines_from) {
      apply_measured(hw, *engines_ref);
    } else {
      throw InputError(file.string() + ": key 'coefficients.measured.reference' = \"" + ref_name +
                       "\" is neither this profile (\"" + hw.name + "\") nor its engines_from (\"" + hw.engines_from +
                       "\")");
    }
  }
  return hw;
}

void apply_measured(HardwareProfile& hw, const HardwareProfile& ref) {
  if (hw.measured_applied) return;
  if (!ref.coefs_calibrated)
    throw InputError(hw.path + ": key 'coefficients.measured.reference' = \"" + ref.name +
                     "\" is not a calibrated profile: measured ratios need its fitted values");
  const auto scaled = [](Coef c, double value, double ratio) {
    const CoefInfo& info = coef_table()[c];
    return std::clamp(value * ratio, info.lower, info.upper);
  };
  for (const auto& [c, ratio] : hw.measured.rel) {
    hw.coefs[c] = scaled(c, ref.coefs[c], ratio);
    for (auto& [engine, sec] : hw.engines) {
      const auto it = sec.values.find(c);
      if (it != sec.values.end()) it->second = scaled(c, it->second, ratio);
    }
  }
  hw.measured_applied = true;
}

std::string with_measured_components(const std::string& profile_text, const MeasuredComponents& m) {
  std::string text = profile_text;
  erase_toml_table(text, "coefficients.measured");
  // One blank line before the section however often it is rewritten.
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (!text.empty()) text += "\n";
  const std::string header = "[coefficients.measured]";
  std::ostringstream sec;
  sec.precision(9);
  sec << "\n" << header << "\nreference = \"" << m.reference << "\"\nsource = \"" << m.source << "\"\n";
  if (!m.runs.empty()) sec << "runs = " << toml_string_array(m.runs) << "\n";
  sec << "\n[coefficients.measured.rel]\n";
  for (const auto& [c, ratio] : m.rel) sec << coef_table()[c].name << " = " << ratio << "\n";
  return text + sec.str();
}

std::string with_calibrated_coefficients(const std::string& profile_text, const CalibratedCoefficients& c) {
  std::ostringstream sec;
  sec.precision(9);
  sec << "[coefficients]\ncalibrated = true\n";
  sec << "model_error_frac = " << c.model_error_frac << "\n";
  sec << "max_micro_tokens = " << c.max_micro_tokens << "\n";
  sec << "source = \"" << c.source << "\"\n";
  if (!c.runs.empty()) sec << "runs = " << toml_string_array(c.runs) << "\n";
  if (c.holdout.frac >= 0.0) sec << "holdout_frac = " << c.holdout.frac << "\nholdout_seed = " << c.holdout.seed << "\n";
  for (const auto& info : coef_table()) sec << info.name << " = " << c.values[info.id] << "\n";
  sec << interval_text("coefficients.interval", c.interval);
  sec << "\n[coefficients.std_errors]\n";
  for (const auto& info : coef_table())
    if (!c.std_errors.empty() && c.std_errors[info.id] > 0) sec << info.name << " = " << c.std_errors[info.id] << "\n";
  if (!c.covariance.empty()) {
    sec << "\n[coefficients.covariance]\nnames = [";
    for (size_t i = 0; i < c.free.size(); ++i) sec << (i ? ", " : "") << '"' << coef_table()[c.free[i]].name << '"';
    sec << "]\nvalues = [\n";
    for (Coef a : c.free) {
      sec << "  [";
      for (size_t j = 0; j < c.free.size(); ++j) sec << (j ? ", " : "") << c.covariance[a][c.free[j]];
      sec << "],\n";
    }
    sec << "]\n";
  }
  std::string text = profile_text;
  const size_t at = text.find("\n[coefficients]");
  if (at != std::string::npos) text = text.substr(0, at + 1);
  return text + sec.str();
}

bool beyond_calibration(const HardwareProfile& hw, int64_t micro_batch, int64_t seq_len) {
  return hw.coefs_calibrated && hw.max_micro_tokens > 0 &&
         static_cast<double>(micro_batch) * static_cast<double>(seq_len) > hw.max_micro_tokens;
}

CollectiveLink collective_link(const HardwareProfile& hw, int gpus_per_node, int nodes) {
  if (nodes <= 1) return {hw.links.intra_node_bytes_per_s, false, 0.0};
  return {std::min(hw.links.inter_node_bytes_per_s * gpus_per_node, hw.links.intra_node_bytes_per_s), true,
          hw.links.inter_node_latency_s};
}

}  // namespace stepcast
