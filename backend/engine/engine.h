// The ZeRO engine: data-parallel training of the transformer with ZeRO stage
// 0-3 (Rajbhandari et al. 2020), gradient accumulation, bf16 or fp32, AdamW on
// the GPU or offloaded to the CPU, parameter offload at stage 3, activation
// checkpointing, and per-phase timing of every step.
//
// Stage 0  every rank holds everything; gradients accumulate locally and are
//          all-reduced on the last micro-batch.
// Stage 1  optimizer states sharded; gradients accumulate locally and are
//          reduce-scattered on the last micro-batch; updated shards all-gathered.
// Stage 2  gradients sharded too: each unit's gradient is reduce-scattered as
//          soon as its backward is done, every micro-batch, into a shard accumulator.
// Stage 3  parameters sharded too: each unit is all-gathered before its forward
//          and again before its backward (prefetching the next), then freed.
// Communication runs on its own stream, unit by unit, overlapping the compute.
//
// CPU optimizer offload (stages 1-3) is a pipeline: with GAS > 1 gradient
// shards accumulate on the GPU (stages 2-3) or in the full gradient (stage 1);
// on the last micro-batch each unit's reduced shard is copied to pinned host
// memory as soon as its backward is done, a worker thread runs the CPU AdamW
// on it while the backward of the earlier units continues, and the updated
// parameters go back up unit by unit as the worker finishes them, during the
// backward where it finishes them early enough; at stages 1-2 the all-gathers
// follow the backward, in one order on every rank. With offload_overlap_forward the step does not
// wait for the last updates: at the end of the backward the worker's backlog is
// put in forward order (the embedding, whose gradient comes last, first), and
// the next step's forward uploads each unit just before it needs it, so that
// the CPU's tail overlaps the next forward.
//
// PEFT (TrainConfig::peft): the units' trainable parameters are LoRA adapters (layout.h); the
// base weights are frozen buffers beside them (working precision, and with QLoRA NF4 codes and
// scales), replicated at stages 0-2 and sharded and gathered with the adapters at stage 3.
// Everything above (reduction, offload, optimizer, checkpoints) concerns the adapters only.
//
// Optimizers: AdamW with fp32 states, or 8-bit AdamW (block-wise quantised
// moments, quant8.h) on the GPU or on the CPU; parameters of small tensors
// keep 32-bit states (the layout puts them last in each unit).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/comm/collectives.h"
#include "backend/cuda/kernels.h"
#include "backend/engine/checkpoint.h"
#include "backend/engine/cpu_update_worker.h"
#include "backend/engine/layout.h"
#include "backend/engine/transformer.h"
#include "backend/runtime/runtime.h"
#include "model/train_config.h"

namespace stepcast::backend {

// What a ZeRO stage partitions across the data-parallel ranks (Rajbhandari et al.
// 2020: P_os at stage 1, P_os+g at stage 2, P_os+g+p at stage 3).
enum class ZeroStage { k0, k1, k2, k3 };
struct Partitioning {
  bool optimizer_states = false;  // stages 1-3
  bool gradients = false;         // stages 2-3
  bool parameters = false;        // stage 3
};
inline Partitioning partitioning_of(ZeroStage stage) {
  return {stage >= ZeroStage::k1, stage >= ZeroStage::k2, stage == ZeroStage::k3};
}
// TrainConfig::zero_stage, validated to 0..3 (validate_config).
inline Partitioning partitioning_of(int zero_stage) { return partitioning_of(static_cast<ZeroStage>(zero_stage)); }

struct EngineOptions {
  TrainConfig config;
  kernels::AdamWArgs adamw;  // lr, betas, eps, weight decay (step and scale are set per step)
  uint64_t seed = 1234;
};

// Seconds, per step, on rank 0's clock; columns as in the planner's JSON.
struct StepTiming {
  double step_s = 0, gas_s = 0, opt_s = 0;
  double forward_s = 0, backward_s = 0;  // backward includes the recomputation with checkpointing
  double grad_comm_s = 0, param_gather_s = 0, offload_transfer_s = 0, optimizer_s = 0;  // exposed
  double optimizer_cpu_s = 0;  // offload: the CPU optimizer's own time, hidden or not
};

// The device allocator's peak allocated bytes in each phase of the step (the largest over
// micro-batches), and its peak reserved bytes over the step: where a step's memory peaks, which
// the cost model's live-tensor count is checked against (0 on the CPU runtime).
struct StepMemory {
  double gpu_peak_allocated_forward_bytes = 0, gpu_peak_allocated_backward_bytes = 0;
  double gpu_peak_allocated_optimizer_bytes = 0;
  double gpu_peak_reserved_bytes = 0;
  double gpu_peak_allocated_bytes() const {
    return std::max({gpu_peak_allocated_forward_bytes, gpu_peak_allocated_backward_bytes,
                     gpu_peak_allocated_optimizer_bytes});
  }
};

struct StepResult {
  int64_t step = 0;
  double loss = 0;  // mean over micro-batches and ranks
  StepTiming time;
  StepMemory memory;
};

class ZeroEngine {
 public:
  ZeroEngine(const ModelSpec& spec, const EngineOptions& options, Runtime& runtime, Collectives& comm);
  ~ZeroEngine();
  ZeroEngine(const ZeroEngine&) = delete;
  ZeroEngine& operator=(const ZeroEngine&) = delete;

  // One optimizer step over `micro_batches` (GAS of them), each (B, S + 1) int64 tokens on the device.
  StepResult train_step(const std::vector<torch::Tensor>& micro_batches);

  // Every parameter in fp32, in layout order without padding, on the CPU (collective: call on all ranks).
  torch::Tensor full_params_fp32();

  // Checkpoints (checkpoint.h): collective; `writer` names the program in the manifest,
  // `die_at_rank` (testing) makes that rank die abruptly in the middle of the save.
  void save(const std::string& root, const std::string& writer, int die_at_rank = -1);
  void load(const std::string& path);

  int64_t step_count() const { return step_; }
  int64_t num_params() const { return total_numel(layout_); }  // trainable (with PEFT: the adapters')
  int64_t num_frozen_params() const { return cfg_.peft_enabled() ? total_numel(base_layout_) : 0; }
  bool splits_master() const;  // some unit holds split master weights (8-bit offload, bf16, unless --split-master off)
  const std::vector<UnitLayout>& layout() const { return layout_; }

 private:
  // PEFT: one storage class of a unit's frozen base weights (FrozenLayout), full and, at
  // stage 3, this rank's shard of it.
  struct FrozenBuf {
    const UnitLayout* layout = nullptr;  // null: the unit holds nothing of this class
    torch::Tensor full, shard;
    UnitParams views;
  };
  struct Unit {
    const UnitLayout* layout = nullptr;
    std::array<FrozenBuf, 3> frozen;  // PEFT: working precision, NF4 codes, NF4 scales
    torch::Tensor full;       // working precision, padded; stage 3: storage only while gathered
    UnitParams leaves;        // parameter leaves viewing `full`
    torch::Tensor full_grad;  // stage 0/1: persistent; stage 2/3: one micro-batch's, transient
    torch::Tensor shard;      // stage 3: this rank's working-precision parameters (host with param offload)
    torch::Tensor grad_acc;   // stage 2/3 on the GPU: this rank's accumulated gradient shard
    torch::Tensor staging;    // offload: pinned working-precision shard (gradients down; parameters up, in place,
                              // unless the master weights are split)
    torch::Tensor upload;     // offload: where the CPU optimizer writes the parameters: the host shard with
                              // parameter offload, else what the uploads read (`staging`, or with split master
                              // weights a pinned buffer of its own)
    torch::Tensor master;     // fp32 master shard (host with offload); with split master weights only [n8, n)
    torch::Tensor master_hi, master_lo;  // split master weights of [0, n8) (cpu_adamw.h): hi views `upload`
    bool split = false;       // 8-bit offload in bf16, unless --split-master off
    torch::Tensor exp_avg, exp_avg_sq;  // fp32 moments of the 32-bit range [n8, n) (all of it for AdamW)
    torch::Tensor code_m, code_v, absmax_m, absmax_v;  // 8-bit AdamW: moments of [0, n8)
    int64_t n8 = 0;           // leading parameters of the shard with 8-bit states
    bool gathered = false;
    int ready_event = -1;
    int upload_event = -1;  // overlapped offload: its upload (and all-gather) is done
  };
  struct Saved {
    torch::Tensor x_in, out;
  };
  // Runtime markers of one step (Runtime::mark), read back by step_timing.
  struct MicroMarks {
    int start = 0, fwd_end = 0, bwd_end = 0, comm_done = 0;
  };
  struct StepMarks {
    int step = 0, last_micro = 0, opt = 0, opt_end = 0, end = 0;
    std::vector<MicroMarks> micro;
    std::vector<std::pair<int, int>> fwd_waits, bwd_waits, upload_waits;  // stage-3 gathers, overlapped uploads
    bool awaiting_uploads = false;  // the previous step's last updates go up during this step's first forward
  };
  struct Pending {
    torch::Tensor buffer;
    int event;
  };

  bool offload() const { return cfg_.offload_optimizer == OffloadDevice::kCpu; }
  bool param_offload() const { return cfg_.offload_params == OffloadDevice::kCpu; }
  int64_t opt_offset(const Unit& u) const;  // start of this rank's optimizer shard within the unit
  int64_t opt_numel(const Unit& u) const;
  torch::TensorOptions work_opts() const;
  torch::TensorOptions host_opts(torch::ScalarType dtype) const;

  void init_parameters();
  void init_frozen(size_t i);  // PEFT: the unit's base weights, initialised as a full run's, frozen
  void seed_dropout(size_t unit) const;  // LoRA dropout: the same mask in a layer's forward and its recompute
  void refresh_working_from_master();
  void gather(size_t u);
  void wait_gathered(size_t u, std::vector<std::pair<int, int>>& waits);
  void release(size_t u);
  void prepare_grads(size_t u);
  void reduce_unit(size_t u, bool boundary);
  void drain_pending(size_t keep);
  void optimizer_step();
  void update_unit(Unit& u, const void* grad, void* out, bool on_cpu, const kernels::AdamWArgs& args);
  std::vector<torch::Tensor*> state_tensors(Unit& u);
  CheckpointIdentity checkpoint_identity() const;
  torch::Tensor master_fp32(const Unit& u) const;   // the fp32 master shard (host), joined if split
  torch::Tensor master_working(const Unit& u) const;  // it as the working copy (split: hi as it is)
  // The step's phases (train_step).
  StepMarks begin_step();
  std::vector<Saved> forward(const torch::Tensor& batch, bool first_micro, StepMarks& marks);
  void backward(std::vector<Saved>& saved, bool boundary, StepMarks& marks);
  void optimizer_phase(StepMarks& marks);
  StepTiming step_timing(const StepMarks& marks);
  // The offload pipeline.
  void enqueue_cpu_update(size_t u);
  int64_t update_step() const;  // the step whose updates the uploads wait for: the outstanding one, else this one
  void upload_unit(size_t u);  // the updated shard up (stages 1-2: and all-gathered), on the comm stream
  void copy_up(size_t u);      // the updated shard up, on the comm stream (rank-local, no collective)
  // Pipelined offload, during the last backward: copies up the units the CPU optimizer has
  // finished, in its order, without waiting for any.
  void copy_up_ready();
  // Overlapped offload: uploads, in forward order, every unit up to `need` (waiting for the
  // worker) and the following ones the worker has already finished.
  void issue_uploads(size_t need);
  void finish_updates();  // every outstanding update done and uploaded

  ModelSpec spec_;
  TrainConfig cfg_;
  Partitioning partition_;
  EngineOptions opts_;
  Runtime& rt_;
  Collectives& comm_;
  Transformer model_;
  std::vector<UnitLayout> base_layout_;  // the model's parameters (with PEFT: the frozen base)
  std::vector<FrozenLayout> frozen_layout_;  // PEFT only
  std::vector<UnitLayout> layout_;       // the trainable units: base_layout_, or with PEFT the adapters
  std::vector<Unit> units_;
  int64_t micro_ = 0;                    // the micro-batch being run (dropout's seed)
  std::deque<Pending> pending_;
  kernels::AdamWArgs step_args_;
  torch::ScalarType work_dtype_;
  int64_t step_ = 0;
  // Overlapped offload: the step whose updates are still going up, and the next unit to upload.
  int64_t outstanding_step_ = 0;
  size_t upload_next_ = 0;
  // Pipelined offload: units copied up during this step's backward, from the last unit down.
  size_t copied_up_ = 0;
  double outstanding_cpu_s_ = 0;
  int rank_, world_;
  std::unique_ptr<CpuUpdateWorker> worker_;  // with offload; last, so that it stops before the units go
};

}  // namespace stepcast::backend
