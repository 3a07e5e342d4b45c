#include "common/units.h"
#include "model/prediction.h"

#include "model/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace stepcast {

Prediction evaluate_features(const Features& features, const TrainConfig& config,
                             const HardwareProfile& hw, const CoefVector& coefs,
                             const ResourceLimits& limits) {
  Prediction p;
  p.config = config;
  p.time = predict_step_time(features.step, coefs.data());
  p.memory = predict_memory(features.memory, coefs.data());

  const StepFeatures& f = features.step;
  const double samples_per_step_rank = static_cast<double>(config.micro_batch * config.gas);
  p.throughput.rank_samples_per_s = samples_per_step_rank / p.time.step_s;
  p.throughput.world_samples_per_s = f.world_size * p.throughput.rank_samples_per_s;
  p.throughput.tokens_per_s = p.throughput.world_samples_per_s * static_cast<double>(config.seq_len);
  p.throughput.mfu = mfu(p.throughput.tokens_per_s, f.model_flops_per_token, f.world_size, f.peak_flops_per_s);

  p.gpu_memory_limit_bytes = limits.gpu_memory_bytes > 0 ? limits.gpu_memory_bytes : hw.gpu.memory_bytes;
  p.host_memory_limit_bytes = limits.host_memory_bytes_node > 0
                                  ? limits.host_memory_bytes_node
                                  : hw.host.memory_bytes_per_gpu * config.gpus_per_node;
  char buf[300];
  const double usable_bytes = (1.0 - kGpuMemoryHeadroomFrac) * p.gpu_memory_limit_bytes;
  const double required_bytes = p.memory.gpu_required_bytes;
  std::snprintf(buf, sizeof buf, "needs %.1f GiB per GPU, %.1f GiB usable (%.1f GiB less %.0f %% headroom)",
                required_bytes / kBytesPerGiB, usable_bytes / kBytesPerGiB, p.gpu_memory_limit_bytes / kBytesPerGiB,
                100.0 * kGpuMemoryHeadroomFrac);
  const std::string need = buf;
  if (required_bytes > p.gpu_memory_limit_bytes) {
    p.reason = need;
  } else if (p.memory.host_node_total_bytes > p.host_memory_limit_bytes) {
    std::snprintf(buf, sizeof buf, "needs %.1f GiB of host memory per node, %.1f GiB available",
                  p.memory.host_node_total_bytes / kBytesPerGiB, p.host_memory_limit_bytes / kBytesPerGiB);
    p.reason = buf;
  } else if (required_bytes > usable_bytes) {
    // The card holds the prediction; the headroom, kept against the memory model's misses, does not.
    p.tight = true;
    std::snprintf(buf, sizeof buf, ": inside the card's %.1f GiB, not its headroom", p.gpu_memory_limit_bytes / kBytesPerGiB);
    p.reason = need + buf;
  }
  p.fits = p.reason.empty();
  return p;
}

std::string fit_verdict(const Prediction& p) {
  if (p.fits) return "";
  return (p.tight ? "tight, not ranked: " : "does not fit: ") + p.reason;
}


double step_time_std_s(const StepFeatures& f, const CoefVector& coefs,
                       const std::vector<std::vector<double>>& cov) {
  if (cov.size() != static_cast<size_t>(kNumCoefs)) return 0.0;
  std::array<double, kNumCoefs> grad{};
  for (int i = 0; i < kNumCoefs; ++i) {
    if (cov[i][i] <= 0.0) continue;
    const double h = 1e-6 * std::max(std::abs(coefs[i]), 1e-12);
    CoefVector up = coefs, down = coefs;
    up[i] += h;
    down[i] -= h;
    grad[i] = (predict_step_time(f, up.data()).step_s - predict_step_time(f, down.data()).step_s) / (2 * h);
  }
  double var = 0;
  for (int i = 0; i < kNumCoefs; ++i)
    for (int j = 0; j < kNumCoefs; ++j) var += grad[i] * cov[i][j] * grad[j];
  return std::sqrt(std::max(0.0, var));
}

double step_interval_std_s(const StepFeatures& f, const HardwareProfile& hw, double step_s) {
  // An engine section carries its fit's model error without a covariance.
  if (hw.coef_covariance.empty()) return hw.coefs_calibrated ? hw.model_error_frac * step_s : 0.0;
  const double sp = step_time_std_s(f, hw.coefs, hw.coef_covariance);
  const double sm = hw.model_error_frac * step_s;
  return std::sqrt(sp * sp + sm * sm);
}

std::vector<OutsideDimension> outside_dimensions(const IntervalModel& m, const std::string& model,
                                                 const TrainConfig& c) {
  std::vector<OutsideDimension> out;
  const auto has = [](const auto& values, const auto& v) {
    return std::find(values.begin(), values.end(), v) != values.end();
  };
  const auto list = [](const auto& v) {
    std::ostringstream o;
    for (size_t i = 0; i < v.size(); ++i) o << (i ? "/" : "") << v[i];
    return "calibrated: " + o.str();
  };
  const auto integer = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f", x);
    return std::string(buf);
  };
  if (!has(m.models, model))
    out.push_back({"model", model, "not one of the " + std::to_string(m.models.size()) + " calibrated"});
  if (!has(m.zero_stages, static_cast<int64_t>(c.zero_stage)))
    out.push_back({"ZeRO stage", std::to_string(c.zero_stage), list(m.zero_stages)});
  const std::string offload = offload_label(c);
  if (!has(m.offloads, offload)) out.push_back({"offload", offload, list(m.offloads)});
  const std::string precision = precision_name(c.precision);
  if (!has(m.precisions, precision)) out.push_back({"precision", precision, list(m.precisions)});
  const std::string attention = attention_name(c.attention);
  if (!has(m.attentions, attention)) out.push_back({"attention", attention, list(m.attentions)});
  const std::string peft = peft_name(c.peft);
  if (!has(m.pefts, peft)) out.push_back({"fine-tuning method", peft, list(m.pefts)});
  if (!has(m.world_sizes, static_cast<int64_t>(c.world_size())))
    out.push_back({"GPUs", std::to_string(c.world_size()), list(m.world_sizes)});
  if (c.nodes > 1) out.push_back({"nodes", std::to_string(c.nodes), "calibrated: 1", false});
  const double seq = static_cast<double>(c.seq_len);
  if (seq < m.seq_min || seq > m.seq_max)
    out.push_back({"sequence", std::to_string(c.seq_len), "calibrated: " + integer(m.seq_min) + "-" + integer(m.seq_max)});
  if (static_cast<double>(c.micro_batch) * seq > m.micro_tokens_max)
    out.push_back({"micro-batch x sequence", integer(static_cast<double>(c.micro_batch) * seq) + " tokens",
                   "calibrated: <= " + integer(m.micro_tokens_max)});
  return out;
}

int unseen_dimensions(const IntervalModel& m, const std::string& model, const TrainConfig& c) {
  int k = 0;
  for (const OutsideDimension& d : outside_dimensions(m, model, c)) k += d.widens_interval ? 1 : 0;
  return k;
}

namespace {

// A pair of quantiles widened for a prediction: the seen one, plus the step to the unseen one
// for each regime dimension outside the region.
double widened_log_halfwidth(double seen, double unseen, int unseen_dims) {
  return seen + static_cast<double>(unseen_dims) * (unseen - seen);
}

}  // namespace

double interval_log_halfwidth(const IntervalModel& m, int unseen_dims, bool launch_bound) {
  const bool own = launch_bound && m.has_launch_bound_class();
  return own ? widened_log_halfwidth(m.log_q95_seen_launch_bound, m.log_q95_unseen_launch_bound, unseen_dims)
             : widened_log_halfwidth(m.log_q95_seen, m.log_q95_unseen, unseen_dims);
}

double memory_interval_log_halfwidth(const IntervalModel& m, int unseen_dims) {
  return widened_log_halfwidth(m.memory_log_q95_seen, m.memory_log_q95_unseen, unseen_dims);
}

double gpu_memory_hi_required_bytes(const Prediction& p) {
  if (p.gpu_memory_hi_bytes <= 0) return 0;
  return p.gpu_memory_hi_bytes - (p.memory.gpu_total_bytes - p.memory.gpu_required_bytes);
}

void set_interval(Prediction& p, const StepFeatures& f, const HardwareProfile& hw, const std::string& model) {
  const double held_out_q =
      hw.coefs_calibrated ? 0.0 : hw.held_out.log_q95_for(engine_name(p.config.engine), p.config.world_size(), p.config.nodes);
  if (held_out_q > 0) {
    // A GPU never calibrated, in the region of its own runs predicted before they ran: as wide as
    // the model's errors there.
    p.step_std_s = p.time.step_s * std::expm1(held_out_q) / 1.96;
    return;
  }
  if (!hw.coefs_calibrated && hw.transferred_log_q95 > 0) {
    // A GPU never calibrated: as wide as the model's errors on others' published runs, those
    // without CPU offload for a plan without it.
    const double q = !offloads(p.config) && hw.transferred_log_q95_no_offload > 0 ? hw.transferred_log_q95_no_offload
                                                                                  : hw.transferred_log_q95;
    p.step_std_s = p.time.step_s * std::expm1(q) / 1.96;
    return;
  }
  if (!hw.interval.empty() && hw.coefs_calibrated) {
    p.unseen_dims = unseen_dimensions(hw.interval, model, p.config);
    // The interval is symmetric in log(step time); its larger side, as a standard deviation.
    p.step_std_s = p.time.step_s * std::expm1(interval_log_halfwidth(hw.interval, p.unseen_dims,
                                                                                launch_bound(p.time.host_issue_ratio))) /
                   1.96;
    if (hw.interval.has_memory()) {
      const double q = memory_interval_log_halfwidth(hw.interval, p.unseen_dims);
      p.gpu_memory_lo_bytes = p.memory.gpu_total_bytes * std::exp(-q);
      p.gpu_memory_hi_bytes = p.memory.gpu_total_bytes * std::exp(q);
    }
    return;
  }
  p.step_std_s = step_interval_std_s(f, hw, p.time.step_s);
}

Prediction evaluate(const ModelSpec& spec, const HardwareProfile& hw, const TrainConfig& config,
                    const ResourceLimits& limits) {
  // A configuration of another engine than the profile is seen for: that engine's coefficients.
  if (hw.engine == "stepcast" && config.engine != Engine::kStepcast)
    return evaluate(spec, for_engine(hw, engine_name(config.engine)), config, limits);
  Features f = make_features(spec, hw, config, limits);
  Prediction p = evaluate_features(f, config, hw, hw.coefs, limits);
  set_interval(p, f.step, hw, spec.name);
  return p;
}

}  // namespace stepcast
