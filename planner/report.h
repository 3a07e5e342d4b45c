// Rendering of plans: the text tables (with a units row) and the JSON
// contract that later tools and tests read (see README "JSON contract").
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "planner/plan_search.h"

namespace stepcast {

struct ReportContext {
  const ModelSpec* model = nullptr;
  const HardwareProfile* hardware = nullptr;
  double train_tokens = 0;  // > 0: show time and cost to train on this many tokens
};

nlohmann::json plan_to_json(const Prediction& p, const ReportContext& ctx);
nlohmann::json model_to_json(const ModelSpec& m);
nlohmann::json hardware_to_json(const HardwareProfile& hw, const TrainConfig& base);

// The founding report's columns plus tokens/s, MFU and memory; one row per plan.
std::string plans_table(const std::vector<Prediction>& plans, const ReportContext& ctx);

// One configuration's step-time and memory breakdown.
std::string breakdown_text(const Prediction& p, const ReportContext& ctx);

// Header line: model, parameters, hardware, calibration status.
std::string context_line(const Prediction& any, const ReportContext& ctx);

// One number by a printf format ("%.1f"), as the tables print it.
std::string fmt(const char* format, double v);
std::string format_gib(double bytes);

}  // namespace stepcast
