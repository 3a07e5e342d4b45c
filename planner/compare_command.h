// `planner compare`'s command: its options and the run (planner/compare.h has the arithmetic it
// uses: run cost, the Pareto front, the picks, the layouts, the SVG).
#pragma once

#include <string>
#include <vector>

#include "planner/k8s_manifest.h"
#include "planner/options.h"

namespace stepcast {

struct CompareOptions {
  CommonOptions common;  // model, seq, precision, attention, data dir, json, train tokens
  std::string hardware_list;  // comma-separated; empty: every profile with a price
  int max_gpus = 16;
  double deadline_hours = 0;
  double budget_usd = 0;
  std::vector<std::string> prices;  // KIND=USD
  std::string provider;
  std::string engine = "stepcast";
  int64_t global_batch = 64;
  std::string svg;
  std::string k8s_manifest;
  ManifestRequest manifest;
};

// Prints the table (or --json), writes the SVG and the manifest where asked; returns the exit status.
int run_compare(CompareOptions& co);

}  // namespace stepcast
