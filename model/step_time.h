// The step-time model: one formula, templated on the scalar type T (double in
// the planner, ceres::Jet in calibrate's fit), over a coefficient vector
// indexed by Coef. No configuration enum is read here; step_features.h has
// already turned the configuration into numbers.
//
// Structure of one optimizer step of GAS micro-batches on one rank:
//   micro-batch   = forward + backward (+ recompute)
//                   + exposed gradient reduction (hidden behind backward up to a share)
//                   + exposed parameter gathers / uploads (hidden behind compute up to a share)
//                   + the hidden collectives' toll on the compute beside them (a share of their time)
//   GAS time      = (GAS - 1) non-boundary micro-batches            (founding report's "GAS Time")
//   OPT time      = last micro-batch (with the boundary reduction and, with CPU offload,
//                   the gradient copies to the host, hidden behind its backward up to a share)
//                   + optimizer step + parameter upload + post-step all-gather   ("OPT Time")
//                   With pipelined CPU offload the optimizer, uploads and all-gathers are a
//                   pipeline over the units that starts during the last backward: only what
//                   that backward does not hide, plus the last unit's upload, is exposed.
//                   Serial CPU offload (DeepSpeed's) runs them one after the other.
//   step          = GAS time + OPT time
#pragma once

#include <cmath>

#include "model/coefficients.h"
#include "model/step_features.h"

namespace stepcast {

template <class T>
struct StepTime {
  // Per step (all GAS micro-batches), seconds.
  T forward_s{}, backward_s{}, recompute_s{};
  T grad_comm_s{}, param_gather_s{}, offload_transfer_s{};  // exposed (not hidden by overlap)
  T grad_comm_total_s{}, param_gather_total_s{}, offload_transfer_total_s{};  // before overlap
  T optimizer_s{};        // exposed
  T optimizer_total_s{};  // the optimizer's own time (CPU: hidden or not)
  T gas_s{}, opt_s{}, step_s{};
  T tail_s{};  // after the last micro-batch: optimizer, uploads, post-step all-gathers (exposed)
  T forward_gather_s{};  // the share of param_gather_s before the forwards' modules
  // The host's time to issue a micro-batch's passes (launches, fetches, hooks) over the GPU's
  // time to run them: 1 or more where the host sets the pace (launch-bound), whatever the GPU.
  T host_issue_ratio{};
};

namespace detail {

template <class T>
T max0(const T& x) {
  return x > T(0.0) ? x : T(0.0);
}

template <class T>
T min2(const T& a, const T& b) {
  return a < b ? a : b;
}

template <class T>
T max2(const T& a, const T& b) {
  return a > b ? a : b;
}

}  // namespace detail

// --- components ----------------------------------------------------------------
// Each formula below is written once and used twice: by predict_step_time and
// by calibrate's component fit, which compares it with the micro-benchmarks
// (backend/microbench_main.cpp) that time the same operation alone.

// Efficiency of one GEMM: the best efficiency (the tensor cores', or the CUDA cores' for fp32
// operands), reduced in each dimension d by d / (d + half): small dimensions under-fill the tiles.
template <class T>
T gemm_efficiency(const GemmShape& g, const T* coef, bool fp32 = false) {
  const T& half = coef[kGemmHalfDim];
  const T& best = fp32 ? coef[kFp32GemmEffMaxFrac] : coef[kGemmEffMaxFrac];
  return best * (g.m / (g.m + half)) * (g.n / (g.n + half)) * (g.k / (g.k + half));
}

// Time of g.count GEMMs of one shape at the dense peak `peak_flops_per_s` (the fp32 peak for
// fp32 operands).
template <class T>
T gemm_time_s(const GemmShape& g, double peak_flops_per_s, const T* coef, bool fp32 = false) {
  if (g.count <= 0.0) return T(0.0);
  return 2.0 * g.m * g.n * g.k * g.count / (peak_flops_per_s * gemm_efficiency(g, coef, fp32));
}

// Forward time of causal attention executing `fwd_flops` (causal_attention_fwd_flops):
// flash kernels reach attn_eff_max_frac, halved at attn_half_seq_tokens; the math
// path runs as batched GEMMs of s x s x 128.
template <class T>
T attention_fwd_time_s(double fwd_flops, double seq_len, bool math_attention, double peak_flops_per_s,
                       const T* coef, bool fp32 = false) {
  const T eff = math_attention ? gemm_efficiency(GemmShape{seq_len, seq_len, 128.0, 1.0}, coef, fp32)
                               : coef[kAttnEffMaxFrac] * (seq_len / (seq_len + coef[kAttnHalfSeqTokens]));
  return fwd_flops / (peak_flops_per_s * eff);
}

// nccl-tests model of `calls` collectives moving `bytes` in all (the full
// buffer): latency per call + bytes * bus factor / bus bandwidth. `allreduce`
// selects the all-reduce efficiency; reduce-scatter and all-gather run at
// rs_ag_bus_eff_mult of it.
template <class T>
T collective_time_s(double bytes, double calls, double bus_factor, bool allreduce, double link_bytes_per_s,
                    bool inter_node, double extra_latency_s, const T* coef) {
  if (bytes <= 0.0) return T(0.0);
  T eff = inter_node ? coef[kInterBusEffFrac] : coef[kIntraBusEffFrac];
  if (!allreduce) eff = eff * coef[kRsAgBusEffMult];
  const T latency = coef[kCollLatencyS] + extra_latency_s;
  return calls * latency + bytes * bus_factor / (link_bytes_per_s * eff);
}

// Backward time of causal attention, `bwd_flops_mult` times the forward's
// `fwd_flops` (2.5 for flash kernels): flash backward kernels have their own
// best efficiency and half-point; the math path runs as batched GEMMs at their
// forward's efficiency, as the data-gradient GEMMs of the projections do.
template <class T>
T attention_bwd_time_s(double fwd_flops, double seq_len, double bwd_flops_mult, bool math_attention,
                       double peak_flops_per_s, const T* coef, bool fp32 = false) {
  if (math_attention)
    return bwd_flops_mult * attention_fwd_time_s(fwd_flops, seq_len, true, peak_flops_per_s, coef, fp32);
  const T eff = coef[kAttnBwdEffMaxFrac] * (seq_len / (seq_len + coef[kAttnBwdHalfSeqTokens]));
  return bwd_flops_mult * fwd_flops / (peak_flops_per_s * eff);
}

// Roofline with a smooth corner, (a^4 + b^4)^(1/4): within 19 % of max() where
// both are equal and 0.005 % where one is 3x the other; it keeps a rate
// identifiable from runs bound by the other one near the corner.
template <class T>
T smooth_max(const T& a, const T& b) {
  using std::pow;
  return pow(pow(a, 4.0) + pow(b, 4.0), 0.25);
}

// A pinned host <-> device copy of `bytes` over a link of `link_bytes_per_s`.
template <class T>
T pcie_copy_time_s(double bytes, double link_bytes_per_s, const T* coef) {
  return bytes / (link_bytes_per_s * coef[kPcieEffFrac]);
}

// A host stream over `units` (cores, or cores x SIMD lanes) of `bytes_per_s_per_unit` each,
// sharing the node's DRAM at its efficiency: the harmonic rate below, one formula for the CPU
// optimizer and the host copies after it.
template <class T>
T host_stream_bytes_per_s(double dram_bytes_per_s, double units, const T& bytes_per_s_per_unit, const T* coef) {
  return 1.0 / (1.0 / (T(dram_bytes_per_s) * coef[kCpuDramEffFrac]) + 1.0 / (units * bytes_per_s_per_unit));
}

// The CPU optimizer over `params` parameters on `cores` cores of `lanes` fp32
// SIMD lanes sharing `dram_bytes_per_s`. It streams at the harmonic rate
// 1 / (1 / (cores x lanes x per-lane rate) + 1 / DRAM): it reproduces torch's
// fused CPU AdamW at 4 and 16 threads (coefficients.cpp), and, unlike a min(),
// keeps both coefficients identifiable from either regime. Its arithmetic runs
// on cores x lanes; memory and arithmetic meet in a smooth roofline, so the lane
// rate stays identifiable from memory-bound runs near the corner (8-bit AdamW).
template <class T>
T cpu_optimizer_time_s(double params, double bytes_per_param, double flops_per_param, double cores, double lanes,
                       double dram_bytes_per_s, const T* coef) {
  const T stream_bps = host_stream_bytes_per_s(dram_bytes_per_s, cores * lanes, coef[kCpuCoreBytesPerSPerLane], coef);
  const T memory_s = params * bytes_per_param / stream_bps;
  const T arith_s = params * flops_per_param / (cores * lanes * coef[kCpuLaneFlopsPerS]);
  return smooth_max(memory_s, arith_s) + coef[kCpuOptStepOverheadS];
}

// Host copies after the optimizer step: `convert_bytes` per rank on the rank's threads (all of
// the node's ranks at once, sharing its DRAM, as the CPU optimizer does) and `pageable_bytes`
// staged to the GPU by one thread.
template <class T>
T host_copy_time_s(double convert_bytes, double pageable_bytes, double ranks, double cores, double dram_bytes_per_s,
                   const T* coef) {
  if (convert_bytes <= 0.0 && pageable_bytes <= 0.0) return T(0.0);
  const T& per_thread = coef[kHostCopyBytesPerSPerThread];
  const T stream_bps = host_stream_bytes_per_s(dram_bytes_per_s, cores, per_thread, coef);
  return convert_bytes * ranks / stream_bps + pageable_bytes / per_thread;
}

// The layers' element-wise work of one forward pass (norms, rotary, activations, residual adds,
// layout copies): `bytes` of analytic saved activations, times the traffic they cost, at the
// GPU's HBM rate scaled by what its element-wise micro-benchmark measured (1 where none did).
// The backward's is backward_slowdown_mult x twice this. The step model and the element-wise
// micro-benchmark (calibrate/micro_record.h) both read it.
template <class T>
T elementwise_time_s(double bytes, double hbm_bytes_per_s, const T* coef) {
  return coef[kElementwiseTrafficMult] * bytes / (hbm_bytes_per_s * coef[kElementwiseBwEffFrac]);
}

// The GPU optimizer: its traffic at a fraction of HBM bandwidth, or its
// arithmetic (8-bit AdamW's decode and encode), in the same smooth roofline.
template <class T>
T gpu_optimizer_time_s(double params, double bytes_per_param, double flops_per_param, double hbm_bytes_per_s,
                       const T* coef) {
  const T memory_s = params * bytes_per_param / (hbm_bytes_per_s * coef[kGpuOptBwEffFrac]);
  const T arith_s = params * flops_per_param / coef[kGpuOptFlopsPerS];
  return smooth_max(memory_s, arith_s) + coef[kOptStepOverheadS];
}

namespace detail {

template <class T>
T collective_time_s(double bytes, double calls, double bus_factor, bool allreduce, const StepFeatures& f,
                    const T* coef) {
  return stepcast::collective_time_s(bytes, calls, bus_factor, allreduce, f.link_bytes_per_s,
                                     f.link_is_inter_node > 0.0, f.extra_latency_s, coef);
}

}  // namespace detail

template <class T>
StepTime<T> predict_step_time(const StepFeatures& f, const T* coef) {
  using detail::max0;
  StepTime<T> out;

  // --- compute of one micro-batch ------------------------------------------
  const bool fp32 = f.gemm_fp32 > 0.0;
  T gemm_fwd_s(0.0), head_gemm_s(0.0);
  for (int i = 0; i < kNumGemmClasses; ++i) {
    const T t = gemm_time_s(f.gemms[i], f.gemm_peak_flops_per_s, coef, fp32);
    gemm_fwd_s += t;
    if (i == kLmHeadGemm) head_gemm_s = t;
  }
  // One attention pass, `pass(flops, peak, fp32)`: math attention whose QK^T runs in fp32
  // (attn_fp32_flops_frac) takes that share of its FLOPs at the fp32 peak.
  const bool math_attn = f.attn_uses_gemm_eff > 0.0;
  const double fp32_share = math_attn ? f.attn_fp32_flops_frac : 0.0;
  const auto attention_s = [&](auto pass) {
    T t = pass((1.0 - fp32_share) * f.attn_fwd_flops, f.peak_flops_per_s, fp32);
    if (fp32_share > 0.0) t += pass(fp32_share * f.attn_fwd_flops, f.fp32_peak_flops_per_s, true);
    return t;
  };
  const T attn_fwd_s = attention_s([&](double flops, double peak, bool fp32_pass) {
                         return attention_fwd_time_s(flops, f.seq_len, math_attn, peak, coef, fp32_pass);
                       }) *
                       f.attn_head_dim_rel_fwd;
  const T elementwise_fwd_s = elementwise_time_s(f.elementwise_bytes_fwd, f.hbm_bytes_per_s, coef);
  const T overhead_s = coef[kLayerOverheadS] * f.num_layers;

  // PEFT: the adapters' low-rank GEMMs and their elementwise traffic at HBM speed; QLoRA's
  // dequantisation of every NF4 weight before its forward and again before its backward
  // product: a streaming kernel of ours like the GPU optimizer's, at its share of HBM bandwidth.
  T adapter_gemm_s(0.0);
  for (const GemmShape& g : f.adapter_gemms) adapter_gemm_s += gemm_time_s(g, f.gemm_peak_flops_per_s, coef, fp32);
  const T dequant_s = f.dequant_bytes_pass / (f.hbm_bytes_per_s * coef[kGpuOptBwEffFrac]);
  const T adapter_fwd_s = adapter_gemm_s + f.adapter_bytes_fwd / f.hbm_bytes_per_s + dequant_s;
  const T adapter_bwd_s = 2.0 * adapter_gemm_s + f.adapter_bytes_bwd / f.hbm_bytes_per_s + dequant_s;

  // Our backend's streaming copies and adds around the layers (stage-2/3 gradient
  // accumulation, one rank's stage-3 gathers) at the GPU optimizer's share of HBM bandwidth.
  const T stream_bw = f.hbm_bytes_per_s * coef[kGpuOptBwEffFrac];
  const T local_gather_s = 0.5 * f.local_gather_bytes_micro / stream_bw;  // half before each pass
  const T grad_accum_s = f.grad_accum_bytes_micro / stream_bw;
  const T fsdp_copy_fwd_s = f.fsdp_copy_bytes_fwd_micro / stream_bw;
  const T fsdp_copy_bwd_s = f.fsdp_copy_bytes_bwd_micro / stream_bw;

  const T fwd_gpu_s = gemm_fwd_s + attn_fwd_s + elementwise_fwd_s + overhead_s + adapter_fwd_s + local_gather_s +
                      fsdp_copy_fwd_s + f.attn_score_bytes_fwd / f.hbm_bytes_per_s;
  // The backward: data-gradient GEMMs at the forward GEMMs' time, weight-gradient GEMMs at
  // weight_grad_gemm_mult of it (none for PEFT's frozen weights), the element-wise ops at
  // backward_slowdown_mult of twice the forward's.
  const T bwd_gpu_s =
      (1.0 + coef[kWeightGradGemmMult] * f.weight_grad_frac) * gemm_fwd_s +
      coef[kBackwardSlowdownMult] * 2.0 * elementwise_fwd_s +
      adapter_bwd_s +
      attention_s([&](double flops, double peak, bool fp32_pass) {
        return attention_bwd_time_s(flops, f.seq_len, f.attn_bwd_flops_mult, math_attn, peak, coef, fp32_pass);
      }) * f.attn_head_dim_rel_bwd +
      overhead_s + local_gather_s + grad_accum_s + fsdp_copy_bwd_s + f.attn_score_bytes_bwd / f.hbm_bytes_per_s;
  // The host's time to issue a layer: the engine's (fitted), scaled for a peer by its model
  // implementation's measured cost relative to the profiled families (transformers' Python).
  const T launch_fwd_s = coef[kHostLayerFwdS] * f.impl_host_fwd_rel * f.num_layers;
  const T launch_bwd_only_s = coef[kHostLayerBwdS] * f.impl_host_bwd_rel * f.num_layers;
  // A pass takes at least the host time to issue its kernels (launch-bound at small micro-batches),
  // and near the corner longer than either: the GPU's queue runs dry whenever a stretch of small
  // kernels issues slower than it runs. The same smooth corner as the hooks' below
  // (docs/calibration.md: what it does to the H200 runs' cross-validated error).
  const T fwd_s = smooth_max(fwd_gpu_s, launch_fwd_s);
  const T bwd_s = smooth_max(bwd_gpu_s, launch_bwd_only_s);
  // Checkpointing recomputes the decoder layers' forward, not the head's (whose logits the
  // loss's backward consumes at once): the forward less the lm_head product.
  const T recompute_gpu_s = fwd_gpu_s - head_gemm_s;
  const T recompute_s = f.recompute * smooth_max(recompute_gpu_s, launch_fwd_s);
  const T compute_s = fwd_s + bwd_s + recompute_s;

  // --- communication and transfers of one micro-batch -----------------------
  const bool allreduce = f.grad_comm_is_allreduce > 0.0;
  const T rs_micro_s = detail::collective_time_s(f.grad_comm_bytes_micro, f.grad_comm_calls_micro,
                                                 f.grad_comm_bus_factor, allreduce, f, coef);
  const T rs_boundary_s =
      detail::collective_time_s(f.grad_comm_bytes_boundary, f.grad_comm_calls_boundary,
                                f.grad_comm_bus_factor, allreduce, f, coef);
  const T gather_s = detail::collective_time_s(f.gather_bytes_micro, f.gather_calls_micro,
                                               f.gather_bus_factor, false, f, coef);
  const T param_up_s = pcie_copy_time_s(f.param_h2d_bytes_micro, f.h2d_bytes_per_s, coef);
  const T d2h_boundary_s = pcie_copy_time_s(f.d2h_bytes_boundary, f.d2h_bytes_per_s, coef);
  const T grad_host_micro_s = pcie_copy_time_s(f.grad_host_bytes_micro, f.d2h_bytes_per_s, coef);
  // A blocking copy staged through pageable host memory: serial, not hidden.
  const T staged_s = f.staged_d2h_bytes_boundary / coef[kStagedCopyBytesPerS];
  const T staged_micro_s = f.staged_d2h_bytes_micro / coef[kStagedCopyBytesPerS];
  // Copies between the GPU and unpinned host buffers (DeepSpeed's "pin_memory": false): the
  // issuing thread waits for each, so they add to the micro-batch they belong to.
  const T pageable_micro_s = T(f.pageable_bytes_micro > 0.0 ? f.pageable_bytes_micro / f.pageable_bytes_per_s : 0.0);
  const T pageable_boundary_s =
      T(f.pageable_bytes_boundary > 0.0 ? f.pageable_bytes_boundary / f.pageable_bytes_per_s : 0.0);
  // Gradient sums on the host after such a copy, on the rank's CPU threads: serial as well.
  const T host_accum_micro_s = host_copy_time_s(f.host_accum_bytes_micro, 0.0, f.ranks_per_node, f.cpu_cores_node,
                                                f.dram_bytes_per_s, coef);
  const T host_accum_boundary_s = host_copy_time_s(f.host_accum_bytes_boundary, 0.0, f.ranks_per_node,
                                                   f.cpu_cores_node, f.dram_bytes_per_s, coef);
  // What the issuing thread waits for on a non-boundary micro-batch and on the last one.
  const T serial_micro_s = pageable_micro_s + staged_micro_s + host_accum_micro_s;
  const T serial_boundary_s = staged_s + pageable_boundary_s + host_accum_boundary_s;

  // Overlap: gradient reduction and copies to the host run on their own
  // streams during backward; gathers and uploads are prefetched during compute.
  // A checkpointed layer's recompute runs inside the backward pass, between the
  // gradients of the layer above and its own, so the window is the pass with it.
  const T bwd_pass_s = bwd_s + recompute_s;
  const T grad_window = coef[kGradCommOverlapFrac] * bwd_pass_s;
  const T copy_window = coef[kOffloadOverlapFrac] * bwd_pass_s;
  const T gather_window = coef[kGatherOverlapFrac] * compute_s;
  // A peer engine's hooks (DeepSpeed ZeRO-3's parameter fetches before each module, its gradient
  // reduction after each tensor) are host work on the thread that issues the kernels. The GPU
  // runs the kernels already queued meanwhile, so a pass takes the longer of its GPU time and its
  // host time (launches + hooks), with a smooth corner. Measured on one H200 (pythia-2.8b, stage
  // 3, GAS 2, data/runs/h200-sxm/2026-12-02_peers_deepspeed_1gpu_zero3_curve.jsonl): 0.84 s a
  // step from micro-batch 1 to 3, then 0.96, 1.06 and 1.33 s at 5, 6 and 8, 0.1 s above stage 2
  // once the GPU's work outweighs the hooks'. The excess over the pass's own time is exposed.
  const T fetch_overhead_s =
      coef[kParamFetchOverheadS] * f.param_fetches_micro + f.param_fetch_bytes_micro / coef[kParamFetchBytesPerS];
  const T hooks_s = coef[kGradHookOverheadS] * f.grad_hooks_micro;
  const T fetch_fwd_host_s = fetch_overhead_s * f.fetch_fwd_frac;
  const T fetch_bwd_host_s = fetch_overhead_s - fetch_fwd_host_s;  // the backward's and the recompute's rounds
  // What the hooks add to the pass beyond its launches: 0 without hooks, continuous in them.
  const T fwd_hook_exposed =
      smooth_max(fwd_gpu_s, launch_fwd_s + fetch_fwd_host_s) - smooth_max(fwd_gpu_s, launch_fwd_s);
  const T bwd_gpu_total_s = bwd_gpu_s + f.recompute * recompute_gpu_s;
  const T launch_bwd_s = launch_bwd_only_s + f.recompute * launch_fwd_s;
  const T hook_host_s = fetch_bwd_host_s + hooks_s;
  const T bwd_exposed =
      smooth_max(bwd_gpu_total_s, launch_bwd_s + hook_host_s) - smooth_max(bwd_gpu_total_s, launch_bwd_s);
  T bwd_fetch_exposed(0.0), hooks_exposed(0.0);
  if (hook_host_s > 0.0) {  // the backward's exposure shared between fetches and hooks
    bwd_fetch_exposed = bwd_exposed * fetch_bwd_host_s / hook_host_s;
    hooks_exposed = bwd_exposed * hooks_s / hook_host_s;
  }
  // Uploads that block the compute stream (param_h2d_blocking) add in full; the rest hide with the
  // gathers behind the compute window.
  const T blocking_up_s = T(f.param_h2d_blocking > 0.0 ? f.param_h2d_bytes_micro / f.h2d_bytes_per_s : 0.0);
  const T hidden_up_s = f.param_h2d_blocking > 0.0 ? T(0.0) : param_up_s;
  const T gather_gpu_exposed = max0(gather_s + hidden_up_s - gather_window) + blocking_up_s;
  const T gather_exposed = gather_gpu_exposed + fwd_hook_exposed + bwd_fetch_exposed;
  T rs_exposed_micro = max0(rs_micro_s - grad_window);
  T rs_exposed_boundary = max0(rs_micro_s + rs_boundary_s - grad_window);
  T d2h_exposed_boundary = max0(d2h_boundary_s - copy_window);
  T grad_host_exposed_micro = max0(grad_host_micro_s - copy_window);
  if (f.pcie_shared_link > 0.0) {
    // GPUs that talk over PCIe reduce gradients over the same link their copies to the host
    // use: the two queue on it and hide together, behind the larger of their windows. The
    // exposed time is shared between them in proportion to their own.
    const T window = detail::max2(grad_window, copy_window);
    const auto share = [&](const T& a, const T& b, T& exposed_a, T& exposed_b) {
      const T total = a + b;
      if (!(total > 0.0)) return;
      const T exposed = max0(total - window);
      exposed_a = exposed * a / total;
      exposed_b = exposed * b / total;
    };
    share(rs_micro_s, grad_host_micro_s, rs_exposed_micro, grad_host_exposed_micro);
    share(rs_micro_s + rs_boundary_s, d2h_boundary_s, rs_exposed_boundary, d2h_exposed_boundary);
  }
  // What the hidden collectives still cost: the compute they run beside slows by a share of their
  // time (kCommInterferenceFrac). The hidden part of the gathers is what the compute window
  // holds; of the gradient reductions, what is not exposed.
  const T interference = coef[kCommInterferenceFrac];
  const T gather_interference_s = interference * detail::min2(gather_s, gather_window);
  const T rs_interference_micro_s = interference * (rs_micro_s - rs_exposed_micro);
  const T rs_interference_boundary_s = interference * (rs_micro_s + rs_boundary_s - rs_exposed_boundary);
  // Hooks that work on the last micro-batch only (DeepSpeed ZeRO-1) lengthen that backward's host
  // time alone; what they add beyond it is exposed once a step.
  const T hooks_boundary_s = coef[kGradHookOverheadS] * f.grad_hooks_boundary;
  const T hooks_boundary_exposed =
      smooth_max(bwd_gpu_total_s, launch_bwd_s + hook_host_s + hooks_boundary_s) -
      smooth_max(bwd_gpu_total_s, launch_bwd_s + hook_host_s);
  const T micro_s = compute_s + gather_exposed + gather_interference_s + hooks_exposed + rs_exposed_micro +
                    rs_interference_micro_s + grad_host_exposed_micro + serial_micro_s;
  const T boundary_micro_s = compute_s + gather_exposed + gather_interference_s + hooks_exposed +
                             hooks_boundary_exposed + rs_exposed_boundary + rs_interference_boundary_s +
                             d2h_exposed_boundary + serial_boundary_s;

  // --- optimizer step --------------------------------------------------------
  // All ranks of a host run their CPU optimizer at once and share its cores and DRAM.
  const T optimizer_s =
      f.opt_on_cpu > 0.0
          ? cpu_optimizer_time_s(f.opt_params_rank * f.ranks_per_node, f.opt_bytes_per_param, f.opt_flops_per_param,
                                 f.cpu_cores_node, f.cpu_simd_lanes, f.dram_bytes_per_s, coef)
          : gpu_optimizer_time_s(f.opt_params_rank, f.opt_bytes_per_param, f.opt_flops_per_param, f.hbm_bytes_per_s,
                                 coef);
  const T upload_s = pcie_copy_time_s(f.h2d_bytes_step, f.h2d_bytes_per_s, coef);
  const T post_gather_s = detail::collective_time_s(f.post_step_gather_bytes, f.post_step_gather_calls,
                                                    f.gather_bus_factor, false, f, coef);
  // After the last micro-batch: serial on the GPU; with pipelined CPU offload, the CPU updates
  // run from the start of the last backward (up to a share of it hidden) and each unit goes
  // back up once updated, during the backward (ZeroEngine::copy_up_ready): what the backward
  // does not hide of the slower stream (updates or uploads) is exposed, or, at stages 1-2 on
  // several ranks, the all-gathers, which follow the backward in one order on every rank;
  // then the last unit's upload and all-gather. Records from before that (uploads issued
  // after the backward, opt_uploads_in_bwd 0) start the upload stream at the backward's end:
  // their tail is the whole stream, or the updates' exposed rest and then the last unit's.
  const T host_copy_s = host_copy_time_s(f.host_convert_bytes_step, f.pageable_h2d_bytes_step, f.ranks_per_node,
                                         f.cpu_cores_node, f.dram_bytes_per_s, coef);
  T tail_s = optimizer_s + upload_s + post_gather_s + host_copy_s;
  T optimizer_exposed = optimizer_s;
  const bool pipelined = f.opt_on_cpu > 0.0 && f.opt_pipelined > 0.0;
  if (pipelined) {
    const T back_s = (upload_s + post_gather_s) / f.opt_pipeline_units;
    const T hidden = coef[kCpuOptOverlapFrac] * bwd_pass_s;
    optimizer_exposed = max0(optimizer_s - hidden);
    tail_s = f.opt_uploads_in_bwd > 0.0
                 ? detail::max2(post_gather_s, max0(detail::max2(optimizer_s, upload_s) - hidden)) + back_s +
                       host_copy_s
                 : detail::max2(upload_s + post_gather_s, optimizer_exposed + back_s) + host_copy_s;
    if (f.opt_overlap_fwd > 0.0) {
      // The step returns; the next forward takes each unit as it comes up, in forward
      // order, and hides up to a share of its own time. It cannot hide the first unit's
      // update and upload (the embedding's gradient is the backward's last), which the
      // tail without the overlap holds as well.
      const T first_unit_s = (optimizer_s + upload_s + post_gather_s) / f.opt_pipeline_units;
      tail_s = detail::min2(tail_s, detail::max2(tail_s - coef[kFwdUploadOverlapFrac] * fwd_s, first_unit_s));
      optimizer_exposed = detail::min2(optimizer_exposed, tail_s);
    }
  }

  // --- the step --------------------------------------------------------------
  const double g = f.gas;
  out.forward_s = g * fwd_s;
  out.backward_s = g * bwd_s;
  out.recompute_s = g * recompute_s;
  // DeepSpeed's gradient hooks launch its reductions, so their exposed host time counts here.
  out.grad_comm_s = (g - 1.0) * (rs_exposed_micro + rs_interference_micro_s) + rs_exposed_boundary +
                    rs_interference_boundary_s + g * hooks_exposed + hooks_boundary_exposed +
                    (pipelined ? T(0.0) : post_gather_s);
  out.grad_comm_total_s = g * (rs_micro_s + hooks_s) + hooks_boundary_s + rs_boundary_s + post_gather_s;
  out.param_gather_s = g * (gather_exposed + gather_interference_s);
  out.forward_gather_s = g * ((gather_gpu_exposed + gather_interference_s) * f.fetch_fwd_frac + fwd_hook_exposed);
  out.param_gather_total_s = g * (gather_s + param_up_s + fetch_overhead_s);
  // Pipelined: everything of the tail beyond the exposed optimizer (uploads and all-gathers).
  const T blocking_s = (g - 1.0) * serial_micro_s + serial_boundary_s;
  out.offload_transfer_s = (g - 1.0) * grad_host_exposed_micro + d2h_exposed_boundary + blocking_s +
                         (pipelined ? tail_s - optimizer_exposed : upload_s + host_copy_s);
  out.offload_transfer_total_s =
      (g - 1.0) * grad_host_micro_s + d2h_boundary_s + blocking_s + upload_s + host_copy_s;
  out.optimizer_s = optimizer_exposed;
  out.optimizer_total_s = optimizer_s;
  out.gas_s = (g - 1.0) * micro_s;
  out.opt_s = boundary_micro_s + tail_s;
  out.tail_s = tail_s;
  out.step_s = out.gas_s + out.opt_s;
  out.host_issue_ratio = (launch_fwd_s + fetch_fwd_host_s + launch_bwd_s + hook_host_s) / (fwd_gpu_s + bwd_gpu_total_s);
  return out;
}

// The phases as a run's harness times them. Our backend's records hold the model's own phases
// (the backward with its recompute; the optimizer's own time, hidden or not). A peer engine's
// harness (bench/peers/peer.py) times engine.backward(), which holds the engine's gradient
// reductions and host copies, and engine.step(), which holds the whole tail after the last
// micro-batch: everything of the step but the forwards and the tail counts as backward there.
template <class T>
struct TimedPhases {
  T forward_s{}, backward_s{}, optimizer_s{};
};

template <class T>
TimedPhases<T> timed_phases(const StepTime<T>& t, bool peer_harness) {
  if (peer_harness) {
    const T forward = t.forward_s + t.forward_gather_s;
    return {forward, t.step_s - t.tail_s - forward, t.tail_s};
  }
  return {t.forward_s, t.backward_s + t.recompute_s, t.optimizer_total_s};
}

}  // namespace stepcast
