#include "calibrate/measure.h"

#include <cstring>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "calibrate/run_record.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/progress.h"
#include "common/text_file.h"
#include "common/units.h"
#include "model/train_config_json.h"
#include "stepcast_git_commit.h"

namespace stepcast::calibrate {

namespace fs = std::filesystem;

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// `text` as a whole number, or 0 where it is not one.
static int whole_number(const std::string& text) {
  try {
    size_t used = 0;
    const int v = std::stoi(text, &used);
    return used == text.size() ? v : 0;
  } catch (const std::exception&) {
    return 0;
  }
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
    e.nproc = words.size() > 1 ? whole_number(words[1]) : 0;
    if (e.nproc < 1)
      throw InputError(e.where + ": expected 'MODEL NPROC [train flags]' with NPROC at least 1, got \"" + line + "\"");
    e.flags.assign(words.begin() + 2, words.end());
    for (size_t i = 0; i < e.flags.size(); ++i) {
      std::string value;
      if (e.flags[i] == "--emulate-nodes") {
        if (++i < e.flags.size()) value = e.flags[i];
        else continue;
      } else if (e.flags[i].rfind("--emulate-nodes=", 0) == 0) {
        value = e.flags[i].substr(16);
      } else {
        e.planner_flags.push_back(e.flags[i]);
        continue;
      }
      e.emulated_nodes = whole_number(value);
      if (e.emulated_nodes < 1 || e.nproc % e.emulated_nodes != 0)
        throw InputError(e.where + ": --emulate-nodes \"" + value + "\" must be a whole number that divides NPROC " +
                         std::to_string(e.nproc));
    }
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

namespace {

// Moves the step records one configuration's run wrote to `mine` (whole lines only) into
// runs.jsonl when the run exited 0, or into failed.jsonl beside it when it did not: a run that
// died part-way (out of memory in its fourth step, say) is no measurement of its configuration,
// and its steps must not count towards resuming it either. Records calibrate cannot read stay
// out of runs.jsonl too. Returns whether the records went into runs.jsonl.
bool collect_records(const fs::path& mine, const fs::path& runs, bool run_ok, const fs::path& data_dir,
                     std::map<std::string, int>& have, const std::string& what) {
  if (!fs::exists(mine)) return false;
  std::string lines = read_text_file(mine);
  lines.resize(lines.rfind('\n') + 1);  // whole lines only (npos + 1 == 0: none)
  const fs::path failed = runs.parent_path() / "failed.jsonl";
  std::string why;
  std::vector<RunRecord> recs;
  if (!run_ok) {
    why = "the run failed";
  } else {
    try {
      recs = load_runs({mine}, data_dir);
    } catch (const InputError& e) {  // the run wrote what calibrate cannot read
      why = e.what();
    }
  }
  std::error_code ec;
  fs::remove(mine, ec);
  if (lines.empty()) return false;
  if (!why.empty()) {
    append_lines(failed, lines);
    std::fprintf(stderr, "calibrate: %s: %s; its records went to %s, not %s\n", what.c_str(), why.c_str(),
                 failed.string().c_str(), runs.string().c_str());
    return false;
  }
  append_lines(runs, lines);
  for (const auto& r : recs) have[r.key] += r.steps;
  return true;
}

}  // namespace

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
  Progress shown("calibrate", "", items.size(), "configuration", true);
  for (size_t i = 0; i < items.size(); ++i) {
    const RunListEntry& it = items[i];
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (budget_min > 0 && elapsed > 60.0 * budget_min) {
      char text[160];
      std::snprintf(text, sizeof text, "calibrate: budget of %.1f min spent; %zu configurations left (rerun to resume)",
                    budget_min, items.size() - i);
      shown.line(text);
      break;
    }
    std::string marker = it.model + " " + std::to_string(it.nproc);
    for (const std::string& w : it.flags) marker += " " + w;
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
    shown.next(marker);  // once the line is known good: bad input stays one line
    if (have.count(key) && have[key] >= steps - 1) {
      ++skipped;
      continue;
    }
    const int rc = run_train(launch, log).exit_status;
    stop_if_interrupted(i);
    if (rc != 0) {
      ++failed;
      shown.line("calibrate: " + key + " failed (exit " + std::to_string(rc) + "; " + log + ")");
    }
    if (!collect_records(mine, runs, rc == 0, resolve_data_dir(dir), have, key) && rc == 0) ++failed;
    ++done;
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char summary[160];
  std::snprintf(summary, sizeof summary, "calibrate: %d run, %d skipped (already measured), %d failed, %.0f s; steps in ",
                done, skipped, failed, total);
  shown.line(summary + runs.string());
  return failed ? 1 : 0;
}

}  // namespace stepcast::calibrate

namespace stepcast::calibrate {

namespace {

// The first executable `name` on PATH (posix_spawn does not search it); InputError when none.
std::string find_on_path(const std::string& name, const char* flag) {
  if (name.find('/') != std::string::npos) {
    if (access(name.c_str(), X_OK) != 0) throw InputError(std::string(flag) + " " + name + ": not an executable file");
    return name;
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw InputError(std::string(flag) + " " + name + ": not found on PATH");
}

// Runs argv with stdout to `out_path` and stderr to `err_path`; the first stderr line on failure.
std::string first_error_line(const fs::path& err_path) {
  std::ifstream e(err_path);
  std::string line, last;
  while (std::getline(e, line))
    if (!line.empty()) {
      last = line;
      break;
    }
  return last;
}

// `planner explain` for one run-list line, its JSON to `plan` (and DeepSpeed's config to `ds`
// when not empty): the plan exactly as a user gets it. InputError naming the line when the
// planner rejects it; the parsed JSON otherwise.
nlohmann::json explain_line(const std::string& planner, const RunListEntry& it, const std::string& engine,
                            const std::string& hardware, const std::string& data_dir, const fs::path& plan,
                            const fs::path& ds, const fs::path& err) {
  // A line that emulates K nodes on one host is, to the planner, K nodes of NPROC / K GPUs.
  const int nodes = it.emulated_nodes;
  const std::vector<std::string>& flags = it.planner_flags;
  std::vector<std::string> argv{planner, "explain", "--model", it.model, "--gpus", std::to_string(it.nproc / nodes),
                                "--nodes", std::to_string(nodes), "--engine", engine, "--hardware", hardware, "--json"};
  if (!data_dir.empty()) argv.insert(argv.end(), {"--data-dir", data_dir});
  if (!ds.empty()) argv.insert(argv.end(), {"--deepspeed-config", ds.string()});
  argv.insert(argv.end(), flags.begin(), flags.end());
  if (spawn_and_wait(argv, plan.string(), err.string()).exit_status != 0)
    throw InputError(it.where + ": planner explain rejects the line: " + first_error_line(err));
  try {
    nlohmann::json j = nlohmann::json::parse(read_text_file(plan));
    j.at("plans").at(0).at("config");
    return j;
  } catch (const nlohmann::json::exception& e) {
    throw InternalError(std::string("planner explain --json printed no plan: ") + e.what());
  }
}

}  // namespace

int run_peer_measure(const PeerMeasure& m) {
  if (m.engine != "deepspeed" && m.engine != "fsdp2")
    throw InputError("--engine \"" + m.engine + "\" is not valid for a peer measurement (valid: deepspeed, fsdp2; "
                     "the backend: calibrate measure without --engine, or --engine stepcast)");
  if (m.steps < 2) throw InputError("--steps " + std::to_string(m.steps) + " must be at least 2 (the first is warm-up)");
  const std::vector<RunListEntry> items = read_run_list(m.list);
  const std::string planner = sibling_binary(m.planner, "planner", "planner");
  const std::string python = find_on_path(m.python, "--python");
  const std::string timeout = find_on_path("timeout", "timeout (coreutils)");
  const std::string script = m.peer_script.empty() ? std::string(STEPCAST_SOURCE_DIR) + "/bench/peers/peer.py" : m.peer_script;
  if (!fs::exists(script)) throw InputError("--peer-script " + script + ": no such file");
  const fs::path data = resolve_data_dir(m.data_dir);
  fs::create_directories(m.out_dir);
  const fs::path out(m.out_dir), runs = out / "runs.jsonl";
  const std::string log = (out / "peer.log").string();
  std::map<std::string, int> have;
  if (fs::exists(runs))
    for (const auto& r : load_runs({runs}, data)) have[r.key] = r.steps;
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0, skipped = 0, failed = 0;
  const InterruptGuard guard;
  const fs::path mine = out / ".current.jsonl", plan = out / ".plan.json", ds = out / ".deepspeed.json",
                 err = out / ".planner.err";
  const auto cleanup = [&] {
    std::error_code ec;
    for (const fs::path& p : {mine, plan, ds, err}) fs::remove(p, ec);
  };
  Progress shown("calibrate " + m.engine, "", items.size(), "configuration", true);
  for (size_t i = 0; i < items.size(); ++i) {
    const RunListEntry& it = items[i];
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (m.budget_min > 0 && elapsed > 60.0 * m.budget_min) {
      char text[160];
      std::snprintf(text, sizeof text, "calibrate: budget of %.1f min spent; %zu configurations left (rerun to resume)",
                    m.budget_min, items.size() - i);
      shown.line(text);
      break;
    }
    std::string marker = it.model + " " + std::to_string(it.nproc);
    for (const std::string& w : it.flags) marker += " " + w;
    cleanup();
    std::string key, model_name;
    try {
      const nlohmann::json j = explain_line(planner, it, m.engine, m.hardware, m.data_dir, plan,
                                            m.engine == "deepspeed" ? ds : fs::path(), err);
      model_name = j.at("model").at("name").get<std::string>();
      key = config_key(model_name, train_config_from_json(j.at("plans").at(0).at("config"), it.where + ": config"));
    } catch (...) {
      cleanup();
      throw;
    }
    shown.next(marker);  // once the line is known good: bad input stays one line
    if (have.count(key) && have[key] >= m.steps - 1) {
      ++skipped;
      continue;
    }
    const fs::path card = fs::exists(it.model) && fs::path(it.model).extension() == ".toml"
                              ? fs::path(it.model)
                              : data / "models" / (model_name + ".toml");
    if (!fs::exists(card)) {
      cleanup();
      throw InputError(it.where + ": " + card.string() + ": no model card for the peer harness (it builds the "
                       "transformers model from a Stepcast card)");
    }
    std::vector<std::string> run{timeout, "--signal=TERM", "--kill-after=30", std::to_string(static_cast<int>(m.timeout_s)),
                                 python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                 std::to_string(it.nproc), script, "--engine", m.engine, "--plan", plan.string(),
                                 "--model-card", card.string(), "--model-name", model_name, "--steps",
                                 std::to_string(m.steps), "--warmup", "1", "--json-out", mine.string(),
                                 "--git-commit", STEPCAST_GIT_COMMIT, "--hardware", m.hardware};
    if (m.engine == "deepspeed") run.insert(run.end(), {"--deepspeed-config", ds.string()});
    {
      std::ofstream l(log, std::ios::app);
      l << "=== " << key << "\n";
    }
    const int rc = spawn_and_wait(run, log, log, /*append=*/true).exit_status;
    if (interrupt_signal() != 0) {
      cleanup();
      throw InterruptedError(std::string(strsignal(interrupt_signal())) + " after " + std::to_string(i) + " of " +
                             std::to_string(items.size()) + " configurations; " + runs.string() +
                             " holds every completed one (rerun to resume)");
    }
    if (rc != 0) {
      ++failed;
      shown.line("calibrate " + m.engine + ": " + key + " failed (exit " + std::to_string(rc) + "; " + log + ")");
    }
    if (!collect_records(mine, runs, rc == 0, data, have, key) && rc == 0) ++failed;
    ++done;
  }
  cleanup();
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char summary[200];
  std::snprintf(summary, sizeof summary, "calibrate %s: %d run, %d skipped (already measured), %d failed, %.0f s; steps in ",
                m.engine.c_str(), done, skipped, failed, total);
  shown.line(summary + runs.string());
  return failed ? 1 : 0;
}

int run_predict_list(const PredictList& p) {
  if (p.engine != "stepcast" && p.engine != "deepspeed" && p.engine != "fsdp2")
    throw InputError("--engine \"" + p.engine + "\" is not valid (valid: stepcast, deepspeed, fsdp2)");
  const std::vector<RunListEntry> items = read_run_list(p.list);
  if (items.empty()) throw InputError(p.list + ": the run list has no configuration");
  if (!p.out.empty()) check_output_path(p.out);
  const std::string planner = sibling_binary(p.planner, "planner", "planner");
  const ScratchFolder scratch("stepcast-predict-");
  const fs::path plan = fs::path(scratch.path()) / "plan.json", err = fs::path(scratch.path()) / "planner.err";
  nlohmann::json rows = nlohmann::json::array();
  for (const RunListEntry& it : items) {
    const nlohmann::json j = explain_line(planner, it, p.engine, p.hardware, p.data_dir, plan, fs::path(), err);
    const nlohmann::json& best = j.at("plans").at(0);
    std::string line = it.model + " " + std::to_string(it.nproc);
    for (const std::string& w : it.flags) line += " " + w;
    const nlohmann::json& interval = best.at("time_s").at("step_interval_95");
    rows.push_back({{"line", line},
                    {"where", it.where},
                    {"config_key", config_key(j.at("model").at("name").get<std::string>(),
                                              train_config_from_json(best.at("config"), it.where + ": config"))},
                    {"step_s", best.at("time_s").at("step")},
                    {"step_interval_95_s", interval},
                    {"gpu_memory_bytes", best.at("gpu_memory_bytes").at("total")},
                    {"gpu_memory_interval_95_bytes", best.at("gpu_memory_bytes").value("total_interval_95", nlohmann::json())},
                    {"host_memory_bytes_per_rank", best.at("cpu_memory_bytes").at("per_rank")},
                    {"fits", best.at("fits")},
                    {"extrapolated_dimensions", best.at("extrapolated_dimensions")}});
  }
  std::string text;
  if (p.json) {
    const nlohmann::json doc{{"list", p.list},      {"engine", p.engine},         {"hardware", p.hardware},
                             {"git_commit", STEPCAST_GIT_COMMIT}, {"predictions", rows}};
    text = doc.dump(2) + "\n";
  } else {
    size_t width = 0;
    for (const auto& r : rows) width = std::max(width, r.at("line").get<std::string>().size());
    text = "# " + p.list + ", predicted by " + STEPCAST_GIT_COMMIT + " (engine " + p.engine + ", hardware " +
           p.hardware + ") before it is measured:\n# planner explain --model M --gpus N (--gpus N/K --nodes K with --emulate-nodes K) --engine " + p.engine +
           " FLAGS; step s, its 95 % interval, peak GPU GiB (its 95 % interval where the profile has one), host GiB per "
           "rank\n";
    for (const auto& r : rows) {
      char memory_band[64] = "";
      const nlohmann::json& band = r.at("gpu_memory_interval_95_bytes");
      if (band.is_array())
        std::snprintf(memory_band, sizeof memory_band, " [%.1f, %.1f]", band.at(0).get<double>() / kBytesPerGiB,
                      band.at(1).get<double>() / kBytesPerGiB);
      char buf[240];
      std::snprintf(buf, sizeof buf, "  step %.3f s  95%% [%.3f, %.3f]  memory %.1f GiB%s  host %.1f GiB%s\n",
                    r.at("step_s").get<double>(), r.at("step_interval_95_s").at(0).get<double>(),
                    r.at("step_interval_95_s").at(1).get<double>(), r.at("gpu_memory_bytes").get<double>() / kBytesPerGiB,
                    memory_band, r.at("host_memory_bytes_per_rank").get<double>() / kBytesPerGiB,
                    r.at("fits").get<bool>() ? "" : "  does not fit");
      std::string line = r.at("line").get<std::string>();
      line.resize(width, ' ');
      text += line + buf;
    }
  }
  if (p.out.empty())
    std::fputs(text.c_str(), stdout);
  else
    write_file_atomic(p.out, text);
  return 0;
}

}  // namespace stepcast::calibrate
