// `planner compare`: the best plan for a whole fine-tune on each GPU kind and GPU count, with
// its wall-clock, its price and its uncertainty; the Pareto front of cost against time.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/plan_search.h"

namespace stepcast {

// One candidate: a GPU kind at one GPU count, priced by one provider.
struct CompareRow {
  std::string hardware;        // profile name
  std::string provider;        // the offer that priced it ("--price" when overridden)
  double usd_per_gpu_hour = 0;
  bool kubernetes = false;
  bool includes_host = false;
  bool calibrated = false;     // the profile's coefficients were fitted on that GPU
  int gpus_per_node = 1;
  int nodes = 1;
  Prediction plan;             // the best plan as recommend ranks it
  double wall_s = 0;           // the whole run
  double gpu_hours = 0;
  double cost_usd = 0;
  double interval_frac = 0;    // ±95 % of the step time, relative; 0 = unknown
  std::vector<std::string> flags;  // e.g. the pod's size is not published
  bool on_front = false;       // no other row is at once cheaper and faster
  double pod_cores_per_gpu = 0;  // the offer's vCPUs per GPU, else the profile's cores per GPU
  std::string gpu_name;        // the profile's GPU name (for the manifest's node affinity)
  int gpus() const { return gpus_per_node * nodes; }
};

// Seconds, GPU-hours and dollars for `train_tokens` at `tokens_per_s` on `gpus` GPUs at
// `usd_per_gpu_hour`: wall = T / rate; GPU-hours = wall / 3600 x GPUs; cost = GPU-hours x price.
struct RunCost {
  double wall_s = 0;
  double gpu_hours = 0;
  double cost_usd = 0;
};
RunCost run_cost(double train_tokens, double tokens_per_s, int gpus, double usd_per_gpu_hour);

// Marks the rows no other row dominates: row i is dominated when some row j costs no more and
// takes no longer, and is strictly better in one of the two.
void mark_pareto_front(std::vector<CompareRow>& rows);

// The cheapest row that finishes within `deadline_s` (0: none asked) and the fastest row that
// costs at most `budget_usd` (0: none asked); indices into rows, nullopt when no row qualifies.
std::optional<size_t> cheapest_within(const std::vector<CompareRow>& rows, double deadline_s);
std::optional<size_t> fastest_within(const std::vector<CompareRow>& rows, double budget_usd);

// GPU counts tried on a kind: 1, 2, 4, ... GPUs in one node up to its gpus_per_node_max, then
// whole nodes (2, 4, ... of them), all up to max_gpus. Returns (GPUs per node, nodes) pairs.
std::vector<std::pair<int, int>> gpu_layouts(int gpus_per_node_max, int max_gpus);

// "KIND=USD" items of --price; throws InputError naming the item when malformed.
std::map<std::string, double> parse_price_overrides(const std::vector<std::string>& items);

// The SVG scatter of cost (x) against wall-clock (y), front rows joined and labelled.
std::string compare_svg(const std::vector<CompareRow>& rows, const std::string& title);

}  // namespace stepcast
