#include "planner/validate.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "calibrate/measure.h"
#include "calibrate/run_record.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/process.h"
#include "common/stats.h"
#include "common/text_file.h"
#include "planner/report.h"

namespace stepcast {

std::vector<size_t> plans_to_validate(size_t ranked, int top, int sample, uint64_t seed) {
  std::vector<size_t> out;
  const size_t k = std::min(ranked, static_cast<size_t>(std::max(top, 0)));
  for (size_t i = 0; i < k; ++i) out.push_back(i);
  const auto add = [&](size_t i) {
    if (i < ranked && std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  };
  const size_t spread = static_cast<size_t>(std::max(sample, 0)) / 2 + static_cast<size_t>(std::max(sample, 0)) % 2;
  const size_t rest = ranked > k ? ranked - k : 0;
  for (size_t j = 1; j <= spread && rest > 0; ++j) add(k + (rest * j) / (spread + 1));
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<size_t> pick(0, ranked ? ranked - 1 : 0);
  const size_t want = std::min(ranked, k + static_cast<size_t>(std::max(sample, 0)));
  for (int tries = 0; out.size() < want && tries < 10000; ++tries) add(pick(gen));
  return out;
}

int validate_plans(const SearchRequest& req, const SearchResult& res, const ValidateOptions& v) {
  namespace fs = std::filesystem;
  const TrainConfig& base = req.base;
  const std::string train = sibling_binary(v.train, "backend", "train");
  // Plans and each run's records go to a scratch folder that goes with this process.
  const ScratchFolder scratch("stepcast_validate_");
  const fs::path tmp = scratch.path();
  const std::string log = v.append;
  const InterruptGuard guard;  // Ctrl-C stops between plans, --append keeps every completed run
  ReportContext ctx{&req.model, &req.hardware, 0};
  struct Measured {
    const Prediction* plan;
    double step_s = 0, tokens_per_s = 0;
    int rc = 0;
  };
  std::vector<Measured> out;
  const std::vector<size_t> chosen = plans_to_validate(res.ranked.size(), v.top, v.sample, v.seed);
  const size_t k = chosen.size();
  for (size_t i = 0; i < k; ++i) {
    const Prediction& p = res.ranked[chosen[i]];
    const fs::path plan = tmp / ("plan" + std::to_string(i) + ".json");
    nlohmann::json pj;
    pj["plans"] = nlohmann::json::array({plan_to_json(p, ctx)});
    write_file_atomic(plan, pj.dump());
    const fs::path mine = tmp / ("run" + std::to_string(i) + ".jsonl");
    std::fprintf(stderr, "validate: [%zu/%zu] %s, micro-batch %lld, GAS %lld ...\n", i + 1, k,
                 family_name(p.config).c_str(), static_cast<long long>(p.config.micro_batch),
                 static_cast<long long>(p.config.gas));
    calibrate::TrainLaunch launch;
    launch.train = train;
    launch.model = v.model;
    launch.plan = plan.string();
    launch.nproc = base.gpus_per_node;
    launch.steps = v.steps;
    launch.device = v.device;
    launch.hardware = v.hardware;
    launch.data_dir = v.data_dir;
    launch.json_out = mine.string();
    Measured m{&p};
    m.rc = calibrate::run_train(launch).exit_status;
    if (interrupt_signal() != 0)
      throw InterruptedError(std::string(strsignal(interrupt_signal())) + " after " + std::to_string(i) + " of " +
                             std::to_string(k) + " plans" + (log.empty() ? "" : "; " + log + " holds the completed ones"));
    if (fs::exists(mine)) {
      // The median of the measured steps, as calibrate reads them.
      const auto recs = calibrate::load_runs({mine}, resolve_data_dir(v.data_dir));
      if (!recs.empty() && recs.front().step_s > 0) {
        m.step_s = recs.front().step_s;
        m.tokens_per_s = static_cast<double>(p.config.global_batch() * p.config.seq_len) / m.step_s;
      }
      std::string lines = read_text_file(mine);
      lines.resize(lines.rfind('\n') + 1);  // whole lines only (npos + 1 == 0: none)
      if (!log.empty() && !lines.empty()) append_lines(log, lines);
    }
    out.push_back(m);
  }
  double best = 0;
  for (const auto& m : out) best = std::max(best, m.tokens_per_s);
  // A top plan that did not run (out of memory, ...) loses everything: regret 100 %.
  const bool top_failed = out.front().rc != 0 || out.front().tokens_per_s <= 0;
  const double regret = top_failed ? 1.0 : (best > 0 ? 1.0 - out.front().tokens_per_s / best : 0.0);
  // The ranking's quality over the plans that ran.
  std::vector<double> predicted, measured;
  for (const auto& m : out)
    if (m.rc == 0 && m.tokens_per_s > 0) {
      predicted.push_back(m.plan->throughput.tokens_per_s);
      measured.push_back(m.tokens_per_s);
    }
  const double tau = kendall_tau_b(predicted, measured);
  if (v.json) {
    nlohmann::json j;
    j["model"] = model_to_json(req.model);
    j["runs_file"] = log.empty() ? nlohmann::json(nullptr) : nlohmann::json(log);
    j["validated"] = nlohmann::json::array();
    for (const auto& m : out) {
      nlohmann::json r = plan_to_json(*m.plan, ctx);
      r["measured"] = {{"exit_code", m.rc}, {"step_s", m.step_s}, {"tokens_per_s", m.tokens_per_s}};
      r["step_error_pct"] = m.step_s > 0 ? 100.0 * (m.plan->time.step_s / m.step_s - 1) : 0.0;
      r["rank"] = (m.plan - res.ranked.data()) + 1;
      j["validated"].push_back(r);
    }
    j["top_plan_regret"] = regret;
    j["kendall_tau"] = predicted.size() >= 2 ? nlohmann::json(tau) : nlohmann::json(nullptr);
    j["ranked_plans"] = res.ranked.size();
    j["top_plan_failed"] = top_failed;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%-4s %-48s %6s %4s %10s %10s %8s %12s %12s\n", "rank", "plan", "micro", "GAS", "pred step", "meas step",
                "error", "pred tok/s", "meas tok/s");
    std::printf("%-4s %-48s %6s %4s %10s %10s %8s %12s %12s\n", "", "", "", "", "s", "s", "%", "", "");
    for (size_t i = 0; i < out.size(); ++i) {
      const auto& m = out[i];
      const std::string label = family_name(m.plan->config) + (m.plan->config.activation_checkpointing ? " + ckpt" : "");
      const std::string err = m.step_s > 0 ? fmt("%+8.1f", 100.0 * (m.plan->time.step_s / m.step_s - 1)) : "     n/a";
      std::printf("%-4zu %-48s %6lld %4lld %10.3f %10.3f %8s %12.0f %12.0f%s\n",
                  static_cast<size_t>(m.plan - res.ranked.data()) + 1, label.c_str(),
                  static_cast<long long>(m.plan->config.micro_batch), static_cast<long long>(m.plan->config.gas),
                  m.plan->time.step_s, m.step_s, err.c_str(), m.plan->throughput.tokens_per_s, m.tokens_per_s,
                  m.rc ? ("  (train exited " + std::to_string(m.rc) + (m.rc == 3 ? ": out of memory" : "") + ")").c_str() : "");
    }
    if (top_failed)
      std::printf("the top plan did not run: regret 100 %% (the best plan that ran reached %.0f tokens/s)\n", best);
    else
      std::printf("regret of the top plan against the best measured: %.1f %%\n", 100.0 * regret);
    if (predicted.size() >= 2)
      std::printf("Kendall's tau, predicted against measured tokens/s over the %zu plans that ran: %.2f\n",
                  predicted.size(), tau);
    if (log.empty()) std::printf("(--append FILE keeps the measured steps for calibrate fit)\n");
    else std::printf("runs appended to %s (refit: calibrate fit --runs ...)\n", log.c_str());
  }
  for (const auto& m : out)
    if (m.rc != 0) return 1;
  return 0;
}

}  // namespace stepcast
