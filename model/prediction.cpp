#include "model/prediction.h"

#include <cstdio>

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
  p.throughput.rank_samples_per_s = samples_per_step_rank / p.time.step;
  p.throughput.world_samples_per_s = f.world_size * p.throughput.rank_samples_per_s;
  p.throughput.tokens_per_s = p.throughput.world_samples_per_s * static_cast<double>(config.seq_len);
  p.throughput.mfu = p.throughput.tokens_per_s * f.model_flops_per_token /
                     (f.world_size * f.peak_flops_per_s);

  p.gpu_memory_limit_bytes = limits.gpu_memory_bytes > 0 ? limits.gpu_memory_bytes : hw.gpu.memory_bytes;
  p.host_memory_limit_bytes = limits.host_memory_bytes_node > 0
                                  ? limits.host_memory_bytes_node
                                  : hw.host.memory_bytes_per_gpu * config.gpus_per_node;
  char buf[200];
  if (p.memory.gpu_total > p.gpu_memory_limit_bytes) {
    std::snprintf(buf, sizeof buf, "needs %.1f GiB per GPU, %.1f GiB available",
                  p.memory.gpu_total / 1073741824.0, p.gpu_memory_limit_bytes / 1073741824.0);
    p.reason = buf;
  } else if (p.memory.host_node_total > p.host_memory_limit_bytes) {
    std::snprintf(buf, sizeof buf, "needs %.1f GiB of host memory per node, %.1f GiB available",
                  p.memory.host_node_total / 1073741824.0, p.host_memory_limit_bytes / 1073741824.0);
    p.reason = buf;
  }
  p.fits = p.reason.empty();
  return p;
}

Prediction evaluate(const ModelSpec& spec, const HardwareProfile& hw, const TrainConfig& config,
                    const ResourceLimits& limits) {
  return evaluate_features(make_features(spec, hw, config, limits), config, hw, hw.coefs, limits);
}

}  // namespace stepcast
