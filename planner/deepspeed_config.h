// Writers of runnable launcher configurations for a plan: a DeepSpeed JSON
// (keys as in DeepSpeed's config documentation, deepspeed.ai/docs/config-json) and an
// Accelerate YAML that points at it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/prediction.h"

namespace stepcast {

struct LauncherConfig {
  nlohmann::json deepspeed;
  std::vector<std::string> notes;  // what the training script must do that the JSON cannot say
};

LauncherConfig deepspeed_config(const ModelSpec& model, const TrainConfig& config);

// Accelerate's YAML for the same plan; `deepspeed_json_path` is written into it.
std::string accelerate_yaml(const TrainConfig& config, const std::string& deepspeed_json_path);

// Accelerate's YAML for an FSDP2 plan (fsdp_version 2; keys as Accelerate's FSDP guide writes
// them, huggingface.co/docs/accelerate/usage_guides/fsdp): stage 3 reshards after the forward,
// stage 2 does not; offload puts parameters, gradients and the optimizer on the CPU; each decoder
// layer of the transformers class for the model type is one unit. Throws InputError for a plan of
// another engine, or a model type without a known decoder-layer class.
std::string accelerate_fsdp_yaml(const ModelSpec& model, const TrainConfig& config);

}  // namespace stepcast
