// Metric definitions shared by the cost model, the backend's run records and
// the calibration (docs/metrics.md says what each one means and why).
#pragma once

#include <cstdint>

namespace stepcast {

// nccl-tests' bus-bandwidth factors (NVIDIA/nccl-tests doc/PERFORMANCE.md): the bytes
// each rank moves over its link per byte of the buffer, for a ring over n ranks.
// busbw = algbw * factor, algbw = buffer bytes / time.
inline double allreduce_bus_factor(double n_ranks) { return 2.0 * (n_ranks - 1.0) / n_ranks; }
inline double reduce_scatter_bus_factor(double n_ranks) { return (n_ranks - 1.0) / n_ranks; }
inline double all_gather_bus_factor(double n_ranks) { return (n_ranks - 1.0) / n_ranks; }

// The model FLOPs of one trained token (Kaplan et al. 2020, eq. 2.1 with the backward at
// twice the forward; the attention term as in Chowdhery et al. 2022, appendix B):
// 6 N for the weights plus 6 L d s for the attention scores and their product with V,
// where d is the query width (heads x head dimension) and s the sequence length.
// Recomputation under activation checkpointing is not counted (MFU, not HFU).
inline double model_flops_per_token(double params, double num_layers, double q_dim, double seq_len) {
  return 6.0 * params + 6.0 * num_layers * q_dim * seq_len;
}

// Model FLOPs utilisation: achieved model FLOPs over the dense peak of all GPUs.
inline double mfu(double tokens_per_s, double flops_per_token, double num_gpus, double peak_flops_per_s) {
  return tokens_per_s * flops_per_token / (num_gpus * peak_flops_per_s);
}

}  // namespace stepcast
