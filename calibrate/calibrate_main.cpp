// calibrate: fits the cost model to measured runs and reports its accuracy.
//
//   calibrate fit    --runs data/runs/h200-sxm/*.jsonl --hardware h200-sxm [--out FILE] [--holdout-frac 0.25]
//   calibrate fit    --runs micro.jsonl --hardware a40 [--out FILE]   (micro-benchmarks alone: the
//                    components microbench timed on that hardware, as [coefficients.measured])
//   calibrate report --runs ... --hardware h200-sxm [--json] [--svg FILE]
//   calibrate report --published [FILE...] [--json]   (data/published: others' measurements)
//   calibrate predict --list bench/runlists/X.txt --engine deepspeed [--out FILE] [--json]
//                     (a designed hold-out's predictions, before it is measured)
//   calibrate measure --list bench/runlists/calibration.txt --out DIR   (on a GPU host:
//                     micro-benchmarks, then the designed step runs)
//   calibrate link    --runs micro.jsonl --hardware h200-sxm --out DIR/NAME.toml   (the inter-node
//                     link from collectives timed across nodes; no Ceres, so on the GPU host too)
#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#ifdef STEPCAST_HAVE_CERES
#include "calibrate/fit_command.h"
#endif
#include "calibrate/link_fit.h"
#include "calibrate/measure.h"
#include "calibrate/published.h"
#include "calibrate/report.h"
#ifdef STEPCAST_HAVE_CERES
#include "calibrate/cross_validate.h"
#endif
#include "common/cli.h"
#include "common/errors.h"
#include "common/parallel.h"
#include "common/run_main.h"

namespace stepcast::calibrate {
namespace {

int main_impl(int argc, char** argv) {
  CLI::App app{"Stepcast calibrate: fits the cost model's coefficients to measured runs (Ceres) and reports accuracy."};
  app.require_subcommand(1);
  std::vector<std::string> runs;
  std::string hardware = "h200-sxm", out, dir, svg;
  double holdout = kDefaultHoldoutSplit.frac;
  uint64_t seed = kDefaultHoldoutSplit.seed;
  bool json = false;
  std::string fit_engine = "stepcast";
  for (CLI::App* sub : {app.add_subcommand("fit", "fit the coefficients and write a calibrated profile"),
                        app.add_subcommand("report", "predicted vs measured for every run")}) {
    sub->add_option("--runs", runs, sub->get_name() == "fit"
                                        ? "JSONL files written by train --json-out"
                                        : "JSONL files written by train --json-out (default: the runs the profile was fitted from)");
    sub->add_option("--hardware", hardware, "hardware profile name or .toml")->capture_default_str();
    sub->add_option("--holdout-frac", holdout, "share of configurations the fit never sees")->capture_default_str();
    sub->add_option("--seed", seed, "hold-out split seed")->capture_default_str();
    sub->add_option("--data-dir", dir, "folder with models/ and hardware/");
    sub->add_flag("--json", json, "print JSON");
    sub->add_option("--engine", fit_engine,
                    "stepcast (the hardware coefficients) | deepspeed | fsdp2 (that engine's section [engines.NAME], "
                    "from its runs only)")
        ->capture_default_str();
  }
  unsigned threads = 0;
  for (CLI::App* sub : {app.get_subcommand("fit"), app.get_subcommand("report")})
    sub->add_option("--threads", threads,
                    "threads for the cross-validation's and the bootstrap's refits (0: every hardware thread); "
                    "the results do not depend on it")
        ->capture_default_str();
  app.get_subcommand("fit")->add_option("--out", out, "calibrated profile to write (default: the profile itself)");
  app.get_subcommand("report")->add_option("--svg", svg, "write a predicted-vs-measured plot");
  bool no_cv = false;
  app.get_subcommand("report")->add_flag(
      "--no-cv", no_cv,
      "predicted against measured only: no cross-validation and no coefficient bootstrap (seconds, not minutes; "
      "the --json has no \"cv\" and no \"coefficients\")");
  std::vector<std::string> published;
  CLI::Option* published_opt =
      app.get_subcommand("report")
          ->add_option("--published", published,
                       "predict published throughputs instead of runs: the given data/published/*.toml files, or "
                       "all of them")
          ->expected(0, -1);
  std::string list, out_dir = "calibration", train, device = "auto";
  int64_t steps = 4;
  double budget = 0;
  CLI::App* measure = app.add_subcommand("measure", "run a designed list of configurations with train (GPU host)");
  measure->add_option("--list", list, "run list: MODEL NPROC [train flags] per line")->required();
  measure->add_option("--out", out_dir, "folder for runs.jsonl and train.log")->capture_default_str();
  measure->add_option("--steps", steps, "steps per configuration (the first is warm-up)")->capture_default_str();
  measure->add_option("--budget-min", budget, "stop starting new configurations after this many minutes (0 = no limit)");
  measure->add_option("--train", train, "path of the train binary");
  measure->add_option("--device", device, "auto | cpu | cuda")->capture_default_str();
  measure->add_option("--data-dir", dir, "folder with models/ and hardware/");
  bool no_micro = false;
  measure->add_flag("--no-micro", no_micro, "skip the micro-benchmarks (microbench) before the step runs");
  std::string micro_flags;
  measure->add_option("--micro-flags", micro_flags, "extra flags for microbench (e.g. --quick)");
  PeerMeasure peer;
  std::string engine = "stepcast";
  measure->add_option("--engine", engine,
                      "stepcast: the backend (train); deepspeed | fsdp2: the peer harness bench/peers/peer.py under "
                      "torchrun, with the plan (and DeepSpeed JSON) planner explain writes for each line")
      ->capture_default_str();
  measure->add_option("--python", peer.python, "peer engines: the Python with torch (and transformers)")->capture_default_str();
  measure->add_option("--peer-script", peer.peer_script, "peer engines: the harness (default: the source tree's)");
  measure->add_option("--planner", peer.planner, "peer engines: the planner binary (default: beside calibrate)");
  measure->add_option("--hardware", peer.hardware, "peer engines: the hardware profile the plans are made for")
      ->capture_default_str();
  measure->add_option("--timeout-s", peer.timeout_s, "peer engines: the longest one configuration may take")
      ->capture_default_str();
  PredictList predict;
  CLI::App* predict_cmd =
      app.add_subcommand("predict", "predict a run list with this build's profile before it is measured");
  predict_cmd->add_option("--list", predict.list, "run list: MODEL NPROC [planner explain flags] per line")->required();
  predict_cmd->add_option("--engine", predict.engine, "stepcast | deepspeed | fsdp2")->capture_default_str();
  predict_cmd->add_option("--hardware", predict.hardware, "hardware profile name or .toml")->capture_default_str();
  predict_cmd->add_option("--out", predict.out, "file to write (default: stdout)");
  predict_cmd->add_option("--data-dir", predict.data_dir, "folder with models/ and hardware/");
  predict_cmd->add_option("--planner", predict.planner, "the planner binary (default: beside calibrate)");
  predict_cmd->add_flag("--json", predict.json, "print JSON");
  std::vector<std::string> link_runs;
  std::string link_out;
  bool link_json = false;
  CLI::App* link_cmd = app.add_subcommand(
      "link", "the inter-node link from collective micro-benchmarks timed across nodes: a profile with it");
  link_cmd->add_option("--runs", link_runs, "microbench JSONL with collectives across nodes (--emulate-nodes K)")->required();
  link_cmd->add_option("--hardware", hardware, "the profile it starts from: name or .toml")->capture_default_str();
  link_cmd->add_option("--out", link_out, "the .toml to write (its name: the file's stem)")->required();
  link_cmd->add_option("--data-dir", dir, "folder with models/ and hardware/");
  link_cmd->add_flag("--json", link_json, "print JSON");
  if (const auto status = parse_cli(app, argc, argv, "calibrate")) return *status;
  if (threads > 4096) throw InputError("--threads " + std::to_string(threads) + " is out of range [0, 4096]");
  default_parallel_threads() = threads;
  if (app.got_subcommand("predict")) return run_predict_list(predict);
  if (app.got_subcommand("link")) return run_link(link_runs, hardware, link_out, dir, link_json);
  if (app.got_subcommand("measure") && engine != "stepcast") {
    peer.engine = engine;
    peer.list = list;
    peer.out_dir = out_dir;
    peer.steps = steps;
    peer.budget_min = budget;
    peer.data_dir = dir;
    if (!(peer.timeout_s >= 10 && peer.timeout_s <= 86400))
      throw InputError("--timeout-s " + std::to_string(peer.timeout_s) + " is out of range [10, 86400]");
    return run_peer_measure(peer);
  }
  if (app.got_subcommand("measure")) return run_measure(list, out_dir, train, steps, budget, device, dir, !no_micro, micro_flags);
  if (app.got_subcommand("report") && published_opt->count() > 0) {
    if (!runs.empty()) throw InputError("--published and --runs exclude each other (published rows are not runs)");
    return run_published_report(published, dir, json);
  }
  if (app.got_subcommand("fit") && runs.empty()) throw InputError("calibrate fit needs --runs FILE...");
#ifdef STEPCAST_HAVE_CERES
  if (app.got_subcommand("fit")) return run_fit(runs, hardware, out, holdout, seed, dir, json, fit_engine);
#else
  if (app.got_subcommand("fit")) throw InputError("this build has no Ceres: fit on a machine with libceres-dev");
#endif
  // Without --holdout-frac the report labels the runs by the split the profile's fit recorded.
  std::optional<HoldoutSplit> split;
  if (app.get_subcommand("report")->get_option("--holdout-frac")->count() > 0) split = HoldoutSplit{holdout, seed};
#ifdef STEPCAST_HAVE_CERES
  return run_report(runs, hardware, split, dir, json, svg, no_cv ? CrossValidator() : CrossValidator(fit_analyses), fit_engine);
#else
  return run_report(runs, hardware, split, dir, json, svg, nullptr, fit_engine);
#endif
}

}  // namespace
}  // namespace stepcast::calibrate

int main(int argc, char** argv) {
  return stepcast::run_main("calibrate", [&] { return stepcast::calibrate::main_impl(argc, argv); });
}
