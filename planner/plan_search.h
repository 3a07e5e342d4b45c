// The planner's search: enumerate ZeRO stage x optimizer offload x parameter
// offload x optimizer x checkpointing x micro-batch x GAS, evaluate each with
// the cost model, keep why the losers lose.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/prediction.h"

namespace stepcast {

// The global batch rule: an optimizer step's sequences divide evenly over the data-parallel
// ranks (each rank runs micro-batch x GAS of them); 0 (free) divides over any count.
inline bool batch_divides_ranks(int64_t global_batch, int64_t world) {
  return world >= 1 && global_batch % world == 0;
}
// A batch the user left at its default rounds up to the next multiple of the ranks, so any
// --gpus and --nodes have plans (64 on 3 ranks: 66); a batch the user gives must divide.
inline int64_t default_batch_for_ranks(int64_t default_batch, int64_t world) {
  return world >= 1 ? (default_batch + world - 1) / world * world : default_batch;
}

struct SearchRequest {
  ModelSpec model;
  HardwareProfile hardware;
  TrainConfig base;          // seq_len, precision, gpus_per_node, nodes, attention
  ResourceLimits limits;
  int64_t global_batch = 64; // sequences per optimizer step; 0 = free (GAS from gas_values)
  std::vector<OptimizerKind> optimizers = {OptimizerKind::kAdamW, OptimizerKind::kAdamW8bit};
  std::vector<int64_t> micro_batches = {1, 2, 4, 8, 16, 32, 64};
  std::vector<int64_t> gas_values = {1, 2, 4, 8, 16, 32};  // when global_batch == 0
  std::vector<int> stages = {0, 1, 2, 3};
  bool allow_offload = true;
  // A peer engine (base.engine DeepSpeed or FSDP2): its CPU optimizer runs after the backward
  // (serial offload); what else it cannot run validate_config refuses.
  bool peer_engine() const { return base.engine != Engine::kStepcast; }
  // Stepcast backend: offload plans let the last CPU updates overlap the next forward
  // (--offload-pipeline full) instead of ending the step.
  bool overlap_forward = false;
  std::vector<bool> checkpointing = {false, true};
  // Fine-tuning methods to search (recommend --peft auto: full, LoRA and QLoRA side by side);
  // empty: the base configuration's alone.
  std::vector<PeftKind> pefts;
};

// The best configuration of one family (stage + offload + optimizer) and why
// it loses to the overall best.
struct FamilyOutcome {
  std::string family;
  bool any_fits = false;
  std::optional<Prediction> best;            // best fitting member
  std::optional<Prediction> smallest_memory; // when none fits: the least GPU memory member
  double loss_frac = 0;                      // 1 - best tokens/s / top tokens/s
  std::string why;                           // one line
};

struct SearchResult {
  std::vector<Prediction> ranked;  // fitting configurations, best first
  std::vector<FamilyOutcome> families;  // best family first
  size_t evaluated = 0;
  size_t dropped = 0;  // evaluated but not fitting
  std::optional<Prediction> smallest_memory;  // overall, for "nothing fits"
  std::vector<std::string> suggestions;       // when nothing fits: what would
  std::vector<std::string> notes;             // e.g. skipped equivalents
  // The model's typical relative step-time error (one standard deviation; 0 when the profile
  // has none) and how many of the ranked plans lie within it of the top plan's tokens/s:
  // the plans the model cannot order.
  double typical_error_frac = 0;
  size_t tied_with_top = 0;
  // The best plan the card holds inside its headroom only (Prediction::tight), where it ranks above
  // the top plan: what accepting the memory model's risk would buy. Not ranked.
  std::optional<Prediction> best_tight;
};

// One standard deviation of the relative step-time error a profile's predictions carry: its
// fit's RMS residual where calibrated, else its transferred 95 % quantile / 1.96.
double typical_error_frac(const HardwareProfile& hw);

// Runs the search. Throws InputError for impossible requests (global batch
// not divisible by the world size, ...).
SearchResult search_plans(const SearchRequest& request);

// How much machinery a configuration adds: the sum of the weights of the mechanisms it turns on
// (parameter offload 2, optimizer offload 1, stage 3, 8-bit states and checkpointing 0.5 each).
// Plans are ranked by tokens/s x (1 - kHandicapPerComplexity x complexity): a plan must beat a
// simpler one by that margin to rank above it. The margin is smaller than the model's error
// (SearchResult::typical_error_frac); plans inside that error of the top plan are reported as
// ones the model does not order.
struct Mechanism {
  std::string_view name;
  double weight;
  bool (*on)(const TrainConfig&);
};
const std::vector<Mechanism>& complexity_mechanisms();
inline constexpr double kHandicapPerComplexity = 0.005;
double complexity(const TrainConfig& config);
double ranking_score(const Prediction& p);
// "0.25-1 %": the smallest and largest handicap one mechanism adds.
std::string handicap_range_text();

// What one change to a CPU-offload plan would buy, the global batch kept.
struct Lever {
  std::string name;        // "8-bit CPU AdamW states", "GAS x2 (micro-batch / 2)", ...
  Prediction result;
  double gain_frac = 0;    // tokens/s relative to the plan: +0.35 = 35 % faster
};

// Levers of an offload plan: 8-bit states, the micro-batch/GAS split, checkpointing, no
// parameter offload, no optimizer offload, twice the CPU cores; each evaluated with the
// same model, fitting or not. Fitting levers first, best first.
std::vector<Lever> offload_levers(const SearchRequest& request, const Prediction& plan);

// "the CPU AdamW", "exposed gradient reduction", ... : the component of a
// step that costs the most beyond forward and backward compute, with its share of the step.
std::string dominant_cost(const Prediction& p, double* share_out = nullptr);

}  // namespace stepcast
