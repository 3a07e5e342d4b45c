// train: runs one configuration on the backend and prints, per step, the
// measured time of every phase beside the planner's prediction.
//
//   train --model llama-2-7b --stage 2 --micro-batch 4 --gas 4 --steps 10 --nproc 2
//   train --plan plan.json --data data/text/kjv_genesis_exodus.txt --json-out runs.jsonl
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <sstream>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/cli.h"
#include "common/errors.h"
#include "common/host_cpu.h"
#include "common/run_main.h"
#include "common/text_file.h"
#include "common/units.h"
#include "backend/comm/collectives.h"
#include "backend/optim/cpu_adamw.h"
#include "backend/optim/cpu_cores.h"
#include "backend/engine/data.h"
#include "backend/engine/engine.h"
#include "backend/comm/launcher.h"
#include "common/errors.h"
#include "model/metrics.h"
#include "model/prediction.h"
#include "model/train_config_json.h"
#include "common/atomic_file.h"

#include "stepcast_git_commit.h"  // generated at every build (cmake/GitCommit.cmake)

namespace stepcast::backend {
namespace {


struct Flags {
  std::string model, plan, data, save, resume, json_out, dump_params, hardware = "auto", device = "auto", data_dir;
  int stage = 0, nproc = 1;
  int emulate_nodes = 1;   // --nproc ranks as this many nodes on this host (launcher.h)
  int emulated_node = -1;  // set by the launcher for the ranks of an emulated node
  std::string offload_optimizer = "none", offload_params = "none", optimizer = "adamw", precision = "bf16",
              checkpointing = "off", offload_pipeline = "on", split_master = "on", cpu_simd = "auto",
              cpu_bind = "on", peft = "none", lora_targets = "all", gpu_allocator = "default";
  int64_t lora_rank = 16;
  double lora_alpha = 16.0, lora_dropout = 0.0;
  int64_t micro_batch = 1, gas = 1, seq = 2048, steps = 10, warmup = 2;
  int cpu_threads = 0;
  double lr = 3e-4, weight_decay = 0.0, beta1 = 0.9, beta2 = 0.95;
  double gpu_mem_limit_gib = 0;  // 0: the whole device
  uint64_t seed = 1234;
  bool quiet = false;
  bool dry_run = false;
  int timeout_s = 120;      // rendezvous and Gloo collectives
  int launcher_pid = 0;     // set by launch_local_ranks for the ranks it starts
  int fault_rank = -1;     // testing: this rank exits abruptly at fault_step
  int64_t fault_step = 0;
  std::string fault_in = "step";  // testing: "step" (before the step's work) or "save" (while saving)
};

std::filesystem::path data_dir(const Flags& f) { return resolve_data_dir(f.data_dir); }

TrainConfig config_from(const Flags& f, const CLI::App& app) {
  TrainConfig c;
  if (!f.plan.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(f.plan, ec)) throw InputError(f.plan + ": cannot open the --plan file");
    c = plan_config_from_text(read_text_file(f.plan), f.plan);
  }
  c.offload_uploads_in_backward = true;  // the backend's only order (a plan from before may say otherwise)
  auto given = [&](const char* flag) { return f.plan.empty() || app.count(flag) > 0; };
  if (given("--stage")) c.zero_stage = f.stage;
  if (given("--offload-optimizer")) c.offload_optimizer = parse_offload(f.offload_optimizer, "--offload-optimizer");
  if (given("--offload-params")) c.offload_params = parse_offload(f.offload_params, "--offload-params");
  if (given("--optimizer")) c.optimizer = parse_optimizer(f.optimizer, "--optimizer");
  if (given("--precision")) c.precision = parse_precision(f.precision, "--precision");
  if (given("--micro-batch")) c.micro_batch = f.micro_batch;
  if (given("--gas")) c.gas = f.gas;
  if (given("--seq")) c.seq_len = f.seq;
  if (given("--offload-pipeline")) parse_offload_pipeline(f.offload_pipeline, "--offload-pipeline", c);
  if (given("--split-master")) c.split_master = parse_on_off(f.split_master, "--split-master");
  if (given("--cpu-simd")) c.cpu_simd = parse_cpu_simd(f.cpu_simd, "--cpu-simd");
  if (given("--cpu-bind")) c.cpu_bind = parse_on_off(f.cpu_bind, "--cpu-bind");
  if (given("--gpu-allocator")) c.gpu_expandable_segments = parse_gpu_allocator(f.gpu_allocator, "--gpu-allocator");
  if (given("--peft")) c.peft = parse_peft(f.peft, "--peft");
  if (given("--lora-rank")) c.lora_rank = f.lora_rank;
  if (given("--lora-alpha")) c.lora_alpha = f.lora_alpha;
  if (given("--lora-targets")) c.lora_targets = parse_lora_targets(f.lora_targets, "--lora-targets");
  if (given("--lora-dropout")) c.lora_dropout = f.lora_dropout;
  if (given("--checkpointing")) {
    if (f.checkpointing != "on" && f.checkpointing != "off")
      throw InputError("--checkpointing \"" + f.checkpointing + "\" is not valid (valid: on, off)");
    c.activation_checkpointing = f.checkpointing == "on";
  }
  return c;
}

// The host's time to issue one small in-place op on the run's device, microseconds: the median
// of five rounds of 256 adds (after one round of warm-up), each timed without waiting for the
// device, below the launch queue's depth on a GPU. A layer's host floor is made of such issues;
// lent machines of one kind differ in it (docs/engines.md), so each record keeps it.
double host_op_us(Runtime& rt) {
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::zeros({1}, torch::TensorOptions().device(rt.device()));
  constexpr int kOps = 256;
  std::vector<double> rounds_us;
  for (int round = 0; round < 6; ++round) {
    rt.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kOps; ++i) x.add_(1.0);
    const std::chrono::duration<double, std::micro> issued = std::chrono::steady_clock::now() - t0;
    if (round > 0) rounds_us.push_back(issued.count() / kOps);
  }
  rt.synchronize();
  std::nth_element(rounds_us.begin(), rounds_us.begin() + rounds_us.size() / 2, rounds_us.end());
  return rounds_us[rounds_us.size() / 2];
}

std::string out_of_memory_message(int rank, const std::string& when, const std::optional<Prediction>& pred,
                                  Runtime& rt) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "out of memory on rank %d %s: predicted %.1f GiB per GPU, device has %.1f GiB", rank,
                when.c_str(), pred ? pred->memory.gpu_total_bytes / kBytesPerGiB : 0.0,
                rt.device_memory_bytes() / kBytesPerGiB);
  return buf;
}

// torch's caching allocator settings variable (c10/cuda/CUDAAllocatorConfig.h reads it).
constexpr const char* kAllocConfVar = "PYTORCH_CUDA_ALLOC_CONF";

// The record says which allocator ran: a run whose environment turns expandable segments on
// without --gpu-allocator expandable (or the reverse, where torch ignores the setting) stops
// before its first step, naming the variable.
void check_allocator(Runtime& rt, const TrainConfig& cfg, const std::string& user_conf) {
  if (!rt.is_cuda()) {
    // As --gpu-mem-limit-gib: the CPU has no CUDA caching allocator for the record to describe.
    if (cfg.gpu_expandable_segments)
      throw InputError("--gpu-allocator expandable (or a plan's config.gpu_allocator) needs a CUDA device; this "
                       "run's device is the CPU");
    return;
  }
  const bool expandable = rt.expandable_segments();
  if (expandable == cfg.gpu_expandable_segments) return;
  if (expandable)
    throw InputError(std::string(kAllocConfVar) + "=\"" + user_conf +
                     "\" turns on expandable segments: pass --gpu-allocator expandable so that the run record says so, "
                     "or unset it");
  throw InputError("--gpu-allocator expandable: torch's CUDA allocator did not take expandable segments (" +
                   std::string(kAllocConfVar) + "=\"" + user_conf + "\" before the run)");
}

// The run's own numbers (the configuration's are validate_config's).
void check_run_flags(const Flags& f) {
  const auto range = [](const char* flag, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw InputError(std::string(flag) + " " + std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
  };
  range("--steps", f.steps, 1, 1000000000);
  range("--warmup", f.warmup, 0, 1000000000);
  range("--cpu-threads", f.cpu_threads, 0, 4096);
  range("--timeout-s", f.timeout_s, 1, 1000000);
  range("--nproc", f.nproc, 1, 4096);
  range("--emulate-nodes", f.emulate_nodes, 1, 4096);
  check_emulated_nodes(f.nproc, f.emulate_nodes);
  // (--lr 0 is a run that leaves the parameters as initialised: the tests use it.)
  if (!(std::isfinite(f.lr) && f.lr >= 0)) throw InputError("--lr " + std::to_string(f.lr) + " must be a non-negative number");
  if (!(std::isfinite(f.weight_decay) && f.weight_decay >= 0))
    throw InputError("--weight-decay " + std::to_string(f.weight_decay) + " must be a non-negative number");
  if (!(std::isfinite(f.gpu_mem_limit_gib) && f.gpu_mem_limit_gib >= 0))
    throw InputError("--gpu-mem-limit-gib " + std::to_string(f.gpu_mem_limit_gib) + " must be a non-negative number of GiB (0: the whole device)");
}

// On the CPU runtime every rank's states, gradients and activations live in host memory:
// a run that cannot fit is refused before it starts (exit 3) instead of being ended by the
// kernel's OOM killer. The estimate is the memory model's (model/memory_model.h): the
// device part of each rank, less the CUDA workspace, plus the host part.
void check_host_memory(const Flags& f, const CLI::App& app) {
  const ModelSpec spec = resolve_model(f.model, data_dir(f));
  TrainConfig cfg = config_from(f, app);
  cfg.gpus_per_node = f.nproc;
  cfg.nodes = 1;
  validate_config(cfg);
  // The CPU runtime has no GPU to name a profile: the memory model's host part is the same in all.
  const HardwareProfile hw = resolve_hardware(f.hardware == "auto" ? "h200-sxm" : f.hardware, data_dir(f));
  const MemoryEstimate<double> m = evaluate(spec, hw, cfg).memory;
  const double need = f.nproc * (m.gpu_total_bytes - m.gpu_workspace_bytes) + m.host_node_total_bytes;
  const double available = host_available_bytes();
  if (available > 0 && need > available) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "out of host memory: %s on the CPU needs about %.1f GiB for %d rank(s), this host has %.1f GiB "
                  "available (fewer ranks, a smaller micro-batch or sequence, or the GPU)",
                  spec.name.c_str(), need / kBytesPerGiB, f.nproc, available / kBytesPerGiB);
    throw OutOfMemoryError(buf);
  }
}

int run_rank(const Flags& f, const CLI::App& app) {
  die_with_launcher(f.launcher_pid);
  const Rendezvous rv = rendezvous_from_env(f.timeout_s);
  const int local_world = rv.local_world;
  const bool lead = rv.rank == 0;

  const ModelSpec spec = resolve_model(f.model, data_dir(f));
  TrainConfig cfg = config_from(f, app);
  cfg.gpus_per_node = local_world;
  cfg.nodes = std::max(1, rv.world / std::max(1, local_world));
  validate_config(cfg);

  // Ranks on one host split its physical cores (those this process may use), and each
  // rank's process and optimizer threads are bound to its share (cpu_cores.h). With
  // offload, the CPU optimizer runs during the backward: it leaves one core of the share
  // to the thread that feeds the GPU.
  const std::vector<LogicalCpu> host_cpus = allowed_cpus();
  // Emulated nodes share this host: each rank takes its share of the host's cores, not of a node's.
  const bool emulated = f.emulate_nodes > 1 && f.emulated_node >= 0;
  const int host_rank = emulated ? f.emulated_node * local_world + rv.local_rank : rv.local_rank;
  const int host_ranks = emulated ? f.emulate_nodes * local_world : local_world;
  const std::vector<int> rank_cores = rank_cpus(host_cpus, host_rank, std::max(1, host_ranks));
  bind_cpus(rank_cores, cfg.cpu_bind);
  select_simd(cfg.cpu_simd);
  const int share = physical_cores(host_cpus, rank_cores);
  const char* alloc_conf_before = std::getenv(kAllocConfVar);
  const std::string user_alloc_conf = alloc_conf_before ? alloc_conf_before : "";
  if (cfg.gpu_expandable_segments) {
    // torch's allocator reads its settings once, at its first use, which comes after this.
    const std::string conf = user_alloc_conf.empty() ? "expandable_segments:True" : user_alloc_conf + ",expandable_segments:True";
    ::setenv(kAllocConfVar, conf.c_str(), 1);
  }
  std::unique_ptr<Runtime> rt = Runtime::from_flag(f.device, rv.local_rank);
  check_allocator(*rt, cfg, user_alloc_conf);
  if (f.gpu_mem_limit_gib != 0) rt->limit_memory(f.gpu_mem_limit_gib * kBytesPerGiB);
  at::set_num_threads(share);
  set_cpu_threads(f.cpu_threads > 0 ? f.cpu_threads : std::max(1, share > 2 ? share - 1 : share));

  Connection conn;
  try {
    conn = connect(rv, *rt);
  } catch (const IoError&) {
    throw;
  } catch (const std::exception& e) {
    // The store or the process group gave up waiting for the other ranks.
    const std::string what = e.what();
    throw IoError("rank " + std::to_string(rv.rank) + ": no rendezvous of " + std::to_string(rv.world) + " ranks at " +
                  rv.master_addr + ":" + std::to_string(rv.master_port) + " within --timeout-s " +
                  std::to_string(f.timeout_s) + " (" + what.substr(0, what.find('\n')) + ")");
  }
  std::unique_ptr<Collectives>& comm = conn.comm;

  EngineOptions eo;
  eo.config = cfg;
  eo.seed = f.seed;
  eo.adamw.lr = static_cast<float>(f.lr);
  eo.adamw.beta1 = static_cast<float>(f.beta1);
  eo.adamw.beta2 = static_cast<float>(f.beta2);
  eo.adamw.weight_decay = static_cast<float>(f.weight_decay);

  // The planner's prediction for this configuration on the named hardware.
  std::optional<Prediction> pred;
  std::optional<HardwareProfile> hw;
  if (rt->is_cuda()) {
    // auto: the profile whose [gpu] name is this device's; a GPU no profile describes gets no
    // prediction rather than another GPU's.
    std::optional<std::string> name = f.hardware;
    if (f.hardware == "auto") {
      name = hardware_for_device(rt->device_name(), data_dir(f));
      if (!name && lead)
        std::fprintf(stderr, "train: no profile in %s/hardware has [gpu] name = \"%s\": no prediction (--hardware NAME "
                     "picks one)\n", data_dir(f).string().c_str(), rt->device_name().c_str());
    }
    if (name) {
      hw = resolve_hardware(*name, data_dir(f));
      pred = evaluate(spec, *hw, cfg);
    }
  }

  std::unique_ptr<ZeroEngine> engine;
  try {
    engine = std::make_unique<ZeroEngine>(spec, eo, *rt, *comm);
    if (!f.resume.empty()) engine->load(f.resume);
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
    throw OutOfMemoryError(out_of_memory_message(rv.rank, "while placing the model", pred, *rt));
  }
  TokenSource tokens(f.data, spec.vocab_size, f.seed);

  nlohmann::json env = {{"device", rt->device_name()},
                        {"driver", rt->driver_version()},
                        {"libtorch", TORCH_VERSION},
                        {"collectives", comm->name()},
                        {"git_commit", STEPCAST_GIT_COMMIT},
                        {"world_size", rv.world},
                        {"data", tokens.description()},
                        {"host_op_us", host_op_us(*rt)},
                        {"cpu_mhz", mean_cpu_mhz()}};
  if (const char* conf = std::getenv(kAllocConfVar)) env["pytorch_cuda_alloc_conf"] = conf;
  // Nodes emulated on one host (--emulate-nodes): config.nodes counts them; NCCL moved the bytes
  // between them over its network transport (launcher.h).
  if (f.emulate_nodes > 1) env["emulated_nodes"] = f.emulate_nodes;
  if (cfg.offload_optimizer == OffloadDevice::kCpu) {
    env["cpu_optimizer"] = {{"threads", cpu_threads()},
                            {"simd", simd_name(selected_simd())},
                            {"cpus", cpu_list_string(rank_cores)},
                            {"bound", cpus_bound()},
                            {"split_master", engine->splits_master()}};
  }
  if (lead && !f.quiet && cfg.peft_enabled())
    std::printf("peft: %s rank %lld on %s projections, alpha %g, dropout %g: %lld trainable of %lld parameters\n",
                peft_name(cfg.peft), static_cast<long long>(cfg.lora_rank), lora_targets_name(cfg.lora_targets),
                cfg.lora_alpha, cfg.lora_dropout, static_cast<long long>(engine->num_params()),
                static_cast<long long>(engine->num_frozen_params() + engine->num_params()));
  if (lead && !f.quiet) {
    std::printf("train: %s (%lld parameters), %s, stage %d, offload %s/%s, %s, micro-batch %lld x GAS %lld x %d ranks, seq %lld%s\n",
                spec.name.c_str(), static_cast<long long>(engine->num_params()), rt->device_name().c_str(), cfg.zero_stage,
                offload_name(cfg.offload_optimizer), offload_name(cfg.offload_params), precision_name(cfg.precision),
                static_cast<long long>(cfg.micro_batch), static_cast<long long>(cfg.gas), rv.world,
                static_cast<long long>(cfg.seq_len), cfg.activation_checkpointing ? ", checkpointing" : "");
    std::printf("data: %s; collectives: %s; prediction: %s\n", tokens.description().c_str(), comm->name().c_str(),
                hw ? (hw->name + " profile").c_str() : "none");
    std::printf("%5s %9s %9s %9s %9s %10s %6s %9s %9s %9s\n", "step", "loss", "step", "GAS", "OPT", "tokens/s", "MFU",
                "pred step", "pred tok/s", "peak mem");
    std::printf("%5s %9s %9s %9s %9s %10s %6s %9s %9s %9s\n", "", "", "s", "s", "s", "", "%", "s", "", "GiB");
  }
  // Each step's record is appended as one whole line (append_lines), so that a run killed
  // mid-write leaves at most a torn last line, which readers skip.
  const bool write_jsonl = lead && !f.json_out.empty();
  if (write_jsonl) append_lines(f.json_out, "");  // fails now, naming --json-out's path, not after the first step

  const double tokens_per_step = static_cast<double>(cfg.micro_batch * cfg.seq_len * cfg.gas * rv.world);
  const double flops_per_token =
      model_flops_per_token(spec, cfg);
  const int64_t first = engine->step_count();
  for (int64_t s = 0; s < f.steps; ++s) {
    const int64_t step = first + s + 1;
    std::vector<torch::Tensor> micro;
    for (int64_t mb = 0; mb < cfg.gas; ++mb)
      micro.push_back(tokens.batch(step, mb, rv.rank, cfg.micro_batch, cfg.seq_len).to(rt->device()));
    if (rv.rank == f.fault_rank && step == f.fault_step && f.fault_in == "step") {
      std::fprintf(stderr, "train: rank %d: injected fault at step %lld\n", rv.rank, static_cast<long long>(step));
      std::fflush(stderr);
      std::_Exit(7);  // abrupt, as a crashed rank: no destructors, no goodbye to the other ranks
    }
    StepResult r;  // its memory peaks are the step's own: train_step resets the allocator's
    const std::optional<CpuTicks> ticks_before = write_jsonl ? read_proc_stat() : std::nullopt;
    try {
      r = engine->train_step(micro);
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("out of memory") == std::string::npos) throw;
      throw OutOfMemoryError(out_of_memory_message(rv.rank, "at step " + std::to_string(step), pred, *rt));
    }
    const std::optional<CpuTicks> ticks_after = write_jsonl ? read_proc_stat() : std::nullopt;
    const double tps = tokens_per_step / r.time.step_s;
    const double mfu_frac = hw ? mfu(tps, flops_per_token, rv.world, hw->gpu.peak_flops_per_s(cfg.precision)) : 0.0;
    const double peak = r.memory.gpu_peak_allocated_bytes(), reserved = r.memory.gpu_peak_reserved_bytes;
    if (lead && !f.quiet) {
      std::printf("%5lld %9.4f %9.3f %9s %9.3f %10.0f %6s %9s %9s %9.1f\n", static_cast<long long>(r.step), r.loss,
                  r.time.step_s, cfg.gas > 1 ? std::to_string(r.time.gas_s).substr(0, 7).c_str() : "n/a", r.time.opt_s, tps,
                  hw ? std::to_string(100 * mfu_frac).substr(0, 4).c_str() : "-",
                  pred ? std::to_string(pred->time.step_s).substr(0, 6).c_str() : "-",
                  pred ? std::to_string(static_cast<long long>(pred->throughput.tokens_per_s)).c_str() : "-",
                  reserved / kBytesPerGiB);
      std::fflush(stdout);
    }
    if (write_jsonl) {
      nlohmann::json j;
      j["model"] = spec.name;
      j["params"] = spec.total_params();
      if (cfg.peft_enabled()) j["trainable_params"] = engine->num_params();  // the adapters (padding excluded)
      j["config"] = train_config_to_json(cfg);
      j["step"] = r.step;
      j["warmup"] = s < f.warmup;
      j["loss"] = r.loss;
      j["time_s"] = {{"step", r.time.step_s}, {"gas", cfg.gas > 1 ? nlohmann::json(r.time.gas_s) : nlohmann::json(nullptr)},
                     {"opt", r.time.opt_s}, {"forward", r.time.forward_s}, {"backward", r.time.backward_s},
                     {"grad_comm", r.time.grad_comm_s}, {"param_gather", r.time.param_gather_s},
                     {"offload_transfer", r.time.offload_transfer_s}, {"optimizer", r.time.optimizer_s},
                     {"optimizer_cpu", r.time.optimizer_cpu_s}};
      j["throughput"] = {{"tokens_per_s", tps}, {"world_samples_per_s", tps / cfg.seq_len},
                         {"rank_samples_per_s", tps / cfg.seq_len / rv.world}, {"mfu", mfu_frac}};
      j["memory_bytes"] = {{"gpu_peak_allocated", peak}, {"gpu_peak_reserved", reserved},
                           {"gpu_peak_allocated_forward", r.memory.gpu_peak_allocated_forward_bytes},
                           {"gpu_peak_allocated_backward", r.memory.gpu_peak_allocated_backward_bytes},
                           {"gpu_peak_allocated_optimizer", r.memory.gpu_peak_allocated_optimizer_bytes},
                           {"host_rss", host_rss_bytes()}, {"host_peak_rss", host_peak_rss_bytes()}};
      if (f.gpu_mem_limit_gib != 0) j["memory_bytes"]["gpu_limit"] = f.gpu_mem_limit_gib * kBytesPerGiB;
      j["allocator"] = {{"alloc_retries_total", rt->alloc_retries()}};
      if (ticks_before && ticks_after) {
        const CpuShare share = cpu_share(*ticks_before, *ticks_after);
        j["host_cpu"] = {{"steal_frac", share.steal_frac}, {"busy_frac", share.busy_frac}, {"ticks", share.ticks}};
      }
      if (pred) {
        j["predicted"] = {{"hardware", hw->name}, {"calibrated", hw->coefs_calibrated},
                          {"step_s", pred->time.step_s}, {"tokens_per_s", pred->throughput.tokens_per_s},
                          {"gpu_memory_bytes", pred->memory.gpu_total_bytes}};
      }
      j["env"] = env;
      append_lines(f.json_out, j.dump() + "\n");
    }
  }
  if (!f.save.empty())
    engine->save(f.save, STEPCAST_GIT_COMMIT, f.fault_in == "save" ? f.fault_rank : -1);
  if (!f.dump_params.empty()) {
    torch::Tensor all = engine->full_params_fp32();
    if (lead) {
      std::ostringstream bytes;
      torch::save(all, bytes);
      write_file_atomic(f.dump_params, bytes.str());
    }
  }
  comm->barrier();
  return 0;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"Stepcast train: runs a training configuration on the backend (ZeRO 0-3, offload, GAS) "
               "and prints measured against predicted step time."};
  Flags f;
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--model", f.model, "catalog name, .toml card or config.json")->required();
  app.add_option("--plan", f.plan, "a planner JSON (explain/recommend --json): runs plans[0]; other flags override");
  app.add_option("--stage", f.stage, "ZeRO stage 0..3")->capture_default_str();
  app.add_option("--offload-optimizer", f.offload_optimizer, "none | cpu")->capture_default_str();
  app.add_option("--offload-params", f.offload_params, "none | cpu (stage 3, with --offload-optimizer cpu)")->capture_default_str();
  app.add_option("--optimizer", f.optimizer, "adamw or adamw8bit (block-wise 8-bit moments)")->capture_default_str();
  app.add_option("--precision", f.precision, "bf16 | fp32")->capture_default_str();
  app.add_option("--micro-batch", f.micro_batch, "sequences per rank per micro-batch")->capture_default_str();
  app.add_option("--gas", f.gas, "gradient accumulation steps")->capture_default_str();
  app.add_option("--seq", f.seq, "sequence length")->capture_default_str();
  app.add_option("--checkpointing", f.checkpointing, "on | off")->capture_default_str();
  app.add_option("--offload-pipeline", f.offload_pipeline,
                 "on: the CPU optimizer updates each unit during the backward; full: and the last updates "
                 "go up during the next forward; off: after the backward (DeepSpeed's order)")
      ->capture_default_str();
  app.add_option("--split-master", f.split_master,
                 "on | off: 8-bit CPU offload in bf16 keeps the fp32 master weights split (bf16 upper half + "
                 "16-bit remainder, 14 instead of 16 bytes per update)")
      ->capture_default_str();
  app.add_option("--cpu-simd", f.cpu_simd, "auto | scalar | avx2 | avx512: the CPU optimizer's instruction set "
                 "(auto: the widest this CPU has)")
      ->capture_default_str();
  app.add_option("--cpu-bind", f.cpu_bind, "on | off: bind each rank and its CPU optimizer threads to its cores")
      ->capture_default_str();
  app.add_option("--gpu-allocator", f.gpu_allocator,
                 "default | expandable: the CUDA caching allocator's segments (expandable: one growing address "
                 "range, less cache above the live bytes; recorded in the run record)")
      ->capture_default_str();
  app.add_option("--peft", f.peft,
                 "none | lora | qlora: train low-rank adapters on frozen base weights (qlora: stored in 4-bit NF4)")
      ->capture_default_str();
  app.add_option("--lora-rank", f.lora_rank, "LoRA rank r")->capture_default_str();
  app.add_option("--lora-alpha", f.lora_alpha, "LoRA alpha (the adapters' output is scaled by alpha / r)")
      ->capture_default_str();
  app.add_option("--lora-targets", f.lora_targets, "attention | mlp | all: the projections that carry adapters")
      ->capture_default_str();
  app.add_option("--lora-dropout", f.lora_dropout, "dropout on the adapters' input")->capture_default_str();
  app.add_option("--steps", f.steps, "optimizer steps to run")->capture_default_str();
  app.add_option("--warmup", f.warmup, "first steps flagged as warm-up in the JSONL")->capture_default_str();
  app.add_option("--cpu-threads", f.cpu_threads,
                 "threads of each rank's CPU optimizer (default: the rank's share of the cores, less one)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--nproc", f.nproc, "ranks to start on this host (one per GPU, or CPU processes with Gloo)")->capture_default_str();
  app.add_option("--emulate-nodes", f.emulate_nodes,
                 "start the --nproc ranks as this many nodes on this host (it divides --nproc): each node its "
                 "own GPUs and host identity, so NCCL moves the bytes between them over its network transport; "
                 "recorded (config.nodes, env.emulated_nodes)")
      ->capture_default_str();
  app.add_option("--emulated-node", f.emulated_node, "set by --emulate-nodes for the ranks it starts")->group("");
  app.add_option("--device", f.device, "auto | cpu | cuda")->capture_default_str();
  app.add_option("--gpu-mem-limit-gib", f.gpu_mem_limit_gib,
                 "emulate a smaller GPU: the caching allocator holds at most this much per device (it frees its "
                 "cache and retries before it fails); recorded in the run record (memory_bytes.gpu_limit)");
  app.add_option("--data", f.data, "a text file (byte-level tokens); random tokens when absent");
  app.add_option("--save", f.save, "write a checkpoint to this folder at the end");
  app.add_option("--resume", f.resume, "continue from a checkpoint folder");
  app.add_option("--json-out", f.json_out, "append one JSON object per step to this file");
  app.add_option("--dump-params", f.dump_params, "write all parameters (fp32) to this file at the end");
  app.add_option("--hardware", f.hardware, "hardware profile for the prediction (auto: the profile whose [gpu] name "
                 "is this GPU's)")->capture_default_str();
  app.add_option("--lr", f.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--seed", f.seed, "initialisation and data seed")->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "folder with models/ and hardware/");
  app.add_option("--timeout-s", f.timeout_s, "seconds to wait for the other ranks at the rendezvous and in a "
                 "collective (Gloo)")->capture_default_str();
  app.add_flag("--quiet", f.quiet, "print nothing per step");
  app.add_flag("--dry-run", f.dry_run,
               "print the model and configuration this run would record (one JSON line) and exit");
  app.add_option("--inject-fault-rank", f.fault_rank, "testing: make this rank die abruptly")->group("");
  app.add_option("--inject-fault-step", f.fault_step, "testing: at this step")->group("");
  app.add_option("--inject-fault-in", f.fault_in, "testing: step | save")->group("");
  app.add_option("--launcher-pid", f.launcher_pid, "set by --nproc for the ranks it starts")->group("");
  if (const auto status = parse_cli(app, argc, argv, "train")) return *status;
  check_run_flags(f);
  if (f.fault_in != "step" && f.fault_in != "save")
    throw InputError("--inject-fault-in \"" + f.fault_in + "\" is not valid (valid: step, save)");
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported as such, instead
  // of killing the process with SIGXFSZ in the middle of a checkpoint.
  std::signal(SIGXFSZ, SIG_IGN);
  if (f.dry_run) {
    // What run_rank records: --nproc ranks on one host, as --emulate-nodes nodes.
    const ModelSpec spec = resolve_model(f.model, data_dir(f));
    TrainConfig cfg = config_from(f, app);
    cfg.gpus_per_node = f.nproc / f.emulate_nodes;
    cfg.nodes = f.emulate_nodes;
    validate_config(cfg);
    std::printf("%s\n", nlohmann::json({{"model", spec.name}, {"config", train_config_to_json(cfg)}}).dump().c_str());
    return 0;
  }
  if (std::getenv("RANK") == nullptr && runs_on_cpu(f.device)) check_host_memory(f, app);
  if (f.nproc > 1 && std::getenv("RANK") == nullptr) {
    std::vector<std::string> args(argv, argv + argc);
    return launch_local_ranks(f.nproc, args, 10, f.emulate_nodes);
  }
  if (f.emulate_nodes > 1 && f.emulated_node < 0)
    throw InputError("--emulate-nodes " + std::to_string(f.emulate_nodes) + " needs --nproc to start the ranks");
  return run_rank(f, app);
}

}  // namespace
}  // namespace stepcast::backend

int main(int argc, char** argv) {
  return stepcast::run_main("train", [&] { return stepcast::backend::main_impl(argc, argv); });
}
