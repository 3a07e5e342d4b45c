// The manifest of a checkpoint (checkpoint.h): what a save writes last and a resume
// checks first. Plain JSON, no LibTorch, so that the fuzz tests and the sanitizer
// build exercise its reader.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace stepcast::backend {

// What a checkpoint must match to be resumed by this run.
struct CheckpointIdentity {
  std::string model;
  int64_t params = 0;
  int world_size = 1;
  int rank = 0;
  // The settings the shards' layout depends on (zero_stage, optimizer, precision, offload,
  // split master weights), as JSON values; compared key by key on resume.
  nlohmann::json state;
  std::string git_commit;  // of the program that writes it (provenance in the manifest)
};

inline constexpr const char* kCheckpointFormat = "stepcast-checkpoint-1";

std::string shard_file_name(int rank);  // "rank3.pt"
std::string crc32c_hex(uint32_t crc);   // 8 lower-case hex digits

// The manifest for `step`, with each rank's shard as (bytes, CRC-32C), in rank order.
std::string manifest_text(const CheckpointIdentity& id, int64_t step,
                          const std::vector<std::pair<uint64_t, uint32_t>>& shards);

// This rank's part of a manifest that matches `id`.
struct ManifestShard {
  int64_t step = 0;
  uint64_t bytes = 0;
  std::string crc32c;
};

// Parses `text` (the manifest at `where`) and checks it against `id`: format, model,
// parameter count, world size, each state setting, the step, and this rank's shard
// entry. Throws InputError naming `where`, the key and both values otherwise.
ManifestShard check_manifest(const std::string& text, const std::string& where, const CheckpointIdentity& id);

}  // namespace stepcast::backend
