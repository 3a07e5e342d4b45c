#include "backend/engine/manifest.h"

#include <cstdio>

#include "common/errors.h"
#include "common/text_file.h"

namespace stepcast::backend {

std::string shard_file_name(int rank) { return "rank" + std::to_string(rank) + ".pt"; }

std::string crc32c_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

std::string manifest_text(const CheckpointIdentity& id, int64_t step,
                          const std::vector<std::pair<uint64_t, uint32_t>>& shards) {
  nlohmann::json m;
  m["format"] = kCheckpointFormat;
  m["model"] = id.model;
  m["params"] = id.params;
  m["step"] = step;
  m["world_size"] = id.world_size;
  m["state"] = id.state;
  m["git_commit"] = id.git_commit;
  m["shards"] = nlohmann::json::array();
  for (size_t r = 0; r < shards.size(); ++r)
    m["shards"].push_back({{"file", shard_file_name(static_cast<int>(r))},
                           {"rank", r},
                           {"bytes", shards[r].first},
                           {"crc32c", crc32c_hex(shards[r].second)}});
  return m.dump(2) + "\n";
}

ManifestShard check_manifest(const std::string& text, const std::string& where, const CheckpointIdentity& id) {
  check_json_depth(text, where);
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(where + ": malformed JSON: " + e.what());
  }
  if (!m.is_object()) throw InputError(where + ": a manifest is a JSON object");
  const auto field = [&](const char* key) -> const nlohmann::json& {
    if (!m.contains(key)) throw InputError(where + ": no \"" + key + "\"");
    return m.at(key);
  };
  const auto shown = [](const nlohmann::json& v) {
    const std::string s = v.dump();
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  };
  if (field("format") != kCheckpointFormat)
    throw InputError(where + ": format " + shown(field("format")) + " is not " + kCheckpointFormat);
  const std::string again = " (resume with the model, ranks, stage, optimizer, precision and offload it was saved with)";
  if (field("model") != id.model)
    throw InputError(where + ": model " + shown(field("model")) + ", this run trains \"" + id.model + "\"" + again);
  if (field("params") != id.params)
    throw InputError(where + ": params " + shown(field("params")) + ", this model has " + std::to_string(id.params) + again);
  if (field("world_size") != id.world_size)
    throw InputError(where + ": world_size " + shown(field("world_size")) + ", this run has " +
                     std::to_string(id.world_size) + again);
  const nlohmann::json& state = field("state");
  if (!state.is_object()) throw InputError(where + ": state is " + shown(state) + ", expected an object");
  for (const auto& [key, value] : id.state.items()) {
    if (!state.contains(key) || state.at(key) != value)
      throw InputError(where + ": state." + key + " " + (state.contains(key) ? shown(state.at(key)) : "absent") +
                       ", this run has " + value.dump() + again);
  }
  const nlohmann::json& step = field("step");
  if (!step.is_number_integer() || (!step.is_number_unsigned() && step.get<int64_t>() < 0) ||
      (step.is_number_unsigned() && step.get<uint64_t>() > (uint64_t{1} << 62)))
    throw InputError(where + ": step " + shown(step) + " is not a step count");
  const nlohmann::json& shards = field("shards");
  if (!shards.is_array() || shards.size() != static_cast<size_t>(id.world_size))
    throw InputError(where + ": shards must list " + std::to_string(id.world_size) + " files");
  const nlohmann::json& e = shards[static_cast<size_t>(id.rank)];
  const bool ok = e.is_object() && e.contains("rank") && e.at("rank") == id.rank && e.contains("file") &&
                  e.at("file") == shard_file_name(id.rank) && e.contains("bytes") && e.at("bytes").is_number_unsigned() &&
                  e.contains("crc32c") && e.at("crc32c").is_string();
  if (!ok)
    throw InputError(where + ": shards[" + std::to_string(id.rank) + "] " + shown(e) + " does not describe " +
                     shard_file_name(id.rank));
  return {step.get<int64_t>(), e.at("bytes").get<uint64_t>(), e.at("crc32c").get<std::string>()};
}

}  // namespace stepcast::backend
