// The TrainConfig's JSON form, written once and read once: the `config` object
// of planner plans (`planner … --json`, read back by `train --plan`) and of run
// records (`train --json-out`, read by calibrate and planner validate), and the
// configuration key that groups run records.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/train_config.h"

namespace stepcast {

nlohmann::json train_config_to_json(const TrainConfig& config);

// Reads and validates a `config` object; `where` ("file:line: config" or "plan.json: plans[0].config")
// names it in the InputError for a missing key or a bad value. Keys added after the first run
// records were written take their defaults when absent.
TrainConfig train_config_from_json(const nlohmann::json& config, const std::string& where);

// Model + configuration, e.g. "llama-2-7b g2n1 s3 off=none/none adamw bf16 mb4 gas4 seq2048 ckpt=0":
// the identity of a measured configuration (run records with the same key are one observation).
// The configuration of plans[0] in a planner JSON (explain/recommend --json), read from
// `text` (the file at `where`): InputError naming plans[0].config.<key> otherwise.
TrainConfig plan_config_from_text(const std::string& text, const std::string& where);

std::string config_key(const std::string& model, const TrainConfig& config);

}  // namespace stepcast
