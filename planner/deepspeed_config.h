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

}  // namespace stepcast
