// Planner speed: evaluations of the cost model per second (one thread) and
// the wall time of a whole `recommend --model 6b --gpus 2` (parsing the
// catalog and profile, searching, ranking). Prints medians over repeats with
// their spread, and ratios against the goals of issue "Planner v1" (10^6
// evaluations/s; a recommend well under 100 ms). For scale: Calculon, the
// nearest analytic tool, evaluates ~300 configurations/s (Isaev et al., "Calculon", SC 2023).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "model/prediction.h"
#include "planner/plan_search.h"

#include "bench/bench_util.h"

using namespace stepcast;
using Clock = std::chrono::steady_clock;
using stepcast::median;

namespace {

double spread(const std::vector<double>& v) {
  auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return *hi - *lo;
}

}  // namespace

int main() {
  const auto data = std::filesystem::path(STEPCAST_DATA_DIR);
  const ModelSpec model = resolve_model("6b", data);
  const HardwareProfile hw = resolve_hardware("h200-sxm", data);

  // The configurations recommend enumerates, as features (resolved once).
  std::vector<std::pair<Features, TrainConfig>> configs;
  for (int stage = 0; stage <= 3; ++stage)
    for (int off = 0; off <= (stage > 0 ? 1 : 0); ++off)
      for (int opt = 0; opt <= 1; ++opt)
        for (int ckpt = 0; ckpt <= 1; ++ckpt)
          for (int64_t micro : {1, 2, 4, 8, 16, 32}) {
            TrainConfig c;
            c.zero_stage = stage;
            c.offload_optimizer = off ? OffloadDevice::kCpu : OffloadDevice::kNone;
            c.optimizer = opt ? OptimizerKind::kAdamW8bit : OptimizerKind::kAdamW;
            c.activation_checkpointing = ckpt;
            c.micro_batch = micro;
            c.gas = 32 / micro;
            c.gpus_per_node = 2;
            configs.emplace_back(make_features(model, hw, c), c);
          }

  // 1. Evaluations (features -> step time, memory, throughput, fit) per second.
  std::vector<double> evals_per_s;
  double sink = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const int iters = 20000;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      const auto& [f, c] = configs[static_cast<size_t>(i) % configs.size()];
      sink += evaluate_features(f, c, hw, hw.coefs, {}).time.step_s;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    evals_per_s.push_back(iters / s);
  }
  // 2. Same including the feature resolution (what the search loop does for
  //    every configuration; intervals are added to the shown plans only).
  std::vector<double> full_per_s;
  for (int rep = 0; rep < 7; ++rep) {
    const int iters = 20000;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      const auto& c = configs[static_cast<size_t>(i) % configs.size()].second;
      sink += evaluate_features(make_features(model, hw, c), c, hw, hw.coefs, {}).time.step_s;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    full_per_s.push_back(iters / s);
  }
  // Reference, same run: the public evaluate() per configuration, as `explain`
  // does it (features + model + the 95 % interval's 2 x coefficients extra evaluations).
  std::vector<double> ref_per_s;
  for (int rep = 0; rep < 7; ++rep) {
    const int iters = 2000;
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      const auto& c = configs[static_cast<size_t>(i) % configs.size()].second;
      sink += evaluate(model, hw, c).time.step_s;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    ref_per_s.push_back(iters / s);
  }
  // 3. A whole recommend: resolve model and hardware from data/, search, rank.
  std::vector<double> recommend_ms;
  for (int rep = 0; rep < 15; ++rep) {
    const auto t0 = Clock::now();
    SearchRequest req;
    req.model = resolve_model("6b", data);
    req.hardware = resolve_hardware("h200-sxm", data);
    req.base.gpus_per_node = 2;
    SearchResult res = search_plans(req);
    sink += res.ranked.empty() ? 0 : res.ranked.front().time.step_s;
    recommend_ms.push_back(1e3 * std::chrono::duration<double>(Clock::now() - t0).count());
  }

  std::printf("planner benchmark (one thread), gpt-j-6b on 2 x h200-sxm, %zu configurations\n", configs.size());
  const double ref = median(ref_per_s);
  std::printf("%-40s %14s %12s %12s %12s\n", "measure", "median", "spread", "vs goal", "vs reference");
  std::printf("%-40s %14s %12s %12s %12s\n", "", "", "", "(x)", "(x)");
  std::printf("%-40s %14.3g %12.3g %12s %12.1f   reference: evaluate() with interval, same run\n",
              "evaluations/s (explain path)", ref, spread(ref_per_s), "", 1.0);
  std::printf("%-40s %14.3g %12.3g %12.1f %12.1f   goal 1e6 evaluations/s\n", "evaluations/s (features precomputed)",
              median(evals_per_s), spread(evals_per_s), median(evals_per_s) / 1e6, median(evals_per_s) / ref);
  std::printf("%-40s %14.3g %12.3g %12.1f %12.1f   goal 1e6 evaluations/s (the search's hot path)\n",
              "evaluations/s (with feature resolution)", median(full_per_s), spread(full_per_s), median(full_per_s) / 1e6,
              median(full_per_s) / ref);
  std::printf("%-40s %11.2f ms %9.2f ms %12.1f   goal < 100 ms (ratio = 100 ms / median)\n",
              "recommend --model 6b --gpus 2", median(recommend_ms), spread(recommend_ms),
              100.0 / median(recommend_ms));
  std::printf("reference: Calculon ~300 configurations/s (published); ratio %.0fx\n",
              median(evals_per_s) / 300.0);
  return sink > 0 ? 0 : 1;
}
