// Reading a user's DeepSpeed JSON (the config a DeepSpeed job already runs with) into the flags
// that name one configuration, so `planner explain` and `planner diagnose` predict the job as that
// config makes DeepSpeed (v0.14) run it. Keys as DeepSpeed's config documentation
// (deepspeed.ai/docs/config-json) and its parser (deepspeed/runtime/zero/config.py,
// offload_config.py) define them; "auto" (Hugging Face's Trainer fills it in) and absent keys
// leave the flag's value.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/train_config.h"

namespace stepcast {

// What the JSON fixes; each field empty where the key is absent or "auto".
struct DeepSpeedJob {
  std::optional<int> stage;
  std::optional<OffloadDevice> offload_optimizer, offload_params;
  std::optional<bool> offload_pinned;  // offload_optimizer.pin_memory (DeepSpeed's default: false)
  std::optional<int64_t> micro_batch, gas, train_batch;
  std::optional<Precision> precision;
  std::vector<std::string> notes;  // keys read and what they set, and keys that do not apply
};

// Parses `text` (the file `origin`); InputError names the file, the key and its value where a
// value is not one DeepSpeed accepts or not one the model covers (NVMe offload, an optimizer other
// than Adam/AdamW, bf16 and fp16 both on).
DeepSpeedJob parse_deepspeed_job(const nlohmann::json& ds, const std::string& origin);
DeepSpeedJob read_deepspeed_job(const std::string& path);

}  // namespace stepcast
