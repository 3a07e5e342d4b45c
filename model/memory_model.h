// The memory model, per rank on the GPU and per node on the host: templated
// on the scalar type like step_time.h, over the same coefficient vector.
//   GPU peak allocated = parameters + gradients + optimizer states + buffers   (static)
//                      + saved activations + the larger of
//                        (logits and loss buffers, one recomputed layer)       (live)
//                      + workspace (library workspaces)
//   GPU peak reserved  = peak allocated + the caching allocator's reserve: the larger of
//                        (fragmentation x live + ckpt_reserve_mult x checkpoints) and the
//                        loss's freed buffers (loss_reserve_bytes_per_logit x logits)
//                        + cache a smaller card does without (releasable)
//   GPU required       = peak reserved - releasable: what a plan needs to fit
//   host               = ranks per node x (the larger of the steady buffers (offloaded
//                        states, gradient accumulators, offloaded parameters, pinned
//                        buffers) and what placing the model holds, + process overhead)
// Measured on one H200 (data/runs/h200-sxm/2026-12-02_memory_phases_1gpu.jsonl): every step
// peaks in its backward; a checkpointed one at the loss's backward, where the recomputed layers
// have not started, so the logits and a recomputed layer are not live together.
#pragma once

#include "model/coefficients.h"
#include "model/step_features.h"

namespace stepcast {

template <class T>
struct MemoryEstimate {
  T gpu_params_bytes{}, gpu_grads_bytes{}, gpu_opt_states_bytes{}, gpu_buffers_bytes{};
  T gpu_live_bytes{};         // saved activations, and the larger of logits and loss buffers or a recomputed layer
  T gpu_activations_bytes{};  // live bytes and the allocator's reserve above them
  T gpu_workspace_bytes{};
  T gpu_allocated_bytes{};    // the caching allocator's peak allocated
  T gpu_reserve_bytes{};      // reserved above that peak
  T gpu_total_bytes{};        // peak reserved, on a card with room
  T gpu_required_bytes{};     // what must fit: the peak reserved less the cache a smaller card does without
  T host_buffers_bytes{};     // per rank: offloaded states, gradient accumulators, offloaded parameters, pinned buffers
  T host_placement_bytes{};   // per rank: held while the engine places the model
  T host_per_rank_bytes{};    // the larger of the two, and the process itself
  T host_node_total_bytes{};
};

template <class T>
MemoryEstimate<T> predict_memory(const MemoryFeatures& m, const T* coef) {
  MemoryEstimate<T> out;
  out.gpu_params_bytes = T(m.gpu_params_bytes);
  out.gpu_grads_bytes = T(m.gpu_grads_bytes);
  out.gpu_opt_states_bytes = T(m.gpu_opt_states_bytes);
  out.gpu_buffers_bytes = T(m.gpu_buffers_bytes);
  using std::max;
  const T loss = m.logits_elems * (m.logit_bytes + max(coef[kLossExtraBytesPerLogit] - m.loss_copy_absent_bytes, T(0.0)));
  out.gpu_live_bytes = coef[kActBytesMult] * m.act_bytes + max(loss, coef[kActBytesMult] * m.recompute_layer_bytes);
  const T& live = out.gpu_live_bytes;
  // The pool keeps whichever is larger: the holes activations and checkpoints leave, or the
  // loss's fp32 buffers, freed after the loss's backward and too large for what follows.
  out.gpu_reserve_bytes = max(coef[kGpuFragFrac] * live + coef[kCkptReserveMult] * m.ckpt_bytes,
                              coef[kLossReserveBytesPerLogit] * m.logits_elems) +
                          m.gpu_releasable_cache_bytes;
  out.gpu_activations_bytes = live + out.gpu_reserve_bytes;
  out.gpu_workspace_bytes = coef[kGpuWorkspaceBytes];
  out.gpu_allocated_bytes = out.gpu_params_bytes + out.gpu_grads_bytes + out.gpu_opt_states_bytes +
                            out.gpu_buffers_bytes + live + out.gpu_workspace_bytes;
  out.gpu_total_bytes = out.gpu_allocated_bytes + out.gpu_reserve_bytes;
  out.gpu_required_bytes = out.gpu_total_bytes - m.gpu_releasable_cache_bytes;
  out.host_buffers_bytes = T(m.host_opt_states_bytes + m.host_grads_bytes + m.host_params_bytes + m.host_pinned_buffers_bytes);
  out.host_placement_bytes = T(m.host_placement_bytes);
  out.host_per_rank_bytes = max(out.host_buffers_bytes, out.host_placement_bytes) + coef[kHostBytesPerRank];
  out.host_node_total_bytes = m.ranks_per_node * out.host_per_rank_bytes;
  return out;
}

}  // namespace stepcast
