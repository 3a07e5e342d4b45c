// Features: a (model, hardware, config) triple resolved into plain numbers.
// Every configuration choice (stage, offload, optimizer, precision,
// checkpointing, attention kernel) is decided here, once; the templated
// formulas in step_time.h and memory.h only do arithmetic on these numbers and
// the coefficient vector, so the same code serves the planner (double) and
// the fit (ceres::Jet).
#pragma once

#include <array>

#include "model/hardware.h"
#include "model/model_spec.h"
#include "model/train_config.h"

namespace stepcast {

// One class of matrix product of the forward pass: C(m x n) = A(m x k) B(k x n),
// executed `count` times per micro-batch. Backward runs twice its FLOPs on the
// same shapes (data and weight gradients).
struct GemmShape {
  double m = 0, n = 0, k = 0, count = 0;
};
inline constexpr int kNumGemmClasses = 5;  // qkv, attention out, MLP up, MLP down, lm_head
inline constexpr int kLmHeadGemm = 4;      // the one outside the decoder layers

struct StepFeatures {
  // --- compute, per micro-batch --------------------------------------------
  std::array<GemmShape, kNumGemmClasses> gemms{};
  double attn_fwd_flops = 0;       // score and value products as executed (causal half for flash)
  double attn_bwd_flops_mult = 0;  // backward/forward FLOPs of attention (2.5 flash, 2 math)
  double attn_uses_gemm_eff = 0;   // 1 for math attention (runs as batched GEMMs)
  // Share of the math attention's FLOPs that run in fp32 on the CUDA cores, at the fp32 peak
  // (fp32_peak_flops_per_s) with the fp32 GEMMs' efficiency: transformers' GPT-J upcasts query
  // and key, so its QK^T and their gradients (half the score and value products) are fp32.
  double attn_fp32_flops_frac = 0;
  double fp32_peak_flops_per_s = 0;
  // Flash kernels: time per FLOP at the model's head dimension relative to a head of 128
  // (attention_head_dim_rel), forward and backward.
  double attn_head_dim_rel_fwd = 1, attn_head_dim_rel_bwd = 1;
  double attn_score_bytes_fwd = 0;  // HBM traffic of the materialised scores in one forward (peers' eager path)
  double attn_score_bytes_bwd = 0;  // and in one backward
  double weight_grad_frac = 1;     // share of the forward GEMMs whose weight gradients the backward computes (PEFT: 0)
  // PEFT (LoRA adapters): the low-rank products of one micro-batch, forward (the backward runs
  // twice their FLOPs: data and weight gradients), and the memory traffic of the adapter's
  // elementwise work in the forward and in the backward (lora_traffic_bytes).
  std::array<GemmShape, 2 * kNumGemmClasses> adapter_gemms{};
  double adapter_bytes_fwd = 0, adapter_bytes_bwd = 0;
  double dequant_bytes_pass = 0;   // QLoRA: HBM bytes of dequantising every NF4 weight once
  double seq_len = 0;
  double elementwise_bytes_fwd = 0;  // analytic activation bytes, the traffic of non-GEMM ops
  double num_layers = 0;
  // A peer's model implementation (transformers): its measured host time per decoder layer,
  // forward and backward (HostSpec::transformers_layer_s), relative to the mean over the
  // profiled families; it scales the engine's fitted per-layer host time. 1 for our backend,
  // for an unprofiled family and where the host was not profiled.
  double impl_host_fwd_rel = 1, impl_host_bwd_rel = 1;
  double recompute = 0;            // 1 with full activation checkpointing
  double gas = 1;
  double peak_flops_per_s = 0;     // dense peak at the run's precision
  double gemm_peak_flops_per_s = 0;  // the peak GEMMs run against: dense peak x matmul_eff_rel_h200
  double gemm_fp32 = 0;            // 1 where the GEMMs run in fp32 on the CUDA cores (their own efficiency)
  double hbm_bytes_per_s = 0;
  // --- collectives ---------------------------------------------------------
  double grad_comm_bytes_micro = 0, grad_comm_calls_micro = 0;        // each micro-batch
  double grad_comm_bytes_boundary = 0, grad_comm_calls_boundary = 0;  // last micro-batch only
  double grad_comm_bus_factor = 0;  // nccl-tests: 2(n-1)/n all-reduce, (n-1)/n reduce-scatter
  double grad_comm_is_allreduce = 0; // 1: all-reduce (stage 0); 0: reduce-scatter
  double gather_bytes_micro = 0, gather_calls_micro = 0;    // stage-3 parameter all-gathers
  // HBM bytes per micro-batch that our backend moves outside the layers' kernels: at stages 2-3
  // each unit's gradient buffer is zeroed and its reduced shard added into the accumulator; at
  // stage 3 on one rank the "gathers" are device copies of every unit, before its forward and
  // before its backward.
  double grad_accum_bytes_micro = 0, local_gather_bytes_micro = 0;
  // HBM bytes per micro-batch (a step's mean) that FSDP2's fully_shard copies on the compute
  // stream around its collectives, on any number of ranks: the all-gathers' copy-out, the
  // gradients' copy into the fp32 reduce-scatter input (step_features.cpp).
  double fsdp_copy_bytes_fwd_micro = 0, fsdp_copy_bytes_bwd_micro = 0;
  double param_fetches_micro = 0;  // hooked parameter fetches per micro-batch (peer engines' stage 3)
  double param_fetch_bytes_micro = 0;  // parameter bytes those fetches make available per micro-batch
  double fetch_fwd_frac = 0;       // share of those fetches (and of the exposed gathers) in the forward
  double grad_hooks_micro = 0;     // hooked gradient reductions per micro-batch, one per tensor (DeepSpeed ZeRO 2-3)
  double grad_hooks_boundary = 0;  // per-tensor host work once a step, in the last backward (DeepSpeed ZeRO 1, FSDP2)
  double post_step_gather_bytes = 0, post_step_gather_calls = 0;  // stage 1/2 updated params
  double gather_bus_factor = 0;     // (n-1)/n
  double link_bytes_per_s = 0;      // slowest link of the ring, before efficiency
  double link_is_inter_node = 0;    // 1 when the ring crosses nodes
  double pcie_shared_link = 0;      // 1 when the ranks' collectives and host copies share PCIe
  double extra_latency_s = 0;       // inter-node latency added to each call
  // --- offload traffic (PCIe) ----------------------------------------------
  double d2h_bytes_boundary = 0;    // gradient shard to the host, last micro-batch only
  double h2d_bytes_step = 0;        // updated parameters back to the GPU after the step
  double param_h2d_bytes_micro = 0; // stage-3 parameter offload: uploads per micro-batch
  double param_h2d_blocking = 0;    // 1 when those uploads block the compute stream (FSDP2 on one rank)
  double grad_host_bytes_micro = 0; // gradients to and from the host on each non-boundary micro-batch (DeepSpeed)
  // Bytes copied blocking from the GPU into new pageable host tensors (torch's temporaries: DeepSpeed
  // ZeRO-3's 16-bit gradients into fp32 host buffers, FSDP2's offloaded fp32 shards), on the last
  // micro-batch and per non-boundary one.
  double staged_d2h_bytes_boundary = 0, staged_d2h_bytes_micro = 0;
  // After the optimizer step, per rank: host bytes read and written by a CPU copy_ on the rank's
  // threads, and bytes staged from pageable host memory to the GPU by one thread (DeepSpeed ZeRO-3).
  double host_convert_bytes_step = 0, pageable_h2d_bytes_step = 0;
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
  // DeepSpeed's offload with unpinned host buffers (TrainConfig::offload_pinned false): the bytes
  // each non-boundary micro-batch and the last one copy between the GPU and pageable memory, which
  // the driver stages and the issuing thread waits for (serial, nothing hides them), at
  // pageable_bytes_per_s (HostSpec).
  double pageable_bytes_micro = 0, pageable_bytes_boundary = 0, pageable_bytes_per_s = 0;
  // Gradient sums taken on the host by the thread that issues the backward (FSDP2's CPU offload
  // reducing every micro-batch): bytes read and written per non-boundary micro-batch and on the
  // last one, on the rank's CPU threads; serial like the blocking copies they follow.
  double host_accum_bytes_micro = 0, host_accum_bytes_boundary = 0;
  // --- optimizer -----------------------------------------------------------
  double opt_on_cpu = 0;
  double opt_pipelined = 1;         // offload: 1 pipelined over units during the backward, 0 serial after it
  double opt_overlap_fwd = 0;       // offload: 1 when the tail also overlaps the next step's forward
  double opt_uploads_in_bwd = 1;    // pipelined offload: 1 when units go up during the backward, 0 after it
  double opt_pipeline_units = 1;    // offload: units the CPU optimizer pipelines over (layers + 2)
  double opt_params_rank = 0;       // parameters this rank updates
  double opt_bytes_per_param = 0;   // memory traffic of one update
  double opt_flops_per_param = 0;
  double ranks_per_node = 1;        // ranks sharing one host's CPU optimizer
  double cpu_cores_node = 0, cpu_simd_lanes = 0, dram_bytes_per_s = 0;
  // --- accounting ----------------------------------------------------------
  double world_size = 1;
  double tokens_per_micro = 0;      // micro-batch x sequence
  double model_flops_per_token = 0; // 6 N + 6 L d_attn s (MFU numerator, no recompute)
};

// DeepSpeed ZeRO-3's stage3_max_live_parameters as our DeepSpeed config writes it
// (planner/deepspeed_config.cpp): the most fetched parameters it keeps on a GPU.
inline constexpr double kDeepSpeedMaxLiveParams = 1e9;

struct MemoryFeatures {
  // GPU, per rank (bytes)
  double gpu_params_bytes = 0;
  double gpu_grads_bytes = 0;
  double gpu_opt_states_bytes = 0;     // fp32 master weights + optimizer moments on the GPU
  double gpu_buffers_bytes = 0;        // communication buckets, stage-3 gather/prefetch buffers
  // Allocated by the optimizer step alone, once the backward has freed its activations (the
  // step's fp32 gradients): the peak allocated is the larger of the backward's and the step's; on
  // a card with room the step's buffers take segments of their own beside the backward's cached
  // ones (memory_model.h).
  double gpu_step_bytes = 0;
  // Of those, what a card without room takes from the backward's freed segments: DeepSpeed's
  // step buffers are a few whole-partition tensors, made after the backward's cache is freeable;
  // FSDP2's sharded gradients come unit by unit while its backward's segments are still in use.
  double gpu_step_reclaimable_bytes = 0;
  // Held through the backward and freed before the step (FSDP2's unsharded gradient accumulators,
  // which the last micro-batch's reduce-scatter turns into the step's sharded gradients).
  double gpu_backward_bytes = 0;
  // Cache the engine's buffer pattern leaves above the peak allocated, measured per parameter
  // (the segments a 16-bit gradient buffer leaves that neither the activations nor the step reuse).
  double gpu_engine_cache_bytes = 0;
  // 1 where the caching allocator grows expandable segments (TrainConfig::gpu_expandable_segments).
  double expandable_segments = 0;
  double act_bytes = 0;                // analytic saved activations of one micro-batch at peak
                                       // (checkpointed: the layer inputs and the head's input)
  double ckpt_bytes = 0;               // checkpointed layer inputs (layers x tokens x hidden)
  double recompute_layer_bytes = 0;    // checkpointed: one recomputed layer's saved activations
  double logits_elems = 0;             // b * s * vocab
  double logit_bytes = 0;              // bytes of one logit element (2 or 4)
  double loss_copy_absent_bytes = 0;   // fp32 logits: the loss's fp32 copy is the logits (4 B saved)
  // host, per rank (bytes)
  double host_opt_states_bytes = 0;
  double host_grads_bytes = 0;         // host gradient accumulators (none: shards accumulate on the GPU)
  double host_params_bytes = 0;        // stage-3 parameter offload
  double host_pinned_buffers_bytes = 0;
  double host_placement_bytes = 0;     // held while the engine places the model, before its buffers
  double ranks_per_node = 1;
};

struct Features {
  StepFeatures step;
  MemoryFeatures memory;
};

// Bytes per parameter of the optimizer state kept per updated parameter
// (fp32 master weights when the working copy is 16-bit, plus the moments).
// The fp32 master copy of 16-bit weights, per parameter: 4 B, none for fp32 training.
double master_weight_bytes_per_param(Precision precision);
double optimizer_state_bytes_per_param(OptimizerKind opt, Precision precision);

// Memory traffic of one optimizer update per parameter (bytes): on the CPU the
// gradient is read in the working precision and the updated parameter written
// over it; 28 B for bf16 AdamW, 14 B for 8-bit with split master weights, 16 B without.
double optimizer_traffic_bytes(OptimizerKind opt, Precision precision, bool on_cpu, bool split_master = true);

// HBM bytes per parameter of DeepSpeed's optimizer step on the GPU (no offload), by ZeRO stage
// and precision, counted from its source (step_features.cpp).
double deepspeed_gpu_step_bytes(int zero_stage, Precision precision);

// Whether the update keeps split master weights: 8-bit AdamW on the CPU in bf16, unless
// the configuration turns them off (TrainConfig::split_master; backend/cpu_adamw.h).
bool splits_master(OptimizerKind opt, Precision precision, bool on_cpu, bool split_master = true);

// FSDP2 with CPU offload on a shard group of one rank: fully_shard uploads each unit's host shard
// with a blocking copy on the compute stream (StepFeatures::param_h2d_blocking, model/step_features.cpp).
bool fsdp2_uploads_block(const TrainConfig& c);

// Arithmetic of one update per parameter (FLOPs).
double optimizer_flops(OptimizerKind opt);

// Forward FLOPs of causal attention of one layer: QK^T and PV are 2 b s^2 d_attn
// each for the full square; flash kernels skip the masked half, the math path
// does not.
// The forward GEMM classes of a model for `tokens` tokens per micro-batch: qkv,
// attention out, MLP up (gate and up together when gated), MLP down, lm_head.
std::array<GemmShape, kNumGemmClasses> gemm_classes(const ModelSpec& spec, double tokens);

inline constexpr double kFlashAttnBwdFlopsMult = 2.5;  // FlashAttention-2 (Dao 2023): backward = 2.5x forward
double causal_attention_fwd_flops(double batch, double seq_len, double q_dim, AttentionKind attention);

// Parameters held in tensors below bitsandbytes' min_8bit_size (4096
// elements): they keep 32-bit states under 8-bit AdamW.
int64_t small_tensor_params(const ModelSpec& spec, int64_t min_8bit_size = 4096);

// Analytic activation elements saved per token per layer (see features.cpp).
double activation_elems_per_token_per_layer(const ModelSpec& spec, AttentionKind attention,
                                            double seq_len);

// PEFT (TrainConfig::peft): the trainable adapter parameters, and the frozen weights that
// QLoRA stores in NF4 (the layers' projection weights; embeddings, head, norms and biases stay
// 16-bit), both as the backend lays them out (backend/engine/layout.h).
double lora_params(const ModelSpec& spec, const TrainConfig& config);
double nf4_params(const ModelSpec& spec, const TrainConfig& config);
// Bytes of the frozen base weights: 16-bit (or fp32), QLoRA's NF4 codes with one fp32 scale per
// 64 values (0.5625 B per weight).
double frozen_weight_bytes(const ModelSpec& spec, const TrainConfig& config);
inline constexpr double kNf4BytesPerParam = 0.5 + 4.0 / 64.0;

// Host bytes of converting fp32 partitions into 16-bit (or fp32) weights of `weight_bytes` a
// parameter on the CPU: 4 bytes read and the weight written, per parameter (DeepSpeed ZeRO-3's
// copy after its CPU step; step_time.h's host_copy_time_s times it).
inline constexpr double host_convert_bytes(double params, double weight_bytes) { return params * (4.0 + weight_bytes); }
// Model FLOPs per token (MFU's numerator): 6 N + 6 L d_attn s for full fine-tuning; with PEFT
// the frozen weights have no weight gradient (4 N) and the adapters train in full (6 N_lora).
double model_flops_per_token(const ModelSpec& spec, const TrainConfig& config);

// Node-level overrides of the profile (planner flags --cpu-cores, --cpu-mem-gib, --gpu-mem-gib).
struct ResourceLimits {
  double gpu_memory_bytes = 0;       // 0 = the profile's
  double host_memory_bytes_node = 0; // 0 = the profile's per-GPU figure x GPUs per node
  double cpu_cores_node = 0;         // 0 = the profile's per-GPU figure x GPUs per node
  // OpenMP threads of each rank's CPU optimizer for the peer engines; 0 = torchrun's default
  // (one per rank when a node runs several ranks; all cores with one). DeepSpeed's own launcher
  // leaves every rank all the node's cores.
  double cpu_threads_per_rank = 0;
};

Features make_features(const ModelSpec& spec, const HardwareProfile& hw, const TrainConfig& config,
                       const ResourceLimits& limits = {});

// The CPU cores of one node: the limit when given, else the profile's cores per GPU times the
// node's GPUs (not the threads a peer's launch leaves its optimizer: make_features).
double node_cpu_cores(const HardwareProfile& hw, const TrainConfig& config, const ResourceLimits& limits);

// The OpenMP threads of each rank's CPU optimizer in a peer engine (DeepSpeed, FSDP2): the
// launch's count where it sets one (limits.cpu_threads_per_rank), else torchrun's default, one
// per rank when a node runs several and all of the node's cores with one.
double peer_cpu_optimizer_threads(const TrainConfig& config, const ResourceLimits& limits, double node_cores);

// Reduction bucket size in elements: Hugging Face's "auto" value h^2 for
// DeepSpeed's reduce_bucket_size, which the DeepSpeed config also writes.
double bucket_elems(const ModelSpec& spec);

}  // namespace stepcast
