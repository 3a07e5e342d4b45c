// The peer engines as features of the one step-time model, and the profile's engine sections.
// Byte counts are derived by hand from DeepSpeed v0.14.5's and torch 2.11's sources (cited in
// model/step_features.cpp).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/errors.h"
#include "common/text_file.h"
#include "model/memory_model.h"
#include "model/prediction.h"
#include "model/train_config_json.h"
#include "planner/deepspeed_config_in.h"
#include "planner/k8s_manifest.h"
#include "planner/plan_search.h"
#include "test_util.h"

using namespace stepcast;
using stepcast::test::hardware;
using stepcast::test::model;

namespace {

TrainConfig offload(Engine e, int stage, int64_t gas) {
  TrainConfig c;
  c.engine = e;
  c.zero_stage = stage;
  c.gpus_per_node = 2;
  c.micro_batch = 4;
  c.gas = gas;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  if (e == Engine::kFsdp2) c.offload_params = OffloadDevice::kCpu;
  return c;
}

}  // namespace

TEST_CASE("DeepSpeed ZeRO-2 offload moves gradients over PCIe every micro-batch (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params()) / 2.0;  // partition of one of 2 ranks
  const StepFeatures f = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).step;
  // GAS 4: micro-batches 1-3 copy 2 B per parameter down; 2 and 3 also bring the host sum up
  // (2 B): (3 x 2 + 2 x 2) / 3 B per non-boundary micro-batch. The boundary sends fp32 (4 B)
  // after bringing the sum up (2 B); the update comes back as fp32 (4 B).
  CHECK(test::close(f.grad_host_bytes_micro, P * (3 * 2.0 + 2 * 2.0) / 3.0, 1e-12));
  CHECK(test::close(f.d2h_bytes_boundary, P * 6.0, 1e-12));
  CHECK(test::close(f.h2d_bytes_step, P * 4.0, 1e-12));
  CHECK(f.opt_pipelined == 0.0);
  CHECK(f.opt_bytes_per_param == 28.0);
  // Per step: 3 x (4/3 x 2P + ... ) = 10 P down and up before the boundary + 6 P + 4 P.
  const double total = 3.0 * f.grad_host_bytes_micro + f.d2h_bytes_boundary + f.h2d_bytes_step;
  CHECK(test::close(total, 20.0 * P, 1e-12));
  // The Stepcast backend copies each shard once (2 B) and the update once (2 B).
  TrainConfig ours = offload(Engine::kDeepSpeed, 2, 4);
  ours.engine = Engine::kStepcast;
  ours.offload_pipeline = true;
  const StepFeatures s = make_features(m, hw, ours).step;
  CHECK(s.grad_host_bytes_micro == 0.0);
  CHECK(test::close(s.d2h_bytes_boundary + s.h2d_bytes_step, 4.0 * P, 1e-12));
  // GAS 1: nothing before the boundary, which sends fp32 only.
  const StepFeatures one = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 1)).step;
  CHECK(one.grad_host_bytes_micro == 0.0);
  CHECK(test::close(one.d2h_bytes_boundary, 4.0 * P, 1e-12));
}

TEST_CASE("DeepSpeed ZeRO-1 offload moves gradients over PCIe on the last micro-batch only (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params()) / 2.0;
  // Stage 1 sums the 16-bit gradients on the GPU; on the last of 4 micro-batches it brings its
  // zero host buffer up (2 B), sends the sum down as fp32 (4 B); the update comes back (4 B).
  const StepFeatures f = make_features(m, hw, offload(Engine::kDeepSpeed, 1, 4)).step;
  CHECK(f.grad_host_bytes_micro == 0.0);
  CHECK(test::close(f.d2h_bytes_boundary, P * 6.0, 1e-12));
  CHECK(test::close(f.h2d_bytes_step, P * 4.0, 1e-12));
  // Its 291 gradient hooks work on that micro-batch only; stage 2's on every one.
  CHECK(f.grad_hooks_micro == 0.0);
  CHECK(f.grad_hooks_boundary == 291.0);
  const StepFeatures two = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).step;
  CHECK(two.grad_hooks_micro == 291.0);
  CHECK(two.grad_hooks_boundary == 0.0);
  // GAS 1: nothing comes up; the sum goes down as fp32.
  const StepFeatures one = make_features(m, hw, offload(Engine::kDeepSpeed, 1, 1)).step;
  CHECK(test::close(one.d2h_bytes_boundary, 4.0 * P, 1e-12));
}

TEST_CASE("FSDP2 CPU offload uploads the fp32 shard in forward and backward, nothing after the step") {
  const ModelSpec m = model("llama-2-7b");
  const StepFeatures f = make_features(m, hardware("h200-sxm"), offload(Engine::kFsdp2, 3, 4)).step;
  const double P = static_cast<double>(m.total_params()) / 2.0;
  CHECK(test::close(f.param_h2d_bytes_micro, 2.0 * 4.0 * P, 1e-12));
  CHECK(test::close(f.d2h_bytes_boundary, 4.0 * P, 1e-12));
  CHECK(f.h2d_bytes_step == 0.0);
  CHECK(f.grad_host_bytes_micro == 0.0);
}

TEST_CASE("FSDP2 CPU offload on one rank: each unit's upload blocks the compute stream and adds in full (hand count)") {
  // torch 2.11's world-size-1 unshard copies the host shard with a blocking copy_ on the compute
  // stream (model/step_features.cpp), so no window hides it: per micro-batch the forward's and
  // the backward's uploads, 2 x 4 B x 6,738,415,616 parameters, at the link's pinned rate
  // (55 GB/s): 0.980 s, GAS 4 times a step; the fitted PCIe efficiency and overlap play no part.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig one = offload(Engine::kFsdp2, 3, 4);
  one.gpus_per_node = 1;
  const StepFeatures f1 = make_features(m, hw, one).step;
  CHECK(f1.param_h2d_blocking == 1.0);
  CHECK(make_features(m, hw, offload(Engine::kFsdp2, 3, 4)).step.param_h2d_blocking == 0.0);  // two ranks gather
  CHECK(make_features(m, hw, offload(Engine::kDeepSpeed, 3, 4)).step.param_h2d_blocking == 0.0);
  const double per_micro_s = 2.0 * 4.0 * 6738415616.0 / 55e9;
  CHECK(per_micro_s == doctest::Approx(0.980).epsilon(1e-3));
  CoefVector k = for_engine(hw, "fsdp2").coefs;
  const StepTime<double> t = predict_step_time(f1, k.data());
  CHECK(test::close(t.param_gather_s, 4.0 * per_micro_s, 1e-9));
  k[kPcieEffFrac] *= 0.5;
  k[kGatherOverlapFrac] = 1.0;
  CHECK(test::close(predict_step_time(f1, k.data()).param_gather_s, 4.0 * per_micro_s, 1e-9));
  // On two ranks the uploads hide behind the gather window (less than they would add in full).
  const StepFeatures f2 = make_features(m, hw, offload(Engine::kFsdp2, 3, 4)).step;
  const CoefVector k2 = for_engine(hw, "fsdp2").coefs;
  CHECK(predict_step_time(f2, k2.data()).param_gather_s < 4.0 * f2.param_h2d_bytes_micro / 55e9);
}

TEST_CASE("DeepSpeed ZeRO-3 fetches every module with parameters, a third time with checkpointing (hand count)") {
  // llama-2-7b's modules with parameters, as transformers registers them: q, k, v, o, gate, up,
  // down and two RMSNorms per layer (9 x 32), the embedding, the final norm and the untied
  // lm_head (3): 291. pythia-2.8b (gpt_neox): fused query_key_value, dense, dense_h_to_4h,
  // dense_4h_to_h and two LayerNorms (6 x 32), embed_in, final_layer_norm, embed_out: 195.
  const HardwareProfile hw = hardware("h200-sxm");
  const ModelSpec llama = model("llama-2-7b");
  const ModelSpec pythia = model("pythia-2.8b");
  CHECK(llama.param_modules_per_layer() * llama.num_layers + llama.param_modules_outside_layers() == 291);
  CHECK(pythia.param_modules_per_layer() * pythia.num_layers + pythia.param_modules_outside_layers() == 195);
  // Their parameter tensors, each with its own gradient hook: llama has no biases and RMSNorm (one
  // tensor per module: 291); pythia's linear layers carry biases and its LayerNorms two tensors
  // (12 per layer x 32, embed_in, the final LayerNorm's 2, embed_out: 388).
  CHECK(llama.param_tensors_per_layer() * llama.num_layers + llama.param_tensors_outside_layers() == 291);
  CHECK(pythia.param_tensors_per_layer() * pythia.num_layers + pythia.param_tensors_outside_layers() == 388);
  TrainConfig c;
  c.engine = Engine::kDeepSpeed;
  c.zero_stage = 3;
  c.gpus_per_node = 2;
  c.micro_batch = 4;
  c.gas = 2;
  StepFeatures f = make_features(llama, hw, c).step;
  CHECK(f.param_fetches_micro == 2.0 * 291);
  CHECK(f.gather_calls_micro == 2.0 * 291);
  CHECK(test::close(f.gather_bytes_micro, 2.0 * 2.0 * static_cast<double>(llama.total_params()), 1e-12));
  c.activation_checkpointing = true;
  f = make_features(pythia, hw, c).step;
  CHECK(f.param_fetches_micro == 3.0 * 195);
  CHECK(test::close(f.gather_bytes_micro, 3.0 * 2.0 * static_cast<double>(pythia.total_params()), 1e-12));
  // One rank fetches too (the hooks run); no collective then.
  c.gpus_per_node = 1;
  CHECK(make_features(pythia, hw, c).step.param_fetches_micro == 3.0 * 195);
  // Stage 2, FSDP2 and the Stepcast backend: none.
  c.gpus_per_node = 2;
  c.zero_stage = 2;
  CHECK(make_features(llama, hw, c).step.param_fetches_micro == 0.0);
  // DeepSpeed's gradient hooks: one per trainable tensor every micro-batch at stages 2-3, on the
  // last micro-batch at stage 1 (stage_1_and_2.py registers them there too, with the
  // overlap_comm our config sets, and works only at the accumulation boundary);
  // none at stage 0 (BF16_Optimizer). FSDP2's post-backward reduce does its per-tensor work
  // on the micro-batches that reduce (below).
  for (int stage : {2, 3}) {
    c.zero_stage = stage;
    CHECK(make_features(pythia, hw, c).step.grad_hooks_micro == 388.0);
    CHECK(make_features(llama, hw, c).step.grad_hooks_micro == 291.0);
  }
  c.zero_stage = 1;  // on the last micro-batch only
  CHECK(make_features(pythia, hw, c).step.grad_hooks_micro == 0.0);
  CHECK(make_features(pythia, hw, c).step.grad_hooks_boundary == 388.0);
  c.zero_stage = 0;
  CHECK(make_features(pythia, hw, c).step.grad_hooks_micro == 0.0);
  // FSDP2: one round of per-tensor host work a step, in a backward, whether it reduces after the
  // last micro-batch (GAS 2 here), after each, or at GAS 1.
  c.zero_stage = 2;
  c.engine = Engine::kFsdp2;
  for (bool each : {false, true}) {
    c.grad_sync_each_micro = each;
    CHECK(make_features(pythia, hw, c).step.grad_hooks_micro == 0.0);
    CHECK(make_features(pythia, hw, c).step.grad_hooks_boundary == 388.0);
  }
  c.grad_sync_each_micro = false;
  c.gas = 1;
  CHECK(make_features(llama, hw, c).step.grad_hooks_micro == 0.0);
  CHECK(make_features(llama, hw, c).step.grad_hooks_boundary == 291.0);
  c.gas = 2;
  c.engine = Engine::kDeepSpeed;
  c.zero_stage = 3;
  c.engine = Engine::kFsdp2;
  CHECK(make_features(llama, hw, c).step.param_fetches_micro == 0.0);
  c.engine = Engine::kStepcast;
  const StepFeatures ours = make_features(llama, hw, c).step;
  // The backend gathers and releases each unit in the forward and in the backward.
  CHECK(ours.param_fetches_micro == 2.0 * (llama.num_layers + 2));
  CHECK(ours.gather_calls_micro == 2.0 * (llama.num_layers + 2));
  // The fetches' host time runs beside the GPU's queued work: hidden where the GPU's work is the
  // longer, the whole of the pass where the host's is. One rank (no collective), so a pass is
  // smooth_max(GPU, host) = (GPU^4 + host^4)^(1/4), within 0.005 % of the larger where it is
  // three times the other (model/step_time.h).
  c.engine = Engine::kDeepSpeed;
  c.activation_checkpointing = false;
  c.gpus_per_node = 1;
  const StepFeatures ds = make_features(llama, hw, c).step;
  CoefVector k = for_engine(hw, "deepspeed").coefs;
  k[kParamFetchOverheadS] = 0.0;
  k[kGradHookOverheadS] = 0.0;
  k[kParamFetchBytesPerS] = 1e30;  // the fetches' cost per byte out of the way: their count alone here
  const double base_s = predict_step_time(ds, k.data()).step_s;
  // Tiny fetches (1 ns each, 0.3 us a round against a forward of tenths of a second): hidden.
  k[kParamFetchOverheadS] = 1e-9;
  CHECK(predict_step_time(ds, k.data()).step_s == doctest::Approx(base_s).epsilon(1e-7));  // unhidden: +8.5e-7
  // Fetches of 50 ms each: 291 x 50 ms = 14.55 s a round, far beyond the GPU's forward: the timed
  // forward of each micro-batch is its host time, the launches and one round of fetches.
  k[kParamFetchOverheadS] = 0.05;
  const StepTime<double> host_bound = predict_step_time(ds, k.data());
  // (The launches: the engine's per-layer time scaled by transformers' llama layer against the
  // profiled families' mean on this host.)
  const double host_fwd_s = k[kHostLayerFwdS] * ds.impl_host_fwd_rel * llama.num_layers + 291 * 0.05;
  CHECK(timed_phases(host_bound, true).forward_s == doctest::Approx(2.0 * host_fwd_s).epsilon(5e-5));
  // And the step grows by at most the two rounds of every micro-batch (less what they hide).
  CHECK(host_bound.step_s > base_s);
  CHECK(host_bound.step_s <= base_s + 2 * 582 * 0.05 + 1e-9);
}

TEST_CASE("DeepSpeed ZeRO-3 offload: the boundary gradient is staged through pageable memory from 16 bits only") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params()) / 2.0;
  // bf16: every micro-batch sends the 16-bit partition down and brings it back (2 x 2 B); the
  // boundary adds the cross-dtype copy into the fp32 host gradient, 2 B of 16-bit source.
  const Features bf = make_features(m, hw, offload(Engine::kDeepSpeed, 3, 4));
  CHECK(test::close(bf.step.grad_host_bytes_micro, 4.0 * P, 1e-12));
  CHECK(test::close(bf.step.d2h_bytes_boundary, 4.0 * P, 1e-12));
  CHECK(test::close(bf.step.staged_d2h_bytes_boundary, 2.0 * P, 1e-12));
  // The gradient partitions live on the host: no gradient buffer on the GPU.
  CHECK(bf.memory.gpu_grads_bytes == 0.0);
  // fp32: the same dtype on both sides, a direct copy (2 x 4 B round trip + 4 B), nothing staged.
  TrainConfig c32 = offload(Engine::kDeepSpeed, 3, 4);
  c32.precision = Precision::kFp32;
  const StepFeatures f32 = make_features(m, hw, c32).step;
  CHECK(f32.staged_d2h_bytes_boundary == 0.0);
  CHECK(test::close(f32.d2h_bytes_boundary, 12.0 * P, 1e-12));
  // The staged copy is serial: the step grows by its bytes over the coefficient's rate.
  CoefVector k = for_engine(hw, "deepspeed").coefs;
  const double base = predict_step_time(bf.step, k.data()).step_s, rate = k[kStagedCopyBytesPerS];
  k[kStagedCopyBytesPerS] = 0.5 * rate;
  CHECK(test::close(predict_step_time(bf.step, k.data()).step_s - base, 2.0 * P / rate, 1e-9));
  // Stages 1-2 copy into pinned fp32 buffers without temporaries.
  CHECK(make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).step.staged_d2h_bytes_boundary == 0.0);
}

TEST_CASE("DeepSpeed ZeRO-3 offload's step converts the fp32 partition on the host threads and stages it (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params()) / 2.0;  // partition of one of 2 ranks
  // bf16: read 4 B and write 2 B per parameter on the CPU, then 2 B staged to the GPU; nothing
  // goes up by pinned DMA.
  const StepFeatures bf = make_features(m, hw, offload(Engine::kDeepSpeed, 3, 4)).step;
  CHECK(test::close(bf.host_convert_bytes_step, 6.0 * P, 1e-12));
  CHECK(test::close(bf.pageable_h2d_bytes_step, 2.0 * P, 1e-12));
  CHECK(bf.h2d_bytes_step == 0.0);
  // Two ranks under torchrun, one thread each, DRAM out of the way (its efficiency huge): each
  // rank converts 6P on its thread (6P / r, both at once), then stages 2P on it (2P / r): the
  // step grows by 8P / r when r halves from r.
  CoefVector k = for_engine(hw, "deepspeed").coefs;
  k[kCpuDramEffFrac] = 1e9;
  const double r = k[kHostCopyBytesPerSPerThread];
  const double base = predict_step_time(bf, k.data()).step_s;
  k[kHostCopyBytesPerSPerThread] = 0.5 * r;
  CHECK(test::close(predict_step_time(bf, k.data()).step_s - base, 8.0 * P / r, 1e-9));
  // Parameter offload: the 16-bit partition is on the host; the conversion only.
  TrainConfig po = offload(Engine::kDeepSpeed, 3, 4);
  po.offload_params = OffloadDevice::kCpu;
  const StepFeatures p = make_features(m, hw, po).step;
  CHECK(test::close(p.host_convert_bytes_step, 6.0 * P, 1e-12));
  CHECK(p.pageable_h2d_bytes_step == 0.0);
  // fp32: pinned fp32 to the GPU by DMA, no conversion.
  TrainConfig c32 = offload(Engine::kDeepSpeed, 3, 4);
  c32.precision = Precision::kFp32;
  const StepFeatures f32 = make_features(m, hw, c32).step;
  CHECK(f32.host_convert_bytes_step == 0.0);
  CHECK(test::close(f32.h2d_bytes_step, 4.0 * P, 1e-12));
  // ZeRO-2 updates through pinned buffers: none of this.
  CHECK(make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).step.host_convert_bytes_step == 0.0);
}

TEST_CASE("a peer's timed forward holds the first of its ZeRO-3 fetch rounds") {
  // pythia-2.8b, DeepSpeed ZeRO-3 on one rank, no checkpointing: two fetch rounds of 195 modules
  // per micro-batch (forward, backward); no collective bytes, so the exposed gather is the fetch
  // overhead alone, and the forward's share is one round: GAS x 195 x the per-fetch cost.
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = offload(Engine::kDeepSpeed, 3, 2);
  c.offload_optimizer = OffloadDevice::kNone;
  c.gpus_per_node = 1;
  const StepFeatures f = make_features(m, hw, c).step;
  const CoefVector k = for_engine(hw, "deepspeed").coefs;
  const StepTime<double> t = predict_step_time(f, k.data());
  const TimedPhases<double> ph = timed_phases(t, true);
  // What the forward's round does not hide behind the forward's GPU work, at most the round.
  CHECK(test::close(ph.forward_s - t.forward_s, t.forward_gather_s, 1e-12));
  CHECK(t.forward_gather_s > 0.0);
  // One round: 195 fetches and the whole model's bytes (2 B a parameter) at the fetch rate.
  CHECK(f.param_fetch_bytes_micro == 2.0 * 2.0 * static_cast<double>(m.total_params()));
  CHECK(t.forward_gather_s <=
        2.0 * (195.0 * k[kParamFetchOverheadS] + 0.5 * f.param_fetch_bytes_micro / k[kParamFetchBytesPerS]) + 1e-12);
  // The three phases still add up to the step.
  CHECK(test::close(ph.forward_s + ph.backward_s + ph.optimizer_s, t.step_s, 1e-12));
  // Our backend's records hold the model's own forward.
  CHECK(timed_phases(t, false).forward_s == t.forward_s);
}

TEST_CASE("the peers' CPU optimizers run on one thread per rank under torchrun, on the launch's threads otherwise") {
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h200-sxm");  // 16 cores per GPU
  // Two ranks per node under torchrun: OMP_NUM_THREADS=1 in each, two cores in all.
  CHECK(make_features(m, hw, offload(Engine::kDeepSpeed, 2, 2)).step.cpu_cores_node == 2.0);
  CHECK(make_features(m, hw, offload(Engine::kFsdp2, 3, 2)).step.cpu_cores_node == 2.0);
  // One rank keeps every core.
  TrainConfig one = offload(Engine::kDeepSpeed, 2, 2);
  one.gpus_per_node = 1;
  CHECK(make_features(m, hw, one).step.cpu_cores_node == 16.0);
  // DeepSpeed's own launcher leaves each rank all 32 cores of the node: two ranks share them.
  ResourceLimits ds_launcher;
  ds_launcher.cpu_threads_per_rank = 32;
  CHECK(make_features(m, hw, offload(Engine::kDeepSpeed, 2, 2), ds_launcher).step.cpu_cores_node == 32.0);
  // Our backend sizes its own threads.
  TrainConfig ours = offload(Engine::kDeepSpeed, 2, 2);
  ours.engine = Engine::kStepcast;
  ours.offload_pipeline = true;
  CHECK(make_features(m, hw, ours).step.cpu_cores_node == 32.0);
}

TEST_CASE("the peers' host memory: 16 B per parameter, pinned buffers rounded up to powers of two (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  // 6 738 415 616 parameters over 2 ranks: 3 369 207 808 each; 4 B of it is 13 476 831 232 B,
  // which the caching host allocator pins as 2^34 = 17 179 869 184 B.
  REQUIRE(m.total_params() == 6738415616);
  const double P = 3369207808.0, pinned_fp32 = 17179869184.0;
  // DeepSpeed ZeRO-2, GAS 1: moments (8 B, pageable), the pinned fp32 partition and its pinned
  // fp32 gradient; no 16-bit accumulation buffer.
  const MemoryFeatures ds = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 1)).memory;
  CHECK(ds.host_opt_states_bytes == 8.0 * P);
  CHECK(ds.host_grads_bytes == pinned_fp32);
  CHECK(ds.host_pinned_buffers_bytes == pinned_fp32);
  // GAS 4 adds one pinned 16-bit tensor per weight, halved over the ranks: per layer q, k, v, o
  // 4096 x 4096 x 2 B = 2^25 B each (exact) and gate, up, down 11008 x 4096 x 2 B = 90 177 536 B,
  // pinned as 2^27 = 134 217 728 B; embedding and head 32000 x 4096 x 2 B = 262 144 000 B, pinned
  // as 2^28 = 268 435 456 B.
  const double per_layer = 4.0 * 33554432.0 + 3.0 * 134217728.0;
  const double accum = (32.0 * per_layer + 2.0 * 268435456.0) / 2.0;
  const MemoryFeatures ds4 = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).memory;
  CHECK(ds4.host_grads_bytes == doctest::Approx(pinned_fp32 + accum).epsilon(1e-12));
  // ZeRO-3: the fp32 partition pageable, its fp32 gradient pinned per sub-group of at most 1e9
  // parameters (4 groups of 842 301 952: 3 369 207 808 B, pinned as 2^32), and the pinned 16-bit
  // gradient partition buffer (6 738 415 616 B, pinned as 2^33).
  const MemoryFeatures z3 = make_features(m, hw, offload(Engine::kDeepSpeed, 3, 2)).memory;
  CHECK(z3.host_pinned_buffers_bytes == 4.0 * P);
  CHECK(z3.host_params_bytes == 0.0);
  // With parameter offload the 16-bit partition (6 738 415 616 B) sits in one pinned flat buffer,
  // 2^33, beside the per-weight partitions zero.Init pinned first, which the host allocator keeps:
  // half of each weight per rank, q, k, v, o 4096 x 4096 / 2 x 2 B = 2^24 B (exact), gate, up,
  // down 11008 x 4096 / 2 x 2 B = 45 088 768 B pinned as 2^26, embedding and head 32000 x 4096 / 2
  // x 2 B = 131 072 000 B pinned as 2^27: 32 x (4 x 2^24 + 3 x 2^26) + 2 x 2^27 = 8 858 370 048 B.
  TrainConfig z3p = offload(Engine::kDeepSpeed, 3, 2);
  z3p.offload_params = OffloadDevice::kCpu;
  CHECK(make_features(m, hw, z3p).memory.host_params_bytes == 8589934592.0 + 8858370048.0);
  CHECK(z3.host_grads_bytes == doctest::Approx(4.0 * 4294967296.0 + 8589934592.0).epsilon(1e-12));
  // FSDP2: the fp32 shard and its fp32 gradient, and the moments.
  const MemoryFeatures fs = make_features(m, hw, offload(Engine::kFsdp2, 3, 1)).memory;
  CHECK(fs.host_opt_states_bytes + fs.host_grads_bytes + fs.host_pinned_buffers_bytes == 16.0 * P);
}

TEST_CASE("a peer harness times engine.backward() with the engine's host work and engine.step() with the tail") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const Features f = make_features(m, hw, offload(Engine::kDeepSpeed, 3, 4));
  const StepTime<double> t = predict_step_time(f.step, for_engine(hw, "deepspeed").coefs.data());
  const TimedPhases<double> peer = timed_phases(t, true), ours = timed_phases(t, false);
  // The forward holds what its own round of the stage-3 fetches exposes, part of all they expose.
  CHECK(test::close(peer.forward_s, t.forward_s + t.forward_gather_s, 1e-12));
  CHECK(t.forward_gather_s > 0.0);
  CHECK(t.forward_gather_s < t.param_gather_s);
  CHECK(test::close(peer.forward_s + peer.backward_s + peer.optimizer_s, t.step_s, 1e-12));
  CHECK(peer.optimizer_s == t.tail_s);
  CHECK(peer.backward_s > t.backward_s);  // the staged copy and the host round trips are in it
  CHECK(ours.backward_s == t.backward_s + t.recompute_s);
  CHECK(ours.optimizer_s == t.optimizer_total_s);
}

TEST_CASE("DeepSpeed's host peak while it places the model: 4 B a parameter at stages 1-2, 2 B of the partition at 3") {
  // stage_1_and_2.py moves the rank's 16-bit parameters to the host and flattens them there
  // (both copies live at once: 2 x 2 B for bf16, the whole model on every rank); stage 3 builds
  // its bf16 partition through the host under zero.Init. Stage 0 keeps the model on the GPU.
  // Measured (docs/engines.md): pythia-2.8b 11.7 GiB at stages 1-2, 6.6 at 3, 2.0 at 0.
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = for_engine(hardware("h200-sxm"), "deepspeed");
  const double P = static_cast<double>(m.total_params());
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    TrainConfig c = offload(Engine::kDeepSpeed, stage, 2);
    c.offload_optimizer = OffloadDevice::kNone;
    c.gpus_per_node = 1;
    const MemoryFeatures f = make_features(m, hw, c).memory;
    const double expected = stage == 0 ? 0.0 : stage <= 2 ? 4.0 * P : 2.0 * P;
    CHECK(f.host_placement_bytes == expected);
    CHECK(predict_memory(f, hw.coefs.data()).host_placement_bytes == expected);
    CHECK(predict_memory(f, hw.coefs.data()).host_buffers_bytes == 0.0);
    // Without offload the host holds nothing else: the peak is the placement plus the process.
    CHECK(predict_memory(f, hw.coefs.data()).host_per_rank_bytes ==
          doctest::Approx(expected + hw.coefs[kHostBytesPerRank]).epsilon(1e-12));
  }
  // With offload the steady buffers are larger than the placement, which then adds nothing.
  const MemoryFeatures off = make_features(m, hw, offload(Engine::kDeepSpeed, 2, 2)).memory;
  CHECK(off.host_opt_states_bytes + off.host_grads_bytes + off.host_pinned_buffers_bytes > off.host_placement_bytes);
  CHECK(predict_memory(off, hw.coefs.data()).host_per_rank_bytes ==
        doctest::Approx(off.host_opt_states_bytes + off.host_grads_bytes + off.host_pinned_buffers_bytes +
                        hw.coefs[kHostBytesPerRank]).epsilon(1e-12));
}

TEST_CASE("DeepSpeed offload under torchrun: the OMP_NUM_THREADS lever, and the manifest that sets it") {
  SearchRequest r;
  r.model = model("llama-2-7b");
  r.hardware = hardware("h200-sxm");  // 16 cores per GPU: 32 on a node of 2
  r.base = offload(Engine::kDeepSpeed, 2, 4);
  const Prediction plan = evaluate(r.model, r.hardware, r.base);
  const std::vector<Lever> levers = offload_levers(r, plan);
  const auto find = [&](const std::string& prefix) -> const Lever* {
    for (const Lever& l : levers)
      if (l.name.rfind(prefix, 0) == 0) return &l;
    return nullptr;
  };
  const Lever* threads = find("OMP_NUM_THREADS=16 in each rank");
  REQUIRE(threads != nullptr);
  CHECK(threads->gain_frac > 0.0);
  // One thread per rank uses 2 of the 32 cores: twice the cores buys nothing.
  const Lever* cores = find("twice the CPU cores");
  REQUIRE(cores != nullptr);
  CHECK(std::abs(cores->gain_frac) < 1e-12);
  // With the threads set, the lever is not offered again.
  SearchRequest set = r;
  set.limits.cpu_threads_per_rank = 16;
  const Prediction faster = evaluate(r.model, r.hardware, r.base, set.limits);
  CHECK(faster.time.step_s < plan.time.step_s);
  for (const Lever& l : offload_levers(set, faster)) CHECK(l.name.find("OMP_NUM_THREADS") == std::string::npos);
  // The manifest launches the DeepSpeed plan with the threads it was predicted with; a Stepcast plan,
  // which sizes its own threads, gets none.
  ManifestRequest mr;
  mr.gpu_product = "NVIDIA-H200";
  mr.hardware = "h200-sxm";
  mr.steps = 10;
  mr.plan_json = "{}";
  mr.cpu_threads_per_rank = 16;
  size_pod(faster, 16, mr);
  const std::string ds_yaml = k8s_manifest_yaml(r.model, faster, mr);
  CHECK(ds_yaml.find("- name: OMP_NUM_THREADS\n              value: \"16\"") != std::string::npos);
  TrainConfig ours = r.base;
  ours.engine = Engine::kStepcast;
  ours.offload_pipeline = true;
  const std::string our_yaml = k8s_manifest_yaml(r.model, evaluate(r.model, r.hardware, ours), mr);
  CHECK(our_yaml.find("OMP_NUM_THREADS") == std::string::npos);
}

TEST_CASE("an engine's constraints are checked where the configuration comes from") {
  TrainConfig c = offload(Engine::kFsdp2, 3, 1);
  c.offload_params = OffloadDevice::kNone;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("CPUOffloadPolicy"), InputError);
  c = TrainConfig{};
  c.engine = Engine::kFsdp2;
  c.zero_stage = 1;
  c.gpus_per_node = 2;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("must be 2 or 3"), InputError);
  c = offload(Engine::kDeepSpeed, 2, 1);
  c.offload_pipeline = true;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("--offload-pipeline must be off"), InputError);
  c = offload(Engine::kDeepSpeed, 2, 1);
  c.optimizer = OptimizerKind::kAdamW8bit;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("fp32 CPU Adam"), InputError);
  // The job's rules hold for any plan: fp16 is a peer engine's (train refuses it), so a plan file
  // for the Stepcast backend in fp16 is refused by its key, and the same job for DeepSpeed passes.
  c = TrainConfig{};
  c.precision = Precision::kFp16;
  CHECK_THROWS_WITH_AS(validate_job(c), doctest::Contains("--precision fp16: the Stepcast backend"), InputError);
  CHECK_THROWS_WITH_AS(train_config_from_json(train_config_to_json(c), "plan.json: plans[0].config"),
                       doctest::Contains("plan.json: plans[0].config.precision fp16"), InputError);
  c.engine = Engine::kDeepSpeed;
  CHECK_NOTHROW(validate_job(c));
  CHECK_NOTHROW(validate_config(c));
  // JSON: the key is named, and the engine round-trips and keys the configuration.
  nlohmann::json j = train_config_to_json(offload(Engine::kDeepSpeed, 2, 4));
  CHECK(j.at("engine") == "deepspeed");
  CHECK(train_config_from_json(j, "r").engine == Engine::kDeepSpeed);
  CHECK(config_key("m", offload(Engine::kDeepSpeed, 2, 4)).ends_with(" engine=deepspeed"));
  j["engine"] = "megatron";
  CHECK_THROWS_WITH_AS(train_config_from_json(j, "r.config"), doctest::Contains("r.config.engine \"megatron\""),
                       InputError);
  j["engine"] = "deepspeed";
  j["offload_pipeline"] = true;
  CHECK_THROWS_WITH_AS(train_config_from_json(j, "r.config"), doctest::Contains("r.config.offload_pipeline must be off"),
                       InputError);
}

TEST_CASE("engine sections: read, written, and rejected on bad input") {
  const HardwareProfile hw = hardware("h200-sxm");
  const std::string text = read_text_file(hw.path);
  CalibratedCoefficients cc;
  cc.values = hw.coefs;
  cc.values[kActBytesMult] = 1.5;
  cc.values[kGemmEffMaxFrac] = 0.1;  // a hardware coefficient: not written into the section
  cc.model_error_frac = 0.07;
  cc.source = "test";
  cc.runs = {"runs/x.jsonl"};
  cc.holdout = HoldoutSplit{0.2, 7};
  const std::string written = with_engine_section(text, "fsdp2", cc);
  const HardwareProfile back = parse_hardware_profile(written, "w.toml");
  REQUIRE(back.engines.count("fsdp2") == 1);
  const HardwareProfile fsdp = for_engine(back, "fsdp2");
  CHECK(fsdp.coefs[kActBytesMult] == 1.5);
  CHECK(fsdp.coefs[kGemmEffMaxFrac] == hw.coefs[kGemmEffMaxFrac]);  // the hardware's, shared
  CHECK(fsdp.model_error_frac == 0.07);
  CHECK(fsdp.calibration_runs == std::vector<std::string>{"runs/x.jsonl"});
  // The split the fit held out, which `calibrate report` labels its runs by.
  CHECK(fsdp.calibration_holdout.frac == 0.2);
  CHECK(fsdp.calibration_holdout.seed == 7);
  CHECK(for_engine(back, "deepspeed").calibration_holdout.frac ==
        for_engine(hardware("h200-sxm"), "deepspeed").calibration_holdout.frac);  // the other section untouched
  CHECK(for_engine(back, "stepcast").coefs == hw.coefs);
  // Writing twice replaces the section; the [coefficients] after it survive.
  const std::string twice = with_engine_section(written, "fsdp2", cc);
  CHECK(twice == written);
  CHECK(parse_hardware_profile(twice, "w.toml").coefs == hw.coefs);
  // A profile without the section: the engine is uncalibrated and gets the hardware's values.
  const HardwareProfile none = for_engine(hardware("a100-80gb-sxm"), "deepspeed");
  CHECK_FALSE(none.coefs_calibrated);
  // Bad input names the file and key.
  const size_t at = written.find("act_bytes_mult = 1.5");
  REQUIRE(at != std::string::npos);
  std::string bad = written;
  bad.replace(at, 20, "gemm_eff_max_frac = 0.5");
  CHECK_THROWS_WITH_AS(parse_hardware_profile(bad, "b.toml"),
                       doctest::Contains("b.toml: key 'engines.fsdp2.gemm_eff_max_frac' is not an engine coefficient"),
                       InputError);
  bad = written;
  bad.replace(at, 20, "act_bytes_mult = -1");
  CHECK_THROWS_AS(parse_hardware_profile(bad, "b.toml"), InputError);
  bad = written;
  bad.replace(bad.find("[engines.fsdp2]"), 15, "[engines.megatron]");
  CHECK_THROWS_WITH_AS(parse_hardware_profile(bad, "b.toml"), doctest::Contains("'engines.megatron'"), InputError);
}

TEST_CASE("the committed profile's peer sections predict their own runs' order of magnitude") {
  // Property: a peer plan uses its engine's coefficients, so the same configuration differs
  // between engines, and DeepSpeed's serial fp32 CPU Adam is slower than the pipelined backend.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig ds = offload(Engine::kDeepSpeed, 2, 4);
  TrainConfig ours = ds;
  ours.engine = Engine::kStepcast;
  ours.offload_pipeline = true;
  const double t_ds = evaluate(m, hw, ds).time.step_s, t_ours = evaluate(m, hw, ours).time.step_s;
  CHECK(t_ds > 1.5 * t_ours);
}

TEST_CASE("the interval model: regime distance by hand, half-width, and its profile section") {
  IntervalModel m;
  m.log_q95_seen = 0.10;
  m.log_q95_unseen = 0.25;
  m.models = {"llama-2-7b"};
  m.offloads = {"cpu", "none"};
  m.precisions = {"bf16"};
  m.attentions = {"flash"};
  m.zero_stages = {2, 3};
  m.world_sizes = {2};
  m.seq_min = 1024;
  m.seq_max = 4096;
  m.micro_tokens_max = 16384;
  TrainConfig c;
  c.zero_stage = 3;
  c.gpus_per_node = 2;
  c.micro_batch = 4;
  c.seq_len = 2048;
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 0);
  CHECK(unseen_dimensions(m, "pythia-2.8b", c) == 1);  // the model
  c.seq_len = 3000;                                    // inside [1024, 4096]: seen
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 0);
  c.seq_len = 8192;                                    // the range and micro-batch x sequence (32768 > 16384)
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 2);
  c.seq_len = 2048;
  c.zero_stage = 1;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.gpus_per_node = 8;  // stage 1 and 8 ranks unseen; "cpu" offload seen
  CHECK(unseen_dimensions(m, "llama-2-7b", c) == 2);
  CHECK(interval_log_halfwidth(m, 0, false) == doctest::Approx(0.10));
  CHECK(interval_log_halfwidth(m, 2, false) == doctest::Approx(0.10 + 2 * 0.15));
  CHECK(interval_log_halfwidth(m, 2, true) == doctest::Approx(0.10 + 2 * 0.15));  // no class of its own: the pair
  // A calibrated profile with the model: a prediction's band is exp(half-width) - 1 of its step.
  HardwareProfile hw = hardware("h200-sxm");
  REQUIRE(hw.coefs_calibrated);
  hw.interval = m;
  TrainConfig seen;
  seen.zero_stage = 3;
  seen.gpus_per_node = 2;
  seen.micro_batch = 4;
  const Prediction p = evaluate(model("llama-2-7b"), hw, seen);
  CHECK(p.unseen_dims == 0);
  CHECK(1.96 * p.step_std_s == doctest::Approx(p.time.step_s * std::expm1(0.10)));
  const Prediction far = evaluate(model("pythia-2.8b"), hw, seen);
  CHECK(far.unseen_dims == 1);
  CHECK(1.96 * far.step_std_s == doctest::Approx(far.time.step_s * std::expm1(0.25)));
  // Written and read back inside [coefficients] and an engine section.
  CalibratedCoefficients cc;
  cc.values = hw.coefs;
  cc.interval = m;
  const std::string text = read_text_file(hw.path);
  const HardwareProfile back = parse_hardware_profile(with_calibrated_coefficients(text, cc), "w.toml");
  CHECK(back.interval.log_q95_unseen == doctest::Approx(0.25));
  CHECK(back.interval.zero_stages == std::vector<int64_t>{2, 3});
  CHECK(back.interval.models == std::vector<std::string>{"llama-2-7b"});
  const std::string eng = with_engine_section(text, "deepspeed", cc);
  CHECK(with_engine_section(eng, "deepspeed", cc) == eng);  // the section and its interval replaced, not doubled
  CHECK(for_engine(parse_hardware_profile(eng, "w.toml"), "deepspeed").interval.seq_max == 4096);
  std::string bad = eng;
  bad.replace(bad.find("log_q95_unseen = 0.25"), 21, "log_q95_unseen = 0.05");  // below the seen quantile
  CHECK_THROWS_AS(parse_hardware_profile(bad, "b.toml"), InputError);
}

TEST_CASE("launch-bound predictions: which they are, their own interval pair, and its profile keys") {
  // Measured on one H200 (docs/calibration.md): llama-2-7b at micro-batch 1 x 512 tokens ran 79 ms
  // a micro-batch where its GEMMs need about 6 x 6.7e9 x 512 / 600e12 = 34 ms at the H200's
  // achieved dense rate: the host sets the pace (ratio above 1). At micro-batch 8 x 2048 the
  // GPU's work is 32x more while the kernels issued stay the same: far below the class's bound.
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig small;
  small.micro_batch = 1;
  small.seq_len = 512;
  small.gas = 16;
  TrainConfig big = small;
  big.micro_batch = 8;
  big.seq_len = 2048;
  big.gas = 2;
  const Prediction ps = evaluate(model("llama-2-7b"), hw, small), pb = evaluate(model("llama-2-7b"), hw, big);
  CHECK(ps.time.host_issue_ratio > 1.0);
  CHECK(launch_bound(ps.time.host_issue_ratio));
  CHECK(pb.time.host_issue_ratio < 0.25);
  CHECK_FALSE(launch_bound(pb.time.host_issue_ratio));

  IntervalModel m;
  m.log_q95_seen = 0.08;
  m.log_q95_unseen = 0.12;
  m.log_q95_seen_launch_bound = 0.20;
  m.log_q95_unseen_launch_bound = 0.30;
  m.seen_launch_bound_predictions = 25;
  m.unseen_launch_bound_predictions = 60;
  CHECK(interval_log_halfwidth(m, 0, false) == doctest::Approx(0.08));
  CHECK(interval_log_halfwidth(m, 1, false) == doctest::Approx(0.12));
  CHECK(interval_log_halfwidth(m, 0, true) == doctest::Approx(0.20));
  CHECK(interval_log_halfwidth(m, 2, true) == doctest::Approx(0.20 + 2 * 0.10));
  // A prediction takes its class's pair.
  HardwareProfile with = hw;
  with.interval = hw.interval;
  with.interval.log_q95_seen = 0.08;
  with.interval.log_q95_unseen = 0.12;
  with.interval.log_q95_seen_launch_bound = 0.20;
  with.interval.log_q95_unseen_launch_bound = 0.30;
  const Prediction qs = evaluate(model("llama-2-7b"), with, small), qb = evaluate(model("llama-2-7b"), with, big);
  REQUIRE(qs.unseen_dims == 0);
  REQUIRE(qb.unseen_dims == 0);
  CHECK(1.96 * qs.step_std_s == doctest::Approx(qs.time.step_s * std::expm1(0.20)));
  CHECK(1.96 * qb.step_std_s == doctest::Approx(qb.time.step_s * std::expm1(0.08)));
  // Written and read back; the unseen quantile may not fall below the seen one.
  m.models = {"llama-2-7b"};
  m.zero_stages = {0};
  m.world_sizes = {1};
  m.seq_min = 512;
  m.seq_max = 2048;
  m.micro_tokens_max = 16384;
  CalibratedCoefficients cc;
  cc.values = hw.coefs;
  cc.interval = m;
  const std::string text = with_calibrated_coefficients(read_text_file(hw.path), cc);
  const IntervalModel back = parse_hardware_profile(text, "w.toml").interval;
  CHECK(back.log_q95_seen_launch_bound == doctest::Approx(0.20));
  CHECK(back.log_q95_unseen_launch_bound == doctest::Approx(0.30));
  CHECK(back.seen_launch_bound_predictions == 25);
  CHECK(back.unseen_launch_bound_predictions == 60);
  std::string bad = text;
  bad.replace(bad.find("log_q95_unseen_launch_bound = 0.3"), 33, "log_q95_unseen_launch_bound = 0.1");
  CHECK_THROWS_AS(parse_hardware_profile(bad, "b.toml"), InputError);
  // Without the class's keys, one pair for all (profiles written before it, other engines).
  IntervalModel pooled = m;
  pooled.log_q95_seen_launch_bound = pooled.log_q95_unseen_launch_bound = 0;
  cc.interval = pooled;
  const IntervalModel back2 =
      parse_hardware_profile(with_calibrated_coefficients(read_text_file(hw.path), cc), "w.toml").interval;
  CHECK_FALSE(back2.has_launch_bound_class());
  CHECK(interval_log_halfwidth(back2, 0, true) == doctest::Approx(0.08));
}

TEST_CASE("the peers' eager attention reads and writes its score matrix: bytes per score by hand count") {
  // transformers 5.17's eager path, 16-bit scores up to softmax (llama): 24 B forward, 28 B
  // backward per score; GPT-J's fp32 scores: 36 and 42 (counts in model/step_features.cpp).
  // llama-2-7b, micro-batch 2, sequence 2048: 2 x 32 heads x 2048^2 x 32 layers = 8589934592 scores.
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c;
  c.engine = Engine::kDeepSpeed;
  c.zero_stage = 3;
  c.gpus_per_node = 1;
  c.micro_batch = 2;
  c.attention = AttentionKind::kMath;
  const StepFeatures f = make_features(model("llama-2-7b"), hw, c).step;
  CHECK(f.attn_score_bytes_fwd == 24.0 * 8589934592.0);
  CHECK(f.attn_score_bytes_bwd == 28.0 * 8589934592.0);
  // gpt-j-6b: 2 x 16 heads x 2048^2 x 28 layers = 3758096384 scores.
  const StepFeatures j = make_features(model("gpt-j-6b"), hw, c).step;
  CHECK(j.attn_score_bytes_fwd == 36.0 * 3758096384.0);
  CHECK(j.attn_score_bytes_bwd == 42.0 * 3758096384.0);
  // Fused SDPA, and our backend's own math path, keep no such chain.
  c.attention = AttentionKind::kFlash;
  CHECK(make_features(model("llama-2-7b"), hw, c).step.attn_score_bytes_fwd == 0.0);
  c.attention = AttentionKind::kMath;
  c.engine = Engine::kStepcast;
  CHECK(make_features(model("llama-2-7b"), hw, c).step.attn_score_bytes_fwd == 0.0);
  // The traffic lengthens the passes: by its time at full HBM bandwidth, forward and backward,
  // less what the host corner (gpu^4 + host^4)^(1/4) absorbs, (gpu / corner)^3 of it passing
  // on: at least 95 % where the host's time is under half the GPU's, as at 2 x 2048 tokens.
  c.engine = Engine::kDeepSpeed;
  StepFeatures none = f;
  none.attn_score_bytes_fwd = none.attn_score_bytes_bwd = 0.0;
  const CoefVector k = for_engine(hw, "deepspeed").coefs;
  const double with_s = predict_step_time(f, k.data()).forward_s + predict_step_time(f, k.data()).backward_s;
  const double without_s = predict_step_time(none, k.data()).forward_s + predict_step_time(none, k.data()).backward_s;
  CHECK(with_s - without_s >= 0.95 * (24.0 + 28.0) * 8589934592.0 / hw.gpu.memory_bytes_per_s);
}

TEST_CASE("DeepSpeed's fp32 gradients of a 16-bit run: held through the backward at stage 0, the step's own at stages 1-3") {
  // BF16_Optimizer (stage 0) holds an fp32 flat gradient buffer of every parameter through the
  // backward and the step; at stages 1-2 the step casts the rank's gradients to fp32 after
  // flattening its 16-bit ones (4 + 2 B a parameter of its partition), once the backward is over;
  // stage 3 does so one sub-group at a time. Per parameter P (pythia-2.8b, 2.78e9):
  //   stage 1, one GPU: 2P of bf16 gradients; the step's 6P.
  //   stage 3, one GPU: 2P; the step's 6 x 1e9 (sub_group_size).
  //   stage 2, two GPUs: P/2 x 2 = P; the step's P/2 x 6 = 3P.
  //   stage 0, two GPUs: 2P + 4P = 6P; no step of its own.
  const ModelSpec m = model("pythia-2.8b");
  const double P = static_cast<double>(m.total_params());
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c;
  c.engine = Engine::kDeepSpeed;
  c.gpus_per_node = 1;
  c.zero_stage = 1;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, 2.0 * P, 1e-12));
  CHECK(test::close(make_features(m, hw, c).memory.gpu_step_bytes, 6.0 * P, 1e-12));
  c.zero_stage = 3;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, 2.0 * P, 1e-12));
  CHECK(test::close(make_features(m, hw, c).memory.gpu_step_bytes, 6.0 * 1e9, 1e-12));
  c.gpus_per_node = 2;
  c.zero_stage = 2;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, P, 1e-12));
  CHECK(test::close(make_features(m, hw, c).memory.gpu_step_bytes, 3.0 * P, 1e-12));
  c.zero_stage = 0;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, 6.0 * P, 1e-12));
  CHECK(make_features(m, hw, c).memory.gpu_step_bytes == 0.0);
  // Not with the optimizer offloaded (its fp32 gradients live on the host; stage 1's 16-bit ones
  // leave the GPU before the step), not in fp32 (the gradients are fp32 already), not for our
  // backend.
  c.zero_stage = 1;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  CHECK(make_features(m, hw, c).memory.gpu_grads_bytes == 0.0);
  CHECK(test::close(make_features(m, hw, c).memory.gpu_backward_bytes, 2.0 * P, 1e-12));
  c.offload_optimizer = OffloadDevice::kNone;
  c.precision = Precision::kFp32;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, 4.0 * P, 1e-12));
  CHECK(make_features(m, hw, c).memory.gpu_step_bytes == 0.0);
  c.precision = Precision::kBf16;
  c.engine = Engine::kStepcast;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, 2.0 * P, 1e-12));
  CHECK(make_features(m, hw, c).memory.gpu_step_bytes == 0.0);
  // The cache the ZeRO optimizer's 16-bit gradient partition buffer leaves at stages 1-2 without
  // offload (one GPU: 2 B a parameter; two GPUs at stage 2: 1 B), and stage 0's 2 B; none for our
  // backend, whose buckets are the same.
  c.engine = Engine::kDeepSpeed;
  c.gpus_per_node = 1;
  c.zero_stage = 1;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_engine_cache_bytes, 2.0 * P, 1e-12));
  c.gpus_per_node = 2;
  c.zero_stage = 2;
  TrainConfig ours = c;
  ours.engine = Engine::kStepcast;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_engine_cache_bytes, P, 1e-12));
  CHECK(make_features(m, hw, ours).memory.gpu_engine_cache_bytes == 0.0);
  CHECK(test::close(make_features(m, hw, c).memory.gpu_buffers_bytes, make_features(m, hw, ours).memory.gpu_buffers_bytes,
                    1e-12));
  c.zero_stage = 0;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_engine_cache_bytes, 2.0 * P, 1e-12));
}

TEST_CASE("FSDP2 accumulating without sync holds every parameter's whole fp32 gradient (hand count)") {
  // torch 2.11, fsdp/_fully_shard/_fsdp_param.py, to_accumulated_grad_if_needed: before the last
  // micro-batch the unsharded gradient is cast to the reduce dtype (fp32) and kept, on every
  // rank: 4 B a parameter through the backward, which the last reduce-scatter turns into the
  // shard's gradient, the step's. Reducing after each micro-batch, or one micro-batch a step,
  // holds none.
  const ModelSpec m = model("llama-2-7b");
  const double P = static_cast<double>(m.total_params());
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c;
  c.engine = Engine::kFsdp2;
  c.zero_stage = 3;
  c.gpus_per_node = 2;
  c.gas = 1;
  const double shard_only = make_features(m, hw, c).memory.gpu_grads_bytes;
  CHECK(test::close(shard_only, 4.0 * P / 2.0, 1e-12));  // the rank's fp32 gradient shard
  c.gas = 4;
  CHECK(make_features(m, hw, c).memory.gpu_grads_bytes == 0.0);
  CHECK(test::close(make_features(m, hw, c).memory.gpu_backward_bytes, 4.0 * P, 1e-12));
  CHECK(test::close(make_features(m, hw, c).memory.gpu_step_bytes, shard_only, 1e-12));
  // Its reduce-scatter then runs once, on the last micro-batch.
  CHECK(make_features(m, hw, c).step.grad_comm_bytes_micro == 0.0);
  CHECK(make_features(m, hw, c).step.grad_comm_bytes_boundary > 0.0);
  c.grad_sync_each_micro = true;
  CHECK(test::close(make_features(m, hw, c).memory.gpu_grads_bytes, shard_only, 1e-12));
  CHECK(make_features(m, hw, c).step.grad_comm_bytes_micro > 0.0);
  CHECK(make_features(m, hw, c).step.grad_comm_bytes_boundary == 0.0);
  // The setting keys the configuration, round-trips through JSON, and is FSDP2's alone.
  CHECK(config_key("m", c).ends_with(" engine=fsdp2 sync=each"));
  CHECK(train_config_from_json(train_config_to_json(c), "r").grad_sync_each_micro);
  CHECK_FALSE(train_config_to_json(TrainConfig{}).contains("grad_sync_each_micro"));
  c.engine = Engine::kDeepSpeed;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("--grad-sync (each micro-batch) is an FSDP2 setting"),
                       InputError);
  nlohmann::json j = train_config_to_json(c);
  CHECK_THROWS_WITH_AS(train_config_from_json(j, "r.config"),
                       doctest::Contains("r.config.grad_sync_each_micro (each micro-batch) is an FSDP2 setting"),
                       InputError);
  // The allocator setting keys the configuration and round-trips through JSON (absent: default).
  {
    TrainConfig e;
    e.gpu_expandable_segments = true;
    CHECK(config_key("m", e).ends_with(" alloc=expandable"));
    CHECK(train_config_to_json(e).at("gpu_allocator") == "expandable");
    CHECK(train_config_from_json(train_config_to_json(e), "r").gpu_expandable_segments);
    CHECK_FALSE(train_config_to_json(TrainConfig{}).contains("gpu_allocator"));
    nlohmann::json bad = train_config_to_json(e);
    bad["gpu_allocator"] = "huge";
    CHECK_THROWS_WITH_AS(train_config_from_json(bad, "r.config"),
                         doctest::Contains("r.config.gpu_allocator \"huge\" is not valid (valid: default, expandable)"),
                         InputError);
  }
  // The search offers both for FSDP2 at GAS > 1; syncing each micro-batch needs 4 B a parameter less.
  SearchRequest r;
  r.model = model("pythia-2.8b");
  r.hardware = hw;
  r.base.engine = Engine::kFsdp2;
  r.base.gpus_per_node = 1;
  r.global_batch = 8;
  r.micro_batches = {2};
  r.optimizers = {OptimizerKind::kAdamW};
  r.allow_offload = false;
  r.checkpointing = {true};
  const SearchResult res = search_plans(r);
  const Prediction* last = nullptr;
  const Prediction* each = nullptr;
  for (const Prediction& p : res.ranked)
    if (p.config.zero_stage == 3) (p.config.grad_sync_each_micro ? each : last) = &p;
  REQUIRE(last != nullptr);
  REQUIRE(each != nullptr);
  CHECK(test::close(last->memory.gpu_total_bytes - each->memory.gpu_total_bytes,
                    4.0 * static_cast<double>(r.model.total_params()), 1e-9));
}

TEST_CASE("DeepSpeed's GPU optimizer step moves more bytes than a fused update: hand count by stage") {
  // Counted from DeepSpeed 0.14.5 with gradient clipping (model/step_features.cpp): 16-bit at
  // stages 0-1 (BF16_Optimizer) 4 + 8 + 28 + 6 + 4 = 50 B a parameter; at stages 2-3, where each
  // gradient's norm goes through a float64 copy and the partition is flattened and cast,
  // 18 + 4 + 6 + 8 + 28 + 6 = 70 B. Our backend's fused bf16 AdamW: 2 + 8 + 16 + 2 = 28 B.
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c;
  c.engine = Engine::kDeepSpeed;
  c.gpus_per_node = 1;
  const ModelSpec m = model("pythia-2.8b");
  for (int stage : {0, 1, 2, 3}) {
    c.zero_stage = stage;
    CHECK(make_features(m, hw, c).step.opt_bytes_per_param == (stage <= 1 ? 50.0 : 70.0));
  }
  c.precision = Precision::kFp32;
  c.zero_stage = 0;
  CHECK(make_features(m, hw, c).step.opt_bytes_per_param == 40.0);
  c.zero_stage = 2;
  CHECK(make_features(m, hw, c).step.opt_bytes_per_param == 72.0);
  // The CPU optimizer under offload keeps the peers' fp32 count; our backend its own.
  c.precision = Precision::kBf16;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  CHECK(make_features(m, hw, c).step.opt_bytes_per_param == 28.0);
  c.offload_optimizer = OffloadDevice::kNone;
  c.engine = Engine::kStepcast;
  CHECK(make_features(m, hw, c).step.opt_bytes_per_param == 28.0);
}

TEST_CASE("the peers' per-layer host cost: transformers' profile, relative by family, carried to other GPUs") {
  const HardwareProfile hw = hardware("h200-sxm");
  // The committed table is host_profile.py's measurement: the per-layer times of its JSON lines.
  std::istringstream lines(read_text_file(test::data_dir() / "runs/h200-sxm/host_profile/2026-12-02_transformers_seq128.jsonl"));
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json r = nlohmann::json::parse(line);
    const auto& cost = hw.host.transformers_layer_s.at(r.at("model_type").get<std::string>());
    CHECK(test::close(cost.fwd_s, r.at("fwd_ms_per_layer").get<double>() / 1e3, 1e-3));
    CHECK(test::close(cost.bwd_s, r.at("bwd_ms_per_layer").get<double>() / 1e3, 1e-3));
    ++rows;
  }
  CHECK(rows == static_cast<int>(hw.host.transformers_layer_s.size()));
  // Relative by hand: a table of llama 2 / 3 ms and gpt_neox 1 / 1 ms has means 1.5 and 2 ms,
  // so llama's layers take 4/3 and 3/2 of the engine's fitted time, pythia's 2/3 and 1/2.
  std::string text = read_text_file(hw.path);
  const size_t from = text.find("[host.transformers_layer_s]");
  const size_t to = text.find("[links]");
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  const std::string table =
      "[host.transformers_layer_s]\nsource = \"test\"\nllama = { fwd_s = 2e-3, bwd_s = 3e-3 }\n"
      "gpt_neox = { fwd_s = 1e-3, bwd_s = 1e-3 }\n\n";
  const HardwareProfile two = parse_hardware_profile(text.substr(0, from) + table + text.substr(to), "t.toml");
  TrainConfig c;
  c.engine = Engine::kFsdp2;
  c.zero_stage = 3;
  const StepFeatures llama = make_features(model("llama-2-7b"), two, c).step;
  CHECK(test::close(llama.impl_host_fwd_rel, 4.0 / 3.0, 1e-12));
  CHECK(test::close(llama.impl_host_bwd_rel, 1.5, 1e-12));
  const StepFeatures pythia = make_features(model("pythia-2.8b"), two, c).step;
  CHECK(test::close(pythia.impl_host_fwd_rel, 2.0 / 3.0, 1e-12));
  CHECK(test::close(pythia.impl_host_bwd_rel, 0.5, 1e-12));
  // An unprofiled family, and our own backend, keep the fitted time as it is.
  CHECK(make_features(model("gpt-j-6b"), two, c).step.impl_host_fwd_rel == 1.0);
  c.engine = Engine::kStepcast;
  CHECK(make_features(model("llama-2-7b"), two, c).step.impl_host_fwd_rel == 1.0);
  // The launch floor scales with it: at micro-batch 1 x 128 tokens the pass is the host's.
  c.engine = Engine::kFsdp2;
  c.micro_batch = 1;
  c.seq_len = 128;
  const HardwareProfile fsdp = for_engine(two, "fsdp2");
  const double fwd_s = predict_step_time(make_features(model("llama-2-7b"), fsdp, c).step, fsdp.coefs.data()).forward_s;
  CHECK(test::close(fwd_s, fsdp.coefs[kHostLayerFwdS] * 4.0 / 3.0 * 32, 0.02));
  // A GPU profile without a table of its own takes the reference's (engines_from).
  const HardwareProfile a100 = hardware("a100-80gb-sxm");
  CHECK(a100.host.transformers_layer_s.size() == hw.host.transformers_layer_s.size());
  CHECK(a100.host.transformers_layer_source.starts_with("transferred from h200-sxm"));
  CHECK(a100.host.transformers_layer_rel.at("llama").fwd_rel == hw.host.transformers_layer_rel.at("llama").fwd_rel);
  CHECK(test::close(two.host.transformers_layer_rel.at("gpt_neox").bwd_rel, 0.5, 1e-12));
  // Bad input names the file and the key.
  const auto parse_with = [&](const std::string& t) { return parse_hardware_profile(text.substr(0, from) + t + text.substr(to), "t.toml"); };
  CHECK_THROWS_WITH_AS(parse_with("[host.transformers_layer_s]\nsource = \"x\"\nbloom = { fwd_s = 1e-3, bwd_s = 1e-3 }\n"),
                       doctest::Contains("t.toml: key 'host.transformers_layer_s.bloom' is not a model_type"), InputError);
  CHECK_THROWS_WITH_AS(parse_with("[host.transformers_layer_s]\nsource = \"x\"\nllama = { fwd_s = -1e-3, bwd_s = 1e-3 }\n"),
                       doctest::Contains("fwd_s"), InputError);
  CHECK_THROWS_AS(parse_with("[host.transformers_layer_s]\nllama = { fwd_s = 1e-3, bwd_s = 1e-3 }\n"), InputError);
}

TEST_CASE("flash attention by head dimension: the microbenchmark's table, time per FLOP relative to 128") {
  const HardwareProfile hw = hardware("h200-sxm");
  // The committed table is microbench's measurement: its records at 16384 tokens a sequence.
  std::istringstream lines(read_text_file(test::data_dir() / "runs/h200-sxm/2026-12-03_attention_head_dim_micro.jsonl"));
  std::string line;
  int rows = 0;
  while (std::getline(lines, line)) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (r.value("kind", "") != "micro" || r.at("seq_len").get<int>() != 16384) continue;
    const auto& cost = hw.gpu.attention_head_dim_s.at(r.at("head_dim").get<int>());
    const double s = r.at("seconds").get<double>();
    CHECK(test::close(r.at("bench").get<std::string>() == "attention" ? cost.fwd_s : cost.bwd_s, s, 1e-6));
    ++rows;
  }
  CHECK(rows == 2 * static_cast<int>(hw.gpu.attention_head_dim_s.size()));
  // By hand on a made-up table: 128 takes 4 / 8 ms; 64 takes 3 / 4 ms, so a FLOP there costs
  // 3/4 x 2 = 1.5 and 4/8 x 2 = 1 of one at 128; 96, half way, takes 3.5 / 6 ms, x 128/96: 7/6 and
  // 1. Outside the table the nearest dimension's ratio; 128 itself is 1.
  GpuSpec g;
  g.attention_head_dim_s = {{64, {3e-3, 4e-3}}, {128, {4e-3, 8e-3}}};
  CHECK(test::close(attention_head_dim_rel(g, 64).fwd, 1.5, 1e-12));
  CHECK(test::close(attention_head_dim_rel(g, 64).bwd, 1.0, 1e-12));
  CHECK(test::close(attention_head_dim_rel(g, 96).fwd, 3.5 / 4.0 * 128.0 / 96.0, 1e-12));
  CHECK(test::close(attention_head_dim_rel(g, 96).bwd, 6.0 / 8.0 * 128.0 / 96.0, 1e-12));
  CHECK(attention_head_dim_rel(g, 128).fwd == 1.0);
  CHECK(test::close(attention_head_dim_rel(g, 32).fwd, 1.5, 1e-12));
  CHECK(attention_head_dim_rel(g, 256).bwd == 1.0);
  CHECK(attention_head_dim_rel(GpuSpec{}, 80).fwd == 1.0);
  // Measured: pythia's heads of 80 run in the kernel for 96 (3.34 against 3.44 ms), so a FLOP
  // there costs about 1.6 of one at 128 forward and 1.4 backward.
  const AttnHeadDimRel pythia = attention_head_dim_rel(hw.gpu, 80);
  CHECK(pythia.fwd > 1.5);
  CHECK(pythia.bwd > 1.3);
  // The step's attention takes it: pythia-2.8b's flash attention at 16384 tokens a sequence costs
  // the ratio's times more than with the table absent.
  TrainConfig c;
  c.seq_len = 16384;
  c.activation_checkpointing = true;
  const StepFeatures f = make_features(model("pythia-2.8b"), hw, c).step;
  CHECK(f.attn_head_dim_rel_fwd == pythia.fwd);
  CHECK(f.attn_head_dim_rel_bwd == pythia.bwd);
  HardwareProfile bare = hw;
  bare.gpu.attention_head_dim_s.clear();
  const StepFeatures f1 = make_features(model("pythia-2.8b"), bare, c).step;
  const StepTime<double> with = predict_step_time(f, hw.coefs.data()), without = predict_step_time(f1, hw.coefs.data());
  CHECK(with.forward_s > without.forward_s);
  CHECK(with.backward_s > without.backward_s);
  // Math attention runs as batched GEMMs: the table does not apply.
  c.attention = AttentionKind::kMath;
  CHECK(make_features(model("pythia-2.8b"), hw, c).step.attn_head_dim_rel_fwd == 1.0);
  // A profile without a table takes the reference's (engines_from), marked transferred.
  const HardwareProfile a100 = hardware("a100-80gb-sxm");
  CHECK(a100.gpu.attention_head_dim_s.size() == hw.gpu.attention_head_dim_s.size());
  CHECK(a100.gpu.attention_head_dim_source.starts_with("transferred from h200-sxm"));
  // Bad input names the file and the key; a table without 128 has no reference.
  std::string text = read_text_file(hw.path);
  const size_t from = text.find("[gpu.attention_head_dim_s]");
  const size_t to = text.find("[host]");
  REQUIRE(from != std::string::npos);
  REQUIRE(to != std::string::npos);
  const auto parse_with = [&](const std::string& t) {
    return parse_hardware_profile(text.substr(0, from) + t + "\n" + text.substr(to), "t.toml");
  };
  CHECK_THROWS_WITH_AS(parse_with("[gpu.attention_head_dim_s]\nsource = \"x\"\nwide = { fwd_s = 1e-3, bwd_s = 1e-3 }\n"),
                       doctest::Contains("t.toml: key 'gpu.attention_head_dim_s.wide' is not a head dimension"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_with("[gpu.attention_head_dim_s]\nsource = \"x\"\n64 = { fwd_s = 1e-3, bwd_s = 1e-3 }\n"),
                       doctest::Contains("128"), InputError);
  CHECK_THROWS_WITH_AS(parse_with("[gpu.attention_head_dim_s]\nsource = \"x\"\n128 = { fwd_s = -1e-3, bwd_s = 1e-3 }\n"),
                       doctest::Contains("fwd_s"), InputError);
}

TEST_CASE("[coefficients.measured]: written, read back, applied over the reference on loading, and bad input named") {
  namespace fs = std::filesystem;
  const HardwareProfile h200 = hardware("h200-sxm");
  const HardwareProfile a40 = hardware("a40");
  MeasuredComponents m;
  m.reference = "h200-sxm";
  m.source = "by hand";
  m.runs = {"micro.jsonl"};
  m.rel = {{kCpuCoreBytesPerSPerLane, 0.25}, {kPcieEffFrac, 0.5}};
  const std::string a40_text = read_text_file(a40.path);
  // Written twice, held once: the second replaces the first.
  MeasuredComponents m2 = m;
  m2.rel[kCpuCoreBytesPerSPerLane] = 0.2;
  const std::string text = with_measured_components(with_measured_components(a40_text, m), m2);
  CHECK(text.find("[coefficients.measured]") == text.rfind("[coefficients.measured]"));
  // Rewriting the same section leaves the text as it was, blank lines included.
  CHECK(with_measured_components(text, m2) == text);
  const fs::path dir = fs::temp_directory_path() / "stepcast_measured_test";
  fs::create_directories(dir);
  const fs::path file = dir / "a40-here.toml";
  std::ofstream(file) << text;
  // A profile file outside the data folder takes its engines_from and reference from the data folder.
  const HardwareProfile here = resolve_hardware(file.string(), test::data_dir());
  CHECK(here.measured.rel.size() == 2);
  CHECK(here.measured.runs == std::vector<std::string>{"micro.jsonl"});
  // By hand: 0.2 x the reference's fitted per-lane rate, in [coefficients] and in the DeepSpeed
  // section transferred from the reference; 0.5 x its PCIe share; the rest as the datasheet profile.
  CHECK(here.coefs[kCpuCoreBytesPerSPerLane] == doctest::Approx(0.2 * h200.coefs[kCpuCoreBytesPerSPerLane]).epsilon(1e-9));
  CHECK(here.coefs[kPcieEffFrac] == doctest::Approx(0.5 * h200.coefs[kPcieEffFrac]).epsilon(1e-9));
  CHECK(here.engines.at("deepspeed").values.at(kCpuCoreBytesPerSPerLane) ==
        doctest::Approx(0.2 * h200.engines.at("deepspeed").values.at(kCpuCoreBytesPerSPerLane)).epsilon(1e-9));
  CHECK(here.engines.at("fsdp2").values.at(kPcieEffFrac) ==
        doctest::Approx(0.5 * h200.engines.at("fsdp2").values.at(kPcieEffFrac)).epsilon(1e-9));
  CHECK(here.coefs[kGemmEffMaxFrac] == a40.coefs[kGemmEffMaxFrac]);
  // A plan with the optimizer on the CPU takes longer where the host's rate is a fifth.
  TrainConfig c;
  c.zero_stage = 2;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.micro_batch = 1;
  c.seq_len = 2048;
  const auto opt_s = [&](const HardwareProfile& hw) {
    return predict_step_time(make_features(model("llama-2-7b"), hw, c).step, hw.coefs.data()).optimizer_total_s;
  };
  CHECK(opt_s(here) > 2.0 * opt_s(a40));

  // Bad input: one line naming the file, the key and the value.
  const auto load_with = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    t.replace(t.find(from), from.size(), to);
    std::ofstream(file) << t;
    return resolve_hardware(file.string(), test::data_dir());
  };
  CHECK_THROWS_WITH_AS(load_with("pcie_eff_frac = 0.5", "pcie_speed = 0.5"),
                       doctest::Contains("key 'coefficients.measured.rel.pcie_speed' is not a cost-model coefficient"),
                       InputError);
  CHECK_THROWS_WITH_AS(load_with("pcie_eff_frac = 0.5", "pcie_eff_frac = 0"),
                       doctest::Contains("coefficients.measured.rel.pcie_eff_frac"), InputError);
  CHECK_THROWS_WITH_AS(load_with("reference = \"h200-sxm\"", "reference = \"l40s\""),
                       doctest::Contains("key 'coefficients.measured.reference' = \"l40s\" is neither this profile"),
                       InputError);
  CHECK_THROWS_WITH_AS(load_with("source = \"by hand\"\n", ""), doctest::Contains("coefficients.measured.source"),
                       InputError);
  fs::remove_all(dir);
}

TEST_CASE("DeepSpeed with unpinned offload buffers: its gradient copies are staged and serial (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  HardwareProfile hw = hardware("h200-sxm");
  hw.host.pageable_bytes_per_s = 10e9;
  const double P = static_cast<double>(m.total_params()) / 2.0;  // partition of one of 2 ranks
  // ZeRO-2, GAS 4 (stage_1_and_2.py with "pin_memory": false): the host sums and the fp32
  // gradient are pageable, so what the pinned plan overlaps, (3 x 2 + 2 x 2) / 3 B per
  // non-boundary micro-batch and 6 B at the boundary, goes through the staging path; the fp32
  // weights stay pinned, so their 4 B copy up is unchanged.
  TrainConfig c = offload(Engine::kDeepSpeed, 2, 4);
  c.offload_pinned = false;
  const StepFeatures f = make_features(m, hw, c).step;
  CHECK(test::close(f.pageable_bytes_micro, P * (3 * 2.0 + 2 * 2.0) / 3.0, 1e-12));
  CHECK(test::close(f.pageable_bytes_boundary, P * 6.0, 1e-12));
  CHECK(f.grad_host_bytes_micro == 0.0);
  CHECK(f.d2h_bytes_boundary == 0.0);
  CHECK(test::close(f.h2d_bytes_step, P * 4.0, 1e-12));
  CHECK(f.pageable_bytes_per_s == 10e9);
  // Stage 1 copies at the boundary only: the zero host buffer up (2 B) and the fp32 sum down (4 B).
  TrainConfig s1 = offload(Engine::kDeepSpeed, 1, 4);
  s1.offload_pinned = false;
  const StepFeatures f1 = make_features(m, hw, s1).step;
  CHECK(f1.pageable_bytes_micro == 0.0);
  CHECK(test::close(f1.pageable_bytes_boundary, P * 6.0, 1e-12));
  // Stage 3, bf16: the 16-bit buffer down and up every micro-batch (2 x 2 B); the boundary's
  // 16-bit round trip is pageable too, its fp32 copy still staged through torch's temporary.
  TrainConfig s3 = offload(Engine::kDeepSpeed, 3, 4);
  s3.offload_pinned = false;
  const StepFeatures f3 = make_features(m, hw, s3).step;
  CHECK(test::close(f3.pageable_bytes_micro, P * 4.0, 1e-12));
  CHECK(test::close(f3.pageable_bytes_boundary, P * 4.0, 1e-12));
  CHECK(test::close(f3.staged_d2h_bytes_boundary, P * 2.0, 1e-12));

  // Time: the pageable seconds add to the micro-batches they belong to. Against the pinned plan
  // the step gains them and loses at most what its overlapped copies exposed.
  const auto coefs = for_engine(hw, "deepspeed").coefs;
  const StepTime<double> un = predict_step_time(f, coefs.data());
  const StepTime<double> pin = predict_step_time(make_features(m, hw, offload(Engine::kDeepSpeed, 2, 4)).step, coefs.data());
  const double pageable_s = (3.0 * P * 10.0 / 3.0 + P * 6.0) / 10e9;  // 16 P bytes at 10 GB/s
  CHECK(un.step_s <= pin.step_s + pageable_s + 1e-9);
  CHECK(un.step_s >= pin.step_s + pageable_s - pin.offload_transfer_s - 1e-9);
  CHECK(un.offload_transfer_total_s >= pageable_s);

  // Host memory: unpinned gradient buffers are not rounded to powers of two: 4 B of fp32
  // gradient per parameter of the partition (13 476 831 232 B, not 2^34) plus, at GAS 4, the
  // 16-bit sums (2 B a parameter, halved over the ranks).
  const MemoryFeatures mem = make_features(m, hw, c).memory;
  CHECK(mem.host_grads_bytes == doctest::Approx(4.0 * P + 2.0 * P).epsilon(1e-12));
  CHECK(mem.host_pinned_buffers_bytes == 17179869184.0);  // the fp32 weights, pinned whatever the setting
}

TEST_CASE("FSDP2's CPU offload reducing every micro-batch: blocking copies and host sums after the first (hand count)") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params()) / 2.0;  // shard of one of 2 ranks
  // GAS 4, reducing each micro-batch (torch's foreach_reduce with CPUOffloadPolicy): micro-batch
  // 1 copies its fp32 shard (4 B) into pinned memory without blocking; 2, 3 and the last copy it
  // blocking into a new pageable tensor and sum on the host (read 4 + 4, write 4 B). Of the three
  // micro-batches before the last: 4/3 B pinned, 8/3 B blocking and 24/3 B summed on average.
  TrainConfig c = offload(Engine::kFsdp2, 3, 4);
  c.grad_sync_each_micro = true;
  const StepFeatures f = make_features(m, hw, c).step;
  CHECK(test::close(f.grad_host_bytes_micro, P * 4.0 / 3.0, 1e-12));
  CHECK(test::close(f.staged_d2h_bytes_micro + f.pageable_bytes_micro, P * 8.0 / 3.0, 1e-12));
  CHECK(test::close(f.host_accum_bytes_micro, P * 24.0 / 3.0, 1e-12));
  CHECK(f.d2h_bytes_boundary == 0.0);
  CHECK(test::close(f.staged_d2h_bytes_boundary + f.pageable_bytes_boundary, P * 4.0, 1e-12));
  CHECK(test::close(f.host_accum_bytes_boundary, P * 12.0, 1e-12));
  // Every llama-2-7b weight's fp32 half is 32 MiB or more (q, k, v and o: 4096 x 4096 / 2 x 4 B =
  // 32 MiB exactly), so only its norms (2 x 4096 a layer and the final 4096) copy into reused heap
  // pages, at the pageable rate.
  const double norms = 32.0 * 2.0 * 4096.0 + 4096.0;
  CHECK(test::close(f.pageable_bytes_micro, norms / 2.0 * 8.0 / 3.0, 1e-9));
  CHECK(test::close(f.pageable_bytes_boundary, norms / 2.0 * 4.0, 1e-9));
  // Reducing once, on the last micro-batch, or with GAS 1: the one copy is pinned and overlapped.
  TrainConfig last = offload(Engine::kFsdp2, 3, 4);
  TrainConfig one = offload(Engine::kFsdp2, 3, 1);
  one.grad_sync_each_micro = true;
  for (const TrainConfig& t : {last, one}) {
    const StepFeatures g = make_features(m, hw, t).step;
    CHECK(g.staged_d2h_bytes_micro + g.staged_d2h_bytes_boundary + g.host_accum_bytes_micro +
              g.host_accum_bytes_boundary ==
          0.0);
    CHECK(test::close(g.d2h_bytes_boundary, P * 4.0, 1e-12));
  }
  // Time: the three blocking copies, 12 P B at the staged-copy rate, and the three sums, 36 P B
  // over the host's streaming rate, add to the step; the first copy hides behind the backward.
  const auto coefs = for_engine(hw, "fsdp2").coefs;
  const double* k = coefs.data();
  StepFeatures no_sums = f;
  no_sums.staged_d2h_bytes_micro = no_sums.staged_d2h_bytes_boundary = 0.0;
  no_sums.pageable_bytes_micro = no_sums.pageable_bytes_boundary = 0.0;
  no_sums.host_accum_bytes_micro = no_sums.host_accum_bytes_boundary = 0.0;
  const double stream_bps = host_stream_bytes_per_s(f.dram_bytes_per_s, f.cpu_cores_node,
                                                    k[kHostCopyBytesPerSPerThread], k);
  const double reused = 3.0 * norms / 2.0 * 4.0;  // the norms' bytes of the three blocking copies
  const double serial_s = (12.0 * P - reused) / k[kStagedCopyBytesPerS] + reused / hw.host.pageable_bytes_per_s +
                          36.0 * P * f.ranks_per_node / stream_bps;
  CHECK(predict_step_time(f, k).step_s ==
        doctest::Approx(predict_step_time(no_sums, k).step_s + serial_s).epsilon(1e-9));
}

TEST_CASE("FSDP2's blocking copies: shards below glibc's 32 MiB mmap threshold reuse heap pages (hand count)") {
  // pythia-2.8b on one GPU, GAS 3, reducing each micro-batch. Its fp32 tensors as Hugging Face
  // holds them: query_key_value 7680 x 2560 (78.6 MB), dense_h_to_4h and dense_4h_to_h
  // 10240 x 2560 (104.9 MB), embed_in and embed_out 50304 x 2560 (515 MB) at or above 32 MiB;
  // the attention's dense 2560 x 2560 (26.2 MB), the biases and the layer norms below it:
  // 2 775 208 960 - 32 x (19 660 800 + 2 x 26 214 400) - 2 x 128 778 240 = 210 785 280 elements.
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h100-sxm");
  REQUIRE(m.total_params() == 2775208960);
  TrainConfig c = offload(Engine::kFsdp2, 3, 3);
  c.gpus_per_node = 1;
  c.grad_sync_each_micro = true;
  const StepFeatures f = make_features(m, hw, c).step;
  const double P = 2775208960.0, small = 210785280.0;
  // One summing micro-batch of the two before the last (half on average), and the last.
  CHECK(test::close(f.pageable_bytes_micro, small * 4.0 / 2.0, 1e-12));
  CHECK(test::close(f.staged_d2h_bytes_micro, (P - small) * 4.0 / 2.0, 1e-12));
  CHECK(test::close(f.pageable_bytes_boundary, small * 4.0, 1e-12));
  CHECK(test::close(f.staged_d2h_bytes_boundary, (P - small) * 4.0, 1e-12));
  CHECK(f.pageable_bytes_per_s == hw.host.pageable_bytes_per_s);
  // Without the profile's pageable rate every blocking copy is timed as fresh pages.
  HardwareProfile no_rate = hw;
  no_rate.host.pageable_bytes_per_s = 0.0;
  const StepFeatures g = make_features(m, no_rate, c).step;
  CHECK(g.pageable_bytes_micro + g.pageable_bytes_boundary == 0.0);
  CHECK(test::close(g.staged_d2h_bytes_boundary, P * 4.0, 1e-12));
}

TEST_CASE("unpinned offload buffers: DeepSpeed's setting only, timed only where the profile gives the rate") {
  const ModelSpec m = model("llama-2-7b");
  HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = offload(Engine::kFsdp2, 3, 2);
  c.offload_pinned = false;
  CHECK_THROWS_WITH_AS(validate_config(c), doctest::Contains("--offload-pin-memory"), InputError);
  TrainConfig none = offload(Engine::kDeepSpeed, 2, 2);
  none.offload_optimizer = OffloadDevice::kNone;
  none.offload_pinned = false;
  CHECK_THROWS_WITH_AS(validate_config(none), doctest::Contains("DeepSpeed's setting"), InputError);
  TrainConfig ds = offload(Engine::kDeepSpeed, 2, 2);
  ds.offload_pinned = false;
  CHECK_NOTHROW(validate_config(ds));
  hw.host.pageable_bytes_per_s = 0.0;
  CHECK_THROWS_WITH_AS(make_features(m, hw, ds), doctest::Contains("host.pageable_bytes_per_s"), InputError);
  // The key: written only when unpinned, and part of the configuration key.
  const nlohmann::json j = train_config_to_json(ds);
  CHECK(j.at("offload_pin_memory") == false);
  CHECK(train_config_from_json(j, "plan").offload_pinned == false);
  CHECK_FALSE(train_config_to_json(offload(Engine::kDeepSpeed, 2, 2)).contains("offload_pin_memory"));
  CHECK(config_key("m", ds) != config_key("m", offload(Engine::kDeepSpeed, 2, 2)));
  CHECK(config_key("m", ds).find(" pin=off") != std::string::npos);
}

TEST_CASE("a user's DeepSpeed JSON: what each key fixes, and DeepSpeed's defaults where it is silent") {
  // The founding report's shape (written here, not copied): fp16 "auto", AdamW, ZeRO-3 with the
  // optimizer on the CPU and no pin_memory, batch sizes "auto".
  const nlohmann::json founding = nlohmann::json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "offload_optimizer": {"device": "cpu"}},
    "gradient_accumulation_steps": "auto", "train_micro_batch_size_per_gpu": "auto"})");
  const DeepSpeedJob job = parse_deepspeed_job(founding, "ds.json");
  CHECK(job.stage == 3);
  CHECK(job.offload_optimizer == OffloadDevice::kCpu);
  CHECK_FALSE(job.offload_params.has_value());
  CHECK(job.offload_pinned == false);  // offload_config.py: pin_memory defaults to false
  CHECK_FALSE(job.micro_batch.has_value());
  CHECK_FALSE(job.gas.has_value());
  CHECK_FALSE(job.precision.has_value());  // "auto": the flag says
  // Explicit values, the deprecated switch, pinning on.
  const DeepSpeedJob full = parse_deepspeed_job(nlohmann::json::parse(R"({
    "bf16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "train_batch_size": 16,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})"),
                                                "ds.json");
  CHECK(full.precision == Precision::kBf16);
  CHECK(full.micro_batch == 4);
  CHECK(full.gas == 2);
  CHECK(full.train_batch == 16);
  CHECK(full.offload_pinned == true);
  const DeepSpeedJob legacy = parse_deepspeed_job(
      nlohmann::json::parse(R"({"zero_optimization": {"stage": 2, "cpu_offload": true}})"), "ds.json");
  CHECK(legacy.offload_optimizer == OffloadDevice::kCpu);
  CHECK(legacy.offload_pinned == false);
  CHECK(parse_deepspeed_job(nlohmann::json::parse(R"({"bf16": {"enabled": false}, "fp16": {"enabled": false}})"),
                            "ds.json").precision == Precision::kFp32);
  // What DeepSpeed rejects or the model does not cover: one line naming the file, key and value.
  const auto fails = [](const char* text, const char* what) {
    CHECK_THROWS_WITH_AS(parse_deepspeed_job(nlohmann::json::parse(text), "ds.json"), doctest::Contains(what), InputError);
  };
  fails(R"({"zero_optimization": {"stage": 4}})", "ds.json: key 'zero_optimization.stage' = 4 is not valid");
  fails(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
        "key 'zero_optimization.offload_param.device' = \"nvme\" is not modelled");
  fails(R"({"optimizer": {"type": "Lamb"}})", "key 'optimizer.type' = \"Lamb\" is not modelled");
  fails(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})", "both true");
  fails(R"({"train_micro_batch_size_per_gpu": 2.5})", "key 'train_micro_batch_size_per_gpu' = 2.5 is not valid");
  fails(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": "yes"}}})",
        "key 'zero_optimization.offload_optimizer.pin_memory' = \"yes\" is not valid");
  fails(R"([1, 2])", "not a DeepSpeed config");
}
