// `planner diagnose`: its flags and the command (planner/diagnose.h holds the analysis).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "planner/options.h"

namespace stepcast {

struct DiagnoseOptions {
  CommonOptions common;
  ExplainOptions config;
  // Measured per optimizer step; negative: not given.
  double step_s = -1, gas_s = -1, opt_s = -1, forward_s = -1, backward_s = -1, optimizer_s = -1;
  double peak_reserved_gib = -1;
  std::vector<std::string> runs;  // JSONL run records (train --json-out, the peer harnesses)
  std::string key;                // which configuration of them
  bool all = false;               // every configuration of them, together
  std::string published;          // a data/published source: its rows with phases
  std::string row;                // which of its rows
  bool leave_one_out = false;     // each run predicted from the others' diagnosis
  int top = 3;                    // plans shown for the machine as diagnosed
};

// Registers the subcommand's flags; `app` is the diagnose subcommand.
void add_diagnose(CLI::App* app, DiagnoseOptions& d);

// Runs it (after parsing): 0, or an InputError for bad input.
int run_diagnose(const CLI::App& app, DiagnoseOptions d);

}  // namespace stepcast
