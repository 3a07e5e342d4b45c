// Measured runs as `train --json-out` writes them (one JSON object per step),
// grouped into one observation per (model, configuration) with the median of
// the measured steps.
#pragma once

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/model_spec.h"
#include "model/train_config.h"
#include "model/train_config_json.h"

namespace stepcast::calibrate {

struct RunRecord {
  std::string key;          // model + configuration, e.g. "llama-2-7b g2n1 s3 off=none/none adamw bf16 mb4 gas4 seq2048 ckpt=0"
  std::string source;       // file the steps came from
  ModelSpec model;
  TrainConfig config;
  int steps = 0;            // measured (non-warm-up) steps
  // Medians over the measured steps, seconds / bytes.
  double step_s = 0, gas_s = 0, opt_s = 0, forward_s = 0, backward_s = 0, grad_comm_s = 0, param_gather_s = 0,
         offload_transfer_s = 0, optimizer_s = 0;
  double optimizer_total_s = 0;  // the optimizer's own time: with CPU offload, hidden or not
  double gpu_peak_reserved_bytes = 0;
  double gpu_peak_allocated_bytes = 0;  // 0: not in the records
  double host_peak_rss_bytes = 0;       // the rank-0 process's high-water mark over its steps; 0: not recorded
  double tokens_per_s = 0;
  // The median step of each runs file that measured the configuration, in load order: files are
  // calls, often on other machines of the kind, and step_s (the median over all) hides how far
  // one machine's run falls from it. Empty: step_s alone.
  struct FileStep {
    std::string file;  // the runs file, as loaded
    double step_s = 0;
  };
  std::vector<FileStep> step_by_file;
};

// The measured step times a prediction of `r` answers for: one per runs file (step_by_file),
// else step_s.
std::vector<double> step_measurements_s(const RunRecord& r);

// Calls fn(file, where, object) for each non-empty line of each JSONL file (where =
// "file:line"); an unreadable file or a line that is not JSON is an InputError
// naming it. `prefilter`, when given, skips lines that do not contain it before
// parsing.
void for_each_jsonl(const std::vector<std::filesystem::path>& files, const std::string& prefilter,
                    const std::function<void(const std::filesystem::path& file, const std::string& where,
                                             const nlohmann::json& j)>& fn);

// Records that no longer describe the engine that wrote them (a later commit changed its speed
// for that configuration) are named in a folder's superseded.toml, beside the runs files:
//   [[superseded]]
//   file = "2026-12-01_validate_1gpu_llama.jsonl"   # a runs file in this folder
//   key = "llama-2-7b g1n1 s1 off=cpu/none ..."      # the configuration key (RunRecord::key)
//   reason = "..."                                    # why they no longer hold
//   by = "2026-12-03_...jsonl"                        # optional: the records that replace them
// The records stay in their file (data are never edited); load_runs leaves them out.
inline constexpr const char* kSupersededFile = "superseded.toml";
inline constexpr const char* kSupersededKey = "superseded";
struct SupersededRecord {
  std::string file, key, reason, by;
};
// The entries of one superseded.toml; none when the file does not exist. Bad input (an unknown
// key, a missing file, key or reason) is an InputError naming the file and the entry.
std::vector<SupersededRecord> read_superseded(const std::filesystem::path& path);
// The superseded.toml of each folder the runs files lie in, where one exists, in the order the
// folders first appear: the lists load_runs applies (and a fit's data hash covers).
std::vector<std::filesystem::path> superseded_lists(const std::vector<std::filesystem::path>& files);

// Reads JSONL files; malformed lines fail with file:line and the key. Records named in their
// folder's superseded.toml are left out (one line to stderr says how many); an entry naming a
// loaded file but none of its records is an InputError.
std::vector<RunRecord> load_runs(const std::vector<std::filesystem::path>& files,
                                 const std::filesystem::path& data_dir);

// The runs of one engine (engine_name of their configuration).
std::vector<RunRecord> runs_of_engine(const std::vector<RunRecord>& runs, const std::string& engine);

// A deterministic split: a run is held out when a hash of its key falls under `fraction`.
bool is_holdout(const std::string& key, double fraction, uint64_t seed);

}  // namespace stepcast::calibrate
