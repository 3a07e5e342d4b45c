#include "model/train_config_json.h"

#include "common/errors.h"

namespace stepcast {

nlohmann::json train_config_to_json(const TrainConfig& c) {
  nlohmann::json j = {{"zero_stage", c.zero_stage},
          {"offload_optimizer", offload_name(c.offload_optimizer)},
          {"offload_params", offload_name(c.offload_params)},
          {"optimizer", optimizer_name(c.optimizer)},
          {"precision", precision_name(c.precision)},
          {"micro_batch", c.micro_batch},
          {"gas", c.gas},
          {"seq_len", c.seq_len},
          {"gpus", c.gpus_per_node},
          {"nodes", c.nodes},
          {"world_size", c.world_size()},
          {"global_batch", c.global_batch()},
          {"activation_checkpointing", c.activation_checkpointing},
          {"offload_pipeline", c.offload_pipeline},
          {"offload_overlap_forward", c.offload_overlap_forward},
          {"attention", attention_name(c.attention)}};
  // The backend's switches are written where they differ from their defaults (absent: default),
  // so that plans and records of default runs read as they always have.
  if (!c.split_master) j["split_master"] = false;
  if (c.cpu_simd != CpuSimd::kAuto) j["cpu_simd"] = cpu_simd_name(c.cpu_simd);
  if (!c.cpu_bind) j["cpu_bind"] = false;
  return j;
}

TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where) {
  TrainConfig c;
  try {
    c.zero_stage = j.at("zero_stage").get<int>();
    c.offload_optimizer = parse_offload(j.at("offload_optimizer").get<std::string>(), where + ".offload_optimizer");
    c.offload_params = parse_offload(j.at("offload_params").get<std::string>(), where + ".offload_params");
    c.optimizer = parse_optimizer(j.at("optimizer").get<std::string>(), where + ".optimizer");
    c.precision = parse_precision(j.at("precision").get<std::string>(), where + ".precision");
    c.micro_batch = j.at("micro_batch").get<int64_t>();
    c.gas = j.at("gas").get<int64_t>();
    c.seq_len = j.at("seq_len").get<int64_t>();
    c.gpus_per_node = j.at("gpus").get<int>();
    c.nodes = j.at("nodes").get<int>();
    c.activation_checkpointing = j.at("activation_checkpointing").get<bool>();
    c.offload_pipeline = j.value("offload_pipeline", true);  // absent before serial offload existed
    c.offload_overlap_forward = j.value("offload_overlap_forward", false);  // absent before it existed
    if (j.contains("attention")) c.attention = parse_attention(j.at("attention").get<std::string>(), where + ".attention");
    c.split_master = j.value("split_master", true);
    if (j.contains("cpu_simd")) c.cpu_simd = parse_cpu_simd(j.at("cpu_simd").get<std::string>(), where + ".cpu_simd");
    c.cpu_bind = j.value("cpu_bind", true);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": " + e.what());
  }
  validate_config(c);
  return c;
}

std::string config_key(const std::string& model, const TrainConfig& c) {
  return model + " g" + std::to_string(c.gpus_per_node) + "n" + std::to_string(c.nodes) + " s" +
         std::to_string(c.zero_stage) + " off=" + offload_name(c.offload_optimizer) + "/" +
         offload_name(c.offload_params) + " " + optimizer_name(c.optimizer) + " " + precision_name(c.precision) +
         " mb" + std::to_string(c.micro_batch) + " gas" + std::to_string(c.gas) + " seq" +
         std::to_string(c.seq_len) + " ckpt=" + (c.activation_checkpointing ? "1" : "0") +
         (c.offload_optimizer == OffloadDevice::kCpu && !c.offload_pipeline ? " serial" : "") +
         (c.offload_overlap_forward ? " overlap-fwd" : "") + (c.split_master ? "" : " split=off") +
         (c.cpu_simd == CpuSimd::kAuto ? "" : std::string(" simd=") + cpu_simd_name(c.cpu_simd)) +
         (c.cpu_bind ? "" : " bind=off");
}

}  // namespace stepcast
