#include "calibrate/run_record.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/hash.h"
#include "common/stats.h"
#include "common/text_file.h"
#include "common/units.h"
#include "model/toml_reader.h"
#include <cstdio>
#include <set>

namespace stepcast::calibrate {

namespace {

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

void for_each_jsonl(const std::vector<std::filesystem::path>& files, const std::string& prefilter,
                    const std::function<void(const std::filesystem::path& file, const std::string& where,
                                             const nlohmann::json& j)>& fn) {
  for (const auto& file : files) {
    std::error_code ec;
    if (std::filesystem::is_directory(file, ec)) throw InputError(file.string() + ": is a folder, expected a runs file");
    if (!std::filesystem::is_regular_file(file, ec)) throw InputError(file.string() + ": cannot open the runs file");
    const std::string text = read_text_file(file);
    size_t begin = 0;
    int line_no = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      const bool torn_candidate = end == std::string::npos;  // the last line, with no newline after it
      if (torn_candidate) end = text.size();
      const std::string line = text.substr(begin, end - begin);
      begin = end + 1;
      ++line_no;
      if (line.empty() || (!prefilter.empty() && line.find(prefilter) == std::string::npos)) continue;
      const std::string where = file.string() + ":" + std::to_string(line_no);
      nlohmann::json j;
      try {
        check_json_depth(line, where);
        j = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        // A writer killed mid-append leaves a torn last line: the records before it stand.
        if (torn_candidate) {
          std::fprintf(stderr, "calibrate: warning: %s: the last line is incomplete (an interrupted write); ignored\n",
                       where.c_str());
          break;
        }
        throw InputError(where + ": malformed JSON: " + e.what());
      }
      fn(file, where, j);
    }
  }
}

namespace {

// Each observation's field, and the values of its steps it is the median of.
constexpr std::pair<const char*, double RunRecord::*> kMedianFields[] = {
    {"step", &RunRecord::step_s},
    {"gas", &RunRecord::gas_s},
    {"opt", &RunRecord::opt_s},
    {"forward", &RunRecord::forward_s},
    {"backward", &RunRecord::backward_s},
    {"grad_comm", &RunRecord::grad_comm_s},
    {"param_gather", &RunRecord::param_gather_s},
    {"offload_transfer", &RunRecord::offload_transfer_s},
    {"optimizer", &RunRecord::optimizer_s},
    {"optimizer_total", &RunRecord::optimizer_total_s},
    {"mem", &RunRecord::gpu_peak_reserved_bytes},
    {"alloc", &RunRecord::gpu_peak_allocated_bytes},
    {"tps", &RunRecord::tokens_per_s},
};

}  // namespace

std::vector<SupersededRecord> read_superseded(const std::filesystem::path& path) {
  std::vector<SupersededRecord> out;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return out;
  const std::string origin = path.string();
  const toml::table root = TomlReader::parse(read_text_file(path), origin);
  TomlReader(root, origin).reject_unknown_keys({std::string(kSupersededKey)});
  const toml::node* list = root.get(kSupersededKey);
  if (list == nullptr) return out;
  const toml::array* entries = list->as_array();
  if (entries == nullptr) throw InputError(origin + ": " + kSupersededKey + " is not an array of tables ([[superseded]])");
  for (size_t i = 0; i < entries->size(); ++i) {
    const std::string where = std::string(kSupersededKey) + "[" + std::to_string(i) + "]";
    const toml::table* t = (*entries)[i].as_table();
    if (t == nullptr) throw InputError(origin + ": " + where + " is not a table");
    const TomlReader r(*t, origin, where);
    r.reject_unknown_keys({"file", "key", "reason", "by"});
    SupersededRecord e{r.get_string("file"), r.get_string("key"), r.get_string("reason"), r.get_string_or("by", "")};
    if (e.file.empty() || e.file.find('/') != std::string::npos)
      throw InputError(origin + ": " + r.key_path("file") + " is \"" + e.file +
                       "\", expected the name of a runs file in this folder");
    if (e.reason.empty()) throw InputError(origin + ": " + r.key_path("reason") + " is empty, expected why the records no longer hold");
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::filesystem::path> superseded_lists(const std::vector<std::filesystem::path>& files) {
  std::vector<std::filesystem::path> out;
  std::set<std::filesystem::path> folders;
  std::error_code ec;
  for (const auto& file : files) {
    const std::filesystem::path folder = file.parent_path();
    if (folders.insert(folder).second && std::filesystem::is_regular_file(folder / kSupersededFile, ec))
      out.push_back(folder / kSupersededFile);
  }
  return out;
}

std::vector<RunRecord> load_runs(const std::vector<std::filesystem::path>& files,
                                 const std::filesystem::path& data_dir) {
  struct Acc {
    RunRecord rec;
    std::map<std::string, std::vector<double>> values;
    std::vector<std::pair<std::string, std::vector<double>>> by_file;  // each file's steps, in load order
  };
  std::map<std::string, Acc> groups;
  std::vector<std::string> order;
  // Each folder's superseded list, read once: (file, key) -> how many records it left out.
  struct Left {
    std::filesystem::path list;
    SupersededRecord entry;
    int records = 0;
  };
  std::map<std::pair<std::string, std::string>, Left> left_out;  // (folder/file, key)
  for (const std::filesystem::path& list : superseded_lists(files))
    for (SupersededRecord& e : read_superseded(list)) {
      const std::pair<std::string, std::string> id{(list.parent_path() / e.file).lexically_normal().string(), e.key};
      left_out[id] = Left{list, std::move(e), 0};
    }
  std::set<std::string> loaded;
  for (const auto& file : files) loaded.insert(file.lexically_normal().string());
  std::pair<std::filesystem::path, std::string> normal_of;  // the file of the record at hand, normalised
  for_each_jsonl(files, "", [&](const std::filesystem::path& file, const std::string& where, const nlohmann::json& j) {
    try {
      if (j.value("warmup", false)) return;
      if (j.contains("kind") && j.at("kind") != "step") return;  // micro-benchmarks: micro_record.h
      const TrainConfig cfg = train_config_from_json(j.at("config"), where + ": config");
      const std::string model = j.at("model").get<std::string>();
      // A run on an emulated smaller GPU (train --gpu-mem-limit-gib) is a configuration of its own.
      const nlohmann::json& mem = j.at("memory_bytes");
      std::string key = config_key(model, cfg);
      if (mem.contains("gpu_limit") && mem.at("gpu_limit").is_number())
        key += " gpu-limit=" + fmt_g(mem.at("gpu_limit").get<double>() / kBytesPerGiB) + "GiB";
      if (!left_out.empty()) {
        if (file != normal_of.first) normal_of = {file, file.lexically_normal().string()};  // once a file
        const auto sup = left_out.find({normal_of.second, key});
        if (sup != left_out.end()) {
          ++sup->second.records;
          return;
        }
      }
      auto it = groups.find(key);
      if (it == groups.end()) {
        Acc acc;
        acc.rec.key = key;
        acc.rec.source = file.filename().string();
        acc.rec.model = resolve_model(model, data_dir);
        acc.rec.config = cfg;
        it = groups.emplace(key, std::move(acc)).first;
        order.push_back(key);
      }
      Acc& acc = it->second;
      // Every measured number: finite, within what a training step can take or hold.
      const auto number = [&](const nlohmann::json& parent, const char* group, const char* key, double lo, double hi,
                              bool lo_open) {
        const nlohmann::json& v = parent.at(key);
        const double x = v.is_number() ? v.get<double>() : std::nan("");
        if (!std::isfinite(x) || x < lo || (lo_open && x == lo) || x > hi)
          throw InputError(where + ": " + group + "." + key + " is " + v.dump() + ", expected a number in " +
                           (lo_open ? "(" : "[") + fmt_g(lo) + ", " + fmt_g(hi) + "]");
        return x;
      };
      constexpr double kMaxStepS = 1e6;        // 11 days: beyond any step, a unit mistake
      constexpr double kMaxBytes = 1e15;       // 1 PB of memory on one device
      const auto& t = j.at("time_s");
      acc.values["step"].push_back(number(t, "time_s", "step", 0.0, kMaxStepS, true));
      if (acc.by_file.empty() || acc.by_file.back().first != file.string()) acc.by_file.push_back({file.string(), {}});
      acc.by_file.back().second.push_back(acc.values["step"].back());
      acc.values["opt"].push_back(number(t, "time_s", "opt", 0.0, kMaxStepS, false));
      // A phase an engine cannot time apart (the peer harnesses' collectives and copies, which run
      // inside the engines' hooks) is null: not measured, 0 here, and no residual in the fit.
      for (const char* k : {"forward", "backward", "grad_comm", "param_gather", "offload_transfer", "optimizer"})
        acc.values[k].push_back(t.at(k).is_null() ? 0.0 : number(t, "time_s", k, 0.0, kMaxStepS, false));
      acc.values["gas"].push_back(t.at("gas").is_null() ? 0.0 : number(t, "time_s", "gas", 0.0, kMaxStepS, false));
      // The offload pipeline's own CPU time (runs before the pipeline: absent; the
      // serial optimizer phase was that time).
      const double cpu_s = t.contains("optimizer_cpu") ? number(t, "time_s", "optimizer_cpu", 0.0, kMaxStepS, false) : 0.0;
      acc.values["optimizer_total"].push_back(cpu_s > 0 ? cpu_s : acc.values["optimizer"].back());
      acc.values["mem"].push_back(number(mem, "memory_bytes", "gpu_peak_reserved", 0.0, kMaxBytes, false));
      // The peak allocated (records before it was written lack it: 0, not measured).
      acc.values["alloc"].push_back(mem.contains("gpu_peak_allocated")
                                        ? number(mem, "memory_bytes", "gpu_peak_allocated", 0.0, kMaxBytes, false)
                                        : 0.0);
      // The process's resident high-water mark (VmHWM) only grows: the largest over the steps.
      if (mem.contains("host_peak_rss"))
        acc.rec.host_peak_rss_bytes = std::max(acc.rec.host_peak_rss_bytes,
                                               number(mem, "memory_bytes", "host_peak_rss", 0.0, kMaxBytes, false));
      acc.values["tps"].push_back(number(j.at("throughput"), "throughput", "tokens_per_s", 0.0, 1e12, false));
      acc.rec.steps++;
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": " + e.what());
    }
  });
  // An entry for a loaded file that matches none of its records is a typo or a stale list.
  int left_records = 0, left_configurations = 0;
  for (const auto& [id, l] : left_out) {
    if (!loaded.count(id.first)) continue;
    if (l.records == 0)
      throw InputError(l.list.string() + ": superseded entry key \"" + l.entry.key + "\" matches no record of " +
                       l.entry.file);
    left_records += l.records;
    ++left_configurations;
  }
  if (left_configurations > 0)
    std::fprintf(stderr, "calibrate: left out %d records of %d configurations that %s names as superseded\n",
                 left_records, left_configurations, kSupersededFile);
  std::vector<RunRecord> out;
  for (const auto& key : order) {
    Acc& a = groups[key];
    RunRecord r = a.rec;
    for (const auto& [name, member] : kMedianFields) r.*member = median(a.values[name]);
    for (const auto& [file, steps] : a.by_file) r.step_by_file.push_back({file, median(steps)});
    out.push_back(r);
  }
  return out;
}

std::vector<double> step_measurements_s(const RunRecord& r) {
  if (r.step_by_file.empty()) return {r.step_s};
  std::vector<double> out;
  for (const RunRecord::FileStep& f : r.step_by_file) out.push_back(f.step_s);
  return out;
}

std::vector<RunRecord> runs_of_engine(const std::vector<RunRecord>& runs, const std::string& engine) {
  std::vector<RunRecord> out;
  for (const RunRecord& r : runs)
    if (engine_name(r.config.engine) == engine) out.push_back(r);
  return out;
}

bool is_holdout(const std::string& key, double fraction, uint64_t seed) {
  return static_cast<double>(fnv1a64(key, seed) % 10000) / 10000.0 < fraction;
}

}  // namespace stepcast::calibrate
