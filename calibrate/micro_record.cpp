#include "calibrate/micro_record.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "calibrate/run_record.h"
#include "common/units.h"
#include "common/errors.h"
#include "common/stats.h"

namespace stepcast::calibrate {

namespace {

struct BenchName {
  MicroBench bench;
  const char* name;
};
constexpr BenchName kBenchNames[kNumMicroBenches] = {
    {MicroBench::kGemm, "gemm"},
    {MicroBench::kAttention, "attention"},
    {MicroBench::kAttentionBwd, "attention_bwd"},
    {MicroBench::kAllReduce, "all_reduce"},
    {MicroBench::kReduceScatter, "reduce_scatter"},
    {MicroBench::kAllGather, "all_gather"},
    {MicroBench::kH2D, "h2d"},
    {MicroBench::kD2H, "d2h"},
    {MicroBench::kCpuOptimizer, "cpu_optimizer"},
    {MicroBench::kGpuOptimizer, "gpu_optimizer"},
    {MicroBench::kElementwise, "elementwise"},
    {MicroBench::kH2DPageable, "h2d_pageable"},
    {MicroBench::kD2HPageable, "d2h_pageable"},
    {MicroBench::kD2HStaged, "d2h_staged"},
    {MicroBench::kH2DStaged, "h2d_staged"},
};

double positive(const nlohmann::json& j, const char* key, const std::string& where) {
  const double v = j.at(key).get<double>();
  if (!(v > 0)) throw InputError(where + ": key \"" + key + "\" must be positive, got " + j.at(key).dump());
  return v;
}

}  // namespace

const char* micro_bench_name(MicroBench b) { return kBenchNames[static_cast<int>(b)].name; }

std::string MicroRecord::label() const {
  char buf[160];
  switch (bench) {
    case MicroBench::kGemm:
      std::snprintf(buf, sizeof buf, "gemm %.0fx%.0fx%.0f", m, n, k);
      break;
    case MicroBench::kAttention:
    case MicroBench::kAttentionBwd:
      std::snprintf(buf, sizeof buf, "%s b%.0f h%.0f s%.0f d%.0f", micro_bench_name(bench), batch, heads, seq_len, head_dim);
      break;
    case MicroBench::kCpuOptimizer:
    case MicroBench::kGpuOptimizer:
      std::snprintf(buf, sizeof buf, "%s %s %.0fM params%s", micro_bench_name(bench), optimizer_name(optimizer),
                    params / 1048576.0,
                    bench == MicroBench::kCpuOptimizer ? (" " + std::to_string(static_cast<int>(threads)) + " threads").c_str() : "");
      break;
    case MicroBench::kElementwise:
      std::snprintf(buf, sizeof buf, "elementwise %s %.0f tokens", model.c_str(), tokens);
      break;
    default:
      std::snprintf(buf, sizeof buf, "%s %.0f MiB x%.0f", micro_bench_name(bench), bytes / kBytesPerMiB, world);
  }
  return buf;
}

std::vector<MicroRecord> load_micro(const std::vector<std::filesystem::path>& files) {
  std::vector<MicroRecord> out;
  std::map<std::filesystem::path, std::string> device_of;  // each file's latest micro_env device
  for_each_jsonl(files, "\"micro", [&](const std::filesystem::path& file, const std::string& where, const nlohmann::json& j) {
    if (j.value("kind", "") == "micro_env" && j.contains("device") && j.at("device").is_string())
      device_of[file] = j.at("device").get<std::string>();
    if (j.value("kind", "") != "micro") return;
    try {
      MicroRecord r;
      r.where = where;
      r.device = device_of.count(file) ? device_of.at(file) : std::string();
      const std::string bench = j.at("bench").get<std::string>();
      bool known = false;
      for (const auto& bn : kBenchNames)
        if (bench == bn.name) {
          r.bench = bn.bench;
          known = true;
        }
      if (!known) throw InputError(where + ": key \"bench\" has unknown value \"" + bench + "\"");
      r.seconds = positive(j, "seconds", where);
      // A timed kernel, copy or collective takes at least a launch (~1e-6 s) and not hours.
      if (r.seconds < 1e-7 || r.seconds > 1e4)
        throw InputError(where + ": key \"seconds\" is " + j.at("seconds").dump() +
                         ", outside [1e-07, 10000] s for one micro-benchmark");
      switch (r.bench) {
        case MicroBench::kGemm:
          r.m = positive(j, "m", where);
          r.n = positive(j, "n", where);
          r.k = positive(j, "k", where);
          break;
        case MicroBench::kAttention:
        case MicroBench::kAttentionBwd:
          r.batch = positive(j, "batch", where);
          r.heads = positive(j, "heads", where);
          r.seq_len = positive(j, "seq_len", where);
          r.head_dim = positive(j, "head_dim", where);
          break;
        case MicroBench::kAllReduce:
        case MicroBench::kReduceScatter:
        case MicroBench::kAllGather:
          r.world = positive(j, "world", where);
          if (r.world < 2) throw InputError(where + ": key \"world\" must be at least 2, got " + j.at("world").dump());
          if (j.contains("nodes")) {
            r.nodes = positive(j, "nodes", where);
            if (r.nodes != std::floor(r.nodes) || std::fmod(r.world, r.nodes) != 0.0)
              throw InputError(where + ": key \"nodes\" is " + j.at("nodes").dump() +
                               ", expected a whole number of nodes that divides world " + j.at("world").dump());
          }
          [[fallthrough]];
        case MicroBench::kH2D:
        case MicroBench::kD2H:
        case MicroBench::kH2DPageable:
        case MicroBench::kD2HPageable:
          r.bytes = positive(j, "bytes", where);
          break;
        case MicroBench::kD2HStaged:
        case MicroBench::kH2DStaged:
          r.bytes = positive(j, "bytes", where);
          r.threads = positive(j, "threads", where);
          break;
        case MicroBench::kElementwise:
          r.model = j.at("model").get<std::string>();
          r.tokens = positive(j, "tokens", where);
          r.bytes = positive(j, "bytes", where);
          break;
        case MicroBench::kCpuOptimizer:
          r.threads = positive(j, "threads", where);
          [[fallthrough]];
        case MicroBench::kGpuOptimizer:
          r.params = positive(j, "params", where);
          r.optimizer = parse_optimizer(j.at("optimizer").get<std::string>(), where + ": key \"optimizer\"");
          break;
      }
      out.push_back(r);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(where + ": " + e.what());
    }
  });
  return out;
}

bool times_gpu(MicroBench b) { return b != MicroBench::kCpuOptimizer; }

double pageable_copy_bytes_per_s(const std::vector<MicroRecord>& micro) {
  std::vector<double> rates;
  for (const MicroRecord& r : micro)
    if ((r.bench == MicroBench::kH2DPageable || r.bench == MicroBench::kD2HPageable) && r.bytes >= 16 * kBytesPerMiB)
      rates.push_back(r.bytes / r.seconds);
  return median(rates);
}

std::vector<Coef> micro_coefs(const MicroRecord& r) {
  std::vector<Coef> out = micro_coefs(r.bench);
  if (r.nodes > 1)
    for (Coef& c : out)
      if (c == kIntraBusEffFrac) c = kInterBusEffFrac;
  return out;
}

std::vector<Coef> micro_coefs(MicroBench b) {
  switch (b) {
    case MicroBench::kGemm:
      return {kGemmEffMaxFrac, kGemmHalfDim};
    case MicroBench::kAttention:
      return {kAttnEffMaxFrac, kAttnHalfSeqTokens};
    case MicroBench::kAttentionBwd:
      return {kAttnBwdEffMaxFrac, kAttnBwdHalfSeqTokens};
    case MicroBench::kAllReduce:
      return {kCollLatencyS, kIntraBusEffFrac};
    case MicroBench::kReduceScatter:
    case MicroBench::kAllGather:
      return {kCollLatencyS, kIntraBusEffFrac, kRsAgBusEffMult};
    case MicroBench::kH2D:
    case MicroBench::kD2H:
      return {kPcieEffFrac};
    case MicroBench::kH2DPageable:
    case MicroBench::kD2HPageable:
      return {};  // the host's measured rate itself (HostSpec::pageable_bytes_per_s)
    case MicroBench::kD2HStaged:
    case MicroBench::kH2DStaged:
      return {};  // measurements of the host for the DeepSpeed section, not fitted here
    case MicroBench::kCpuOptimizer:
      return {kCpuCoreBytesPerSPerLane, kCpuDramEffFrac, kCpuLaneFlopsPerS, kCpuOptStepOverheadS};
    case MicroBench::kGpuOptimizer:
      return {kGpuOptBwEffFrac, kGpuOptFlopsPerS, kOptStepOverheadS};
    case MicroBench::kElementwise:
      // Its formula reads the traffic multiplier and the backward's slowdown too; those are the
      // end-to-end fit's, and a GPU's measurement against another's takes their ratio.
      return {kElementwiseBwEffFrac};
  }
  return {};
}

}  // namespace stepcast::calibrate
