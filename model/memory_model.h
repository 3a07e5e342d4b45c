// The memory model, per rank on the GPU and per node on the host: templated
// on the scalar type like step_time.h, over the same coefficient vector.
//   static             = parameters + gradients + optimizer states + buffers + workspace
//   backward's peak    = static + what only the backward holds (gradient accumulators the step
//                        does not see) + saved activations + the larger of
//                        (logits and loss buffers, one recomputed layer)       (live)
//   step's peak        = static + the step's own buffers (its fp32 gradients), allocated once the
//                        backward has freed the activations
//   GPU peak allocated = the larger of the two
//   GPU peak reserved  = backward's peak + the step's buffers (on a card with room the step's
//                        large buffers take segments of their own while the backward's stay
//                        cached) + the caching allocator's reserve: the larger of
//                        (fragmentation x live + ckpt_reserve_mult x checkpoints) and the
//                        loss's freed buffers (loss_reserve_bytes_per_logit x logits),
//                        + the cache the engine's buffers leave (measured per parameter)
//   GPU required       = peak reserved - the smaller of (the step's buffers a card without
//                        room reclaims, what only the backward holds): on a card
//                        without room the allocator frees the backward's cached segments and
//                        retries, so DeepSpeed's whole-partition step buffers reuse them
//                        (measured on one H100: five DeepSpeed plans reserved 76-90 GiB on the
//                        H200 ran there; FSDP2's unit-by-unit sharded gradients do not:
//                        data/runs/h100-sxm/2026-12-06_h100_tight_*_1gpu*.jsonl)
//   expandable segments: the loss's freed buffers stay reserved; the rest of the default
//                        allocator's cache above the peak allocated keeps the share
//                        expandable_reserve_frac; what a card needs is the peak allocated
//   host               = ranks per node x (the larger of the steady buffers (offloaded
//                        states, gradient accumulators, offloaded parameters, pinned
//                        buffers) and what placing the model holds, + process overhead)
// Measured on one H200 (data/runs/h200-sxm/2026-12-02_memory_phases_1gpu.jsonl): every step of
// our backend peaks in its backward; a checkpointed one at the loss's backward, where the
// recomputed layers have not started, so the logits and a recomputed layer are not live
// together. The peers' peak allocated (DeepSpeed at stages 1-2, 22 B a parameter at every small
// micro-batch) is their step's where the activations are small (step_features.cpp).
#pragma once

#include "model/coefficients.h"
#include "model/step_features.h"

namespace stepcast {

template <class T>
struct MemoryEstimate {
  T gpu_params_bytes{}, gpu_grads_bytes{}, gpu_opt_states_bytes{}, gpu_buffers_bytes{};
  T gpu_live_bytes{};         // saved activations, and the larger of logits and loss buffers or a recomputed layer
  T gpu_activations_bytes{};  // live bytes and the pool's reserve above them (fragmentation, the loss's buffers)
  T gpu_workspace_bytes{};
  T gpu_step_bytes{};         // the optimizer step's own buffers, after the backward
  T gpu_backward_bytes{};     // gradient accumulators the backward holds and the step does not
  T gpu_allocated_bytes{};    // the caching allocator's peak allocated: the backward's or the step's
  T gpu_reserve_bytes{};      // reserved above that peak: the pool's reserve, the engine's cache, the step's segments
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
  const T holes = coef[kGpuFragFrac] * live + coef[kCkptReserveMult] * m.ckpt_bytes;
  const T loss_buffers = coef[kLossReserveBytesPerLogit] * m.logits_elems;
  const T pool_reserve = max(holes, loss_buffers);
  out.gpu_activations_bytes = live + pool_reserve;
  out.gpu_workspace_bytes = coef[kGpuWorkspaceBytes];
  out.gpu_step_bytes = T(m.gpu_step_bytes);
  const T statics = out.gpu_params_bytes + out.gpu_grads_bytes + out.gpu_opt_states_bytes + out.gpu_buffers_bytes +
                    out.gpu_workspace_bytes;
  out.gpu_backward_bytes = T(m.gpu_backward_bytes);
  const T backward_only = out.gpu_backward_bytes + live;
  const T backward_peak = statics + backward_only;
  out.gpu_allocated_bytes = max(backward_peak, statics + out.gpu_step_bytes);
  out.gpu_total_bytes = backward_peak + out.gpu_step_bytes + pool_reserve + T(m.gpu_engine_cache_bytes);
  out.gpu_reserve_bytes = out.gpu_total_bytes - out.gpu_allocated_bytes;  // all the cache above the peak allocated
  using std::min;
  out.gpu_required_bytes = out.gpu_total_bytes - min(T(m.gpu_step_reclaimable_bytes), backward_only);
  if (m.expandable_segments > 0.0) {
    // The loss's fp32 buffers, freed after the loss's backward, stay reserved whole (qwen2.5-7b
    // LoRA on one H100: 3.77 GiB above the peak with the default allocator, 3.71 with expandable
    // segments); the rest of the cache above the peak keeps the share expandable_reserve_frac.
    const T& alloc = out.gpu_allocated_bytes;
    const T keep = coef[kExpandableReserveFrac];
    const T pool_kept = max(keep * holes, loss_buffers);
    const T rest = out.gpu_total_bytes - alloc - pool_reserve;  // the step's segments, the engine's cache
    out.gpu_total_bytes = alloc + keep * rest + pool_kept;
    out.gpu_reserve_bytes = out.gpu_total_bytes - alloc;
    // A card without room: the allocator's free-and-retry unmaps every free page of its
    // expandable segments and maps them where the allocation needs them, so no cache stands in
    // the way (FSDP2's stage 2 at 4 x 2048, out of memory on one H100 with the default allocator,
    // ran with expandable segments at 73.8 GiB allocated, retrying;
    // data/runs/h100-sxm/2026-12-06_expandable_fsdp2_1gpu.jsonl).
    out.gpu_required_bytes = alloc;
  }
  out.host_buffers_bytes = T(m.host_opt_states_bytes + m.host_grads_bytes + m.host_params_bytes + m.host_pinned_buffers_bytes);
  out.host_placement_bytes = T(m.host_placement_bytes);
  out.host_per_rank_bytes = max(out.host_buffers_bytes, out.host_placement_bytes) + coef[kHostBytesPerRank];
  out.host_node_total_bytes = m.ranks_per_node * out.host_per_rank_bytes;
  return out;
}

}  // namespace stepcast
