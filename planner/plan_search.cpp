#include "common/units.h"
#include "planner/plan_search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "common/errors.h"

namespace stepcast {

namespace {

struct Component {
  const char* name;
  double seconds;
};

std::vector<Component> components(const Prediction& p) {
  const auto& t = p.time;
  const bool cpu = p.config.offload_optimizer == OffloadDevice::kCpu;
  const bool q8 = p.config.optimizer == OptimizerKind::kAdamW8bit;
  const char* opt = cpu ? (q8 ? "the 8-bit CPU AdamW" : "the CPU AdamW")
                        : (q8 ? "the 8-bit GPU AdamW" : "the GPU AdamW");
  return {
      {"forward and backward compute", t.forward_s + t.backward_s},
      {"activation recomputation", t.recompute_s},
      {"exposed gradient reduction", t.grad_comm_s},
      {"exposed parameter gathering", t.param_gather_s},
      {"exposed PCIe offload copies", t.offload_transfer_s},
      {opt, t.optimizer_s},
  };
}

std::string pct(double frac) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f %%", 100.0 * frac);
  return buf;
}

std::string fmt_tps(double tps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f tokens/s", tps);
  return buf;
}

// The component whose time per sample grew most against the top plan.
std::string largest_increase(const Prediction& p, const Prediction& top) {
  const auto a = components(p);
  const auto b = components(top);
  const double sp = static_cast<double>(p.config.micro_batch * p.config.gas);
  const double st = static_cast<double>(top.config.micro_batch * top.config.gas);
  size_t best = 0;
  double best_delta = -1e300;
  for (size_t i = 0; i < a.size(); ++i) {
    const double delta = a[i].seconds / sp - b[i].seconds / st;
    if (delta > best_delta) {
      best_delta = delta;
      best = i;
    }
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s costs %.1f ms more per sample", a[best].name, 1e3 * best_delta);
  return buf;
}

}  // namespace

const std::vector<Mechanism>& complexity_mechanisms() {
  static const std::vector<Mechanism> mechanisms = {
      {"parameter offload", 2.0, [](const TrainConfig& c) { return c.offload_params == OffloadDevice::kCpu; }},
      {"optimizer offload", 1.0, [](const TrainConfig& c) { return c.offload_optimizer == OffloadDevice::kCpu; }},
      {"stage 3", 0.5, [](const TrainConfig& c) { return c.zero_stage == 3; }},
      {"8-bit states", 0.5, [](const TrainConfig& c) { return c.optimizer == OptimizerKind::kAdamW8bit; }},
      {"checkpointing", 0.5, [](const TrainConfig& c) { return c.activation_checkpointing; }},
  };
  return mechanisms;
}

double complexity(const TrainConfig& c) {
  double score = 0;
  for (const Mechanism& m : complexity_mechanisms())
    if (m.on(c)) score += m.weight;
  return score;
}

std::string handicap_range_text() {
  double lo = 0, hi = 0;
  for (const Mechanism& m : complexity_mechanisms()) {
    lo = lo == 0 ? m.weight : std::min(lo, m.weight);
    hi = std::max(hi, m.weight);
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%g-%g %%", 100 * kHandicapPerComplexity * lo, 100 * kHandicapPerComplexity * hi);
  return buf;
}

double typical_error_frac(const HardwareProfile& hw) {
  if (hw.coefs_calibrated && hw.model_error_frac > 0) return hw.model_error_frac;
  if (hw.transferred_log_q95 > 0) return std::expm1(hw.transferred_log_q95 / 1.96);
  return 0.0;
}

double ranking_score(const Prediction& p) {
  return p.throughput.tokens_per_s * (1.0 - kHandicapPerComplexity * complexity(p.config));
}

std::string dominant_cost(const Prediction& p, double* share_out) {
  // Compute is the work itself; name the largest cost beyond it.
  const auto comps = components(p);
  size_t best = 1;
  for (size_t i = 2; i < comps.size(); ++i)
    if (comps[i].seconds > comps[best].seconds) best = i;
  const double share = comps[best].seconds / p.time.step_s;
  if (share_out) *share_out = share;
  if (share < 0.005) return "nothing beyond forward and backward costs 0.5 % of its step";
  return pct(share) + " of the step is " + comps[best].name;
}

SearchResult search_plans(const SearchRequest& req) {
  const int world = req.base.world_size();
  if (world < 1) throw InputError("--gpus and --nodes must be at least 1");
  if (req.global_batch < 0)
    throw InputError("--global-batch " + std::to_string(req.global_batch) + " must not be negative");
  if (!batch_divides_ranks(req.global_batch, world))
    throw InputError("--global-batch " + std::to_string(req.global_batch) +
                     " is not a multiple of the " + std::to_string(world) +
                     " data-parallel ranks (--gpus x --nodes)");
  if (req.optimizers.empty()) throw InputError("--optimizers must name at least one optimizer");

  SearchResult result;
  std::vector<Prediction> all;
  const std::vector<PeftKind> peft_list = req.pefts.empty() ? std::vector<PeftKind>{req.base.peft} : req.pefts;
  bool skipped_single_rank = false;
  for (int stage : req.stages) {
    for (OffloadDevice off_opt : {OffloadDevice::kNone, OffloadDevice::kCpu}) {
      if (off_opt == OffloadDevice::kCpu && (stage == 0 || !req.allow_offload)) continue;
      for (OffloadDevice off_par : {OffloadDevice::kNone, OffloadDevice::kCpu}) {
        if (off_par == OffloadDevice::kCpu &&
            (stage != 3 || !req.allow_offload || off_opt != OffloadDevice::kCpu))
          continue;
        // On one rank, the Stepcast backend's stages 1-3 without offload partition nothing: they are
        // its stage 0. A peer's are plans of their own there: DeepSpeed's ZeRO optimizers keep flat
        // fp32 partitions and run their gradient hooks (stage 3 its parameter fetches) on one rank
        // as on many, with other memory and speed than its stage 0; FSDP2 has no stage 0.
        if (world == 1 && stage > 0 && off_opt == OffloadDevice::kNone && off_par == OffloadDevice::kNone &&
            req.base.engine == Engine::kStepcast) {
          skipped_single_rank = true;
          continue;
        }
        for (OptimizerKind opt : req.optimizers) {
          for (bool ckpt : req.checkpointing) {
            for (int64_t micro : req.micro_batches) {
              std::vector<int64_t> gas_list;
              if (req.global_batch > 0) {
                const int64_t per_rank = req.global_batch / world;
                if (per_rank % micro != 0) continue;
                gas_list = {per_rank / micro};
              } else {
                gas_list = req.gas_values;
              }
              for (int64_t gas : gas_list) for (PeftKind peft : peft_list) for (bool sync_each : {false, true}) {
                // FSDP2 accumulating over micro-batches: syncing after each holds no whole
                // gradients (less memory, a reduce-scatter per micro-batch); both are plans.
                if (sync_each && !(req.base.engine == Engine::kFsdp2 && gas > 1)) continue;
                TrainConfig c = req.base;
                c.grad_sync_each_micro = sync_each;
                c.peft = peft;
                c.zero_stage = stage;
                c.offload_optimizer = off_opt;
                c.offload_params = off_par;
                c.optimizer = opt;
                c.activation_checkpointing = ckpt;
                c.offload_pipeline = !req.peer_engine();
                c.offload_overlap_forward =
                    c.offload_pipeline && off_opt == OffloadDevice::kCpu && req.overlap_forward;
                c.micro_batch = micro;
                c.gas = gas;
                if (c.engine != Engine::kStepcast || c.peft_enabled()) {
                  try {
                    validate_config(c);  // what the peer engine (or PEFT) cannot run is not a plan for it
                  } catch (const InputError&) {
                    continue;
                  }
                }
                Features f = make_features(req.model, req.hardware, c, req.limits);
                all.push_back(evaluate_features(f, c, req.hardware, req.hardware.coefs, req.limits));
              }
            }
          }
        }
      }
    }
  }
  if (req.peer_engine() && req.allow_offload)
    result.notes.push_back(std::string("ranked for ") + engine_name(req.base.engine) +
                           ": its CPU optimizer runs after the backward (serial offload) with fp32 states; 8-bit "
                           "offloaded states and the pipelined offload are Stepcast backend features");
  if (skipped_single_rank)
    result.notes.push_back("on one GPU, stages 1-3 without offload partition nothing and equal stage 0: not listed");
  if (all.empty())
    throw InputError("--global-batch " + std::to_string(req.global_batch) +
                     " leaves no micro-batch in the search (needs a multiple of " +
                     std::to_string(world) + " ranks x a micro-batch)");
  result.evaluated = all.size();

  auto better = [](const Prediction& a, const Prediction& b) {
    const double ka = ranking_score(a), kb = ranking_score(b);
    if (ka != kb) return ka > kb;
    return a.memory.gpu_required_bytes < b.memory.gpu_required_bytes;
  };
  for (const auto& p : all) {
    if (p.fits) result.ranked.push_back(p);
    if (!result.smallest_memory || p.memory.gpu_required_bytes < result.smallest_memory->memory.gpu_required_bytes)
      result.smallest_memory = p;
  }
  result.dropped = all.size() - result.ranked.size();
  std::sort(result.ranked.begin(), result.ranked.end(), better);
  result.typical_error_frac = typical_error_frac(req.hardware);
  if (!result.ranked.empty() && result.typical_error_frac > 0) {
    const double floor_tps = result.ranked.front().throughput.tokens_per_s * (1.0 - result.typical_error_frac);
    for (const Prediction& p : result.ranked) result.tied_with_top += p.throughput.tokens_per_s >= floor_tps;
    if (result.tied_with_top > 1) {
      char buf[400];
      std::snprintf(buf, sizeof buf,
                    "%zu plans lie within %.1f %% of the top plan's tokens/s, the model's typical error (one "
                    "standard deviation): it does not order them; planner validate --top %zu measures the first %zu",
                    result.tied_with_top, 100.0 * result.typical_error_frac,
                    std::min<size_t>(result.tied_with_top, 5), std::min<size_t>(result.tied_with_top, 5));
      result.notes.push_back(buf);
    }
  }
  // A tight plan that would rank first: said, not ranked.
  for (const Prediction& p : all)
    if (p.tight && (!result.best_tight || better(p, *result.best_tight))) result.best_tight = p;
  if (result.best_tight && !result.ranked.empty() && !better(*result.best_tight, result.ranked.front()))
    result.best_tight.reset();
  if (result.best_tight) {
    const Prediction& t = *result.best_tight;
    char buf[500];
    char gain[80] = "no plan fits inside the headroom";
    if (!result.ranked.empty())
      std::snprintf(gain, sizeof gain, "%+.1f %% over the top plan",
                    100.0 * (t.throughput.tokens_per_s / result.ranked.front().throughput.tokens_per_s - 1.0));
    std::snprintf(buf, sizeof buf,
                  "a plan the card holds but not its %.0f %% headroom would rank first: %s, micro-batch %lld, GAS "
                  "%lld%s at %.0f tokens/s (%s); it %s. Not ranked: the headroom covers the memory model's misses "
                  "(planner explain shows its interval)",
                  100.0 * kGpuMemoryHeadroomFrac, family_name(t.config).c_str(),
                  static_cast<long long>(t.config.micro_batch), static_cast<long long>(t.config.gas),
                  t.config.activation_checkpointing ? ", checkpointing" : "", t.throughput.tokens_per_s, gain,
                  t.reason.c_str());
    result.notes.push_back(buf);
  }
  // Intervals (2 x coefficients more evaluations each) for the plans anyone will read.
  auto add_interval = [&](Prediction& p) {
    if (req.hardware.coef_covariance.empty() && !req.hardware.coefs_calibrated && req.hardware.transferred_log_q95 <= 0) return;
    const Features f = make_features(req.model, req.hardware, p.config, req.limits);
    set_interval(p, f.step, req.hardware, req.model.name);
  };
  for (size_t i = 0; i < std::min<size_t>(result.ranked.size(), 64); ++i) add_interval(result.ranked[i]);

  // Families, in order of their best member.
  std::map<std::string, FamilyOutcome> fams;
  for (const auto& p : all) {
    FamilyOutcome& fo = fams[family_name(p.config)];
    fo.family = family_name(p.config);
    if (p.fits) {
      fo.any_fits = true;
      if (!fo.best || better(p, *fo.best)) fo.best = p;
    } else if (!fo.smallest_memory || p.memory.gpu_required_bytes < fo.smallest_memory->memory.gpu_required_bytes) {
      fo.smallest_memory = p;
    }
  }
  const Prediction* top = result.ranked.empty() ? nullptr : &result.ranked.front();
  for (auto& [name, fo] : fams) {
    if (fo.best) add_interval(*fo.best);
    char buf[400];
    if (!fo.any_fits) {
      const Prediction& s = *fo.smallest_memory;
      std::snprintf(buf, sizeof buf, "%s even at micro-batch %lld%s", fit_verdict(s).c_str(), static_cast<long long>(s.config.micro_batch),
                    s.config.activation_checkpointing ? " with checkpointing" : "");
      fo.why = buf;
    } else if (top) {
      const Prediction& b = *fo.best;
      fo.loss_frac = 1.0 - b.throughput.tokens_per_s / top->throughput.tokens_per_s;
      if (family_name(b.config) == family_name(top->config)) {
        fo.why = "the top plan's family; " + dominant_cost(b);
      } else if (fo.loss_frac < 0.01) {
        std::snprintf(buf, sizeof buf,
                      "%s, within 1 %% of the top plan (a tie at the model's accuracy; the simpler "
                      "plan ranks first); %s",
                      fmt_tps(b.throughput.tokens_per_s).c_str(), dominant_cost(b).c_str());
        fo.why = buf;
      } else {
        std::snprintf(buf, sizeof buf, "%s, %s slower than the top plan: %s; %s",
                      fmt_tps(b.throughput.tokens_per_s).c_str(), pct(fo.loss_frac).c_str(),
                      dominant_cost(b).c_str(), largest_increase(b, *top).c_str());
        fo.why = buf;
      }
    }
    result.families.push_back(fo);
  }
  std::sort(result.families.begin(), result.families.end(),
            [](const FamilyOutcome& a, const FamilyOutcome& b) {
              if (a.any_fits != b.any_fits) return a.any_fits;
              if (a.any_fits) return a.loss_frac < b.loss_frac;
              return a.smallest_memory->memory.gpu_required_bytes < b.smallest_memory->memory.gpu_required_bytes;
            });

  // Nothing fits: say what would.
  if (result.ranked.empty()) {
    const Prediction& s = *result.smallest_memory;
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "the smallest configuration (%s, micro-batch %lld%s) %s",
                  family_name(s.config).c_str(), static_cast<long long>(s.config.micro_batch),
                  s.config.activation_checkpointing ? ", checkpointing" : "", s.reason.c_str());
    result.suggestions.push_back(buf);
    // More GPUs: the least-memory configuration shrinks as stage 3 shards over more ranks.
    for (int factor = 2; factor <= 256; factor *= 2) {
      TrainConfig c = s.config;
      const int total = world * factor;
      const int per_node_max = std::max(1, req.hardware.links.gpus_per_node_max);
      c.gpus_per_node = std::min(total, per_node_max);
      c.nodes = (total + c.gpus_per_node - 1) / c.gpus_per_node;
      c.gas = 1;
      Prediction p = evaluate(req.model, req.hardware, c, ResourceLimits{req.limits.gpu_memory_bytes, 0, 0});
      if (p.fits) {
        std::snprintf(buf, sizeof buf, "would fit on %d GPUs (--gpus %d --nodes %d): %.1f GiB per GPU",
                      total, c.gpus_per_node, c.nodes, p.memory.gpu_required_bytes / kBytesPerGiB);
        result.suggestions.push_back(buf);
        break;
      }
    }
    if (std::find(req.optimizers.begin(), req.optimizers.end(), OptimizerKind::kAdamW8bit) ==
        req.optimizers.end()) {
      TrainConfig c = s.config;
      c.optimizer = OptimizerKind::kAdamW8bit;
      Prediction p = evaluate(req.model, req.hardware, c, req.limits);
      if (p.fits) result.suggestions.push_back("would fit with 8-bit optimizer states (--optimizers adamw8bit)");
    }
    if (!req.allow_offload) result.suggestions.push_back("CPU offload was excluded: allow it");
    if (req.base.seq_len > 512) {
      TrainConfig c = s.config;
      c.seq_len = req.base.seq_len / 2;
      Prediction p = evaluate(req.model, req.hardware, c, req.limits);
      if (p.fits)
        result.suggestions.push_back("would fit at --seq " + std::to_string(c.seq_len));
    }
  }
  return result;
}

std::vector<Lever> offload_levers(const SearchRequest& req, const Prediction& plan) {
  std::vector<Lever> out;
  const TrainConfig& c = plan.config;
  if (c.offload_optimizer != OffloadDevice::kCpu) return out;
  auto add = [&](const std::string& name, const TrainConfig& changed, const ResourceLimits& limits) {
    try {
      validate_config(changed);  // a lever the plan's engine does not have is not offered
    } catch (const InputError&) {
      return;
    }
    Lever l{name, evaluate(req.model, req.hardware, changed, limits), 0.0};
    l.gain_frac = l.result.throughput.tokens_per_s / plan.throughput.tokens_per_s - 1.0;
    out.push_back(std::move(l));
  };
  TrainConfig t = c;
  if (!c.offload_pipeline) {
    t.offload_pipeline = true;
    add("pipelined CPU optimizer (Stepcast backend)", t, req.limits);
    t = c;
  }
  if (c.offload_pipeline && !c.offload_overlap_forward) {
    t.offload_overlap_forward = true;
    add("last CPU updates overlapping the next forward (--offload-pipeline full)", t, req.limits);
    t = c;
  }
  if (c.optimizer == OptimizerKind::kAdamW) {
    t.optimizer = OptimizerKind::kAdamW8bit;
    t.offload_pipeline = true;  // 8-bit offloaded states exist in the Stepcast backend only
    add(c.offload_pipeline ? "8-bit CPU AdamW states" : "8-bit CPU AdamW states, pipelined (Stepcast backend)", t,
        req.limits);
  }
  if (c.micro_batch % 2 == 0) {
    t = c;
    t.micro_batch /= 2;
    t.gas *= 2;
    add("GAS x2, micro-batch / 2", t, req.limits);
  }
  if (c.gas % 2 == 0) {
    t = c;
    t.micro_batch *= 2;
    t.gas /= 2;
    add("micro-batch x2, GAS / 2", t, req.limits);
  }
  t = c;
  t.activation_checkpointing = !c.activation_checkpointing;
  add(c.activation_checkpointing ? "no activation checkpointing" : "activation checkpointing", t, req.limits);
  if (c.offload_params == OffloadDevice::kCpu) {
    t = c;
    t.offload_params = OffloadDevice::kNone;
    add("parameters on the GPU (no parameter offload)", t, req.limits);
  }
  t = c;
  t.offload_params = OffloadDevice::kNone;
  t.offload_optimizer = OffloadDevice::kNone;
  t.offload_overlap_forward = false;
  add("no offload (optimizer on the GPU)", t, req.limits);
  const double node_cores = node_cpu_cores(req.hardware, c, req.limits);
  ResourceLimits more = req.limits;
  more.cpu_cores_node = 2.0 * node_cores;
  add("twice the CPU cores (" + std::to_string(static_cast<int>(more.cpu_cores_node)) + " per node)", c, more);
  if (c.engine != Engine::kStepcast && c.offload_optimizer != OffloadDevice::kNone && c.gpus_per_node > 1 &&
      req.limits.cpu_threads_per_rank <= 0) {
    // torchrun gives each of a node's ranks one OpenMP thread: the peer's CPU optimizer on the node's
    // cores split between its ranks instead.
    const int per_rank = std::max(1, static_cast<int>(node_cores / c.gpus_per_node));
    if (per_rank > 1) {
      ResourceLimits threads = req.limits;
      threads.cpu_threads_per_rank = per_rank;
      add("OMP_NUM_THREADS=" + std::to_string(per_rank) + " in each rank (--cpu-threads-per-rank " +
              std::to_string(per_rank) + "; torchrun sets 1)",
          c, threads);
    }
  }
  // Fitting levers first, each group by gain.
  std::stable_sort(out.begin(), out.end(), [](const Lever& a, const Lever& b) {
    if (a.result.fits != b.result.fits) return a.result.fits;
    return a.gain_frac > b.gain_frac;
  });
  return out;
}

}  // namespace stepcast
