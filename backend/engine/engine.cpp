#include "backend/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "backend/engine/nf4_tensor.h"
#include "backend/runtime/compat.h"
#include "backend/optim/cpu_adamw.h"
#include "backend/optim/quant8.h"
#include "common/errors.h"
#include "model/hardware.h"

namespace stepcast::backend {

namespace fs = std::filesystem;

namespace {

kernels::DType kdtype(torch::ScalarType t) {
  return t == torch::kBFloat16 ? kernels::DType::kBFloat16 : kernels::DType::kFloat32;
}

}  // namespace

ZeroEngine::ZeroEngine(const ModelSpec& spec, const EngineOptions& options, Runtime& runtime, Collectives& comm)
    : spec_(spec),
      cfg_(options.config),
      partition_(partitioning_of(options.config.zero_stage)),
      opts_(options),
      rt_(runtime),
      comm_(comm),
      model_(spec, runtime.device(),
             LoraSettings{options.config.lora_alpha / static_cast<double>(options.config.lora_rank),
                          options.config.peft_enabled() ? options.config.lora_dropout : 0.0}),
      base_layout_(build_layout(spec, comm.world())),
      rank_(comm.rank()),
      world_(comm.world()) {
  validate_config(cfg_);
  if (cfg_.peft_enabled()) {
    frozen_layout_ = build_frozen_layout(base_layout_, cfg_.peft == PeftKind::kQlora, world_);
    layout_ = build_adapter_layout(spec_, base_layout_, cfg_.lora_rank, cfg_.lora_targets, world_);
  } else {
    layout_ = base_layout_;
  }
  validate_job(cfg_);  // the backend trains bf16 or fp32
  work_dtype_ = cfg_.precision == Precision::kBf16 ? torch::kBFloat16 : torch::kFloat;
  init_parameters();
  if (offload())
    worker_ = std::make_unique<CpuUpdateWorker>(units_.size(), [this](size_t i, const kernels::AdamWArgs& args) {
      Unit& u = units_[i];
      update_unit(u, u.staging.data_ptr(), u.upload.data_ptr(), /*on_cpu=*/true, args);
    });
}

ZeroEngine::~ZeroEngine() = default;

torch::TensorOptions ZeroEngine::work_opts() const { return torch::dtype(work_dtype_).device(rt_.device()); }

torch::TensorOptions ZeroEngine::host_opts(torch::ScalarType dtype) const {
  auto o = torch::dtype(dtype).device(torch::kCPU);
  return rt_.is_cuda() ? o.pinned_memory(true) : o;
}

int64_t ZeroEngine::opt_offset(const Unit& u) const {
  return partition_.optimizer_states ? rank_ * u.layout->shard_numel() : 0;
}

int64_t ZeroEngine::opt_numel(const Unit& u) const {
  return partition_.optimizer_states ? u.layout->shard_numel() : u.layout->padded_numel;
}

void ZeroEngine::init_parameters() {
  const bool fp32 = work_dtype_ == torch::kFloat;
  units_.resize(layout_.size());
  for (size_t i = 0; i < layout_.size(); ++i) {
    Unit& u = units_[i];
    u.layout = &layout_[i];
    const int64_t padded = u.layout->padded_numel, shard = u.layout->shard_numel();
    // The same full initial weights on every rank, whatever the stage (PEFT: the same base
    // weights as a full run's, and adapters from a seed of their own).
    torch::Tensor init = torch::empty({padded}, torch::dtype(torch::kFloat).device(rt_.device()));
    if (cfg_.peft_enabled()) init_frozen(i);
    init_unit(*u.layout, init, (opts_.seed * 1000003ULL + i) ^ (cfg_.peft_enabled() ? 0x5bd1e995ULL : 0ULL),
              spec_.num_layers);
    const torch::Tensor own = init.narrow(0, opt_offset(u), opt_numel(u));

    u.full = torch::empty({padded}, work_opts());
    u.full.copy_(init);
    const UnitParams* frozen = u.leaves.frozen;
    u.leaves = make_views(*u.layout, u.full, /*requires_grad=*/true);
    u.leaves.frozen = frozen;
    if (partition_.parameters) {
      if (param_offload()) {
        u.shard = torch::empty({shard}, host_opts(work_dtype_));
        u.shard.copy_(own);
      } else {
        u.shard = own.to(work_dtype_).clone();
      }
      compat::free_storage(u.full);
    }
    if (!partition_.gradients) u.full_grad = torch::zeros({padded}, work_opts());
    // 8-bit AdamW: the shard's part before the unit's small tensors has quantised moments.
    const int64_t n = opt_numel(u);
    u.n8 = cfg_.optimizer == OptimizerKind::kAdamW8bit
               ? std::clamp<int64_t>(u.layout->small_begin - opt_offset(u), 0, n)
               : 0;
    // Offloaded states live in ordinary host memory (only the buffers that DMA reads or
    // writes are pinned: the staging shard, and the parameter shard with parameter offload).
    const auto state = [&](torch::ScalarType t) {
      return offload() ? torch::dtype(t).device(torch::kCPU) : torch::dtype(t).device(rt_.device());
    };
    if (offload()) {
      // Gradients come down into `staging` and the optimizer writes the updated parameters over
      // them for the upload, or, with parameter offload, straight into the host shard. With split
      // master weights (8-bit states, bf16) the upper halves are the upload copy: they live in
      // their own pinned buffer (the host shard with parameter offload), updated in place.
      u.staging = torch::empty({n}, host_opts(work_dtype_));
      u.split = u.n8 > 0 && work_dtype_ == torch::kBFloat16 && cfg_.split_master;
      u.upload = param_offload() ? u.shard : u.split ? torch::empty({n}, host_opts(work_dtype_)) : u.staging;
      if (u.split) {
        u.master_hi = u.upload.narrow(0, 0, u.n8);
        u.master_lo = torch::empty({u.n8}, state(torch::kInt16));
        const torch::Tensor head = own.narrow(0, 0, u.n8).to(torch::kCPU).contiguous();
        split_master_n(head.data_ptr<float>(), reinterpret_cast<uint16_t*>(u.master_hi.data_ptr()),
                       reinterpret_cast<int16_t*>(u.master_lo.data_ptr()), u.n8);
        u.master = torch::empty({n - u.n8}, state(torch::kFloat));
        u.master.copy_(own.narrow(0, u.n8, n - u.n8));
      } else {
        u.master = torch::empty({n}, state(torch::kFloat));
        u.master.copy_(own);
      }
      // With GAS > 1, stages 2-3 accumulate the reduced shards on the GPU until the last micro-batch.
      if (partition_.gradients && cfg_.gas > 1) u.grad_acc = torch::zeros({shard}, work_opts());
    } else {
      if (fp32) {
        // fp32 training: the working copy is the master copy (no duplicate).
        u.master = partition_.parameters ? u.shard : u.full.narrow(0, opt_offset(u), n);
      } else {
        u.master = own.clone();
      }
      if (partition_.gradients) u.grad_acc = torch::zeros({shard}, work_opts());
    }
    u.exp_avg = torch::zeros({n - u.n8}, state(torch::kFloat));
    u.exp_avg_sq = torch::zeros({n - u.n8}, state(torch::kFloat));
    if (u.n8 > 0) {
      u.code_m = torch::zeros({u.n8}, state(torch::kByte));
      u.code_v = torch::zeros({u.n8}, state(torch::kByte));
      u.absmax_m = torch::zeros({quant8::num_blocks(u.n8)}, state(torch::kFloat));
      u.absmax_v = torch::zeros({quant8::num_blocks(u.n8)}, state(torch::kFloat));
    }
  }
  rt_.synchronize();
}

void ZeroEngine::init_frozen(size_t i) {
  Unit& u = units_[i];
  const UnitLayout& base = base_layout_[i];
  const FrozenLayout& fl = frozen_layout_[i];
  torch::Tensor init = torch::empty({base.padded_numel}, torch::dtype(torch::kFloat).device(rt_.device()));
  init_unit(base, init, opts_.seed * 1000003ULL + i, spec_.num_layers);
  const UnitLayout* parts[3] = {&fl.work, &fl.codes, &fl.absmax};
  const torch::ScalarType types[3] = {work_dtype_, torch::kByte, torch::kFloat};
  for (size_t k = 0; k < 3; ++k) {
    if (parts[k]->numel == 0) continue;
    u.frozen[k].layout = parts[k];
    u.frozen[k].full = torch::zeros({parts[k]->padded_numel}, torch::dtype(types[k]).device(rt_.device()));
  }
  const auto base_of = [&](const ParamSlot& s) { return init.narrow(0, s.offset, s.numel); };
  for (const ParamSlot& slot : fl.work.params)
    u.frozen[0].full.narrow(0, slot.offset, slot.numel).copy_(base_of(base.param(slot.name)));
  for (const ParamSlot& slot : fl.codes.params) {
    const std::string weight = slot.name.substr(0, slot.name.size() - std::string(".nf4").size());
    const ParamSlot& scale = fl.absmax.param(weight + ".absmax");
    torch::Tensor codes = u.frozen[1].full.narrow(0, slot.offset, slot.numel);
    torch::Tensor absmax = u.frozen[2].full.narrow(0, scale.offset, scale.numel);
    nf4::quantize_into(base_of(base.param(weight)), codes, absmax);
  }
  // Views, chained after the adapters; at stage 3 each rank keeps its shard only.
  const UnitParams* next = nullptr;
  for (size_t k = 3; k-- > 0;) {
    FrozenBuf& f = u.frozen[k];
    if (f.layout == nullptr) continue;
    f.views = make_views(*f.layout, f.full, /*requires_grad=*/false);
    f.views.frozen = next;
    next = &f.views;
    if (partition_.parameters) {
      f.shard = f.full.narrow(0, rank_ * f.layout->shard_numel(), f.layout->shard_numel()).clone();
      compat::free_storage(f.full);
    }
  }
  u.leaves.frozen = next;  // make_views of the adapters (init_parameters) keeps it: set again there
}

void ZeroEngine::seed_dropout(size_t unit) const {
  // One seed per (step, micro-batch, unit, rank): the recompute under checkpointing draws the mask
  // its forward drew, and the ranks draw different masks.
  if (!(cfg_.peft_enabled() && cfg_.lora_dropout > 0.0)) return;
  const uint64_t key = ((static_cast<uint64_t>(step_) * 1000003ULL + static_cast<uint64_t>(micro_)) * 100003ULL +
                        unit) * 4099ULL + static_cast<uint64_t>(rank_);
  torch::manual_seed(opts_.seed ^ (key * 0x9E3779B97F4A7C15ULL));
}

// --- stage 3: gather, wait, release -------------------------------------------
void ZeroEngine::gather(size_t i) {
  Unit& u = units_[i];
  if (u.gathered) return;
  compat::alloc_storage(u.full, static_cast<size_t>(u.layout->padded_numel) * u.full.element_size());
  rt_.comm_waits_for_compute();  // the fresh block may still be in use by earlier compute
  torch::Tensor own = u.full.narrow(0, rank_ * u.layout->shard_numel(), u.layout->shard_numel());
  if (param_offload()) {
    rt_.copy_to_device_on_comm(own, u.shard);
    comm_.all_gather(own, u.full);
  } else {
    comm_.all_gather(u.shard, u.full);
  }
  for (FrozenBuf& f : u.frozen) {
    if (f.layout == nullptr) continue;
    compat::alloc_storage(f.full, static_cast<size_t>(f.layout->padded_numel) * f.full.element_size());
    comm_.all_gather(f.shard, f.full);
  }
  u.ready_event = rt_.record_comm_event();
  u.gathered = true;
}

void ZeroEngine::wait_gathered(size_t i, std::vector<std::pair<int, int>>& waits) {
  const int a = rt_.mark();
  rt_.compute_waits_for_event(units_[i].ready_event);
  waits.emplace_back(a, rt_.mark());
}

void ZeroEngine::release(size_t i) {
  Unit& u = units_[i];
  if (!u.gathered) return;
  compat::free_storage(u.full);
  for (FrozenBuf& f : u.frozen)
    if (f.layout != nullptr) compat::free_storage(f.full);
  u.gathered = false;
}

// --- gradients ----------------------------------------------------------------
void ZeroEngine::prepare_grads(size_t i) {
  Unit& u = units_[i];
  if (partition_.gradients) u.full_grad = torch::zeros({u.layout->padded_numel}, work_opts());
  // Gradients accumulate in place into views of the flat gradient buffer.
  for (size_t p = 0; p < u.layout->params.size(); ++p) {
    const ParamSlot& slot = u.layout->params[p];
    u.leaves.tensors[p].mutable_grad() = u.full_grad.narrow(0, slot.offset, slot.numel).view(slot.shape);
  }
}

void ZeroEngine::drain_pending(size_t keep) {
  // Transient gradient buffers live until the communication reading them is done.
  while (!pending_.empty() && (pending_.size() > keep || rt_.event_done(pending_.front().event))) {
    if (pending_.size() > keep) rt_.host_waits_for_event(pending_.front().event);
    pending_.pop_front();
  }
}

void ZeroEngine::reduce_unit(size_t i, bool boundary) {
  Unit& u = units_[i];
  const int64_t shard = u.layout->shard_numel();
  if (!partition_.gradients && !boundary) return;  // accumulate locally
  rt_.comm_waits_for_compute();
  if (!partition_.optimizer_states) {
    comm_.all_reduce_sum(u.full_grad);
    return;
  }
  // Reduce-scatter in place: this rank's shard of the sum lands in its own slice.
  torch::Tensor own = u.full_grad.narrow(0, rank_ * shard, shard);
  comm_.reduce_scatter_sum(u.full_grad, own);
  if (offload() && boundary) {
    // The shard is complete: down to the host, and the CPU optimizer takes it from there.
    if (u.grad_acc.defined()) rt_.add_inplace_on_comm(own, u.grad_acc);
    rt_.copy_to_host_on_comm(u.staging, own);
    enqueue_cpu_update(i);
  } else if (partition_.gradients) {
    rt_.add_inplace_on_comm(u.grad_acc, own);
  }
  if (partition_.gradients) {
    pending_.push_back({u.full_grad, rt_.record_comm_event()});
    for (auto& leaf : u.leaves.tensors) leaf.mutable_grad() = torch::Tensor();
    u.full_grad = torch::Tensor();
    drain_pending(2);  // at most two buckets in flight, as the planner's memory model assumes
  }
}

// --- optimizer ------------------------------------------------------------------
void ZeroEngine::update_unit(Unit& u, const void* grad, void* out, bool on_cpu, const kernels::AdamWArgs& args) {
  const kernels::DType dt = kdtype(work_dtype_);
  const int64_t n = opt_numel(u), n8 = u.n8, esize = work_dtype_ == torch::kBFloat16 ? 2 : 4;
  float* master = u.master.data_ptr<float>();
  if (u.split) {
    // The upper halves are the upload copy: `out` must be the buffer they live in.
    STEPCAST_ASSERT(on_cpu && out == u.master_hi.data_ptr());
    cpu_adamw8bit_split(reinterpret_cast<uint16_t*>(u.master_hi.data_ptr()),
                        reinterpret_cast<int16_t*>(u.master_lo.data_ptr()), u.code_m.data_ptr<uint8_t>(),
                        u.code_v.data_ptr<uint8_t>(), u.absmax_m.data_ptr<float>(), u.absmax_v.data_ptr<float>(), grad,
                        dt, n8, args);
  } else if (n8 > 0) {
    if (on_cpu)
      cpu_adamw8bit(master, u.code_m.data_ptr<uint8_t>(), u.code_v.data_ptr<uint8_t>(), u.absmax_m.data_ptr<float>(),
                    u.absmax_v.data_ptr<float>(), grad, dt, out, dt, n8, args);
    else
      kernels::adamw8bit(master, u.code_m.data_ptr<uint8_t>(), u.code_v.data_ptr<uint8_t>(),
                         u.absmax_m.data_ptr<float>(), u.absmax_v.data_ptr<float>(), grad, dt, out, dt, n8,
                         args, quant8::signed_magnitudes(), quant8::unsigned_map(), nullptr);
  }
  if (n == n8) return;
  const void* g32 = static_cast<const char*>(grad) + n8 * esize;
  void* o32 = out ? static_cast<char*>(out) + n8 * esize : nullptr;
  float* tail = u.split ? master : master + n8;  // split: `master` holds [n8, n) only
  if (on_cpu)
    cpu_adamw(tail, u.exp_avg.data_ptr<float>(), u.exp_avg_sq.data_ptr<float>(), g32, dt, o32, dt, n - n8,
              args);
  else
    kernels::adamw(tail, u.exp_avg.data_ptr<float>(), u.exp_avg_sq.data_ptr<float>(), g32, dt, o32, dt,
                   n - n8, args, nullptr);
}

void ZeroEngine::optimizer_step() {
  // Without offload: every unit's shard on the device (the CPU runtime's "device" is the CPU).
  const bool fp32 = work_dtype_ == torch::kFloat;
  for (Unit& u : units_) {
    const int64_t off = opt_offset(u), n = opt_numel(u);
    torch::Tensor grad = partition_.gradients ? u.grad_acc : u.full_grad.narrow(0, off, n);
    torch::Tensor out;
    if (!fp32) out = partition_.parameters ? u.shard : u.full.narrow(0, off, n);
    update_unit(u, grad.data_ptr(), out.defined() ? out.data_ptr() : nullptr, !rt_.is_cuda(), step_args_);
  }
}

// --- the offload pipeline ------------------------------------------------------
void ZeroEngine::enqueue_cpu_update(size_t i) {
  // Serial offload (DeepSpeed's order) holds the jobs until the whole backward has ended.
  worker_->enqueue(i, step_, step_args_, rt_.comm_host_waiter(), /*hold=*/!cfg_.offload_pipeline);
}

int64_t ZeroEngine::update_step() const { return outstanding_step_ > 0 ? outstanding_step_ : step_; }

void ZeroEngine::copy_up(size_t i) {
  Unit& u = units_[i];
  if (param_offload()) return;  // the update landed in the host shard, which the gathers read
  torch::Tensor own = partition_.parameters ? u.shard : u.full.narrow(0, opt_offset(u), opt_numel(u));
  rt_.copy_to_device_on_comm(own, u.upload);
}

void ZeroEngine::upload_unit(size_t i) {
  Unit& u = units_[i];
  if (i + copied_up_ < units_.size()) copy_up(i);  // not already up during the backward
  if (!partition_.parameters) {
    torch::Tensor own = u.full.narrow(0, opt_offset(u), opt_numel(u));
    comm_.all_gather(own, u.full);
  }
  u.upload_event = rt_.record_comm_event();
}

void ZeroEngine::copy_up_ready() {
  // The copies are this rank's own business; the all-gathers that follow them keep one order on
  // every rank and wait for optimizer_phase.
  const size_t n = units_.size();
  while (copied_up_ < n && worker_->done(n - 1 - copied_up_, step_)) {
    copy_up(n - 1 - copied_up_);
    ++copied_up_;
  }
}

void ZeroEngine::issue_uploads(size_t need) {
  // Forward order on every rank (the collectives' order must agree); how far past `need`
  // a rank gets depends on its worker only.
  const size_t n = units_.size();
  while (outstanding_step_ > 0 && upload_next_ < n) {
    const size_t j = upload_next_;
    if (j > need && !worker_->done(j, update_step())) break;
    worker_->wait_done(j, update_step());
    upload_unit(j);
    ++upload_next_;
  }
  if (outstanding_step_ > 0 && upload_next_ == n) {
    outstanding_cpu_s_ = worker_->seconds(outstanding_step_);
    outstanding_step_ = 0;
  }
}

void ZeroEngine::finish_updates() {
  if (outstanding_step_ == 0) return;
  issue_uploads(units_.size() - 1);
  rt_.compute_waits_for_comm();
  rt_.synchronize();
}

// --- one step -------------------------------------------------------------------
// A step is four phases: begin (zero the accumulators, the step's optimizer arguments),
// each micro-batch's forward and backward (its gradients reduced unit by unit), the
// optimizer phase (one of three orders, below), and the loss and the timings.
StepResult ZeroEngine::train_step(const std::vector<torch::Tensor>& micro_batches) {
  STEPCAST_ASSERT(static_cast<int64_t>(micro_batches.size()) == cfg_.gas);
  ++step_;
  StepMarks marks = begin_step();
  // The allocator's statistics move as operations are issued on this thread, so the phases'
  // peaks are read where each phase's work has been issued; reserved is read before each reset.
  StepMemory mem;
  const auto phase_peak = [&](double& peak_bytes) {
    peak_bytes = std::max(peak_bytes, rt_.peak_allocated_bytes());
    mem.gpu_peak_reserved_bytes = std::max(mem.gpu_peak_reserved_bytes, rt_.peak_reserved_bytes());
    rt_.reset_peak();
  };
  rt_.reset_peak();
  torch::Tensor loss_sum = torch::zeros({1}, torch::dtype(torch::kFloat).device(rt_.device()));
  for (int64_t mb = 0; mb < cfg_.gas; ++mb) {
    micro_ = mb;
    const bool boundary = mb == cfg_.gas - 1;
    MicroMarks mm{};
    mm.start = rt_.mark();
    if (boundary) marks.last_micro = mm.start;
    std::vector<Saved> saved = forward(micro_batches[static_cast<size_t>(mb)], mb == 0, marks);
    loss_sum += saved.back().out.detach();
    mm.fwd_end = rt_.mark();
    phase_peak(mem.gpu_peak_allocated_forward_bytes);
    backward(saved, boundary, marks);
    mm.bwd_end = rt_.mark();
    phase_peak(mem.gpu_peak_allocated_backward_bytes);
    rt_.compute_waits_for_comm();
    mm.comm_done = rt_.mark();
    drain_pending(0);
    marks.micro.push_back(mm);
  }
  optimizer_phase(marks);

  // The loss, averaged over micro-batches and ranks.
  rt_.comm_waits_for_compute();
  comm_.all_reduce_sum(loss_sum);
  rt_.compute_waits_for_comm();
  rt_.synchronize();
  phase_peak(mem.gpu_peak_allocated_optimizer_bytes);
  StepResult r;
  r.step = step_;
  r.memory = mem;
  r.loss = loss_sum.item<double>() / static_cast<double>(cfg_.gas * world_);
  r.time = step_timing(marks);
  if (!std::isfinite(r.loss)) throw NonFiniteLossError(step_, r.loss);
  return r;
}

ZeroEngine::StepMarks ZeroEngine::begin_step() {
  rt_.reset_markers();
  StepMarks marks;
  marks.step = rt_.mark();
  marks.last_micro = marks.step;
  for (Unit& u : units_) {
    if (!partition_.gradients) u.full_grad.zero_();
    if (u.grad_acc.defined()) u.grad_acc.zero_();
  }
  step_args_ = opts_.adamw;
  step_args_.step = step_;
  step_args_.grad_scale = 1.0f / static_cast<float>(world_ * cfg_.gas);
  if (offload()) worker_->reset_seconds(step_);  // the previous step may still be adding to its own
  // Overlapped offload: the previous step's last updates go up during this step's first forward.
  marks.awaiting_uploads = outstanding_step_ > 0;
  return marks;
}

// Forward, unit by unit; each unit's input is a leaf so that its backward can run on its own.
std::vector<ZeroEngine::Saved> ZeroEngine::forward(const torch::Tensor& batch, bool first_micro, StepMarks& marks) {
  const size_t n_units = units_.size();
  const int64_t s = batch.size(1) - 1;
  const torch::Tensor tokens = batch.narrow(1, 0, s), targets = batch.narrow(1, 1, s);
  std::vector<Saved> saved(n_units);
  torch::Tensor x;
  for (size_t i = 0; i < n_units; ++i) {
    if (marks.awaiting_uploads && first_micro) {
      const int a = rt_.mark();
      issue_uploads(i);
      if (!partition_.parameters) rt_.compute_waits_for_event(units_[i].upload_event);
      marks.upload_waits.emplace_back(a, rt_.mark());
    }
    if (partition_.parameters) {
      gather(i);  // a no-op where prefetched
      // Prefetch overlaps this unit's forward (once the next unit's update is up).
      if (i + 1 < n_units && (outstanding_step_ == 0 || i + 1 < upload_next_)) gather(i + 1);
      wait_gathered(i, marks.fwd_waits);
    }
    const UnitLayout& ul = *units_[i].layout;
    const UnitParams& p = units_[i].leaves;
    if (ul.kind == UnitKind::kEmbedding) {
      saved[i].out = model_.embed(p, tokens);
    } else {
      saved[i].x_in = x.detach().requires_grad_(true);
      if (ul.kind == UnitKind::kHead) {
        saved[i].out = model_.head_loss(p, saved[i].x_in, targets);
      } else if (cfg_.activation_checkpointing) {
        torch::NoGradGuard no_grad;
        seed_dropout(i);
        saved[i].out = model_.layer(p, saved[i].x_in);
      } else {
        seed_dropout(i);
        saved[i].out = model_.layer(p, saved[i].x_in);
      }
    }
    x = saved[i].out;
    if (partition_.parameters && i + 1 < n_units) release(i);  // the head stays for its backward
  }
  return saved;
}

// Backward, unit by unit in reverse; each unit's gradients are reduced as soon as they exist.
void ZeroEngine::backward(std::vector<Saved>& saved, bool boundary, StepMarks& marks) {
  torch::Tensor grad_out;
  for (size_t k = units_.size(); k-- > 0;) {
    if (partition_.parameters) {
      if (k > 0) gather(k - 1);
      gather(k);
      wait_gathered(k, marks.bwd_waits);
    }
    prepare_grads(k);
    const UnitLayout& ul = *units_[k].layout;
    Saved& sv = saved[k];
    if (ul.kind == UnitKind::kHead) {
      torch::autograd::backward({sv.out});
    } else if (ul.kind == UnitKind::kEmbedding && !sv.out.requires_grad()) {
      // PEFT: a frozen embedding has nothing to differentiate (its gradient buffer stays zero).
    } else if (ul.kind == UnitKind::kLayer && cfg_.activation_checkpointing) {
      seed_dropout(k);
      torch::Tensor out = model_.layer(units_[k].leaves, sv.x_in);  // recompute
      torch::autograd::backward({out}, {grad_out});
    } else {
      torch::autograd::backward({sv.out}, {grad_out});
    }
    if (sv.x_in.defined()) grad_out = sv.x_in.grad();
    sv = Saved{};
    if (partition_.parameters) release(k);
    reduce_unit(k, boundary);
    // The units the CPU optimizer has finished go back up while the backward runs.
    if (boundary && offload() && cfg_.offload_pipeline && !cfg_.offload_overlap_forward) copy_up_ready();
  }
}

// The optimizer step on this rank's shard, then the parameters come back; three orders:
//  - offload overlapping the next forward: return now, the worker's backlog in forward order;
//  - offload (pipelined or serial): each unit goes back up as the worker finishes it;
//  - on the device: the update, then (stages 1-2) the updated shards all-gathered.
void ZeroEngine::optimizer_phase(StepMarks& marks) {
  marks.opt = rt_.mark();
  marks.opt_end = marks.opt;
  if (offload() && cfg_.offload_overlap_forward) {
    // The worker has taken units in the order their gradients reached the host (the backward's);
    // what is left goes in the next forward's order, once every gradient is on the host. Sorted
    // earlier, the embedding, whose gradient comes last, would head the queue and the worker
    // would idle behind it while later units' gradients wait on the host: at stage 1 nothing
    // holds this thread back, so it reaches this point with most of the backward still queued
    // on the device (stage 2 waits for all but two buckets, drain_pending). The step waits for
    // the device at its end anyway.
    rt_.host_waits_for_event(rt_.record_comm_event());
    worker_->sort_queue_by_unit();
    outstanding_step_ = step_;
    upload_next_ = 0;
  } else if (offload()) {
    // The worker has been updating units since their gradients reached the host; those it
    // finished during the backward went up then (copy_up_ready). The rest go up as it finishes
    // them, and every unit is all-gathered, in one order on every rank. Serial offload: the
    // backward has ended; every unit is updated, then every unit goes up.
    if (!cfg_.offload_pipeline) worker_->release_held();
    for (size_t k = units_.size(); k-- > 0;) {  // in the worker's order (the backward's), on every rank
      worker_->wait_done(k, step_);
      upload_unit(k);
    }
    copied_up_ = 0;
    marks.opt_end = rt_.mark();  // the compute stream reaches it once the last CPU update is done
    rt_.compute_waits_for_comm();
  } else {
    optimizer_step();
    marks.opt_end = rt_.mark();
    if (partition_.optimizer_states && !partition_.parameters) {
      rt_.comm_waits_for_compute();
      for (Unit& u : units_) {
        torch::Tensor own = u.full.narrow(0, opt_offset(u), opt_numel(u));
        comm_.all_gather(own, u.full);
      }
      rt_.compute_waits_for_comm();
    }
  }
  marks.end = rt_.mark();
}

// Seconds of each phase from the step's markers (rank 0's clock; StepTiming says what is exposed).
StepTiming ZeroEngine::step_timing(const StepMarks& marks) {
  StepTiming t;
  double fwd_wait = 0, bwd_wait = 0, upload_wait = 0;
  for (auto [a, b] : marks.fwd_waits) fwd_wait += rt_.elapsed_s(a, b);
  for (auto [a, b] : marks.upload_waits) upload_wait += rt_.elapsed_s(a, b);
  for (auto [a, b] : marks.bwd_waits) bwd_wait += rt_.elapsed_s(a, b);
  for (const MicroMarks& mm : marks.micro) {
    t.forward_s += rt_.elapsed_s(mm.start, mm.fwd_end);
    t.backward_s += rt_.elapsed_s(mm.fwd_end, mm.bwd_end);
    // With offload, the last micro-batch's exposed tail also holds the copies to the host.
    t.grad_comm_s += rt_.elapsed_s(mm.bwd_end, mm.comm_done);
  }
  t.forward_s -= fwd_wait + upload_wait;
  t.backward_s -= bwd_wait;
  t.param_gather_s = fwd_wait + bwd_wait;
  t.optimizer_s = rt_.elapsed_s(marks.opt, marks.opt_end);  // exposed: with offload, what the backward did not hide
  if (offload() && cfg_.offload_overlap_forward) {
    // What this step's forward waited for: the previous step's last updates and uploads.
    t.optimizer_s += upload_wait;
    t.optimizer_cpu_s = outstanding_cpu_s_;  // the previous step's (this one's is still running)
  } else if (offload()) {
    t.offload_transfer_s += rt_.elapsed_s(marks.opt_end, marks.end);  // the last uploads (and all-gathers)
    t.optimizer_cpu_s = worker_->seconds(step_);
  } else {
    t.grad_comm_s += rt_.elapsed_s(marks.opt_end, marks.end);
  }
  t.step_s = rt_.elapsed_s(marks.step, marks.end);
  t.gas_s = rt_.elapsed_s(marks.step, marks.last_micro);
  t.opt_s = t.step_s - t.gas_s;
  return t;
}

// --- parameters out, checkpoints -------------------------------------------------
torch::Tensor ZeroEngine::full_params_fp32() {
  finish_updates();
  std::vector<torch::Tensor> parts;
  for (Unit& u : units_) {
    torch::Tensor full = torch::empty({u.layout->padded_numel}, torch::dtype(torch::kFloat).device(rt_.device()));
    torch::Tensor mine = master_fp32(u).to(rt_.device()).to(torch::kFloat).contiguous();
    rt_.comm_waits_for_compute();
    if (!partition_.optimizer_states) {
      full.copy_(mine);
    } else {
      comm_.all_gather(mine, full);
    }
    rt_.compute_waits_for_comm();
    parts.push_back(full.narrow(0, 0, u.layout->numel).to(torch::kCPU));
  }
  rt_.synchronize();
  return torch::cat(parts);
}

CheckpointIdentity ZeroEngine::checkpoint_identity() const {
  CheckpointIdentity id;
  id.model = spec_.name;
  id.params = num_params();
  id.world_size = world_;
  id.rank = rank_;
  // What the shards' count, sizes and types depend on.
  id.state = {{"zero_stage", cfg_.zero_stage},
              {"optimizer", optimizer_name(cfg_.optimizer)},
              {"precision", precision_name(cfg_.precision)},
              {"offload_optimizer", offload_name(cfg_.offload_optimizer)},
              {"offload_params", offload_name(cfg_.offload_params)},
              {"split_master", splits_master()}};
  if (cfg_.peft_enabled())
    id.state.update({{"peft", peft_name(cfg_.peft)},
                     {"lora_rank", cfg_.lora_rank},
                     {"lora_targets", lora_targets_name(cfg_.lora_targets)}});
  return id;
}

void ZeroEngine::save(const std::string& root, const std::string& writer, int die_at_rank) {
  finish_updates();
  std::vector<torch::Tensor> tensors;
  for (Unit& u : units_)
    for (torch::Tensor* t : state_tensors(u)) tensors.push_back(t->to(torch::kCPU));
  CheckpointIdentity id = checkpoint_identity();
  id.git_commit = writer;
  save_checkpoint(root, step_, id, tensors, comm_, rt_, die_at_rank);
}

void ZeroEngine::load(const std::string& path) {
  finish_updates();
  // Every rank verifies its shard; all load, or all stop (the rank that refused says why).
  LoadedShard shard;
  std::string why;
  try {
    shard = load_checkpoint(path, checkpoint_identity());
    size_t expected = 0;
    for (Unit& u : units_) expected += state_tensors(u).size();
    if (shard.tensors.size() != expected)
      throw InputError(shard.file.string() + ": holds " + std::to_string(shard.tensors.size()) +
                       " tensors, this model, stage and optimizer need " + std::to_string(expected));
    size_t k = 0;
    for (Unit& u : units_)
      for (torch::Tensor* dst : state_tensors(u)) {
        const torch::Tensor& src = shard.tensors[k++];
        if (src.numel() != dst->numel() || src.scalar_type() != dst->scalar_type())
          throw InputError(shard.file.string() + ": unit " + u.layout->name + " has " + std::to_string(src.numel()) +
                           " values, expected " + std::to_string(dst->numel()));
      }
  } catch (const InputError& e) {
    why = e.what();
  }
  all_ranks_ok(why.empty(), why, kExitBadInput, comm_, rt_, "refused its checkpoint shard");
  size_t k = 0;
  for (Unit& u : units_)
    for (torch::Tensor* dst : state_tensors(u)) dst->copy_(shard.tensors[k++]);
  step_ = shard.step;
  refresh_working_from_master();
}

bool ZeroEngine::splits_master() const {
  return std::any_of(units_.begin(), units_.end(), [](const Unit& u) { return u.split; });
}

std::vector<torch::Tensor*> ZeroEngine::state_tensors(Unit& u) {
  std::vector<torch::Tensor*> out{&u.master, &u.exp_avg, &u.exp_avg_sq};
  if (u.n8 > 0) out.insert(out.end(), {&u.code_m, &u.code_v, &u.absmax_m, &u.absmax_v});
  if (u.split) out.insert(out.end(), {&u.master_hi, &u.master_lo});
  return out;
}

torch::Tensor ZeroEngine::master_fp32(const Unit& u) const {
  if (!u.split) return u.master;
  torch::Tensor head = torch::empty({u.n8}, torch::kFloat);
  join_master_n(reinterpret_cast<const uint16_t*>(u.master_hi.data_ptr()),
                reinterpret_cast<const int16_t*>(u.master_lo.data_ptr()), head.data_ptr<float>(), u.n8);
  return torch::cat({head, u.master});
}

torch::Tensor ZeroEngine::master_working(const Unit& u) const {
  // Split: the upper halves are the copy training uploads (ties round away from zero there).
  if (!u.split) return u.master;
  return torch::cat({u.master_hi, u.master.to(work_dtype_)});
}

void ZeroEngine::refresh_working_from_master() {
  // After loading master weights: rebuild the working-precision parameters.
  for (Unit& u : units_) {
    torch::Tensor m = master_working(u).to(rt_.device());
    if (partition_.parameters) {
      if (u.split && param_offload()) u.shard.narrow(0, u.n8, u.master.numel()).copy_(u.master);  // hi is in place
      else if (u.shard.data_ptr() != u.master.data_ptr()) u.shard.copy_(m);
      continue;
    }
    torch::Tensor own = u.full.narrow(0, opt_offset(u), opt_numel(u));
    if (own.data_ptr() != u.master.data_ptr()) own.copy_(m);
    if (partition_.optimizer_states) {
      rt_.comm_waits_for_compute();
      comm_.all_gather(own, u.full);
      rt_.compute_waits_for_comm();
    }
  }
  rt_.synchronize();
}

}  // namespace stepcast::backend
