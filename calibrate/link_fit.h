// The inter-node link of a host, measured: from collective micro-benchmarks timed across nodes
// (microbench --suite collectives --emulate-nodes K on one host: records with "nodes" > 1), the rate
// and latency that a profile's [links] inter_node_bytes_per_s and inter_node_latency_s must hold
// for the model's own collective formula (predict_micro, model/step_time.h collective_time_s) to
// reproduce the records, every coefficient held at the profile's. Two numbers from a direct
// search, no Ceres: it runs on the GPU host between the micro-benchmarks and the prediction of
// the step runs that follow them (bench/two_node_emulation.sh).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "calibrate/micro_record.h"
#include "model/hardware.h"

namespace stepcast::calibrate {

struct LinkFit {
  double inter_node_bytes_per_s = 0;
  double inter_node_latency_s = 0;
  double rms_log_error = 0;          // sqrt(mean(log(predicted / measured)^2)) over `records`
  std::vector<MicroRecord> records;  // the collectives across nodes, in file order
  std::vector<double> predicted_s;   // each record predicted with the fitted link
};

// The records of `micro` that time a collective across nodes (nodes > 1). InputError naming the
// files' lack when there is none.
LinkFit fit_inter_node_link(const std::vector<MicroRecord>& micro, const HardwareProfile& hw);

// `profile_text` with its name and its [links] inter_node_bytes_per_s and inter_node_latency_s
// set (each with `source`); InputError naming `origin` and the key where one is missing.
std::string with_inter_node_link(const std::string& profile_text, const std::string& origin, const std::string& name,
                                 double bytes_per_s, double latency_s, const std::string& source);

// calibrate link --runs MICRO... --hardware H --out FILE.toml [--json]: writes H's profile with
// the measured link as FILE.toml (its name FILE's stem) and prints each record against it.
int run_link(const std::vector<std::string>& run_files, const std::string& hw_name, const std::string& out_path,
             const std::string& dir, bool json);

}  // namespace stepcast::calibrate
