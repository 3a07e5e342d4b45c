#include "planner/deepspeed_config.h"

#include <sstream>

#include "common/errors.h"

#include "model/step_features.h"

namespace stepcast {

LauncherConfig deepspeed_config(const ModelSpec& model, const TrainConfig& c) {
  LauncherConfig out;
  nlohmann::json& ds = out.deepspeed;
  ds["train_micro_batch_size_per_gpu"] = c.micro_batch;
  ds["gradient_accumulation_steps"] = c.gas;
  ds["train_batch_size"] = c.micro_batch * c.gas * c.world_size();
  ds["gradient_clipping"] = 1.0;
  ds["steps_per_print"] = 10;
  ds["wall_clock_breakdown"] = false;
  ds["bf16"] = {{"enabled", c.precision == Precision::kBf16}};
  if (c.precision == Precision::kFp16) {
    ds["fp16"] = {{"enabled", true},
                  {"loss_scale", 0},
                  {"initial_scale_power", 16},
                  {"loss_scale_window", 1000},
                  {"hysteresis", 2},
                  {"min_loss_scale", 1}};
  } else {
    ds["fp16"] = {{"enabled", false}};
  }
  const bool offload = c.offload_optimizer == OffloadDevice::kCpu;
  if (c.optimizer == OptimizerKind::kAdamW || offload) {
    ds["optimizer"] = {{"type", "AdamW"},
                       {"params", {{"lr", 2e-5}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.0}}}};
  }
  if (c.optimizer == OptimizerKind::kAdamW8bit) {
    if (offload) {
      out.notes.push_back(
          "8-bit AdamW with offloaded states is a Stepcast backend feature: DeepSpeed runs its fp32 CPU "
          "Adam for this config (expect the fp32 optimizer's time, not the plan's)");
    } else {
      out.notes.push_back(
          "8-bit AdamW: no \"optimizer\" block; pass bitsandbytes.optim.AdamW8bit(model.parameters()) "
          "to deepspeed.initialize(optimizer=...) (HF Trainer: optim=\"adamw_bnb_8bit\")");
    }
  }
  if (c.activation_checkpointing)
    out.notes.push_back("activation checkpointing: call model.gradient_checkpointing_enable() "
                        "(HF Trainer: gradient_checkpointing=True)");
  if (c.peft_enabled()) {
    // DeepSpeed's JSON has no LoRA keys: the adapters come from Hugging Face PEFT in the script
    // (LoraConfig and get_peft_model, huggingface.co/docs/peft), QLoRA's NF4 base from
    // transformers' BitsAndBytesConfig (load_in_4bit, bnb_4bit_quant_type "nf4").
    std::string modules;
    if (model.model_type == "gpt_neox") {
      modules = c.lora_targets == LoraTargets::kAttention ? "\"query_key_value\", \"dense\""
                : c.lora_targets == LoraTargets::kMlp   ? "\"dense_h_to_4h\", \"dense_4h_to_h\""
                                                          : "\"query_key_value\", \"dense\", \"dense_h_to_4h\", \"dense_4h_to_h\"";
    } else if (model.model_type == "gptj") {
      modules = c.lora_targets == LoraTargets::kAttention ? "\"q_proj\", \"k_proj\", \"v_proj\", \"out_proj\""
                : c.lora_targets == LoraTargets::kMlp   ? "\"fc_in\", \"fc_out\""
                                                          : "\"q_proj\", \"k_proj\", \"v_proj\", \"out_proj\", \"fc_in\", \"fc_out\"";
    } else {
      modules = c.lora_targets == LoraTargets::kAttention ? "\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\""
                : c.lora_targets == LoraTargets::kMlp   ? "\"gate_proj\", \"up_proj\", \"down_proj\""
                                                          : "\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", "
                                                            "\"up_proj\", \"down_proj\"";
    }
    std::ostringstream note;
    note << "LoRA is not a DeepSpeed setting: wrap the model in the script with peft.get_peft_model(model, "
         << "LoraConfig(r=" << c.lora_rank << ", lora_alpha=" << c.lora_alpha << ", lora_dropout=" << c.lora_dropout
         << ", target_modules=[" << modules << "]))";
    if (c.peft == PeftKind::kQlora)
      note << ", loading the base with quantization_config=BitsAndBytesConfig(load_in_4bit=True, "
              "bnb_4bit_quant_type=\"nf4\", bnb_4bit_compute_dtype=torch.bfloat16)";
    note << "; the plan's speed and memory are the Stepcast backend's (train --plan runs it)";
    out.notes.push_back(note.str());
  }

  nlohmann::json zero = {{"stage", c.zero_stage}};
  if (c.zero_stage > 0) {
    // Hugging Face's "auto" bucket sizes, written out (transformers, integrations/deepspeed.py:
    // reduce_bucket_size h^2, stage3_prefetch_bucket_size 0.9 h^2, stage3_param_persistence_threshold 10 h).
    const double h = static_cast<double>(model.hidden_size);
    const auto bucket = static_cast<int64_t>(bucket_elems(model));
    zero["overlap_comm"] = true;
    zero["contiguous_gradients"] = true;
    zero["reduce_scatter"] = true;
    zero["reduce_bucket_size"] = bucket;
    zero["offload_optimizer"] = {{"device", offload_name(c.offload_optimizer)}, {"pin_memory", c.offload_pinned}};
    // DeepSpeed's own default is pin_memory false (deepspeed/runtime/zero/offload_config.py): its
    // offload copies then run from pageable host memory. Measured on one H100 with ZeRO-2,
    // pythia-2.8b at 4 x 2048, GAS 2: 2.02 s a step pinned, 4.07 s not
    // (data/runs/h100-sxm/2026-12-06_unpinned_offload_*_1gpu.jsonl, docs/diagnose.md). The key is
    // written either way, so the config runs as the plan was predicted.
    if (c.offload_optimizer == OffloadDevice::kCpu)
      out.notes.push_back(c.offload_pinned
                              ? "offload buffers pinned (\"pin_memory\": true): DeepSpeed's default, false, ran the "
                                "same ZeRO-2 offload plan 2.0x slower on one H100 (its copies from pageable memory)"
                              : "offload buffers unpinned (\"pin_memory\": false, DeepSpeed's default, as asked): "
                                "--offload-pin-memory on predicts the faster pinned plan");
    if (c.zero_stage <= 2) {
      zero["allgather_partitions"] = true;
      zero["allgather_bucket_size"] = bucket;
    } else {
      zero["stage3_prefetch_bucket_size"] = static_cast<int64_t>(0.9 * h * h);
      zero["stage3_param_persistence_threshold"] = static_cast<int64_t>(10 * h);
      zero["stage3_max_live_parameters"] = static_cast<int64_t>(kDeepSpeedMaxLiveParams);
      zero["stage3_max_reuse_distance"] = static_cast<int64_t>(1e9);
      zero["stage3_gather_16bit_weights_on_model_save"] = true;
      zero["offload_param"] = {{"device", offload_name(c.offload_params)}, {"pin_memory", c.offload_pinned}};
    }
  }
  ds["zero_optimization"] = zero;
  return out;
}

namespace {

// The keys every Accelerate config of a plan ends with: one machine of the plan's processes.
std::string accelerate_machine_keys(const TrainConfig& c) {
  return "machine_rank: 0\nmain_training_function: main\nnum_machines: " + std::to_string(c.nodes) +
         "\nnum_processes: " + std::to_string(c.world_size()) +
         "\nrdzv_backend: static\nsame_network: true\nuse_cpu: false\n";
}

}  // namespace

std::string accelerate_yaml(const TrainConfig& c, const std::string& deepspeed_json_path) {
  std::ostringstream y;
  y << "compute_environment: LOCAL_MACHINE\n"
    << "distributed_type: DEEPSPEED\n"
    << "deepspeed_config:\n"
    << "  deepspeed_config_file: " << deepspeed_json_path << "\n"
    << "  zero3_init_flag: " << (c.zero_stage == 3 ? "true" : "false") << "\n"
    << accelerate_machine_keys(c);
  return y.str();
}

std::string accelerate_fsdp_yaml(const ModelSpec& model, const TrainConfig& c) {
  if (c.engine != Engine::kFsdp2)
    throw InputError(std::string("--fsdp-config writes FSDP2 plans: add --engine fsdp2 (the plan's engine is ") +
                     engine_name(c.engine) + ")");
  // transformers' decoder-layer classes (models/<type>/modeling_<type>.py).
  static const std::pair<const char*, const char*> kLayer[] = {
      {"llama", "LlamaDecoderLayer"}, {"mistral", "MistralDecoderLayer"}, {"qwen2", "Qwen2DecoderLayer"},
      {"gpt_neox", "GPTNeoXLayer"},   {"gptj", "GPTJBlock"},              {"gpt2", "GPT2Block"},
      {"opt", "OPTDecoderLayer"}, {"mpt", "MPTBlock"}};
  std::string layer;
  for (const auto& [type, cls] : kLayer)
    if (model.model_type == type) layer = cls;
  if (layer.empty())
    throw InputError(model.name + ": model_type \"" + model.model_type +
                     "\" has no known transformers decoder-layer class for --fsdp-config");
  const bool offload = c.offload_params == OffloadDevice::kCpu;
  std::ostringstream y;
  y << "compute_environment: LOCAL_MACHINE\n"
    << "distributed_type: FSDP\n"
    << "fsdp_config:\n"
    << "  fsdp_version: 2\n"
    << "  fsdp_reshard_after_forward: " << (c.zero_stage == 3 ? "true" : "false") << "\n"
    << "  fsdp_offload_params: " << (offload ? "true" : "false") << "\n"
    << "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
    << "  fsdp_transformer_layer_cls_to_wrap: " << layer << "\n"
    << "  fsdp_activation_checkpointing: " << (c.activation_checkpointing ? "true" : "false") << "\n"
    << "  fsdp_cpu_ram_efficient_loading: true\n"
    << "  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
    << "mixed_precision: " << (c.precision == Precision::kFp32 ? "no" : precision_name(c.precision)) << "\n"
    << accelerate_machine_keys(c);
  return y.str();
}

}  // namespace stepcast
