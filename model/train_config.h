// TrainConfig: one training configuration as the user chooses it (the flags
// of `planner explain` and `train`). Enums live here; step_features.h turns a
// config into plain numbers before any templated formula runs.
#pragma once

#include <cstdint>
#include <string>

#include "model/hardware.h"

namespace stepcast {

enum class OffloadDevice { kNone, kCpu };
enum class OptimizerKind { kAdamW, kAdamW8bit };
enum class AttentionKind { kFlash, kMath };  // fused SDPA kernels, or softmax(QK^T)V materialised
enum class CpuSimd { kAuto, kScalar, kAvx2, kAvx512 };  // the CPU optimizer's instruction set (kAuto: the widest)
// The training engine that runs the configuration: Stepcast's backend, DeepSpeed's ZeRO
// (v0.14, with a Hugging Face transformers model) or PyTorch FSDP2 (fully_shard per decoder
// layer, with the same transformers model). The engine decides the order of copies,
// collectives and optimizer work (step_features.cpp) and selects the profile's engine
// coefficients ([engines.NAME], hardware.h).
enum class Engine { kStepcast, kDeepSpeed, kFsdp2 };
// Parameter-efficient fine-tuning (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
// Language Models"; Dettmers et al. 2023, "QLoRA"): the base weights are frozen (kQlora:
// stored as 4-bit NormalFloat, dequantised on the fly) and each targeted projection W gains
// a trainable low-rank update (alpha / r) B A, B (out x r) starting at zero, A (r x in).
// Only the adapters have gradients, optimizer states and ZeRO-partitioned updates.
enum class PeftKind { kNone, kLora, kQlora };
// Which projections of each decoder layer carry adapters: the attention's (q, k, v and the
// output projection), the MLP's (gate/up and down), or both.
enum class LoraTargets { kAttention, kMlp, kAll };

struct TrainConfig {
  int zero_stage = 0;  // 0..3
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_params = OffloadDevice::kNone;  // stage 3 only
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  Precision precision = Precision::kBf16;
  int64_t micro_batch = 1;
  int64_t gas = 1;
  int64_t seq_len = 2048;
  int gpus_per_node = 1;
  int nodes = 1;
  bool activation_checkpointing = false;
  AttentionKind attention = AttentionKind::kFlash;
  // CPU optimizer offload: pipelined (the CPU updates each unit as soon as its
  // gradient shard lands, during the backward; Stepcast's backend) or serial
  // (after the whole backward, then the uploads: how DeepSpeed's CPU Adam runs).
  bool offload_pipeline = true;
  // Pipelined offload only: the step returns without waiting for the last CPU
  // updates; the CPU finishes them in forward order and each unit goes up just
  // before the next step's forward needs it ("--offload-pipeline full").
  bool offload_overlap_forward = false;
  // Pipelined offload without the overlap: our backend copies each unit's updated parameters
  // up as soon as its CPU update is done, during the backward (ZeroEngine::copy_up_ready).
  // Records without the key come from an engine that uploaded only after the backward had been
  // issued (false); the cost model reads it (step_time.h), so those records still describe
  // what ran. Not a choice: the backend runs only the current order.
  bool offload_uploads_in_backward = true;
  // 8-bit CPU offload in bf16: the fp32 master weights are held split, as their bf16 upper
  // half (the upload copy) and a 16-bit remainder (backend/cpu_adamw.h), moving 14 instead
  // of 16 bytes per update and holding 2 bytes less host memory per parameter with parameter
  // offload. The cost model reads it (step_features.cpp).
  bool split_master = true;
  // The backend's CPU optimizer: its instruction set, and whether its threads are bound to
  // cores (backend/cpu_cores.h). The cost model reads neither (its CPU rate is calibrated
  // with the defaults); they are in the configuration key so that runs with other settings
  // are not grouped with the defaults'.
  CpuSimd cpu_simd = CpuSimd::kAuto;
  bool cpu_bind = true;
  Engine engine = Engine::kStepcast;
  // FSDP2 with GAS > 1: reduce-scatter the gradients after every micro-batch (true) or only after
  // the last (false, set_requires_gradient_sync(False) before it, as Accelerate accumulates by
  // default: accelerate/utils/dataclasses.py, GradientAccumulationPlugin.sync_each_batch = False),
  // which holds every parameter's whole gradient in fp32 until then (step_features.cpp).
  // DeepSpeed's stage and the backend decide this themselves.
  bool grad_sync_each_micro = false;
  PeftKind peft = PeftKind::kNone;
  int64_t lora_rank = 16;
  LoraTargets lora_targets = LoraTargets::kAll;
  // The adapters' scale alpha / r and the dropout on their input: training behaviour that
  // the cost model does not read (the dropout's mask is one elementwise pass per adapter).
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  // The CUDA caching allocator's segments: one cudaMalloc per segment (false, torch's default) or
  // expandable segments that grow by mapping pages into one reserved address range
  // (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; torch's c10/cuda/CUDACachingAllocator.cpp,
  // ExpandableSegment). A freed block then joins its neighbours and the range's free end, so the
  // cache a step leaves above its live bytes is smaller (memory_model.h). Every engine here runs
  // torch's allocator: the backend sets it with `train --gpu-allocator`, the peers' launch with
  // the variable.
  bool gpu_expandable_segments = false;
  // DeepSpeed's CPU offload with its host buffers page-locked (true: "pin_memory": true, what the
  // planner's configs write) or in pageable memory (false: DeepSpeed's own default,
  // deepspeed/runtime/zero/offload_config.py, which the founding report's ds_config.json kept).
  // Copies between the GPU and pageable memory are staged by the CUDA driver through its own
  // pinned buffers and block the issuing thread (step_features.cpp). The backend always pins;
  // FSDP2's CPUOffloadPolicy pins by default and is run so.
  bool offload_pinned = true;

  bool peft_enabled() const { return peft != PeftKind::kNone; }
  int world_size() const { return gpus_per_node * nodes; }
  int64_t global_batch() const { return micro_batch * gas * world_size(); }
};

const char* offload_name(OffloadDevice d);
const char* optimizer_name(OptimizerKind o);
const char* attention_name(AttentionKind a);
const char* cpu_simd_name(CpuSimd s);
// "default" or "expandable" (TrainConfig::gpu_expandable_segments).
const char* gpu_allocator_name(const TrainConfig& c);
bool parse_gpu_allocator(const std::string& text, const std::string& what);
const char* engine_name(Engine e);
Engine parse_engine(const std::string& text, const std::string& what);
const char* peft_name(PeftKind p);
PeftKind parse_peft(const std::string& text, const std::string& what);
const char* lora_targets_name(LoraTargets t);
// Whether LoRA with `targets` adapts a projection (attention, MLP, or all).
inline bool lora_adapts(bool attention_projection, LoraTargets targets) {
  return attention_projection ? targets != LoraTargets::kMlp : targets != LoraTargets::kAttention;
}
LoraTargets parse_lora_targets(const std::string& text, const std::string& what);
CpuSimd parse_cpu_simd(const std::string& text, const std::string& what);
// "on" / "off" settings of flags and keys; `what` names the flag or key in the error.
bool parse_on_off(const std::string& text, const std::string& what);
OffloadDevice parse_offload(const std::string& text, const std::string& what);
OptimizerKind parse_optimizer(const std::string& text, const std::string& what);
AttentionKind parse_attention(const std::string& text, const std::string& what);
// The CPU offload's order as one word: off (serial), on (pipelined over the backward),
// full (also overlapping the next forward). parse sets offload_pipeline and
// offload_overlap_forward; `what` names the flag or key in the error.
const char* offload_pipeline_name(const TrainConfig& c);
void parse_offload_pipeline(const std::string& text, const std::string& what, TrainConfig& c);

// Throws InputError for combinations that make no sense (stage 5, parameter
// offload below stage 3, optimizer offload at stage 0, non-positive sizes).
// What each checked field is called where the configuration came from: command-line
// flags (the default) or the keys of a JSON object (a plan file, a run record).
struct ConfigFieldNames {
  std::string stage = "--stage", offload_optimizer = "--offload-optimizer", offload_params = "--offload-params",
              offload_pipeline = "--offload-pipeline", micro_batch = "--micro-batch", gas = "--gas", seq = "--seq",
              gpus = "--gpus", nodes = "--nodes", engine = "--engine", peft = "--peft", lora_rank = "--lora-rank",
              lora_alpha = "--lora-alpha", lora_dropout = "--lora-dropout",
              offload_order = "--offload-pipeline",  // whether the CPU optimizer is pipelined
              grad_sync = "--grad-sync", precision = "--precision", offload_pin_memory = "--offload-pin-memory";
};
// `where` + ".zero_stage" and so on (train_config_json.h's keys).
ConfigFieldNames json_config_names(const std::string& where);

// Throws InputError naming the field (as `names` calls it), its value and the valid range;
// also for what the configuration's engine cannot run: DeepSpeed offloads in series after the
// backward (offload pipeline off); FSDP2 runs stage 2 or 3, torch's AdamW, and offloads
// parameters together with the optimizer (CPUOffloadPolicy).
void validate_config(const TrainConfig& config, const ConfigFieldNames& names = {});

// The part of validate_config that holds whatever the plan: what the configuration's engine
// cannot run for this job (the Stepcast backend trains bf16 or fp32; PEFT runs on the Stepcast
// backend only). The planner checks it before it searches plans.
void validate_job(const TrainConfig& config, const ConfigFieldNames& names = {});

// "none", "cpu", or "cpu+params" with parameter offload: the offload regime as reports group it.
std::string offload_label(const TrainConfig& config);

// Whether the configuration offloads anything (optimizer or parameters) to the host.
inline bool offloads(const TrainConfig& c) {
  return c.offload_optimizer != OffloadDevice::kNone || c.offload_params != OffloadDevice::kNone;
}

// Whether offload_uploads_in_backward applies: our backend's pipelined CPU offload without the
// overlap of the next forward.
inline bool pipelined_offload_uploads(const TrainConfig& c) {
  return c.offload_optimizer == OffloadDevice::kCpu && c.offload_pipeline && !c.offload_overlap_forward &&
         c.engine == Engine::kStepcast;
}

// "stage 3 + CPU optimizer offload + 8-bit AdamW": the family a config
// belongs to, without micro-batch, GAS and checkpointing.
std::string family_name(const TrainConfig& config);

}  // namespace stepcast
