// Checkpoints as a unit. `train --save ROOT` writes one folder per save:
//
//   ROOT/step-00000006/rank0.pt ... rank<W-1>.pt   each rank's optimizer and master shards
//   ROOT/step-00000006/manifest.json               written last: model, world size, step, the
//                                                   settings the shards depend on, and per shard
//                                                   its file, rank, size and CRC-32C
//   ROOT/latest                                     "step-00000006": the last complete save
//
// A save goes to ROOT/.step-00000006.partial first; every rank writes and syncs its
// shard; the ranks agree that all succeeded (a collective), and only then does rank 0
// write the manifest, rename the folder into place, point `latest` at it and remove the
// older saves. A save that fails on any rank (disk full, a dead rank) leaves `latest`
// and the folder it names untouched; the next save removes the partial folder. ROOT is
// shared by all ranks (one host, or a shared file system).
//
// `--resume ROOT` (or a step folder) verifies before it loads: the manifest's model,
// world size and state settings against the run, and each shard's size, checksum, rank
// and step, so that shards of different steps, swapped rank files, a truncated or
// corrupted file are refused with one line naming the file.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/comm/collectives.h"
#include "backend/engine/manifest.h"
#include "backend/runtime/runtime.h"

namespace stepcast::backend {

// Collective: every rank calls it with its shard. `die_at_rank` (testing) ends that rank
// abruptly after its shard is written, before the ranks agree. Throws IoError (or
// PeerFailure on the ranks that did not fail) when the save is not complete.
void save_checkpoint(const std::filesystem::path& root, int64_t step, const CheckpointIdentity& id,
                     const std::vector<torch::Tensor>& shard, Collectives& comm, Runtime& runtime,
                     int die_at_rank = -1);

struct LoadedShard {
  std::vector<torch::Tensor> tensors;  // as given to save_checkpoint
  int64_t step = 0;
  std::filesystem::path file;  // for messages
};

// This rank's verified shard of the checkpoint at `path` (ROOT or ROOT/step-N). Throws
// InputError naming the file, key and value when anything does not match.
LoadedShard load_checkpoint(const std::filesystem::path& path, const CheckpointIdentity& id);

// Every rank learns whether all ranks are `ok`. The ranks that are not throw
// `failure_message` (an InputError for exit status 2, else an IoError); the others throw
// PeerFailure with that status, so that only the rank that knows the cause says it.
void all_ranks_ok(bool ok, const std::string& failure_message, int exit_status, Collectives& comm, Runtime& runtime,
                  const std::string& peer_message);

// Each rank's `values` (the same count on every rank, integers below 2^24), gathered:
// rank r's at [r * n, (r + 1) * n). Collective.
std::vector<int64_t> gather_small_ints(const std::vector<int64_t>& values, Collectives& comm, Runtime& runtime);

}  // namespace stepcast::backend
