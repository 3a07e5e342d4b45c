// planner validate: runs the top plans on the backend (`train --plan`, a few
// steps each, through calibrate/measure.h), prints predicted against measured
// and the regret of the top plan against the best measured one, and appends the
// run records for a refit.
#pragma once

#include <cstdint>
#include <string>

#include "planner/plan_search.h"

namespace stepcast {

struct ValidateOptions {
  int top = 3;
  // Further plans to measure beside the top ones, for the ranking's quality: half spread evenly
  // over the rest of the ranking, half drawn at random among the fitting plans (seeded).
  int sample = 0;
  uint64_t seed = 1;
  int64_t steps = 4;
  std::string train;   // path of the train binary (default: beside this build's planner)
  std::string device = "auto";
  std::string append;  // JSONL to append the runs to (for a refit); default: none kept
  std::string pipeline = "full";  // offload plans: as recommend's --offload-pipeline
  std::string model, hardware, data_dir;  // as given to the planner (train resolves them the same way)
  bool json = false;
};

// The plans validate runs: the first `top` of the ranking, then `sample` more (indices into
// res.ranked, in the order run): ranks spread evenly below the top ones, then random ones.
std::vector<size_t> plans_to_validate(size_t ranked, int top, int sample, uint64_t seed);

// Runs the chosen plans of `res`; prints predicted against measured, Kendall's tau between
// predicted and measured tokens/s over the plans that ran, and the top plan's regret against
// the best measured one. Returns the exit status (1 when a plan did not run).
int validate_plans(const SearchRequest& req, const SearchResult& res, const ValidateOptions& v);

}  // namespace stepcast
