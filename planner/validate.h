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
  int64_t steps = 4;
  std::string train;   // path of the train binary (default: beside this build's planner)
  std::string device = "auto";
  std::string append;  // JSONL to append the runs to (for a refit); default: none kept
  std::string pipeline = "full";  // offload plans: as recommend's --offload-pipeline
  std::string model, hardware, data_dir;  // as given to the planner (train resolves them the same way)
  bool json = false;
};

// Runs the first `top` plans of `res`; returns the exit status (1 when a plan did not run).
int validate_plans(const SearchRequest& req, const SearchResult& res, const ValidateOptions& v);

}  // namespace stepcast
