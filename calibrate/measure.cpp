#include "calibrate/measure.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/errors.h"
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

}  // namespace stepcast::calibrate
