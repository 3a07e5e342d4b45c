// The flags recommend, explain and validate share (compare takes a subset), and the
// configuration, limits and data folder they give.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "model/step_features.h"
#include "model/train_config.h"
#include "planner/diagnose.h"

namespace stepcast {

struct CommonOptions {
  std::string model;
  std::string hardware = "h200-sxm";
  std::string data_dir;
  int gpus = 1;
  int nodes = 1;
  int64_t seq = 2048;
  std::string precision = "bf16";
  std::string attention = "auto";
  std::string gpu_allocator = "default";
  double gpu_mem_gib = 0;
  double cpu_mem_gib = 0;
  double cpu_cores = 0;
  int cpu_threads_per_rank = 0;  // 0: the launcher's default (torchrun: one per rank with several)
  bool json = false;
  std::string deepspeed_config;
  std::string accelerate_config;
  std::string fsdp_config;
  double train_tokens = 0;
  std::string peft = "none";
  int64_t lora_rank = 16;
  std::string lora_targets = "all";
  double lora_alpha = 16.0;
  double lora_dropout = 0.0;
  std::vector<std::string> speeds;  // --speed RESOURCE=X: the machine as `planner diagnose` found it
};

void add_common(CLI::App* app, CommonOptions& o);
std::filesystem::path data_dir(const CommonOptions& o);

// A flag's number: 0 when omitted (where `allow_zero`), else within [lo, hi]; InputError otherwise.
void check_range(const char* flag, double v, double lo, double hi, bool allow_zero);

// The base configuration of a search or an explanation of `model` run by `engine`: GPUs, nodes,
// sequence, precision, PEFT settings (--peft auto leaves full fine-tuning: recommend searches the
// methods), and the attention the engine runs: --attention as given, and "auto" the fused SDPA
// kernels, except where a peer engine runs a transformers architecture that has no SDPA
// implementation (math). InputError for what that engine cannot run: --attention flash there, or
// a sequence beyond a fixed position table.
TrainConfig base_config(const CommonOptions& o, const ModelSpec& model, Engine engine);
ResourceLimits limits_of(const CommonOptions& o);

// --speed's resources and factors (all 1 where not given); InputError names a bad item.
ResourceSpeeds speeds_of(const CommonOptions& o);
bool has_speeds(const CommonOptions& o);

// The profile and limits a prediction of `config` uses: as given without --speed; with it, the
// profile for the configuration's engine (for_engine) with the speeds applied (scale_machine).
// `hw` must not already be for an engine.
ScaledMachine machine_of(const CommonOptions& o, const HardwareProfile& hw, const TrainConfig& config);

// A line naming the speeds, for the notes ("" without --speed).
std::string speeds_note(const CommonOptions& o);

// The flags that name one configuration (explain's and diagnose's): stage, offload, optimizer,
// micro-batch, GAS, checkpointing, engine, gradient sync.
struct ExplainOptions {
  int stage = 0;
  std::string offload_optimizer = "none";
  std::string offload_params = "none";
  std::string optimizer = "adamw";
  int64_t micro_batch = 1;
  int64_t gas = 1;
  std::string checkpointing = "off";
  std::string offload_pipeline = "on";
  bool offload_pipeline_given = false;
  std::string engine = "stepcast";
  std::string grad_sync = "last";
  std::string offload_pin_memory = "on";
  // --from-deepspeed FILE: a DeepSpeed JSON that fixes what it sets (planner/deepspeed_config_in.h).
  std::string from_deepspeed;
  const CLI::App* app = nullptr;  // the command these were parsed by: which flags were given
};

void add_explain_config(CLI::App* app, ExplainOptions& e);

// The configuration those flags and the common ones name, checked (validate_config);
// InputError names the flag at fault.
TrainConfig explain_config(const CommonOptions& o, const ExplainOptions& e, const ModelSpec& model);

}  // namespace stepcast
