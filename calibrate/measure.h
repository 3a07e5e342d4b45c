// Measuring on the backend, for `calibrate measure` and `planner validate`:
// run lists, launching `train` and `microbench` with an argv vector (no shell:
// common/process.h), and what a configuration will be recorded as before it
// runs, so that a measurement resumes by the run records' configuration keys.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/process.h"

namespace stepcast::calibrate {

// One line of a run list: MODEL NPROC [train flags], flags split at white space.
// '#' starts a comment line; blank lines are skipped.
struct RunListEntry {
  std::string model;
  int nproc = 1;
  std::vector<std::string> flags;  // train's flags as written, --emulate-nodes among them
  int emulated_nodes = 1;          // the line's `--emulate-nodes K`: to the planner, K nodes of NPROC / K GPUs
  std::vector<std::string> planner_flags;  // `flags` less --emulate-nodes, which the planner reads as --gpus and --nodes
  std::string where;               // "file:line"
};

// Throws InputError naming the file and line of a malformed entry.
std::vector<RunListEntry> read_run_list(const std::filesystem::path& list);

// One `train` run: what every measuring tool passes, plus the entry's own flags.
struct TrainLaunch {
  std::string train;  // the binary (sibling_binary)
  std::string model;
  int nproc = 1;
  int64_t steps = 3;
  int64_t warmup_steps = 1;
  std::string device = "auto";
  std::string hardware;  // empty: train's default
  std::string data_dir;  // empty: train's default
  std::string plan;      // a planner JSON whose plans[0] runs, or empty
  std::vector<std::string> flags;
  std::string json_out;  // the run records, appended
};

std::vector<std::string> train_argv(const TrainLaunch& launch);

// Runs train to its end; its console output is appended to `log` (inherited when empty).
SpawnResult run_train(const TrainLaunch& launch, const std::string& log = "");

// The configuration key (model/train_config_json.h) that `launch` will record, from
// `train --dry-run`, which parses the flags and resolves the model without training.
// Throws InputError with train's message when train rejects the flags.
std::string planned_config_key(const TrainLaunch& launch, const std::filesystem::path& scratch_dir);

// `calibrate measure`: runs `microbench` (unless micro is false), then each configuration of the
// run list with `train`, appending every step to OUT/runs.jsonl. A configuration whose key
// already has enough measured steps there is skipped, so that an interrupted run resumes.
// Progress and an ETA go to stderr. Returns the exit status (1 when a run failed).
int run_measure(const std::string& list, const std::string& out_dir, const std::string& train_flag, int64_t steps,
                double budget_min, const std::string& device, const std::string& dir, bool micro,
                const std::string& micro_flags);

// `calibrate measure --engine deepspeed|fsdp2`: each run-list line (MODEL NPROC [planner explain
// flags]) becomes a plan with `planner explain --engine E --json` (and, for DeepSpeed, the JSON config
// the planner writes, as a user would run it), then runs on the peer harness (bench/peers/peer.py)
// under torchrun, appending every step to OUT/runs.jsonl in the backend's schema. Resumes by
// configuration key like run_measure. Returns the exit status (1 when a run failed).
struct PeerMeasure {
  std::string engine;       // deepspeed | fsdp2
  std::string list, out_dir;
  int64_t steps = 4;
  double budget_min = 0;
  std::string data_dir;     // empty: the build's
  std::string hardware = "h200-sxm";
  std::string planner;      // the planner binary; empty: beside calibrate
  std::string python = "python3";
  std::string peer_script;  // empty: the source tree's bench/peers/peer.py
  double timeout_s = 900;   // one configuration, set-up included
};
int run_peer_measure(const PeerMeasure& m);

// `calibrate predict`: each run-list line (MODEL NPROC [planner explain flags]) predicted by this
// build's profile with `planner explain --engine E --json` before it is measured, so that a
// designed hold-out's predictions are committed with the commit that made them. A table (or
// JSON) to stdout or, atomically, to `out`.
struct PredictList {
  std::string engine = "stepcast";
  std::string list, out;
  std::string hardware = "h200-sxm";
  std::string data_dir;  // empty: the build's
  std::string planner;   // empty: beside calibrate
  bool json = false;
};
int run_predict_list(const PredictList& p);

// Splits a flag string ("--quick --suite compute") at white space.
std::vector<std::string> split_words(const std::string& text);

}  // namespace stepcast::calibrate
