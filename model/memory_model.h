// The memory model, per rank on the GPU and per node on the host: templated
// on the scalar type like step_time.h, over the same coefficient vector.
//   GPU peak = parameters + gradients + optimizer states + buffers      (static)
//            + (activations + logits and loss buffers) x (1 + fragmentation)
//            + workspace (CUDA context, library workspaces)
//   host     = ranks per node x (offloaded states, gradient accumulators,
//              offloaded parameters, pinned buffers, process overhead)
#pragma once

#include "model/coefficients.h"
#include "model/step_features.h"

namespace stepcast {

template <class T>
struct MemoryEstimate {
  T gpu_params_bytes{}, gpu_grads_bytes{}, gpu_opt_states_bytes{}, gpu_buffers_bytes{};
  T gpu_activations_bytes{};  // saved activations, logits and loss buffers, with fragmentation
  T gpu_workspace_bytes{};
  T gpu_total_bytes{};
  T host_per_rank_bytes{};
  T host_node_total_bytes{};
};

template <class T>
MemoryEstimate<T> predict_memory(const MemoryFeatures& m, const T* coef) {
  MemoryEstimate<T> out;
  out.gpu_params_bytes = T(m.gpu_params_bytes);
  out.gpu_grads_bytes = T(m.gpu_grads_bytes);
  out.gpu_opt_states_bytes = T(m.gpu_opt_states_bytes);
  out.gpu_buffers_bytes = T(m.gpu_buffers_bytes);
  const T dynamic = coef[kActBytesMult] * m.act_bytes +
                    m.logits_elems * (m.logit_bytes + coef[kLossExtraBytesPerLogit]);
  out.gpu_activations_bytes = dynamic * (1.0 + coef[kGpuFragFrac]);
  out.gpu_workspace_bytes = coef[kGpuWorkspaceBytes];
  out.gpu_total_bytes = out.gpu_params_bytes + out.gpu_grads_bytes + out.gpu_opt_states_bytes + out.gpu_buffers_bytes +
                  out.gpu_activations_bytes + out.gpu_workspace_bytes;
  out.host_per_rank_bytes = m.host_opt_states_bytes + m.host_grads_bytes + m.host_params_bytes +
                      m.host_pinned_buffers_bytes + coef[kHostBytesPerRank];
  out.host_node_total_bytes = m.ranks_per_node * out.host_per_rank_bytes;
  return out;
}

}  // namespace stepcast
