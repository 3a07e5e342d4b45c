#include "model/coefficients.h"

namespace stepcast {

// Defaults are first estimates from the H200 measurements in
// docs/h200_measurements.md (derivations inline); `calibrate fit` replaces them.
static const std::array<CoefInfo, kNumCoefs> kTable = {{
    // 790 TFLOP/s measured for a bf16 8192^3 GEMM / 989 TFLOP/s datasheet = 0.80
    // is the ceiling; training shapes (e.g. 11008 columns) reach less: 0.75.
    {kGemmEffMaxFrac, "gemm_eff_max_frac", 0.05, 1.0, 0.75, "1",
     "best fraction of the dense peak reached by a large GEMM"},
    {kGemmHalfDim, "gemm_half_dim", 0.0, 4096.0, 64.0, "elements",
     "GEMM dimension at which efficiency halves (eff = max * prod d/(d+half))"},
    // fp32 GEMMs (no TF32: torch's default matmul precision "highest") run on the CUDA cores,
    // whose FMA pipes a GEMM keeps busier than a tensor-core GEMM keeps its tensor cores (no
    // operand staging ahead of much faster math). The H200's fit (docs/calibration.md) is the
    // default for a GPU never calibrated.
    {kFp32GemmEffMaxFrac, "fp32_gemm_eff_max_frac", 0.05, 1.0, 0.86, "1",
     "best fraction of the fp32 (CUDA-core) peak reached by a large fp32 GEMM"},
    // SDPA causal bf16 fwd+bwd: 406 TFLOP/s at s=2048, 489 at s=4096. Solving
    // eff(s) = E*s/(s+k) through both points gives k = 1052 tokens, E = 0.62.
    {kAttnEffMaxFrac, "attn_eff_max_frac", 0.05, 1.0, 0.62, "1",
     "best fraction of the dense peak reached by fused attention"},
    {kAttnHalfSeqTokens, "attn_half_seq_tokens", 0.0, 65536.0, 1052.0, "tokens",
     "sequence length at which attention runs at half its best efficiency"},
    // The backward of norms, activations, rotary and residuals reads and writes about twice the
    // forward's bytes; the multiplier says how much more or less time that takes. The backward's
    // GEMMs are not under it: the data gradient dX = dY W has the forward's shape and runs at its
    // efficiency, the weight gradient has a coefficient of its own (below). 1.15 is a first
    // estimate until a fit replaces it.
    {kBackwardSlowdownMult, "backward_slowdown_mult", 0.3, 4.0, 1.15, "1",
     "the backward's element-wise time over twice the forward's"},
    // A weight gradient dW = dY^T X reduces over the micro-batch's tokens into a weight-sized
    // result, where the forward and the data gradient reduce over a hidden dimension. Full
    // fine-tuning alone cannot tell its time from the element-wise ops' (both grow with the
    // tokens); PEFT runs, whose frozen weights get no weight gradient, can. Default 1: the
    // forward GEMM's efficiency, until a fit on both kinds of runs replaces it.
    {kWeightGradGemmMult, "weight_grad_gemm_mult", 0.5, 3.0, 1.0, "1",
     "time of a weight-gradient GEMM over its forward GEMM's"},
    // Uncalibrated default chosen so that llama-2-7b on 2 x H200 (micro-batch
    // 4, GAS 4, seq 2048, bf16) predicts about the 20,100 tokens/s (43 % MFU)
    // that PyTorch FSDP2 reached there (docs/h200_measurements.md).
    // FlashAttention-2's backward runs 2.5x its forward FLOPs at a lower efficiency
    // than its forward, and reaches it at longer sequences (Dao 2023, figures 5-6).
    // Defaults: the forward's values; the micro-benchmarks measure both.
    {kAttnBwdEffMaxFrac, "attn_bwd_eff_max_frac", 0.05, 1.0, 0.62, "1",
     "best fraction of peak of fused attention backward"},
    {kAttnBwdHalfSeqTokens, "attn_bwd_half_seq_tokens", 0.0, 65536.0, 1052.0, "tokens",
     "sequence length at which attention backward runs at half its best efficiency"},
    {kElementwiseTrafficMult, "elementwise_traffic_mult", 0.0, 50.0, 8.0, "1",
     "HBM bytes moved by norms, activations, rotary and residuals per saved activation byte"},
    // The element-wise term above runs at the GPU's HBM rate times this. A GPU's element-wise
    // micro-benchmark (microbench --suite elementwise: a decoder layer's norms, rotary, layout
    // copies, activation and residual adds, forward and backward) measures it against that term's
    // own time; where no micro-benchmark says otherwise it is 1 and the traffic multiplier holds
    // everything. On another GPU kind the ratio of the two GPUs' measurements carries the term
    // ([coefficients.measured]), in place of the ratio of their HBM rates. Above 1 where a GPU's
    // kernels beat the reference's share of its own HBM rate.
    {kElementwiseBwEffFrac, "elementwise_bw_eff_frac", 0.05, 4.0, 1.0, "1",
     "rate of the layers' element-wise kernels over the HBM rate the element-wise term assumes"},
    {kLayerOverheadS, "layer_overhead_s", 0.0, 5e-3, 30e-6, "s",
     "fixed launch and synchronisation time per layer per pass"},
    // DeepSpeed ZeRO-3 fetches each module's parameters from a forward pre-hook and again from a
    // backward pre-hook (runtime/zero/parameter_offload.py registers the hooks on every submodule;
    // partitioned_param_coordinator.py fetch_sub_module all-gathers that module's own parameters
    // and waits for them); FSDP2 does the same per fully_shard unit. The Python work of each fetch
    // sits on the launching thread. The Stepcast backend's stage-3 gather and release of each unit
    // (C++, no Python) is fitted on the same term; the default, 0.2 ms, is the order of a Python
    // hook with an all-gather launch and the fit's starting point.
    {kParamFetchOverheadS, "param_fetch_overhead_s", 0.0, 0.02, 2e-4, "s",
     "host time of one hooked parameter fetch (a peer engine's stage-3 module or FSDP2 unit; the Stepcast backend's stage-3 unit gather)"},
    // DeepSpeed ZeRO-3's backward hook on each parameter tensor's gradient (runtime/zero/stage3.py,
    // reduce_ready_partitions_and_remove_grads: the bucket, its reduce-scatter launch and the
    // partition copy) runs on the launching thread too. On one H200 the stage-3 backward at
    // micro-batch 1 is 0.9 ms per module longer than the fetch alone explains for pythia-2.8b
    // (two tensors per module) and 0.8 ms for llama-2-7b (one): about 0.2 ms per tensor.
    // FSDP2 spends host time of the same order per tensor once a step (step_features.cpp).
    {kGradHookOverheadS, "grad_hook_overhead_s", 0.0, 0.02, 2e-4, "s",
     "host time of a gradient reduction hook: a peer engine's on one parameter tensor (DeepSpeed stages 1-3, FSDP2), the Stepcast backend's on one unit from stage 2"},
    // DeepSpeed's ZeRO-3 forward on one H200 at micro-batch 1 spends, beyond its no-hook floor,
    // 0.080 s a micro-batch for pythia-2.8b (195 modules, 2.78 B parameters), 0.187 for
    // llama-2-7b (291, 6.74 B), 0.167 for gpt-j-6b (199, 6.05 B) and 0.22 for mistral-7b (291,
    // 7.24 B): 0.03 ms a module and 26.6 ms per billion parameters fit all four within 10 %, where
    // a cost per module alone leaves GPT-J 30 % short
    // (data/runs/h200-sxm/2026-12-02_peers_deepspeed_1gpu_host.jsonl). The default is that rate in
    // bf16 bytes; the fit sets it per engine.
    {kParamFetchBytesPerS, "param_fetch_bytes_per_s", 1e9, 1e13, 7.5e10, "B/s",
     "parameter bytes a peer engine's ZeRO-3 fetch makes available per second, on the hooks' thread"},
    // The GPU cannot run ahead of the thread that issues its kernels: a layer's pass takes at
    // least the host time to issue it (C++ dispatch, autograd's graph walk and launches). On the
    // H200 host, pythia-2.8b at micro-batch 1 runs its backward in 60.5 ms per micro-batch at
    // 2048 tokens and 60.7 ms at 1024 (data/runs/h200-sxm/2026-12-01_small_micro_1gpu.jsonl):
    // a floor of about 1.9 ms per layer that does not scale with tokens; its forward, 0.7 ms.
    // The defaults are that order; the fit sets them per host from runs near the floor.
    {kHostLayerFwdS, "host_layer_fwd_s", 0.0, 0.02, 0.5e-3, "s",
     "host time to issue one layer's forward pass (floor of a launch-bound forward)"},
    {kHostLayerBwdS, "host_layer_bwd_s", 0.0, 0.05, 1.5e-3, "s",
     "host time to issue one layer's backward pass (floor of a launch-bound backward)"},
    // NCCL all-reduce on 2 H200 (NV18): 71 GB/s at 4 MB, 246 at 64 MB, 325 at
    // 1 GiB. t = lat + bytes/bw through the 4 MB and 1 GiB points: lat = 46 us,
    // bw = 330 GB/s; 330 / 450 GB/s (NVLink 4, one direction) = 0.73.
    {kCollLatencyS, "coll_latency_s", 0.0, 1e-2, 46e-6, "s", "latency of one collective call"},
    {kIntraBusEffFrac, "intra_bus_eff_frac", 0.05, 1.0, 0.73, "1",
     "achieved bus bandwidth over the intra-node link bandwidth"},
    {kInterBusEffFrac, "inter_bus_eff_frac", 0.05, 1.0, 0.80, "1",
     "achieved bus bandwidth over the inter-node bandwidth per GPU"},
    // At 1 GiB on 2 H200: reduce-scatter 258, all-gather 263, all-reduce 325 GB/s busbw: 0.80.
    {kRsAgBusEffMult, "rs_ag_bus_eff_mult", 0.2, 1.5, 0.80, "1",
     "reduce-scatter and all-gather bus bandwidth relative to all-reduce"},
    {kGradCommOverlapFrac, "grad_comm_overlap_frac", 0.0, 1.0, 0.80, "1",
     "share of backward time that can hide gradient reduction"},
    {kGatherOverlapFrac, "gather_overlap_frac", 0.0, 1.0, 0.70, "1",
     "share of compute time that can hide stage-3 parameter gathers and uploads"},
    // A collective behind compute is not free: NCCL runs each channel as one thread block on an
    // SM of its own (Hu et al., "Demystifying NCCL", arXiv 2507.04786), taken from the layers'
    // kernels, and streams its bytes through the same HBM. A few tens of channels on NVLink are
    // of order a fifth of an H100's or H200's 132 SMs: the default charges a fifth of each hidden
    // second to the compute, and the fit moves it.
    {kCommInterferenceFrac, "comm_interference_frac", 0.0, 1.0, 0.20, "1",
     "compute time that a collective hidden behind it still adds, per second of the collective"},
    {kPcieEffFrac, "pcie_eff_frac", 0.05, 1.0, 0.95, "1",
     "achieved fraction of the profile's pinned PCIe bandwidth"},
    {kOffloadOverlapFrac, "offload_overlap_frac", 0.0, 1.0, 0.50, "1",
     "share of backward time that can hide gradient copies to the host"},
    // The backend's offload pipeline starts the CPU optimizer on each unit as soon as its
    // gradient shard is on the host: most of the last micro-batch's backward can hide it.
    {kCpuOptOverlapFrac, "cpu_opt_overlap_frac", 0.0, 1.0, 0.80, "1",
     "share of the last micro-batch's backward that hides the pipelined CPU optimizer"},
    // With the pipeline's last updates overlapping the next forward, the forward takes
    // the units in order as they come up: all of it but the last unit's forward can
    // run behind the CPU (1 - 1/units: 0.97 for 32 layers + 2), less the waits.
    {kFwdUploadOverlapFrac, "fwd_upload_overlap_frac", 0.0, 1.0, 0.90, "1",
     "share of the next step's first forward that hides the offload tail (--offload-pipeline full)"},
    // DeepSpeed ZeRO-3 with optimizer offload writes each 16-bit gradient partition into its fp32
    // host buffer with a blocking cross-dtype copy_, which torch stages through a fresh pageable
    // host tensor and converts on the CPU (aten/src/ATen/native/cuda/Copy.cu,
    // copy_requires_temporaries). Measured per 16-bit byte on the H200 host: about 1.1 GB/s
    // (5 configurations, 1 and 2 GPUs, 1 and 16 threads; docs/engines.md).
    {kStagedCopyBytesPerS, "staged_copy_bytes_per_s", 1e7, 1e11, 1.1e9, "B/s",
     "device-to-host copy into another dtype through torch's pageable temporaries (DeepSpeed ZeRO-3 offload)"},
    // DeepSpeed ZeRO-3's optimizer step copies each updated fp32 host partition into the 16-bit
    // one (runtime/zero/stage3.py, _reassign_or_swap_out_partitioned_parameters): torch converts
    // on the rank's CPU threads and a host-to-device source in pageable memory is staged by the
    // copying thread alone. Start: 5 GB/s, a single core's streaming copy on the H200 host
    // (1.4 s more per step than ZeRO-2 for pythia-2.8b's 16.8 GB converted at 16 threads and
    // 5.6 GB staged on one: docs/engines.md).
    {kHostCopyBytesPerSPerThread, "host_copy_bytes_per_s_per_thread", 1e8, 1e11, 5e9, "B/s",
     "host memory one CPU thread copies or converts (torch's CPU copy_, pageable host-to-device staging)"},
    // torch fused AdamW, fp32, 1 Gi params in 9.0 ms = 28 B/param * 1.07e9 /
    // 9.0e-3 s = 3.34 TB/s of 4.8 TB/s = 0.70.
    {kGpuOptBwEffFrac, "gpu_opt_bw_eff_frac", 0.05, 1.0, 0.70, "1",
     "GPU optimizer: achieved fraction of HBM bandwidth"},
    // The 8-bit kernel decodes and re-encodes both moments: ~60 operations per
    // parameter; on the H200, 2^28 parameters in 2.09 ms (calibration micro-benchmark,
    // 2026-11-30) = 7.7e12 per second.
    {kGpuOptFlopsPerS, "gpu_opt_flops_per_s", 1e11, 1e15, 8e12, "FLOP/s",
     "GPU optimizer: arithmetic rate of its kernels"},
    // torch fused CPU AdamW at 28 B/param: 2.24 Gparam/s (63 GB/s) at 4 threads
    // and 4.0 (112 GB/s) at 16. A harmonic model 1/bw = 1/(cores*c) + 1/D
    // through both points gives c = 27 GB/s per AVX-512 core = 1.7 GB/s per
    // lane, D = 151 GB/s (= 0.94 of the 160 GB/s in the h200-sxm profile).
    {kCpuCoreBytesPerSPerLane, "cpu_core_bytes_per_s_per_lane", 1e7, 1e11, 1.7e9, "B/s",
     "CPU optimizer: streaming rate of one core per fp32 SIMD lane"},
    {kCpuLaneFlopsPerS, "cpu_lane_flops_per_s", 1e7, 1e11, 2.0e9, "FLOP/s",
     "CPU optimizer: arithmetic rate of one fp32 SIMD lane"},
    {kCpuDramEffFrac, "cpu_dram_eff_frac", 0.05, 1.0, 0.94, "1",
     "CPU optimizer: achievable fraction of the host DRAM bandwidth"},
    // One kernel per parameter unit (layers + 2) at ~5 us each.
    {kOptStepOverheadS, "opt_step_overhead_s", 0.0, 1.0, 2e-4, "s",
     "fixed time of one GPU optimizer step"},
    // Waking the optimizer's threads and joining them: ~1 ms for 32 threads on the
    // H200 host (calibration micro-benchmark, 2026-11-30).
    {kCpuOptStepOverheadS, "cpu_opt_step_overhead_s", 0.0, 1.0, 1e-3, "s",
     "fixed time of one CPU optimizer step"},
    {kGpuWorkspaceBytes, "gpu_workspace_bytes", 0.0, 16e9, 1.5e9, "B",
     "CUDA context, library workspaces and allocator reserve per GPU"},
    {kGpuFragFrac, "gpu_frag_frac", 0.0, 1.0, 0.10, "1",
     "caching-allocator reserve above the peak allocated, per byte of activations and temporaries"},
    // Checkpointed runs of our backend reserve about the checkpoints' bytes again above their
    // peak allocated (llama-2-7b at micro-batch 8 / 16 / 24: 4.3 / 8.7 / 12.9 GiB for 4 / 8 / 12
    // GiB of checkpoints; docs/peft.md): one byte per byte.
    {kCkptReserveMult, "ckpt_reserve_mult", 0.0, 3.0, 1.0, "1",
     "caching-allocator reserve above the peak allocated, per byte of checkpointed layer inputs"},
    {kActBytesMult, "act_bytes_mult", 0.2, 5.0, 1.0, "1",
     "saved activations relative to the analytic count"},
    // bf16 logits are followed by an fp32 log-softmax kept for backward (4 B)
    // and its fp32 gradient (4 B); the fp32 copy the loss takes of 16-bit logits (4 B) is
    // counted here too, and is absent for fp32 logits (MemoryFeatures::loss_copy_absent_bytes).
    {kLossExtraBytesPerLogit, "loss_extra_bytes_per_logit", 0.0, 32.0, 8.0, "B",
     "bytes per logit held at the loss beyond the logits themselves"},
    // The loss's fp32 buffers are the largest allocations of a step: freed after the loss's
    // backward, they stay in the caching allocator's pool. Where they exceed what the activations
    // and checkpoints leave, they set the reserve above the peak: qwen2.5-7b and llama-3-8b
    // (vocabularies of 152k and 128k) checkpointed on one H200 reserved 3.4-8.0 GiB above their
    // peak allocated against 1.5-4.0 GiB of checkpoints, 0.8-0.9 of their fp32 logits
    // (data/runs/h200-sxm, docs/calibration.md): about 3.5 B per logit.
    {kLossReserveBytesPerLogit, "loss_reserve_bytes_per_logit", 0.0, 16.0, 3.5, "B",
     "caching-allocator reserve above the peak allocated that the loss's freed buffers leave, per logit"},
    // Measured host high-water marks of runs without offload on the H200 host: our backend 0.8 GiB
    // on one rank and 1.2 on each of two, DeepSpeed 2.0 GiB at stage 0, FSDP2 1.7-1.9 GiB
    // (data/runs/h200-sxm, memory_bytes.host_peak_rss).
    {kHostBytesPerRank, "host_bytes_per_rank", 0.0, 64e9, 1.5e9, "B",
     "host memory of one rank process beyond its buffers (runtime, libraries)"},
    // Expandable segments (TrainConfig::gpu_expandable_segments) keep one growing address range,
    // so a freed block joins its neighbours and the free end: less of what the default allocator
    // caches above the peak allocated stays reserved, the loss's freed buffers aside
    // (memory_model.h). Measured in pairs on one H100, default then expandable, the same step
    // time (data/runs/h100-sxm/2026-12-06_expandable_{stepcast,deepspeed}_1gpu.jsonl), peak
    // reserved with expandable segments against the model at this share 0 and 1 (GiB):
    //   ours, pythia-2.8b stage 2, 8 x 2048 x GAS 2, checkpointed   55.10 against 55.89 / 56.06
    //   ours, llama-2-7b LoRA, 16 x 2048, checkpointed               35.87 against 36.86 / 41.47
    //   ours, qwen2.5-7b LoRA, 4 x 2048 x GAS 2, checkpointed        34.07 against 34.18 / 34.18
    //   DeepSpeed stage 1, pythia-2.8b, 8 x 2048 x GAS 2, ckpt       61.28 against 59.68 / 76.74
    //   DeepSpeed stage 2, pythia-2.8b, 3 x 2048 x GAS 2             73.92 against 61.49 / 82.16
    // Least squares in GiB over the spans as if linear in the share (a_i = the span, b_i = the
    // miss at 0): -sum(a b) / sum(a^2) = 279.5 / 739.5 = 0.378. The model at 0.378 (the loss's
    // buffers set llama-2-7b's floor): +1.5, +2.9, +0.4, +7.9 and -6.2 %; in sample, five plans.
    // FSDP2 keeps more (its cache is the all-gather buffers' stream-ordered reuse, not holes):
    // over its three checkpointed pairs with room on one H100
    // (2026-12-06_expandable_{cost,fsdp2_room}_fsdp2*_1gpu.jsonl), the same least squares give
    // (202.9 / 216.4 =) 0.937, data/hardware/h200-sxm.toml [engines.fsdp2]. An engine's share is
    // behaviour of its code with torch's allocator, not of the GPU: it carries to datasheet
    // profiles with the section's time coefficients (not is_memory_coef).
    {kExpandableReserveFrac, "expandable_reserve_frac", 0.0, 1.0, 0.378, "1",
     "with expandable segments, the share of the default allocator's reserve above the peak allocated that stays reserved"},
}};

const std::array<CoefInfo, kNumCoefs>& coef_table() { return kTable; }

std::optional<Coef> coef_by_name(std::string_view name) {
  for (const auto& info : kTable)
    if (info.name == name) return info.id;
  return std::nullopt;
}

CoefVector default_coefs() {
  CoefVector out{};
  for (const auto& info : kTable) out[info.id] = info.default_value;
  return out;
}

bool is_memory_coef(Coef c) {
  return c == kGpuWorkspaceBytes || c == kGpuFragFrac || c == kCkptReserveMult || c == kActBytesMult ||
         c == kLossExtraBytesPerLogit || c == kLossReserveBytesPerLogit || c == kHostBytesPerRank;
}

const std::vector<Coef>& engine_coefs() {
  static const std::vector<Coef> kEngine = {
      kBackwardSlowdownMult, kElementwiseTrafficMult, kLayerOverheadS,  kParamFetchOverheadS, kGradHookOverheadS, kParamFetchBytesPerS, kHostLayerFwdS,
      kHostLayerBwdS,        kGradCommOverlapFrac,
      kGatherOverlapFrac,    kPcieEffFrac,            kOffloadOverlapFrac, kStagedCopyBytesPerS, kHostCopyBytesPerSPerThread, kGpuOptBwEffFrac,
      kCpuCoreBytesPerSPerLane, kCpuLaneFlopsPerS,    kOptStepOverheadS,  kCpuOptStepOverheadS,
      kGpuWorkspaceBytes,    kGpuFragFrac,            kCkptReserveMult,   kActBytesMult,
      kLossExtraBytesPerLogit, kLossReserveBytesPerLogit, kHostBytesPerRank, kExpandableReserveFrac};
  return kEngine;
}

bool is_engine_coef(Coef c) {
  for (Coef e : engine_coefs())
    if (e == c) return true;
  return false;
}

}  // namespace stepcast
