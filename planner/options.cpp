#include "planner/options.h"

#include <sstream>

#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/units.h"
#include "model/model_spec.h"

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

}  // namespace stepcast
