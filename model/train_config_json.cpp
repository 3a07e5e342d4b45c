#include "model/train_config_json.h"

#include "common/errors.h"
#include "common/text_file.h"

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
  if (c.engine != Engine::kStepcast) j["engine"] = engine_name(c.engine);
  if (c.grad_sync_each_micro) j["grad_sync_each_micro"] = true;
  if (c.gpu_expandable_segments) j["gpu_allocator"] = gpu_allocator_name(c);
  if (!c.offload_pinned) j["offload_pin_memory"] = false;
  if (pipelined_offload_uploads(c)) j["offload_uploads_in_backward"] = c.offload_uploads_in_backward;
  if (c.peft_enabled()) {
    j["peft"] = peft_name(c.peft);
    j["lora_rank"] = c.lora_rank;
    j["lora_targets"] = lora_targets_name(c.lora_targets);
    j["lora_alpha"] = c.lora_alpha;
    j["lora_dropout"] = c.lora_dropout;
  }
  return j;
}

namespace {

// An integer key: a JSON integer (not 1.7, not "2") within [lo, hi], so that nothing is
// truncated or wraps on the way into an int.
int64_t integer_key(const nlohmann::json& j, const char* key, const std::string& where, int64_t lo, int64_t hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer())
    throw InputError(where + "." + key + " is " + v.dump() + ", expected an integer");
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) : v.get<int64_t>() <= hi;
  if (!fits || (!v.is_number_unsigned() && v.get<int64_t>() < lo))
    throw InputError(where + "." + key + " is " + v.dump() + ", out of range [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "]");
  return v.get<int64_t>();
}

bool boolean_key(const nlohmann::json& j, const char* key, const std::string& where, bool fallback, bool required) {
  if (!j.contains(key)) {
    if (required) throw InputError(where + "." + key + " is missing");
    return fallback;
  }
  const nlohmann::json& v = j.at(key);
  if (!v.is_boolean()) throw InputError(where + "." + key + " is " + v.dump() + ", expected true or false");
  return v.get<bool>();
}

}  // namespace

TrainConfig train_config_from_json(const nlohmann::json& j, const std::string& where) {
  TrainConfig c;
  if (!j.is_object()) throw InputError(where + " is " + j.dump().substr(0, 40) + ", expected an object");
  try {
    // Ranges wide enough for validate_config to name the value it refuses.
    constexpr int64_t kWide = int64_t{1} << 40;
    c.zero_stage = static_cast<int>(integer_key(j, "zero_stage", where, -1000, 1000));
    c.offload_optimizer = parse_offload(j.at("offload_optimizer").get<std::string>(), where + ".offload_optimizer");
    c.offload_params = parse_offload(j.at("offload_params").get<std::string>(), where + ".offload_params");
    c.optimizer = parse_optimizer(j.at("optimizer").get<std::string>(), where + ".optimizer");
    c.precision = parse_precision(j.at("precision").get<std::string>(), where + ".precision");
    c.micro_batch = integer_key(j, "micro_batch", where, -kWide, kWide);
    c.gas = integer_key(j, "gas", where, -kWide, kWide);
    c.seq_len = integer_key(j, "seq_len", where, -kWide, kWide);
    c.gpus_per_node = static_cast<int>(integer_key(j, "gpus", where, -(1 << 30), 1 << 30));
    c.nodes = static_cast<int>(integer_key(j, "nodes", where, -(1 << 30), 1 << 30));
    c.activation_checkpointing = boolean_key(j, "activation_checkpointing", where, false, true);
    c.offload_pipeline = boolean_key(j, "offload_pipeline", where, true, false);  // absent before serial offload existed
    c.offload_overlap_forward = boolean_key(j, "offload_overlap_forward", where, false, false);  // absent before it existed
    if (j.contains("attention")) c.attention = parse_attention(j.at("attention").get<std::string>(), where + ".attention");
    c.split_master = boolean_key(j, "split_master", where, true, false);
    if (j.contains("cpu_simd")) c.cpu_simd = parse_cpu_simd(j.at("cpu_simd").get<std::string>(), where + ".cpu_simd");
    c.cpu_bind = boolean_key(j, "cpu_bind", where, true, false);
    if (j.contains("engine")) c.engine = parse_engine(j.at("engine").get<std::string>(), where + ".engine");
    c.grad_sync_each_micro = boolean_key(j, "grad_sync_each_micro", where, false, false);
    // Absent: torch's default allocator (every record from before the key existed).
    if (j.contains("gpu_allocator"))
      c.gpu_expandable_segments = parse_gpu_allocator(j.at("gpu_allocator").get<std::string>(), where + ".gpu_allocator");
    // Absent: pinned host buffers, as every engine's records without the key ran (the unpinned
    // ones carry it; data/runs/h100-sxm/README.md says where it was added by hand).
    c.offload_pinned = boolean_key(j, "offload_pin_memory", where, true, false);
    // Absent: a record from before the backend uploaded during the backward (or a plan then).
    c.offload_uploads_in_backward = boolean_key(j, "offload_uploads_in_backward", where, false, false);
    if (j.contains("peft")) {
      c.peft = parse_peft(j.at("peft").get<std::string>(), where + ".peft");
      if (c.peft_enabled()) {
        c.lora_rank = integer_key(j, "lora_rank", where, -(int64_t{1} << 40), int64_t{1} << 40);
        c.lora_targets = parse_lora_targets(j.at("lora_targets").get<std::string>(), where + ".lora_targets");
        c.lora_alpha = j.at("lora_alpha").get<double>();
        c.lora_dropout = j.at("lora_dropout").get<double>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": " + e.what());
  }
  validate_config(c, json_config_names(where));
  return c;
}

TrainConfig plan_config_from_text(const std::string& text, const std::string& where) {
  check_json_depth(text, where);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": not a planner plan (" + std::string(e.what()) + ")");
  }
  if (!j.is_object() || !j.contains("plans") || !j.at("plans").is_array() || j.at("plans").empty() ||
      !j.at("plans").at(0).is_object() || !j.at("plans").at(0).contains("config"))
    throw InputError(where + ": not a planner plan (no plans[0].config; write one with planner explain --json)");
  return train_config_from_json(j.at("plans").at(0).at("config"), where + ": plans[0].config");
}

std::string config_key(const std::string& model, const TrainConfig& c) {
  return model + " g" + std::to_string(c.gpus_per_node) + "n" + std::to_string(c.nodes) + " s" +
         std::to_string(c.zero_stage) + " off=" + offload_name(c.offload_optimizer) + "/" +
         offload_name(c.offload_params) + " " + optimizer_name(c.optimizer) + " " + precision_name(c.precision) +
         " mb" + std::to_string(c.micro_batch) + " gas" + std::to_string(c.gas) + " seq" +
         std::to_string(c.seq_len) + " ckpt=" + (c.activation_checkpointing ? "1" : "0") +
         (c.offload_optimizer == OffloadDevice::kCpu && !c.offload_pipeline ? " serial" : "") +
         (c.offload_overlap_forward ? " overlap-fwd" : "") +
         (pipelined_offload_uploads(c) && !c.offload_uploads_in_backward ? " uploads=after-bwd" : "") +
         (c.split_master ? "" : " split=off") +
         (c.cpu_simd == CpuSimd::kAuto ? "" : std::string(" simd=") + cpu_simd_name(c.cpu_simd)) +
         (c.cpu_bind ? "" : " bind=off") +
         (c.attention == AttentionKind::kFlash ? "" : std::string(" attn=") + attention_name(c.attention)) +
         (c.engine == Engine::kStepcast ? "" : std::string(" engine=") + engine_name(c.engine)) +
         (c.grad_sync_each_micro ? " sync=each" : "") +
         (c.gpu_expandable_segments ? " alloc=expandable" : "") + (c.offload_pinned ? "" : " pin=off") +
         (c.peft_enabled() ? std::string(" peft=") + peft_name(c.peft) + " r" + std::to_string(c.lora_rank) + " " +
                                 lora_targets_name(c.lora_targets) + (c.lora_dropout > 0 ? " dropout" : "")
                           : "");
}

}  // namespace stepcast
