#include "planner/options.h"

#include <cstdio>
#include <sstream>
#include <type_traits>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/units.h"
#include "model/model_spec.h"
#include "planner/deepspeed_config_in.h"

namespace stepcast {

void add_common(CLI::App* app, CommonOptions& o) {
  app->add_option("--peft", o.peft,
                  "none | lora | qlora: full fine-tuning, or low-rank adapters on frozen 16-bit (lora) or 4-bit NF4 "
                  "(qlora) base weights; recommend also takes auto (all three side by side)")
      ->capture_default_str();
  app->add_option("--lora-rank", o.lora_rank, "LoRA rank r")->capture_default_str();
  app->add_option("--lora-targets", o.lora_targets, "attention | mlp | all: the projections with adapters")
      ->capture_default_str();
  app->add_option("--lora-alpha", o.lora_alpha, "LoRA alpha (carried into the plan for train)")->capture_default_str();
  app->add_option("--lora-dropout", o.lora_dropout, "LoRA dropout (carried into the plan for train)")
      ->capture_default_str();
  app->add_option("--model", o.model,
                  "catalog name or alias (see `planner models`), a .toml card, a Hugging Face "
                  "config.json or a folder holding one")
      ->required();
  app->add_option("--gpus", o.gpus, "GPUs per node (data-parallel ranks per node)")->capture_default_str();
  app->add_option("--nodes", o.nodes, "nodes")->capture_default_str();
  app->add_option("--hardware", o.hardware, "hardware profile name or .toml path (see `planner hardware`)")
      ->capture_default_str();
  app->add_option("--seq", o.seq, "sequence length in tokens")->capture_default_str();
  app->add_option("--precision", o.precision, "fp32 | bf16 | fp16 (bf16/fp16: mixed precision with fp32 master weights)")
      ->capture_default_str();
  app->add_option("--attention", o.attention,
                  "auto | flash (fused SDPA kernels) | math (materialised softmax); auto: flash, or math where "
                  "DeepSpeed/FSDP2 run a transformers model without SDPA (GPT-J)")
      ->capture_default_str();
  app->add_option("--gpu-allocator", o.gpu_allocator,
                  "default | expandable: torch's CUDA caching allocator as the job runs it (expandable: "
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, `train --gpu-allocator expandable`), "
                  "which caches less above the live bytes")
      ->capture_default_str();
  app->add_option("--gpu-mem-gib", o.gpu_mem_gib, "usable memory per GPU in GiB (default: the profile's)");
  app->add_option("--cpu-mem-gib", o.cpu_mem_gib, "host memory per node in GiB (default: profile's per-GPU figure x GPUs)");
  app->add_option("--cpu-cores", o.cpu_cores, "CPU cores per node for the CPU optimizer (default: profile's per-GPU figure x GPUs)");
  app->add_option("--cpu-threads-per-rank", o.cpu_threads_per_rank,
                  "DeepSpeed and FSDP2 with CPU offload: OpenMP threads of each rank's CPU optimizer (OMP_NUM_THREADS, "
                  "which --k8s-manifest sets; default: torchrun's, one per rank when a node runs several)");
  app->add_option("--train-tokens", o.train_tokens, "tokens to train on: adds training time and cost");
  app->add_flag("--json", o.json, "print one JSON object instead of tables");
  app->add_option("--deepspeed-config", o.deepspeed_config, "write a DeepSpeed JSON for the (top) plan to FILE");
  app->add_option("--accelerate-config", o.accelerate_config,
                  "write an Accelerate YAML for the (top) plan to FILE (needs --deepspeed-config)");
  app->add_option("--fsdp-config", o.fsdp_config,
                  "write an Accelerate YAML (FSDP2) for the (top) plan to FILE (needs --engine fsdp2); the script "
                  "trains with accelerate's prepare(), batch sizes as the plan says");
  app->add_option("--data-dir", o.data_dir, "folder with models/ and hardware/ (default: the build's data/)");
  app->add_option("--speed", o.speeds,
                  "RESOURCE=X: this machine's RESOURCE runs at X times the profile's speed, as `planner diagnose` "
                  "finds it from a measured run (gpu, cpu_optimizer, pcie, intra_node_link, inter_node_link, "
                  "host_issue); repeatable");
}

ResourceSpeeds speeds_of(const CommonOptions& o) {
  ResourceSpeeds out;
  for (const std::string& item : o.speeds) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    int found = -1;
    for (int i = 0; i < kNumResources; ++i)
      if (name == resource_key(static_cast<Resource>(i))) found = i;
    if (eq == std::string::npos || found < 0)
      throw InputError("--speed \"" + item + "\" is not RESOURCE=X (resources: gpu, cpu_optimizer, pcie, "
                       "intra_node_link, inter_node_link, host_issue)");
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(item.substr(eq + 1), &used);
      if (used != item.size() - eq - 1) v = -1;
    } catch (const std::exception&) {
      v = -1;
    }
    if (!(v >= 1.0 / 64.0 && v <= 64.0))
      throw InputError("--speed \"" + item + "\": the factor must be a number in [1/64, 64]");
    out.speed[found] = v;
  }
  return out;
}

bool has_speeds(const CommonOptions& o) { return !o.speeds.empty(); }

ScaledMachine machine_of(const CommonOptions& o, const HardwareProfile& hw, const TrainConfig& config) {
  if (!has_speeds(o)) return {hw, limits_of(o)};
  const HardwareProfile hw_engine = config.engine == Engine::kStepcast ? hw : for_engine(hw, engine_name(config.engine));
  return scale_machine(hw_engine, config, limits_of(o), speeds_of(o));
}

std::string speeds_note(const CommonOptions& o) {
  if (!has_speeds(o)) return "";
  const ResourceSpeeds s = speeds_of(o);
  std::string out = "machine speeds relative to the profile (--speed):";
  for (int i = 0; i < kNumResources; ++i)
    if (s.speed[i] != 1.0) {
      char buf[80];
      std::snprintf(buf, sizeof buf, " %s x%.3g", resource_key(static_cast<Resource>(i)), s.speed[i]);
      out += buf;
    }
  return out;
}

std::filesystem::path data_dir(const CommonOptions& o) { return resolve_data_dir(o.data_dir); }

void check_range(const char* flag, double v, double lo, double hi, bool allow_zero) {
  if (allow_zero && v == 0) return;
  if (!(v >= lo && v <= hi)) {
    std::ostringstream msg;
    msg << flag << " " << v << " is out of range [" << lo << ", " << hi << "]" << (allow_zero ? " (or omit it)" : "");
    throw InputError(msg.str());
  }
}

namespace {

AttentionKind attention_for(const CommonOptions& o, const ModelSpec& model, Engine engine) {
  const bool eager_only = engine != Engine::kStepcast && !transformers_impl(model).has_sdpa;
  if (o.attention == "auto") return eager_only ? AttentionKind::kMath : AttentionKind::kFlash;
  const AttentionKind a = parse_attention(o.attention, "--attention");
  if (a == AttentionKind::kFlash && eager_only)
    throw InputError("--attention flash: transformers has no SDPA attention for " + model.name + " (model_type " +
                     model.model_type + "); " + engine_name(engine) + " runs it with math attention (--attention math or auto)");
  return a;
}

// The peers run transformers' implementation, whose fixed position table (GPT-J) bounds the
// sequence (transformers_impl in model/model_spec.h).
void check_position_table(const ModelSpec& model, Engine engine, int64_t seq) {
  const int64_t rows = transformers_impl(model).position_table_rows;
  if (engine == Engine::kStepcast || rows <= 0) return;
  if (seq > rows)
    throw InputError("--seq " + std::to_string(seq) + " exceeds " + model.name + "'s max_position_embeddings " +
                     std::to_string(rows) + ": transformers' " + model.model_type + ", which " + engine_name(engine) +
                     " runs, has a position table of that many rows");
}

}  // namespace

TrainConfig base_config(const CommonOptions& o, const ModelSpec& model, Engine engine) {
  if (o.gpus < 1) throw InputError("--gpus " + std::to_string(o.gpus) + " must be at least 1");
  if (o.nodes < 1) throw InputError("--nodes " + std::to_string(o.nodes) + " must be at least 1");
  if (o.seq < 1) throw InputError("--seq " + std::to_string(o.seq) + " must be at least 1");
  check_range("--gpu-mem-gib", o.gpu_mem_gib, 0.01, 1e6, true);
  check_range("--cpu-mem-gib", o.cpu_mem_gib, 0.01, 1e7, true);
  check_range("--cpu-cores", o.cpu_cores, 1, 1e6, true);
  check_range("--cpu-threads-per-rank", o.cpu_threads_per_rank, 1, 4096, true);
  check_range("--train-tokens", o.train_tokens, 1, 1e16, true);
  if (!o.fsdp_config.empty()) check_output_path(o.fsdp_config);
  if (!o.accelerate_config.empty() && o.deepspeed_config.empty())
    throw InputError("--accelerate-config needs --deepspeed-config (the YAML points at the JSON)");
  TrainConfig c;
  c.gpus_per_node = o.gpus;
  c.nodes = o.nodes;
  c.seq_len = o.seq;
  c.precision = parse_precision(o.precision, "--precision");
  c.attention = attention_for(o, model, engine);
  c.gpu_expandable_segments = parse_gpu_allocator(o.gpu_allocator, "--gpu-allocator");
  check_position_table(model, engine, o.seq);
  // --peft auto is recommend's (make_request): the base configuration is full fine-tuning.
  c.peft = o.peft == "auto" ? PeftKind::kNone : parse_peft(o.peft, "--peft");
  c.lora_rank = o.lora_rank;
  c.lora_targets = parse_lora_targets(o.lora_targets, "--lora-targets");
  c.lora_alpha = o.lora_alpha;
  c.lora_dropout = o.lora_dropout;
  // The engine's rules for the job (sizes, precision, PEFT) hold for every plan; those for a
  // plan (stages, offload order) are checked where the plan is complete.
  c.engine = engine;
  if (o.peft == "auto") {
    TrainConfig probe = c;
    probe.peft = PeftKind::kLora;
    probe.engine = Engine::kStepcast;  // the LoRA settings, checked once for the searched methods
    validate_job(probe);
  }
  validate_job(c);
  return c;
}

ResourceLimits limits_of(const CommonOptions& o) {
  return ResourceLimits{o.gpu_mem_gib * kBytesPerGiB, o.cpu_mem_gib * kBytesPerGiB, o.cpu_cores,
                        static_cast<double>(o.cpu_threads_per_rank)};
}

void add_explain_config(CLI::App* app, ExplainOptions& e) {
  app->add_option("--stage", e.stage, "ZeRO stage 0..3")->capture_default_str();
  app->add_option("--offload-optimizer", e.offload_optimizer, "none | cpu (stages 1-3)")->capture_default_str();
  app->add_option("--offload-pipeline", e.offload_pipeline,
                  "on: CPU optimizer pipelined with the backward (Stepcast's backend); full: its last updates also "
                  "overlap the next forward; off: serial, after the backward (DeepSpeed, FSDP2; their default)")
      ->capture_default_str()
      ->each([&](const std::string&) { e.offload_pipeline_given = true; });
  app->add_option("--engine", e.engine,
                  "stepcast | deepspeed | fsdp2: the engine that runs the configuration (its order of copies and "
                  "collectives, and its coefficients from the profile)")
      ->capture_default_str();
  app->add_option("--offload-params", e.offload_params, "none | cpu (stage 3)")->capture_default_str();
  app->add_option("--optimizer", e.optimizer, "adamw | adamw8bit")->capture_default_str();
  app->add_option("--micro-batch", e.micro_batch, "sequences per rank per micro-batch")->capture_default_str();
  app->add_option("--gas", e.gas, "gradient accumulation steps")->capture_default_str();
  app->add_option("--checkpointing", e.checkpointing, "on | off (full activation checkpointing)")->capture_default_str();
  app->add_option("--grad-sync", e.grad_sync,
                  "FSDP2 with GAS > 1: last (reduce-scatter after the last micro-batch only, holding whole fp32 "
                  "gradients until then; Accelerate's accumulation) | each (after every micro-batch)")
      ->capture_default_str();
  e.app = app;
  app->add_option("--from-deepspeed", e.from_deepspeed,
                  "a DeepSpeed JSON the job runs with: its ZeRO stage, offload (and pin_memory, default false), "
                  "micro-batch, GAS and precision set the configuration (engine deepspeed); keys that are absent or "
                  "\"auto\" leave the flags; a flag that contradicts a key is an error");
  app->add_option("--offload-pin-memory", e.offload_pin_memory,
                  "DeepSpeed with --offload-optimizer cpu: on (\"pin_memory\": true, what the configs written here "
                  "set) | off (DeepSpeed's default: host buffers in pageable memory, copied through the CUDA "
                  "driver's staging buffers)")
      ->capture_default_str();
}

namespace {

// The flags with what a DeepSpeed JSON fixes merged in: a key's value where the flag was not
// given, the flag where the key is absent or "auto"; both and different is an error naming both.
void merge_deepspeed_job(const std::string& path, CommonOptions& o, ExplainOptions& e) {
  const DeepSpeedJob job = read_deepspeed_job(path);
  const auto given = [&](const char* flag) { return e.app != nullptr && e.app->count(flag) > 0; };
  const auto merge = [&](const char* flag, std::string& value, const std::string& from_json, const std::string& key) {
    if (given(flag) && value != from_json)
      throw InputError(path + ": key '" + key + "' sets " + from_json + ", but " + flag + " " + value);
    value = from_json;
  };
  const auto merge_int = [&](const char* flag, auto& value, int64_t from_json, const std::string& key) {
    if (given(flag) && static_cast<int64_t>(value) != from_json)
      throw InputError(path + ": key '" + key + "' = " + std::to_string(from_json) + ", but " + flag + " " +
                       std::to_string(value));
    value = static_cast<std::remove_reference_t<decltype(value)>>(from_json);
  };
  if (given("--engine") && e.engine != "deepspeed")
    throw InputError("--from-deepspeed " + path + " describes a DeepSpeed job, but --engine " + e.engine);
  e.engine = "deepspeed";
  if (job.stage) merge_int("--stage", e.stage, *job.stage, "zero_optimization.stage");
  if (job.offload_optimizer)
    merge("--offload-optimizer", e.offload_optimizer, offload_name(*job.offload_optimizer),
          "zero_optimization.offload_optimizer.device");
  if (job.offload_params)
    merge("--offload-params", e.offload_params, offload_name(*job.offload_params), "zero_optimization.offload_param.device");
  if (job.offload_pinned && e.offload_optimizer == "cpu")
    merge("--offload-pin-memory", e.offload_pin_memory, *job.offload_pinned ? "on" : "off",
          "zero_optimization.offload_optimizer.pin_memory");
  if (job.micro_batch) merge_int("--micro-batch", e.micro_batch, *job.micro_batch, "train_micro_batch_size_per_gpu");
  if (job.gas) merge_int("--gas", e.gas, *job.gas, "gradient_accumulation_steps");
  if (job.precision) merge("--precision", o.precision, precision_name(*job.precision), "bf16.enabled / fp16.enabled");
  if (job.train_batch) {
    // train_batch_size = micro-batch x GAS x ranks (DeepSpeed's batch assertion): the GAS it implies.
    const int64_t per_step = e.micro_batch * static_cast<int64_t>(o.gpus) * o.nodes;
    if (!job.gas && *job.train_batch % per_step == 0 && !given("--gas")) e.gas = *job.train_batch / per_step;
    if (*job.train_batch != e.micro_batch * e.gas * o.gpus * o.nodes)
      throw InputError(path + ": key 'train_batch_size' = " + std::to_string(*job.train_batch) +
                       " is not micro-batch " + std::to_string(e.micro_batch) + " x GAS " + std::to_string(e.gas) +
                       " x " + std::to_string(o.gpus * o.nodes) + " GPUs");
  }
  for (const std::string& note : job.notes) std::fprintf(stderr, "planner: %s: %s\n", path.c_str(), note.c_str());
}

}  // namespace

TrainConfig explain_config(const CommonOptions& common, const ExplainOptions& given, const ModelSpec& model) {
  CommonOptions o = common;
  ExplainOptions e = given;
  if (!e.from_deepspeed.empty()) merge_deepspeed_job(e.from_deepspeed, o, e);
  TrainConfig c = base_config(o, model, parse_engine(e.engine, "--engine"));
  c.zero_stage = e.stage;
  c.offload_optimizer = parse_offload(e.offload_optimizer, "--offload-optimizer");
  c.offload_params = parse_offload(e.offload_params, "--offload-params");
  c.optimizer = parse_optimizer(e.optimizer, "--optimizer");
  c.micro_batch = e.micro_batch;
  c.gas = e.gas;
  if (e.grad_sync == "each") {
    c.grad_sync_each_micro = c.gas > 1;  // one micro-batch a step reduces once either way: one key
  } else if (e.grad_sync != "last") {
    throw InputError("--grad-sync \"" + e.grad_sync + "\" is not valid (valid: last, each)");
  }
  c.offload_pinned = parse_on_off(e.offload_pin_memory, "--offload-pin-memory");
  if (e.checkpointing == "on" || e.checkpointing == "true") {
    c.activation_checkpointing = true;
  } else if (e.checkpointing == "off" || e.checkpointing == "false") {
    c.activation_checkpointing = false;
  } else {
    throw InputError("--checkpointing \"" + e.checkpointing + "\" is not valid (valid: on, off)");
  }
  // DeepSpeed and FSDP2 step their CPU optimizer after the backward: their order unless asked otherwise
  // (validate_config names a contradiction).
  const bool serial_engine = c.engine != Engine::kStepcast;
  parse_offload_pipeline(serial_engine && !e.offload_pipeline_given ? "off" : e.offload_pipeline, "--offload-pipeline", c);
  if (c.offload_optimizer != OffloadDevice::kCpu) c.offload_overlap_forward = false;  // the flag's default is for offload
  validate_config(c);
  return c;
}

}  // namespace stepcast
