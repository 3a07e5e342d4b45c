// Published training throughputs (data/published/*.toml): what other teams measured on GPUs and
// scales this project cannot calibrate, each row with its source, and `calibrate report
// --published`, which predicts every row and prints the error per row and per source.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "model/hardware.h"
#include "model/model_spec.h"
#include "model/prediction.h"
#include "model/step_features.h"
#include "model/train_config.h"

namespace stepcast::calibrate {

// One published measurement: a configuration as the source describes it and what it reached.
struct PublishedRow {
  std::string where;  // the table and row of the source
  std::string model_name, hardware_name;
  ModelSpec model;
  TrainConfig config;
  double tokens_per_s_per_gpu = 0;
  // The founding report's phases (0: not published): step, GAS and OPT time in seconds.
  double step_s = 0, gas_time_s = 0, opt_time_s = 0;
  double peak_memory_bytes = 0;  // 0: not published
  // The host the source ran on where it differs from the profile's (cores of the node or pod,
  // shared by its GPUs): the limits the prediction takes (0: the profile's).
  ResourceLimits limits;
};

struct PublishedSource {
  std::string id, title, url, retrieved, engine, notes, file;
  // [source.memory_habits]: memory coefficients (is_memory_coef) of the model implementation the
  // source ran, read from its code (e.g. its loss's bytes per logit); they replace the profile's.
  std::map<Coef, double> memory_habits;
  bool grad_sync_each = false;  // [source] grad_sync = "each": FSDP2 reduces after every micro-batch
  std::vector<PublishedRow> rows;
};

// Reads one file; every bad key or value throws InputError naming the file and key. Models
// and hardware are resolved in data_dir (the row's GPU count becomes nodes x GPUs per node
// of the profile's node size).
PublishedSource load_published(const std::filesystem::path& file, const std::filesystem::path& data_dir);

// The files of data_dir/published, sorted.
std::vector<std::filesystem::path> published_files(const std::filesystem::path& data_dir);

// A row's prediction on `hw`: the source engine's view of the profile, with the source's memory
// habits over its coefficients.
Prediction predict_row(const PublishedSource& s, const PublishedRow& row, const HardwareProfile& hw);

// How the coefficients a prediction for `engine` on `hw` uses were obtained: "calibrated",
// "hardware calibrated, engine not", "engine from REF, hardware uncalibrated" (engines_from)
// or "uncalibrated".
std::string coefficient_status(const HardwareProfile& hw, const std::string& engine);

// The 95 % split-conformal quantile of |log(published / predicted tokens/s)| over the rows
// (the ceil(0.95 (n + 1))-th smallest, the largest when n < 19): the interval of predictions
// on GPUs that were not calibrated ([coefficients] transferred_log_q95).
// `without_offload`: the same over the rows without CPU offload ([coefficients]
// transferred_log_q95_no_offload). Both from one prediction of the rows.
struct PublishedLogQ95 {
  double all = 0, without_offload = 0;
};
PublishedLogQ95 published_log_q95(const std::vector<PublishedSource>& sources, const std::filesystem::path& data_dir);

// `calibrate report --published`: predicts every row with the catalog's profiles (the row's
// engine coefficients where the profile has a section, else the hardware's) and prints the
// table, the error per source and overall (or JSON). Returns the exit status.
int run_published_report(const std::vector<std::string>& files, const std::string& data_dir_flag, bool json);

}  // namespace stepcast::calibrate
