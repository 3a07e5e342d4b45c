// The step-time model against hand derivations, the nccl-tests measurements
// of docs/h200_measurements.md, and properties.
#include <doctest/doctest.h>

#include "model/prediction.h"
#include "model/train_config_json.h"
#include "test_util.h"

using namespace stepcast;
using stepcast::test::hardware;
using stepcast::test::model;

namespace {

TrainConfig config(int stage, int gpus, int64_t micro = 1, int64_t gas = 1) {
  TrainConfig c;
  c.zero_stage = stage;
  c.gpus_per_node = gpus;
  c.micro_batch = micro;
  c.gas = gas;
  c.seq_len = 2048;
  return c;
}

// Coefficients that make compute exactly FLOPs / peak: every efficiency 1,
// no shape penalty, no overheads.
CoefVector ideal_coefs() {
  CoefVector c = default_coefs();
  c[kGemmEffMaxFrac] = 1.0;
  c[kGemmHalfDim] = 0.0;
  c[kAttnEffMaxFrac] = 1.0;
  c[kAttnHalfSeqTokens] = 0.0;
  c[kBackwardSlowdownMult] = 1.0;
  c[kAttnBwdEffMaxFrac] = 1.0;
  c[kAttnBwdHalfSeqTokens] = 0.0;
  c[kElementwiseTrafficMult] = 0.0;
  c[kLayerOverheadS] = 0.0;
  c[kHostLayerFwdS] = 0.0;
  c[kHostLayerBwdS] = 0.0;
  c[kOptStepOverheadS] = 0.0;
  c[kCpuOptStepOverheadS] = 0.0;
  c[kGpuOptFlopsPerS] = 1e15;  // the GPU optimizer is bound by its memory traffic
  return c;
}

double gemm_flops_fwd(const StepFeatures& f) {
  double total = 0;
  for (const auto& g : f.gemms) total += 2.0 * g.m * g.n * g.k * g.count;
  return total;
}

}  // namespace

TEST_CASE("forward GEMM FLOPs are 2 x tokens x matrix parameters") {
  // Llama-2-7b matrix parameters: 32 x (4 x 4096^2 + 3 x 4096 x 11008)
  // = 32 x 202,375,168 = 6,476,005,376, plus the lm_head 32000 x 4096 =
  // 131,072,000. Embedding lookups and norms are not GEMMs.
  const ModelSpec m = model("llama-2-7b");
  Features f = make_features(m, hardware("h200-sxm"), config(0, 1, 2));
  const double tokens = 2 * 2048;
  CHECK(gemm_flops_fwd(f.step) == doctest::Approx(2.0 * tokens * (6'476'005'376.0 + 131'072'000.0)));
  // Causal attention (flash): QK^T and PV over the lower triangle,
  // 2 b s^2 d per layer = 2 x 2 x 2048^2 x 4096 x 32.
  CHECK(f.step.attn_fwd_flops == doctest::Approx(2.0 * 2 * 2048.0 * 2048.0 * 4096.0 * 32.0));
}

TEST_CASE("backward: weight-gradient GEMMs at weight_grad_gemm_mult, element-wise at backward_slowdown_mult") {
  // With every efficiency 1 the forward GEMMs take gemm_s = FLOPs / peak (the case below). The
  // data gradient takes gemm_s again, the weight gradient w x gemm_s, the element-wise backward
  // slowdown x 2 x the forward's element-wise time, the flash attention backward 2.5 x its
  // forward. The element-wise forward time is what the forward spends beyond GEMMs and attention.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  CoefVector c = ideal_coefs();
  c[kElementwiseTrafficMult] = 8.0;
  c[kBackwardSlowdownMult] = 0.7;
  c[kWeightGradGemmMult] = 1.5;
  const Features f = make_features(m, hw, config(0, 1));
  const StepTime<double> t = predict_step_time(f.step, c.data());
  const double gemm_s = 2.0 * 2048 * 6'607'077'376.0 / 989.4e12;
  const double attn_s = 2.0 * 2048.0 * 2048.0 * 4096.0 * 32.0 / 989.4e12;
  const double elementwise_s = t.forward_s - gemm_s - attn_s;
  CHECK(elementwise_s > 0.0);
  CHECK(t.backward_s == doctest::Approx((1.0 + 1.5) * gemm_s + 0.7 * 2.0 * elementwise_s + 2.5 * attn_s).epsilon(1e-9));
  // LoRA: the frozen weights get no weight gradient, so the multiplier changes nothing there.
  TrainConfig lora = config(0, 1);
  lora.peft = PeftKind::kLora;
  const StepFeatures fl = make_features(m, hw, lora).step;
  CoefVector c1 = c;
  c1[kWeightGradGemmMult] = 1.0;
  CHECK(predict_step_time(fl, c.data()).backward_s == doctest::Approx(predict_step_time(fl, c1.data()).backward_s).epsilon(1e-12));
  // Full fine-tuning: it adds (1.5 - 1) x gemm_s.
  CHECK(t.backward_s - predict_step_time(f.step, c1.data()).backward_s == doctest::Approx(0.5 * gemm_s).epsilon(1e-9));
}

TEST_CASE("MFU numerator: 6N + 6 L d s per token reproduces the FSDP reference's 43 %") {
  // docs/h200_measurements.md: FSDP2, llama-2-7b, 2 x H200, 20,100 tokens/s, 43 % MFU
  // against the 989.4 TFLOP/s dense bf16 peak.
  Features f = make_features(model("llama-2-7b"), hardware("h200-sxm"), config(3, 2, 4, 4));
  const double mfu = 20100.0 * f.step.model_flops_per_token / (2.0 * 989.4e12);
  CHECK(mfu == doctest::Approx(0.43).epsilon(0.01));
}

TEST_CASE("ideal coefficients: step time is FLOPs over peak, by hand") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const CoefVector c = ideal_coefs();
  Features f = make_features(m, hw, config(0, 1));
  StepTime<double> t = predict_step_time(f.step, c.data());
  // GEMMs: 2 x 2048 x 6,607,077,376 = 2.70626e13 FLOPs; attention (causal,
  // flash): 2 x 2048^2 x 4096 x 32 = 1.09951e12. At 989.4 TFLOP/s:
  const double gemm_s = 2.0 * 2048 * 6'607'077'376.0 / 989.4e12;
  const double attn_s = 2.0 * 2048.0 * 2048.0 * 4096.0 * 32.0 / 989.4e12;
  CHECK(t.forward_s == doctest::Approx(gemm_s + attn_s).epsilon(1e-9));
  // Backward: twice the GEMMs, 2.5x the attention (FlashAttention-2).
  CHECK(t.backward_s == doctest::Approx(2 * gemm_s + 2.5 * attn_s).epsilon(1e-9));
  // GPU AdamW: 28 bytes per parameter (read grad bf16 2 + master 4 + m 4 + v 4,
  // write master 4 + m 4 + v 4, bf16 copy 2) at 0.70 x 4.8 TB/s.
  CHECK(t.optimizer_s == doctest::Approx(6'738'415'616.0 * 28.0 / (0.70 * 4.8e12)).epsilon(1e-9));
  // One rank, GAS 1: no communication; the whole step is OPT time.
  CHECK(t.grad_comm_total_s == 0.0);
  CHECK(t.param_gather_total_s == 0.0);
  CHECK(t.gas_s == 0.0);
  CHECK(t.step_s == doctest::Approx(t.forward_s + t.backward_s + t.optimizer_s));
}

TEST_CASE("checkpointing recomputes the decoder layers, not the lm_head; the recompute is part of the backward's window") {
  const ModelSpec m = model("llama-2-7b");
  HardwareProfile hw = hardware("h200-sxm");
  const CoefVector ideal = ideal_coefs();
  TrainConfig c = config(0, 1);
  c.activation_checkpointing = true;
  const StepTime<double> t = predict_step_time(make_features(m, hw, c).step, ideal.data());
  // The head's product, 2 x 2048 x 32000 x 4096 FLOPs at 989.4 TFLOP/s, is the forward's only
  // part outside the layers (the embedding is a lookup).
  const double head_s = 2.0 * 2048.0 * 32000.0 * 4096.0 / 989.4e12;
  CHECK(t.recompute_s == doctest::Approx(t.forward_s - head_s).epsilon(1e-9));
  // The CPU updates of pipelined offload start with the first unit's gradients and run beside
  // the rest of the backward pass, recompute included: what cpu_opt_overlap_frac of that pass
  // does not hide is exposed. 1 x 2048 tokens with CPU AdamW is CPU-bound.
  hw.coefs = default_coefs();
  c.zero_stage = 2;
  c.offload_optimizer = OffloadDevice::kCpu;
  const Prediction p = evaluate(m, hw, c);
  const double window_s = hw.coefs[kCpuOptOverlapFrac] * (p.time.backward_s + p.time.recompute_s);
  REQUIRE(p.time.recompute_s > 0.0);
  REQUIRE(p.time.optimizer_total_s > window_s);
  CHECK(p.time.optimizer_s == doctest::Approx(p.time.optimizer_total_s - window_s).epsilon(1e-9));
}

TEST_CASE("transformers' GPT-J under a peer: QK^T and its gradients run in fp32 at the fp32 peak, by hand") {
  const ModelSpec m = model("gpt-j-6b");
  const HardwareProfile hw = hardware("h200-sxm");
  CoefVector c = ideal_coefs();
  c[kFp32GemmEffMaxFrac] = 1.0;
  TrainConfig cfg = config(2, 2, 1, 1);
  cfg.engine = Engine::kDeepSpeed;
  cfg.attention = AttentionKind::kMath;
  StepFeatures f = make_features(m, hw, cfg).step;
  CHECK(f.attn_fp32_flops_frac == 0.5);
  const StepTime<double> with_fp32 = predict_step_time(f, c.data());
  f.attn_fp32_flops_frac = 0.0;
  const StepTime<double> all_bf16 = predict_step_time(f, c.data());
  // Math attention: QK^T and PV are 2 x 2048^2 x 4096 FLOPs each per layer, 28 layers; QK^T's
  // half moves from 989.4 TFLOP/s (bf16 dense) to 66.9 (fp32), and the backward (twice the
  // forward's products) moves twice that.
  const double qk_flops = 2.0 * 2048.0 * 2048.0 * 4096.0 * 28.0;
  const double extra_s = qk_flops / 66.9e12 - qk_flops / 989.4e12;
  CHECK(with_fp32.forward_s - all_bf16.forward_s == doctest::Approx(extra_s).epsilon(1e-9));
  CHECK(with_fp32.backward_s - all_bf16.backward_s == doctest::Approx(2.0 * extra_s).epsilon(1e-9));
  // Our backend's fused attention and an fp32 run (fp32 throughout) have no such share.
  cfg.engine = Engine::kStepcast;
  CHECK(make_features(m, hw, cfg).step.attn_fp32_flops_frac == 0.0);
  cfg.engine = Engine::kDeepSpeed;
  cfg.precision = Precision::kFp32;
  CHECK(make_features(m, hw, cfg).step.attn_fp32_flops_frac == 0.0);
}

TEST_CASE("a pass takes at least the host time to issue it: the floor of launch-bound micro-batches") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  CoefVector c = ideal_coefs();
  c[kHostLayerFwdS] = 1e-3;
  c[kHostLayerBwdS] = 3e-3;
  // 128 tokens: the GEMMs take 2 x 128 x 6.6e9 / 989.4 TFLOP/s = 1.7 ms per pass, under the
  // 32 layers' 32 ms (forward) and 96 ms (backward) of issuing: the host sets both. The corner
  // (gpu^4 + host^4)^(1/4) lies above the host's time by (1.7 / 32)^4 / 4 = 2e-6 of it.
  TrainConfig small = config(0, 1);
  small.seq_len = 128;
  const StepTime<double> a = predict_step_time(make_features(m, hw, small).step, c.data());
  CHECK(a.forward_s == doctest::Approx(32 * 1e-3).epsilon(1e-5));
  CHECK(a.backward_s == doctest::Approx(32 * 3e-3).epsilon(1e-5));
  // Twice the tokens under the floor: the same time, to (3.4 / 32)^4 / 4 = 3e-5.
  small.seq_len = 256;
  const StepTime<double> b = predict_step_time(make_features(m, hw, small).step, c.data());
  CHECK(b.forward_s == doctest::Approx(a.forward_s).epsilon(1e-4));
  CHECK(b.backward_s == doctest::Approx(a.backward_s).epsilon(1e-4));
  // 8192 tokens (micro-batch 4): 110 ms of GEMMs per forward, over the floor, which then adds
  // only the corner: each pass is (gpu^4 + host^4)^(1/4), (32 / 110)^4 / 4 = 0.2 % above the
  // GPU's time forward.
  const TrainConfig big = config(0, 1, 4);
  const StepTime<double> with = predict_step_time(make_features(m, hw, big).step, c.data());
  const StepTime<double> without = predict_step_time(make_features(m, hw, big).step, ideal_coefs().data());
  const auto corner = [](double gpu_s, double host_s) { return std::pow(std::pow(gpu_s, 4) + std::pow(host_s, 4), 0.25); };
  CHECK(with.forward_s == doctest::Approx(corner(without.forward_s, 32 * 1e-3)).epsilon(1e-9));
  CHECK(with.backward_s == doctest::Approx(corner(without.backward_s, 32 * 3e-3)).epsilon(1e-9));
  CHECK(with.forward_s < 1.003 * without.forward_s);
  CHECK(with.forward_s > 32 * 1e-3);
}

TEST_CASE("our backend's gradient accumulation and one rank's stage-3 gathers, by hand") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double n_params = 6'738'415'616.0, wb = 2.0;
  // Stages 2-3, each micro-batch (backend/engine/engine.cpp): zero every unit's bf16 gradient
  // buffer (N x 2 B written), add the reduced shard into the accumulator (N/2 x 2 B read twice
  // and written once on each of 2 ranks).
  CHECK(make_features(m, hw, config(2, 2, 1, 4)).step.grad_accum_bytes_micro ==
        doctest::Approx(n_params * wb * (1.0 + 3.0 / 2.0)).epsilon(1e-12));
  // With CPU offload and GAS 1 the shard goes to the host without an accumulator.
  TrainConfig off = config(2, 2, 1, 1);
  off.offload_optimizer = OffloadDevice::kCpu;
  CHECK(make_features(m, hw, off).step.grad_accum_bytes_micro == doctest::Approx(n_params * wb).epsilon(1e-12));
  // Stages 0-1 accumulate in the autograd buffers themselves; the peers are modelled apart.
  CHECK(make_features(m, hw, config(1, 2, 1, 4)).step.grad_accum_bytes_micro == 0.0);
  TrainConfig ds = config(2, 2, 1, 4);
  ds.engine = Engine::kDeepSpeed;
  CHECK(make_features(m, hw, ds).step.grad_accum_bytes_micro == 0.0);
  // Stage 3 on one rank: each unit's shard is copied into its full buffer before its forward and
  // before its backward, N x 2 B read and written each time; on two ranks NCCL gathers instead.
  CHECK(make_features(m, hw, config(3, 1, 1, 4)).step.local_gather_bytes_micro ==
        doctest::Approx(4.0 * n_params * wb).epsilon(1e-12));
  CHECK(make_features(m, hw, config(3, 2, 1, 4)).step.local_gather_bytes_micro == 0.0);
  // Their time, at the GPU optimizer's share (0.70) of 4.8 TB/s, lands in the passes: on one
  // GPU, stage 2 adds the accumulation to the backward of stage 1.
  const CoefVector c = ideal_coefs();
  const StepTime<double> s1 = predict_step_time(make_features(m, hw, config(1, 1, 1, 4)).step, c.data());
  const StepTime<double> s2 = predict_step_time(make_features(m, hw, config(2, 1, 1, 4)).step, c.data());
  CHECK(s2.backward_s - s1.backward_s == doctest::Approx(4.0 * n_params * wb * 4.0 / (4.8e12 * 0.70)).epsilon(1e-9));
  CHECK(s2.forward_s == doctest::Approx(s1.forward_s).epsilon(1e-12));
}

TEST_CASE("FSDP2's copies on the compute stream, by hand") {
  // torch 2.11 fully_shard, llama-2-7b in bf16 (wb = 2 B), no adapter: every parameter is
  // trainable. Each all-gather copies its output into the unsharded parameters (read and write
  // 2 B a parameter); each reduction copies the bf16 gradients into the fp32 reduce-scatter input
  // (read 2, write 4). Neither depends on the number of ranks.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double n_params = 6'738'415'616.0;
  const auto fsdp2 = [](int stage, int gpus, int gas, bool sync_each) {
    TrainConfig c = config(stage, gpus, 2, gas);
    c.engine = Engine::kFsdp2;
    c.grad_sync_each_micro = sync_each;
    return c;
  };
  // Stage 3, reducing each micro-batch: one gather before the forward; one before the backward
  // and one reduction in it: 4 + 6 = 10 B a parameter.
  for (int gpus : {1, 2}) {
    const StepFeatures f = make_features(m, hw, fsdp2(3, gpus, 4, true)).step;
    CHECK(f.fsdp_copy_bytes_fwd_micro == doctest::Approx(4.0 * n_params).epsilon(1e-12));
    CHECK(f.fsdp_copy_bytes_bwd_micro == doctest::Approx(10.0 * n_params).epsilon(1e-12));
  }
  // Stage 2 keeps the gathered parameters to the backward: no second copy-out.
  CHECK(make_features(m, hw, fsdp2(2, 1, 4, true)).step.fsdp_copy_bytes_bwd_micro ==
        doctest::Approx(6.0 * n_params).epsilon(1e-12));
  // Without sync, over GAS 4: the first micro-batch's gradients cast to fp32 (read 2, write 4),
  // three added into that sum (read 4 + 2, write 4 each), the sum reduced once (read and write
  // 4): (6 + 3 x 10 + 8) / 4 = 11 B a parameter a micro-batch.
  CHECK(make_features(m, hw, fsdp2(2, 1, 4, false)).step.fsdp_copy_bytes_bwd_micro ==
        doctest::Approx(11.0 * n_params).epsilon(1e-12));
  // Our backend and DeepSpeed have none of it.
  TrainConfig ds = config(3, 1, 2, 4);
  ds.engine = Engine::kDeepSpeed;
  CHECK(make_features(m, hw, ds).step.fsdp_copy_bytes_bwd_micro == 0.0);
  CHECK(make_features(m, hw, config(3, 1, 2, 4)).step.fsdp_copy_bytes_fwd_micro == 0.0);
  // Their time lands in the passes at the GPU optimizer's share (0.70) of 4.8 TB/s: stage 3,
  // reducing each micro-batch, against the same features without the copies, over the step's
  // 4 micro-batches.
  const CoefVector c = ideal_coefs();
  const StepFeatures with = make_features(m, hw, fsdp2(3, 1, 4, true)).step;
  StepFeatures without = with;
  without.fsdp_copy_bytes_fwd_micro = without.fsdp_copy_bytes_bwd_micro = 0.0;
  const StepTime<double> a = predict_step_time(with, c.data()), b = predict_step_time(without, c.data());
  CHECK(a.forward_s - b.forward_s == doctest::Approx(4 * 4.0 * n_params / (4.8e12 * 0.70)).epsilon(1e-6));
  CHECK(a.backward_s - b.backward_s == doctest::Approx(4 * 10.0 * n_params / (4.8e12 * 0.70)).epsilon(1e-6));
}

TEST_CASE("collectives: all-reduce bus bandwidth matches nccl-tests on 2 x H200 (NV18)") {
  // docs/h200_measurements.md: busbw measured with nccl-tests: 246 GB/s at 64 MB, 325 at 1 GiB
  // (all-reduce); 258 / 263 at 1 GiB (reduce-scatter / all-gather). At 4 MB it lists
  // 71 GB/s, but Stepcast's own all-reduce of 4 MiB took 34.3 us on the calibration
  // host (data/runs/h200-sxm/2026-11-30_calibration_v2_micro.jsonl): 4194304 / 34.3e-6
  // = 122 GB/s, which the calibrated latency follows.
  const HardwareProfile hw = hardware("h200-sxm");
  StepFeatures f;
  f.link_bytes_per_s = hw.links.intra_node_bytes_per_s;
  const double n = 2, ar_factor = 2 * (n - 1) / n, rs_factor = (n - 1) / n;
  struct Point {
    double bytes, busbw;
  };
  for (Point p : {Point{4194304.0, 122e9}, Point{64 * 1048576.0, 246e9}, Point{1073741824.0, 325e9}}) {
    CAPTURE(p.bytes);
    const double t = detail::collective_time_s(p.bytes, 1.0, ar_factor, true, f, hw.coefs.data());
    CHECK(p.bytes * ar_factor / t == doctest::Approx(p.busbw).epsilon(0.15));
  }
  const double t_rs = detail::collective_time_s(1073741824.0, 1.0, rs_factor, false, f, hw.coefs.data());
  CHECK(1073741824.0 * rs_factor / t_rs == doctest::Approx(260e9).epsilon(0.15));
}

TEST_CASE("properties over the configuration space") {
  const HardwareProfile hw = hardware("h200-sxm");
  for (const char* name : {"gpt-j-6b", "llama-2-7b", "qwen2.5-7b"}) {
    const ModelSpec m = model(name);
    for (int stage = 0; stage <= 3; ++stage) {
      for (int gpus : {1, 2, 4}) {
        CAPTURE(name);
        CAPTURE(stage);
        CAPTURE(gpus);
        // One rank: no collective. What the backend still times in those phases is its host work
        // per unit (layers, embedding, head) and micro-batch: the gradient's reduce bookkeeping
        // from stage 2, the gather and release at stage 3 (model/step_features.cpp).
        if (gpus == 1) {
          const Prediction p = evaluate(m, hw, config(stage, 1, 2, 4));
          const double units = static_cast<double>(m.num_layers) + 2.0, gas = 4.0;
          CHECK(p.time.grad_comm_total_s ==
                doctest::Approx(stage >= 2 ? gas * units * hw.coefs[kGradHookOverheadS] : 0.0).epsilon(1e-9));
          CHECK(p.time.param_gather_total_s ==
                doctest::Approx(stage == 3 ? gas * 2.0 * units * hw.coefs[kParamFetchOverheadS] : 0.0).epsilon(1e-9));
        }
        // GAS amortises per-step costs: tokens/s never falls as GAS grows; step time grows.
        double last_tps = 0, last_step = 0;
        for (int64_t gas : {1, 2, 4, 8, 16}) {
          TrainConfig c = config(stage, gpus, 2, gas);
          if (stage > 0) c.offload_optimizer = OffloadDevice::kCpu;
          const Prediction p = evaluate(m, hw, c);
          CHECK(p.throughput.tokens_per_s >= last_tps * (1 - 1e-12));
          CHECK(p.time.step_s > last_step);
          // The founding report's columns: step = GAS + OPT; rank samples/s = micro x GAS / step.
          CHECK(p.time.step_s == doctest::Approx(p.time.gas_s + p.time.opt_s));
          CHECK(p.throughput.rank_samples_per_s == doctest::Approx(2.0 * gas / p.time.step_s));
          CHECK(p.throughput.world_samples_per_s == doctest::Approx(gpus * p.throughput.rank_samples_per_s));
          // Exposed time never exceeds the total.
          CHECK(p.time.grad_comm_s <= p.time.grad_comm_total_s + 1e-15);
          CHECK(p.time.param_gather_s <= p.time.param_gather_total_s + 1e-15);
          CHECK(p.time.offload_transfer_s <= p.time.offload_transfer_total_s + 1e-15);
          last_tps = p.throughput.tokens_per_s;
          last_step = p.time.step_s;
        }
        // Checkpointing adds one forward of the layers (less than the whole forward, which
        // has the head's product too) and lowers MFU (recompute is not model FLOPs).
        TrainConfig c = config(stage, gpus, 2, 2);
        const Prediction a = evaluate(m, hw, c);
        c.activation_checkpointing = true;
        const Prediction b = evaluate(m, hw, c);
        CHECK(b.time.recompute_s < a.time.forward_s);
        CHECK(b.time.recompute_s > 0.9 * a.time.forward_s);
        CHECK(b.throughput.mfu < a.throughput.mfu);
      }
    }
  }
}

TEST_CASE("GAS time is (GAS - 1) non-boundary micro-batches") {
  // Stage 0, one GPU: every micro-batch is forward + backward; the last adds
  // the optimizer step.
  const Prediction p = evaluate(model("gpt-j-6b"), hardware("h200-sxm"), config(0, 1, 2, 5));
  const double micro = (p.time.forward_s + p.time.backward_s) / 5.0;
  CHECK(p.time.gas_s == doctest::Approx(4.0 * micro));
  CHECK(p.time.opt_s == doctest::Approx(micro + p.time.optimizer_s));
}

TEST_CASE("CPU AdamW: memory-bound on the shared host, by hand") {
  // Llama-2-7b, stage 2 + CPU offload on one H200 host slice: 16 cores x 16
  // lanes x 1.7 GB/s = 435.2 GB/s of core streaming and 0.94 x 160 = 150.4 GB/s
  // of DRAM combine harmonically to 1 / (1/435.2 + 1/150.4) = 111.8 GB/s (the
  // ~112 GB/s torch's fused CPU AdamW reaches on 16 threads there). Traffic:
  // bf16 grad 2 + master 4+4 + m 4+4 + v 4+4 + bf16 copy 2 = 28 B/param.
  // 6,738,415,616 x 28 / 111.8e9 = 1.688 s; the arithmetic, 15 FLOP/param on
  // 16 cores x 16 lanes x 2 GFLOP/s, takes 0.197 s and the smooth roofline
  // (m^4 + a^4)^(1/4) adds 0.005 %; plus the 1 ms CPU step overhead.
  // (Default coefficients, not the calibrated ones.)
  const ModelSpec m = model("llama-2-7b");
  HardwareProfile hw = hardware("h200-sxm");
  hw.coefs = default_coefs();
  TrainConfig c = config(2, 1);
  c.offload_optimizer = OffloadDevice::kCpu;
  const Prediction p = evaluate(m, hw, c);
  const double bw = 1.0 / (1.0 / (16.0 * 16.0 * 1.7e9) + 1.0 / (0.94 * 160e9));
  CHECK(bw == doctest::Approx(111.8e9).epsilon(1e-3));
  const double mem_s = 6'738'415'616.0 * 28.0 / bw, arith_s = 6'738'415'616.0 * 15.0 / (16.0 * 16.0 * 2e9);
  CHECK(p.time.optimizer_total_s == doctest::Approx(std::pow(std::pow(mem_s, 4) + std::pow(arith_s, 4), 0.25) + 1e-3).epsilon(1e-9));
  CHECK(p.time.optimizer_total_s == doctest::Approx(mem_s + 1e-3).epsilon(1e-4));
  // The pipeline hides it behind 0.8 of the last micro-batch's backward (GAS 1: all of it).
  CHECK(p.time.optimizer_s == doctest::Approx(std::max(0.0, p.time.optimizer_total_s - 0.8 * p.time.backward_s)).epsilon(1e-9));
  // Two ranks on a two-GPU host share its DRAM: each updates half the
  // parameters, but both stream at once over 2 x 16 cores and the same DRAM:
  // 1 / (1/870.4 + 1/150.4) = 128.2 GB/s for all 6.74 B parameters.
  c.gpus_per_node = 2;
  const Prediction q = evaluate(m, hw, c);
  const double bw2 = 1.0 / (1.0 / (32.0 * 16.0 * 1.7e9) + 1.0 / (0.94 * 160e9));
  CHECK(q.time.optimizer_total_s == doctest::Approx(6'738'415'616.0 * 28.0 / bw2 + 1e-3).epsilon(1e-4));
  // Uploading the updated bf16 shard: 2 B x Psi / 2 over 0.95 x 55 GB/s.
  CHECK(q.time.offload_transfer_total_s >= 6'738'415'616.0 / 2 * 2 / (0.95 * 55e9));
  // 8-bit states move 2 + 8 + 2 x 2 + 2 = 16 B (+ absmax) instead of 28: faster when memory-bound.
  c.optimizer = OptimizerKind::kAdamW8bit;
  const Prediction r = evaluate(m, hw, c);
  CHECK(r.time.optimizer_total_s < q.time.optimizer_total_s);
}

TEST_CASE("offload slows the step on fast GPUs, and GAS amortises it") {
  // The founding report: raising GAS raises throughput under offload because
  // the per-step optimizer and copies are shared by more samples.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  double ratio_gas1 = 0, ratio_gas16 = 0;
  for (int64_t gas : {1, 16}) {
    TrainConfig c = config(2, 2, 4, gas);
    const Prediction gpu = evaluate(m, hw, c);
    c.offload_optimizer = OffloadDevice::kCpu;
    const Prediction cpu = evaluate(m, hw, c);
    CHECK(cpu.time.step_s > gpu.time.step_s);
    (gas == 1 ? ratio_gas1 : ratio_gas16) = cpu.throughput.tokens_per_s / gpu.throughput.tokens_per_s;
  }
  CHECK(ratio_gas1 < 0.7);
  CHECK(ratio_gas16 > ratio_gas1 + 0.1);
}

TEST_CASE("a ring across nodes runs at the slower of NVLink and the node's NICs shared by its GPUs") {
  const ModelSpec m = model("llama-2-13b");
  for (const std::string name : {"h100-sxm", "a100-80gb-sxm"}) {
    CAPTURE(name);
    const HardwareProfile hw = hardware(name);
    TrainConfig one = config(2, 8, 2, 1);
    TrainConfig two = one;
    two.nodes = 2;
    const StepFeatures f1 = make_features(m, hw, one).step;
    const StepFeatures f2 = make_features(m, hw, two).step;
    CHECK(f1.link_bytes_per_s == hw.links.intra_node_bytes_per_s);
    // h100-sxm: 8 x 50 GB/s of NICs = 400 GB/s against 450 GB/s of NVLink; a100-80gb-sxm:
    // 8 x 25 = 200 against 300. Both are NIC-bound, by the node's eight NICs together.
    const double expected = name == "h100-sxm" ? 400e9 : 200e9;
    CHECK(f2.link_bytes_per_s == doctest::Approx(expected));
    CHECK(f2.link_is_inter_node == 1.0);
    // One GPU per node: its own NIC.
    TrainConfig single = config(2, 1, 2, 1);
    single.nodes = 4;
    CHECK(make_features(m, hw, single).step.link_bytes_per_s == doctest::Approx(hw.links.inter_node_bytes_per_s));
    // Reduce-scatter time: bus factor 15/16 against 7/8, the inter-node efficiency against the
    // NVLink one, at the slower link: more time across nodes, but not the NIC's 9x.
    const Prediction a = evaluate(m, hw, one);
    const Prediction b = evaluate(m, hw, two);
    CHECK(b.time.grad_comm_total_s > a.time.grad_comm_total_s);
    CHECK(b.time.grad_comm_total_s < 3.0 * a.time.grad_comm_total_s);
  }
}

TEST_CASE("pipelined CPU offload: the uploads run during the backward; before 2026-12-04 they followed it") {
  // Llama-2-7b in fp32 at stage 2 on one GPU, default coefficients: the updated fp32 parameters
  // go up, 4 B x 6,738,415,616 over 0.95 x 55 GB/s = 0.5159 s, in 34 units (embedding, 32
  // layers, head).
  const ModelSpec m = model("llama-2-7b");
  HardwareProfile hw = hardware("h200-sxm");
  hw.coefs = default_coefs();
  TrainConfig c = config(2, 1, 16, 1);
  c.precision = Precision::kFp32;
  c.offload_optimizer = OffloadDevice::kCpu;
  const double upload_s = 4.0 * 6'738'415'616.0 / (0.95 * 55e9);
  CHECK(upload_s == doctest::Approx(0.5159).epsilon(1e-3));
  CHECK(make_features(m, hw, c).step.opt_pipeline_units == 34.0);
  // GPU-bound (16 x 2048 tokens): 0.8 of the backward hides the CPU updates and the uploads;
  // the last unit's upload is exposed.
  const Prediction now = evaluate(m, hw, c);
  CHECK(now.time.optimizer_s == 0.0);
  CHECK(now.time.tail_s == doctest::Approx(upload_s / 34.0).epsilon(1e-9));
  // A record from before: the backend issued the uploads once the backward had been issued
  // (ZeroEngine::optimizer_phase), so the whole upload stream followed it.
  c.offload_uploads_in_backward = false;
  const Prediction before = evaluate(m, hw, c);
  CHECK(before.time.optimizer_s == 0.0);
  CHECK(before.time.tail_s == doctest::Approx(upload_s).epsilon(1e-9));
  CHECK(config_key("llama-2-7b", c) ==
        "llama-2-7b g1n1 s2 off=cpu/none adamw fp32 mb16 gas1 seq2048 ckpt=0 uploads=after-bwd");
  // CPU-bound (1 x 512 tokens): the updates outlast the backward by more than the uploads
  // take, and the uploads of updated units run meanwhile in both orders: the last unit's is
  // exposed after the updates' rest.
  c.micro_batch = 1;
  c.seq_len = 512;
  for (bool in_backward : {true, false}) {
    c.offload_uploads_in_backward = in_backward;
    const Prediction p = evaluate(m, hw, c);
    CHECK(p.time.optimizer_s > upload_s);
    CHECK(p.time.tail_s == doctest::Approx(p.time.optimizer_s + upload_s / 34.0).epsilon(1e-9));
  }
}

TEST_CASE("serial CPU offload (DeepSpeed's order) exposes the whole optimizer; the pipeline hides part of it") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(2, 2, 4, 4);
  c.offload_optimizer = OffloadDevice::kCpu;
  const Prediction piped = evaluate(m, hw, c);
  c.offload_pipeline = false;
  const Prediction serial = evaluate(m, hw, c);
  // Same work: the same optimizer, transfers and micro-batches.
  CHECK(serial.time.optimizer_total_s == doctest::Approx(piped.time.optimizer_total_s));
  CHECK(serial.time.gas_s == doctest::Approx(piped.time.gas_s));
  // Serial: nothing of the optimizer hides; the uploads and all-gathers follow it.
  CHECK(serial.time.optimizer_s == doctest::Approx(serial.time.optimizer_total_s));
  CHECK(serial.time.offload_transfer_s >= piped.time.offload_transfer_s - 1e-12);
  CHECK(piped.time.optimizer_s < piped.time.optimizer_total_s);
  CHECK(serial.time.step_s > piped.time.step_s);
  // The difference is at most the part of the pipeline the last backward hid.
  CHECK(serial.time.step_s - piped.time.step_s <=
        piped.time.optimizer_total_s + piped.time.offload_transfer_total_s + piped.time.grad_comm_total_s);
}

TEST_CASE("offload pipeline full: the next forward hides the tail, never more than itself, never less than nothing") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  for (int64_t gas : {1, 4}) {
    for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kAdamW8bit}) {
      CAPTURE(gas);
      CAPTURE(optimizer_name(opt));
      TrainConfig c = config(2, 2, 4, gas);
      c.offload_optimizer = OffloadDevice::kCpu;
      c.optimizer = opt;
      const Prediction on = evaluate(m, hw, c);
      c.offload_overlap_forward = true;
      const Prediction full = evaluate(m, hw, c);
      // Same work; only the tail after the last backward shrinks.
      CHECK(full.time.optimizer_total_s == doctest::Approx(on.time.optimizer_total_s));
      CHECK(full.time.gas_s == doctest::Approx(on.time.gas_s));
      const double tail_on = on.time.opt_s - on.time.backward_s / static_cast<double>(gas) -
                             on.time.forward_s / static_cast<double>(gas);
      const double saved = on.time.step_s - full.time.step_s;
      // Hand bound: what it hides is at most one micro-batch's forward (the one running
      // behind the CPU) and at most the tail itself.
      CHECK(saved >= -1e-12);
      CHECK(saved <= on.time.forward_s / static_cast<double>(gas) + 1e-12);
      CHECK(saved <= tail_on + 1e-12);
    }
  }
  // Where the CPU is the bottleneck (fp32 states, GAS 1) the tail is longer than a forward:
  // the forward hides fwd_upload_overlap_frac of itself.
  TrainConfig c = config(2, 2, 4, 1);
  c.offload_optimizer = OffloadDevice::kCpu;
  const Prediction on = evaluate(m, hw, c);
  c.offload_overlap_forward = true;
  const Prediction full = evaluate(m, hw, c);
  CHECK(on.time.step_s - full.time.step_s ==
        doctest::Approx(hw.coefs[kFwdUploadOverlapFrac] * on.time.forward_s).epsilon(1e-9));
}

TEST_CASE("the founding report's phases are its PerformanceCallback's: GAS - 1 micro-batches, then the last with the step") {
  // Founding report (data/published/founding_report.toml): pythia-2.8b on 2 x A40, ZeRO-3 with
  // DeepSpeed's CPU Adam, 16-bit weights, eager attention, checkpointing, micro-batch 4, 8 vCPUs.
  // Its callback stamps the time after every micro-batch but the last of a window, so GAS time
  // grows with GAS - 1 and OPT time (the last micro-batch and the step) does not grow with GAS:
  // measured 68.412 s / 17.238 s = 3.97 (GAS 5 against 2) and OPT 23.677 s against 23.498 s.
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("a40");
  TrainConfig c = config(3, 2, 4, 2);
  c.engine = Engine::kDeepSpeed;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_pipeline = false;
  c.precision = Precision::kFp16;
  c.attention = AttentionKind::kMath;
  c.activation_checkpointing = true;
  const ResourceLimits pod{0, 0, 8.0};
  const Prediction gas2 = evaluate(m, hw, c, pod);
  c.gas = 5;
  const Prediction gas5 = evaluate(m, hw, c, pod);
  CHECK(gas5.time.gas_s / gas2.time.gas_s == doctest::Approx(68.412 / 17.238).epsilon(0.01));
  CHECK(gas5.time.opt_s / gas2.time.opt_s == doctest::Approx(23.677 / 23.498).epsilon(0.01));
  // Our backend (bf16: it trains no fp16) with its pipelined offload hides part of the optimizer
  // behind the last backward.
  c.engine = Engine::kStepcast;
  c.precision = Precision::kBf16;
  c.offload_pipeline = true;
  const Prediction pipelined = evaluate(m, hw, c, pod);
  c.offload_pipeline = false;
  CHECK(pipelined.time.opt_s < evaluate(m, hw, c, pod).time.opt_s);
}

TEST_CASE("over PCIe, gradient reduction and host copies share one link and hide behind one window") {
  const ModelSpec m = model("gpt-j-6b");
  TrainConfig c = config(2, 2, 1, 4);
  c.offload_optimizer = OffloadDevice::kCpu;
  const HardwareProfile a40 = hardware("a40");  // intra_node = "pcie"
  const Features f = make_features(m, a40, c);
  REQUIRE(f.step.pcie_shared_link == 1.0);
  CHECK(make_features(m, hardware("h200-sxm"), c).step.pcie_shared_link == 0.0);  // NVLink
  CHECK(make_features(m, a40, config(2, 1, 1, 4)).step.pcie_shared_link == 0.0);   // one GPU
  StepFeatures apart = f.step;
  apart.pcie_shared_link = 0.0;
  const StepTime<double> shared = predict_step_time(f.step, a40.coefs.data());
  const StepTime<double> separate = predict_step_time(apart, a40.coefs.data());
  // One window for both can hide no more than two windows, one for each, and exposes at most
  // what the two transfers take.
  CHECK(shared.step_s >= separate.step_s - 1e-12);
  CHECK(shared.step_s - separate.step_s <= shared.grad_comm_total_s + shared.offload_transfer_total_s + 1e-12);
  // The boundary micro-batch by hand: reduce-scatter rs over the PCIe ring and the shard's copy
  // d2h queue on the link; the backward's larger window hides max(0, rs + d2h - window).
  const double* k = a40.coefs.data();
  const double bwd = shared.backward_s / 4.0;
  const double window = std::max(k[kGradCommOverlapFrac], k[kOffloadOverlapFrac]) * bwd;
  const double rs = collective_time_s(f.step.grad_comm_bytes_micro, f.step.grad_comm_calls_micro,
                                      f.step.grad_comm_bus_factor, false, f.step.link_bytes_per_s, false, 0.0, k);
  const double d2h = pcie_copy_time_s(f.step.d2h_bytes_boundary, f.step.d2h_bytes_per_s, k);
  const double exposed_micro = std::max(0.0, rs - window);
  const double exposed_boundary = std::max(0.0, rs + d2h - window);
  // Each non-boundary micro-batch: its exposed reduction, and the hidden rest's toll on the
  // backward (comm_interference_frac of it).
  CHECK(shared.gas_s == doctest::Approx(3.0 * (shared.forward_s + shared.backward_s) / 4.0 + 3.0 * exposed_micro +
                                        3.0 * k[kCommInterferenceFrac] * (rs - exposed_micro)));
  // The boundary, without that toll (it differs between one window and two by what each hides).
  CoefVector quiet = a40.coefs;
  quiet[kCommInterferenceFrac] = 0.0;
  const StepTime<double> shared_quiet = predict_step_time(f.step, quiet.data());
  const StepTime<double> separate_quiet = predict_step_time(apart, quiet.data());
  const double boundary_exposed_shared = shared_quiet.opt_s - (shared.forward_s + shared.backward_s) / 4.0;
  const double boundary_exposed_apart = separate_quiet.opt_s - (separate.forward_s + separate.backward_s) / 4.0;
  CHECK(boundary_exposed_shared - boundary_exposed_apart ==
        doctest::Approx(exposed_boundary - std::max(0.0, rs - k[kGradCommOverlapFrac] * bwd) -
                        std::max(0.0, d2h - k[kOffloadOverlapFrac] * bwd))
            .epsilon(1e-9));
}

TEST_CASE("a hidden collective still slows the compute beside it by a share of its time") {
  // llama-2-7b on 2 H200, ZeRO-3, micro-batch 4, GAS 4: the gathers hide behind the compute and
  // the reduce-scatters behind the backward (nothing exposed), so comm_interference_frac alone
  // moves the step. By hand: k x (GAS x one micro-batch's gathers + GAS x its reduce-scatter
  // + the boundary's own reduction).
  const HardwareProfile hw = hardware("h200-sxm");
  const Features f = make_features(model("llama-2-7b"), hw, config(3, 2, 4, 4));
  CoefVector quiet = hw.coefs, loud = hw.coefs;
  quiet[kCommInterferenceFrac] = 0.0;
  loud[kCommInterferenceFrac] = 0.3;
  const StepTime<double> t0 = predict_step_time(f.step, quiet.data());
  const StepTime<double> t1 = predict_step_time(f.step, loud.data());
  REQUIRE(t0.param_gather_s < 1e-3 * t0.step_s);  // hidden (a smooth corner leaves microseconds)
  REQUIRE(t0.grad_comm_s < 1e-3 * t0.step_s);
  const double gather = detail::collective_time_s(f.step.gather_bytes_micro, f.step.gather_calls_micro,
                                                  f.step.gather_bus_factor, false, f.step, loud.data());
  const bool allreduce = f.step.grad_comm_is_allreduce > 0.0;
  const double rs = detail::collective_time_s(f.step.grad_comm_bytes_micro, f.step.grad_comm_calls_micro,
                                              f.step.grad_comm_bus_factor, allreduce, f.step, loud.data());
  const double rs_boundary = detail::collective_time_s(f.step.grad_comm_bytes_boundary, f.step.grad_comm_calls_boundary,
                                                       f.step.grad_comm_bus_factor, allreduce, f.step, loud.data());
  REQUIRE(gather > 0.0);
  REQUIRE(rs > 0.0);
  CHECK(t1.param_gather_s - t0.param_gather_s == doctest::Approx(0.3 * 4.0 * gather));
  CHECK(t1.grad_comm_s - t0.grad_comm_s == doctest::Approx(0.3 * (4.0 * rs + rs_boundary)));
  CHECK(t1.step_s - t0.step_s == doctest::Approx(0.3 * (4.0 * gather + 4.0 * rs + rs_boundary)));
  // The forward's share of the gathers' toll is the forward's share of the fetches.
  CHECK(t1.forward_gather_s - t0.forward_gather_s == doctest::Approx(0.3 * 4.0 * gather * f.step.fetch_fwd_frac));
  // One GPU moves nothing over NCCL: no toll.
  const Features one = make_features(model("llama-2-7b"), hw, config(3, 1, 4, 4));
  CHECK(predict_step_time(one.step, loud.data()).step_s == doctest::Approx(predict_step_time(one.step, quiet.data()).step_s));
}
