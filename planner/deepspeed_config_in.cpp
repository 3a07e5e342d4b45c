#include "planner/deepspeed_config_in.h"

#include <cctype>

#include "common/errors.h"
#include "common/text_file.h"

namespace stepcast {

namespace {

bool is_auto(const nlohmann::json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

std::string where_of(const std::string& origin, const std::string& key) { return origin + ": key '" + key + "'"; }

// An integer key within [lo, hi] (DeepSpeed also accepts a float written as 1e9); empty for "auto".
std::optional<int64_t> int_key(const nlohmann::json& obj, const char* key, const std::string& path,
                               const std::string& origin, int64_t lo, int64_t hi) {
  if (!obj.contains(key) || is_auto(obj.at(key))) return std::nullopt;
  const nlohmann::json& v = obj.at(key);
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d == static_cast<double>(static_cast<int64_t>(d)) && d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
      return static_cast<int64_t>(d);
  }
  throw InputError(where_of(origin, path) + " = " + v.dump() + " is not valid (valid: an integer " + std::to_string(lo) +
                   ".." + std::to_string(hi) + " or \"auto\")");
}

// "enabled": true | false | "auto"; empty for "auto" or absent.
std::optional<bool> enabled_key(const nlohmann::json& ds, const char* section, const std::string& origin) {
  if (!ds.contains(section)) return std::nullopt;
  const nlohmann::json& s = ds.at(section);
  if (!s.is_object() || !s.contains("enabled")) return std::nullopt;
  const nlohmann::json& v = s.at("enabled");
  if (is_auto(v)) return std::nullopt;
  if (!v.is_boolean())
    throw InputError(where_of(origin, std::string(section) + ".enabled") + " = " + v.dump() +
                     " is not valid (valid: true, false, \"auto\")");
  return v.get<bool>();
}

// An offload section's device: "cpu" or "none" (NVMe is not modelled); empty where absent.
std::optional<OffloadDevice> device_key(const nlohmann::json& section, const std::string& path, const std::string& origin) {
  if (!section.contains("device")) return std::nullopt;
  const nlohmann::json& v = section.at("device");
  const std::string d = v.is_string() ? v.get<std::string>() : v.dump();
  if (d == "cpu") return OffloadDevice::kCpu;
  if (d == "none") return OffloadDevice::kNone;
  if (d == "nvme")
    throw InputError(where_of(origin, path + ".device") + " = " + v.dump() +
                     " is not modelled (valid here: \"cpu\", \"none\"): NVMe offload's swaps are not in the cost model");
  throw InputError(where_of(origin, path + ".device") + " = " + v.dump() + " is not valid (valid: \"cpu\", \"none\")");
}

std::optional<bool> bool_key(const nlohmann::json& obj, const char* key, const std::string& path, const std::string& origin) {
  if (!obj.contains(key)) return std::nullopt;
  const nlohmann::json& v = obj.at(key);
  if (!v.is_boolean()) throw InputError(where_of(origin, path) + " = " + v.dump() + " is not valid (valid: true, false)");
  return v.get<bool>();
}

}  // namespace

DeepSpeedJob parse_deepspeed_job(const nlohmann::json& ds, const std::string& origin) {
  if (!ds.is_object()) throw InputError(origin + ": not a DeepSpeed config (a JSON object)");
  DeepSpeedJob job;
  job.micro_batch = int_key(ds, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", origin, 1, 1 << 20);
  job.gas = int_key(ds, "gradient_accumulation_steps", "gradient_accumulation_steps", origin, 1, 1 << 20);
  job.train_batch = int_key(ds, "train_batch_size", "train_batch_size", origin, 1, int64_t{1} << 40);
  const std::optional<bool> bf16 = enabled_key(ds, "bf16", origin), fp16 = enabled_key(ds, "fp16", origin);
  if (bf16.value_or(false) && fp16.value_or(false))
    throw InputError(where_of(origin, "bf16.enabled") + " and 'fp16.enabled' are both true: DeepSpeed trains in one of them");
  if (bf16.value_or(false)) {
    job.precision = Precision::kBf16;
  } else if (fp16.value_or(false)) {
    job.precision = Precision::kFp16;
  } else if (bf16.has_value() && fp16.has_value()) {
    job.precision = Precision::kFp32;  // both written false: fp32
  }
  if (ds.contains("optimizer") && ds.at("optimizer").is_object() && ds.at("optimizer").contains("type")) {
    const nlohmann::json& t = ds.at("optimizer").at("type");
    const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
    std::string lower;
    for (char ch : type) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (lower != "adam" && lower != "adamw")
      throw InputError(where_of(origin, "optimizer.type") + " = " + t.dump() +
                       " is not modelled (valid here: \"Adam\", \"AdamW\")");
  }
  if (ds.contains("zero_optimization")) {
    const nlohmann::json& z = ds.at("zero_optimization");
    if (!z.is_object()) throw InputError(where_of(origin, "zero_optimization") + " is not an object");
    if (const auto s = int_key(z, "stage", "zero_optimization.stage", origin, 0, 3)) job.stage = static_cast<int>(*s);
    // The deprecated switches, as DeepSpeed maps them (runtime/zero/config.py): cpu_offload ->
    // offload_optimizer on the CPU with its defaults (pin_memory false), cpu_offload_param ->
    // offload_param on the CPU; cpu_offload_use_pin_memory sets nothing (set_new_param=False).
    if (bool_key(z, "cpu_offload", "zero_optimization.cpu_offload", origin).value_or(false)) {
      job.offload_optimizer = OffloadDevice::kCpu;
      job.offload_pinned = false;
      job.notes.push_back("zero_optimization.cpu_offload (deprecated) = true: offload_optimizer on the CPU, pin_memory false");
    }
    if (bool_key(z, "cpu_offload_param", "zero_optimization.cpu_offload_param", origin).value_or(false))
      job.offload_params = OffloadDevice::kCpu;
    if (z.contains("cpu_offload_use_pin_memory"))
      job.notes.push_back("zero_optimization.cpu_offload_use_pin_memory (deprecated) sets nothing in DeepSpeed 0.14");
    if (z.contains("offload_optimizer") && !z.at("offload_optimizer").is_null()) {
      const nlohmann::json& o = z.at("offload_optimizer");
      if (!o.is_object()) throw InputError(where_of(origin, "zero_optimization.offload_optimizer") + " is not an object");
      if (const auto d = device_key(o, "zero_optimization.offload_optimizer", origin)) job.offload_optimizer = d;
      // offload_config.py: pin_memory defaults to false.
      job.offload_pinned = bool_key(o, "pin_memory", "zero_optimization.offload_optimizer.pin_memory", origin).value_or(false);
    }
    if (z.contains("offload_param") && !z.at("offload_param").is_null()) {
      const nlohmann::json& p = z.at("offload_param");
      if (!p.is_object()) throw InputError(where_of(origin, "zero_optimization.offload_param") + " is not an object");
      if (const auto d = device_key(p, "zero_optimization.offload_param", origin)) job.offload_params = d;
    }
  }
  if (ds.contains("activation_checkpointing"))
    job.notes.push_back("activation_checkpointing is DeepSpeed's own checkpointing API (Megatron-style models); "
                        "a Hugging Face model checkpoints by its gradient_checkpointing: --checkpointing says which");
  return job;
}

DeepSpeedJob read_deepspeed_job(const std::string& path) {
  const std::string text = read_text_file(path);
  nlohmann::json ds;
  try {
    ds = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not JSON (" + std::string(e.what()) + ")");
  }
  return parse_deepspeed_job(ds, path);
}

}  // namespace stepcast
