#include "calibrate/measure.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "calibrate/run_record.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/text_file.h"
#include "model/train_config_json.h"

namespace stepcast::calibrate {

namespace fs = std::filesystem;

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::vector<RunListEntry> read_run_list(const fs::path& list) {
  std::ifstream in(list);
  if (!in) throw InputError(list.string() + ": cannot open the run list");
  std::vector<RunListEntry> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::vector<std::string> words = split_words(line);
    if (words.empty() || words[0][0] == '#') continue;
    RunListEntry e;
    e.where = list.string() + ":" + std::to_string(n);
    e.model = words[0];
    try {
      size_t used = 0;
      e.nproc = words.size() > 1 ? std::stoi(words[1], &used) : 0;
      if (used != (words.size() > 1 ? words[1].size() : 0)) e.nproc = 0;
    } catch (const std::exception&) {
      e.nproc = 0;
    }
    if (e.nproc < 1)
      throw InputError(e.where + ": expected 'MODEL NPROC [train flags]' with NPROC at least 1, got \"" + line + "\"");
    e.flags.assign(words.begin() + 2, words.end());
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::string> train_argv(const TrainLaunch& l) {
  std::vector<std::string> a{l.train, "--model", l.model, "--nproc", std::to_string(l.nproc), "--steps",
                             std::to_string(l.steps), "--warmup", std::to_string(l.warmup_steps), "--quiet",
                             "--device", l.device};
  if (!l.plan.empty()) a.insert(a.end(), {"--plan", l.plan});
  if (!l.hardware.empty()) a.insert(a.end(), {"--hardware", l.hardware});
  if (!l.data_dir.empty()) a.insert(a.end(), {"--data-dir", l.data_dir});
  if (!l.json_out.empty()) a.insert(a.end(), {"--json-out", l.json_out});
  a.insert(a.end(), l.flags.begin(), l.flags.end());
  return a;
}

SpawnResult run_train(const TrainLaunch& launch, const std::string& log) {
  return spawn_and_wait(train_argv(launch), log, log, /*append=*/true);
}

std::string planned_config_key(const TrainLaunch& launch, const fs::path& scratch_dir) {
  TrainLaunch dry = launch;
  dry.json_out.clear();
  std::vector<std::string> argv = train_argv(dry);
  argv.push_back("--dry-run");
  const fs::path out = scratch_dir / ".dry_run.json", err = scratch_dir / ".dry_run.err";
  const SpawnResult r = spawn_and_wait(argv, out.string(), err.string());
  std::ifstream o(out), e(err);
  std::stringstream text, message;
  text << o.rdbuf();
  message << e.rdbuf();
  std::error_code ec;
  fs::remove(out, ec);
  fs::remove(err, ec);
  if (r.exit_status != 0) {
    std::string m = message.str();
    while (!m.empty() && m.back() == '\n') m.pop_back();
    throw InputError(launch.model + " " + std::to_string(launch.nproc) + ": train rejects the flags: " + m);
  }
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    return config_key(j.at("model").get<std::string>(), train_config_from_json(j.at("config"), "train --dry-run: config"));
  } catch (const nlohmann::json::exception& ex) {
    throw InternalError(std::string("train --dry-run printed no configuration: ") + ex.what());
  }
}

// calibrate measure: runs a designed list of configurations with `train`,
// appending every step to OUT/runs.jsonl. A configuration already present with
// enough measured steps is skipped, so an interrupted run resumes where it
// stopped. Progress and an ETA go to stderr.
int run_measure(const std::string& list, const std::string& out_dir, const std::string& train_flag, int64_t steps,
                double budget_min, const std::string& device, const std::string& dir, bool micro,
                const std::string& micro_flags) {
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw InputError("--device \"" + device + "\" is not valid (valid: auto, cpu, cuda)");
  const std::vector<RunListEntry> items = read_run_list(list);
  if (steps < 2) throw InputError("--steps " + std::to_string(steps) + " must be at least 2 (the first is warm-up)");
  fs::create_directories(out_dir);
  const fs::path runs = fs::path(out_dir) / "runs.jsonl";
  const std::string log = (fs::path(out_dir) / "train.log").string();
  const std::string train = sibling_binary(train_flag, "backend", "train");
  // What is already measured: steps per configuration key.
  std::map<std::string, int> have;
  if (fs::exists(runs))
    for (const auto& r : load_runs({runs}, resolve_data_dir(dir))) have[r.key] = r.steps;
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0, skipped = 0, failed = 0;
  // Ctrl-C or SIGTERM stops between configurations: the one that was running is dropped
  // (its steps are incomplete), runs.jsonl keeps every completed one.
  const InterruptGuard guard;
  const auto stop_if_interrupted = [&](size_t completed) {
    if (interrupt_signal() == 0) return;
    std::error_code ec;
    fs::remove(fs::path(out_dir) / ".current.jsonl", ec);
    throw InterruptedError(std::string(strsignal(interrupt_signal())) + " after " + std::to_string(completed) + " of " +
                           std::to_string(items.size()) + " configurations; " + runs.string() +
                           " holds every completed one (rerun to resume)");
  };
  // The micro-benchmarks first (OUT/micro.jsonl, skipped once a run of them has completed).
  if (micro) {
    const fs::path micro_out = fs::path(out_dir) / "micro.jsonl";
    const bool complete = fs::exists(micro_out) && read_text_file(micro_out).find("\"micro_done\"") != std::string::npos;
    if (complete) {
      std::fprintf(stderr, "calibrate: micro-benchmarks already in %s\n", micro_out.string().c_str());
    } else {
      int nproc = 1;
      for (const auto& it : items) nproc = std::max(nproc, it.nproc);
      const fs::path bench = fs::path(train).parent_path() / "microbench";
      if (!fs::exists(bench)) throw InputError(bench.string() + ": no microbench binary beside train (build the backend)");
      std::fprintf(stderr, "calibrate: micro-benchmarks on %d rank(s) -> %s\n", nproc, micro_out.string().c_str());
      std::vector<std::string> argv{bench.string(), "--out", micro_out.string(), "--nproc", std::to_string(nproc),
                                    "--device", device};
      if (!dir.empty()) argv.insert(argv.end(), {"--data-dir", dir});
      for (const std::string& w : split_words(micro_flags)) argv.push_back(w);
      const SpawnResult r = spawn_and_wait(argv);
      stop_if_interrupted(0);
      if (r.exit_status != 0) {
        std::fprintf(stderr, "calibrate: microbench failed (exit %d); the step runs go on\n", r.exit_status);
        ++failed;
      }
    }
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const RunListEntry& it = items[i];
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (budget_min > 0 && elapsed > 60.0 * budget_min) {
      std::fprintf(stderr, "calibrate: budget of %.1f min spent; %zu configurations left (rerun to resume)\n", budget_min,
                   items.size() - i);
      break;
    }
    std::string marker = it.model + " " + std::to_string(it.nproc);
    for (const std::string& w : it.flags) marker += " " + w;
    const double eta = done > 0 ? elapsed / done * static_cast<double>(items.size() - i) : 0.0;
    const int width = 30, filled = static_cast<int>(width * static_cast<double>(i) / items.size());
    std::fprintf(stderr, "\r[%s%s] %zu/%zu  %s  ETA %.0f s          ", std::string(filled, '#').c_str(),
                 std::string(width - filled, '.').c_str(), i, items.size(), marker.substr(0, 50).c_str(), eta);
    const fs::path mine = fs::path(out_dir) / ".current.jsonl";
    fs::remove(mine);
    TrainLaunch launch;
    launch.train = train;
    launch.model = it.model;
    launch.nproc = it.nproc;
    launch.steps = steps;
    launch.device = device;
    launch.data_dir = dir;
    launch.flags = it.flags;
    launch.json_out = mine.string();
    // Resume: a configuration whose key already has enough measured steps in runs.jsonl is skipped.
    std::string key;
    try {
      key = planned_config_key(launch, out_dir);
    } catch (const InputError&) {
      stop_if_interrupted(i);
      throw;
    }
    stop_if_interrupted(i);
    if (have.count(key) && have[key] >= steps - 1) {
      ++skipped;
      continue;
    }
    const int rc = run_train(launch, log).exit_status;
    stop_if_interrupted(i);
    if (rc != 0) ++failed;
    if (fs::exists(mine)) {
      const auto recs = load_runs({mine}, resolve_data_dir(dir));
      std::string lines = read_text_file(mine);
      lines.resize(lines.rfind('\n') + 1);  // whole lines only (npos + 1 == 0: none)
      if (!lines.empty()) append_lines(runs, lines);
      for (const auto& r : recs) have[r.key] += r.steps;
      fs::remove(mine);
    }
    ++done;
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\rcalibrate: %d run, %d skipped (already measured), %d failed, %.0f s; steps in %s\n", done,
               skipped, failed, total, runs.string().c_str());
  return failed ? 1 : 0;
}

}  // namespace stepcast::calibrate
