// The memory model against the ZeRO paper's formulas, hand derivations and
// properties.
#include <doctest/doctest.h>

#include "model/prediction.h"
#include "test_util.h"

using namespace stepcast;
using stepcast::test::hardware;
using stepcast::test::model;

namespace {

TrainConfig config(int stage, int gpus, OffloadDevice off_opt = OffloadDevice::kNone,
                   OptimizerKind opt = OptimizerKind::kAdamW) {
  TrainConfig c;
  c.zero_stage = stage;
  c.gpus_per_node = gpus;
  c.offload_optimizer = off_opt;
  c.optimizer = opt;
  c.micro_batch = 1;
  c.seq_len = 2048;
  return c;
}

double model_states(const MemoryFeatures& m) {
  return m.gpu_params_bytes + m.gpu_grads_bytes + m.gpu_opt_states_bytes;
}

// Hand-set values of the coefficients memory_model.h reads; the others at their defaults.
struct MemoryCoefs {
  double act_mult, loss_extra_per_logit, frag_frac, ckpt_reserve_mult, workspace_bytes, loss_reserve_per_logit;
};
CoefVector memory_coefs(const MemoryCoefs& m) {
  CoefVector c = default_coefs();
  c[kActBytesMult] = m.act_mult;
  c[kLossExtraBytesPerLogit] = m.loss_extra_per_logit;
  c[kGpuFragFrac] = m.frag_frac;
  c[kCkptReserveMult] = m.ckpt_reserve_mult;
  c[kGpuWorkspaceBytes] = m.workspace_bytes;
  c[kLossReserveBytesPerLogit] = m.loss_reserve_per_logit;
  return c;
}

// The two-phase hand case: static 40 GB (parameters 10, gradients 10, optimizer states 20),
// backward-only accumulators 4 GB, activations 10 GB, step buffers 6 GB (reclaimable), the
// engine's cache 1 GB.
MemoryFeatures two_phase_case() {
  MemoryFeatures f;
  f.gpu_params_bytes = 10e9;
  f.gpu_grads_bytes = 10e9;
  f.gpu_opt_states_bytes = 20e9;
  f.gpu_backward_bytes = 4e9;
  f.gpu_step_bytes = 6e9;
  f.gpu_step_reclaimable_bytes = 6e9;
  f.gpu_engine_cache_bytes = 1e9;
  f.act_bytes = 10e9;
  return f;
}

// Its coefficients: every activation byte counted once, a pool reserve of 5 % of the live bytes,
// no loss buffers, checkpoints or workspace.
CoefVector two_phase_coefs() {
  return memory_coefs({.act_mult = 1.0, .loss_extra_per_logit = 0.0, .frag_frac = 0.05, .ckpt_reserve_mult = 0.0,
                       .workspace_bytes = 0.0, .loss_reserve_per_logit = 0.0});
}

}  // namespace

TEST_CASE("ZeRO paper: model states per GPU for stages 0-3 (Rajbhandari et al. 2020)") {
  // Section 5 / Figure 1: Psi parameters, N ranks, mixed-precision Adam (K = 12):
  //   stage 0: (2 + 2 + 12) Psi      stage 1: 2 Psi + 2 Psi + 12 Psi / N
  //   stage 2: 2 Psi + 14 Psi / N    stage 3: 16 Psi / N
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double psi = static_cast<double>(m.total_params());
  for (int n : {1, 2, 8, 64}) {
    CAPTURE(n);
    const double expected[4] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(stage);
      Features f = make_features(m, hw, config(stage, n));
      CHECK(model_states(f.memory) == doctest::Approx(expected[stage]).epsilon(1e-12));
    }
  }
}

TEST_CASE("ZeRO paper Figure 1: Psi = 7.5B, N = 64 gives 120 / 31.4 / 16.6 / 1.9 GB") {
  // The figure's numbers, from the same formulas, in GB (1e9).
  const double psi = 7.5e9, n = 64;
  CHECK(16 * psi / 1e9 == doctest::Approx(120.0));
  CHECK((4 * psi + 12 * psi / n) / 1e9 == doctest::Approx(31.4).epsilon(0.002));
  CHECK((2 * psi + 14 * psi / n) / 1e9 == doctest::Approx(16.6).epsilon(0.005));
  CHECK(16 * psi / n / 1e9 == doctest::Approx(1.9).epsilon(0.02));
  // And our model on a card scaled to 7.5B parameters would follow, which the
  // previous test already covers for every stage and rank count.
}

TEST_CASE("fp32 training keeps no master copy: 4 + 4 + 8 bytes per parameter") {
  const ModelSpec m = model("gpt-j-6b");
  TrainConfig c = config(0, 1);
  c.precision = Precision::kFp32;
  Features f = make_features(m, hardware("a40"), c);
  CHECK(model_states(f.memory) == doctest::Approx(16.0 * m.total_params()));
}

TEST_CASE("8-bit AdamW states: 2 bytes + one fp32 absmax per 2048-block per moment") {
  // Dettmers et al. 2022: block-wise quantisation, block size 2048. With
  // mixed precision the fp32 master copy stays: 4 + 2 + 8/2048 bytes.
  CHECK(optimizer_state_bytes_per_param(OptimizerKind::kAdamW8bit, Precision::kBf16) ==
        doctest::Approx(6.0 + 8.0 / 2048.0));
  CHECK(optimizer_state_bytes_per_param(OptimizerKind::kAdamW, Precision::kBf16) == 12.0);
  // Llama-2-7b: every tensor has >= 4096 elements, so all states are 8-bit.
  CHECK(small_tensor_params(model("llama-2-7b")) == 0);
  // Pythia-2.8b (h = 2560): norms and the attention/MLP-out biases stay 32-bit:
  // per layer 2 LayerNorms x (w + b) x 2560 + qkv bias 3 x 2560 (each < 4096)
  // + dense bias 2560 + MLP out bias 2560 = 10240 + 7680 + 5120 = 23040;
  // x 32 layers + final norm 5120 = 742,400. (The 10240-wide MLP-in bias is 8-bit.)
  CHECK(small_tensor_params(model("pythia-2.8b")) == 742'400);
}

TEST_CASE("activation count: hand derivation for llama-2-7b and Korthikanti's 34 sbh") {
  // Llama-2-7b (h = 4096, q/k/v 4096 each, i = 11008, gated, 2 norms), flash:
  //   norms 2h = 8192; attention h + q + k + v + O = 5 x 4096 = 20480;
  //   MLP h + 4i = 4096 + 44032 = 48128; total 76800 elements per token per layer.
  const ModelSpec m = model("llama-2-7b");
  CHECK(activation_elems_per_token_per_layer(m, AttentionKind::kFlash, 2048) == 76800.0);
  // In bf16 that is 153,600 B = 37.5 h bytes per token per layer, against
  // Korthikanti et al.'s 34 h for a 4h GeLU MLP: the gated 2.69h MLP of Llama
  // keeps 4 intermediates (8 bytes x 11008 = 21.5 h) where GeLU keeps 2 (16 h).
  CHECK(2.0 * 76800.0 / 4096.0 == doctest::Approx(37.5));
  // Math attention adds the softmax probabilities: heads x s per token.
  CHECK(activation_elems_per_token_per_layer(m, AttentionKind::kMath, 2048) == 76800.0 + 32.0 * 2048.0);
  // GPT-2-style layer (4h MLP, 2 LayerNorms): 2h + 5h + h + 8h = 16h elements
  // = 32 h bytes; Korthikanti's 34 h includes the dropout masks (1 + 1 byte per
  // element of the two dropout outputs) that fine-tuning without dropout drops.
  ModelSpec g = m;
  g.gated_mlp = false;
  g.intermediate_size = 4 * g.hidden_size;
  CHECK(2.0 * activation_elems_per_token_per_layer(g, AttentionKind::kFlash, 2048) / g.hidden_size ==
        doctest::Approx(32.0));
}

TEST_CASE("activations: a peer's eager attention keeps the fp32 softmax beside the 16-bit probabilities") {
  // gpt-j-6b (16 heads, 28 layers), bf16, micro-batch 2 at 2048 tokens, DeepSpeed with math
  // attention: each layer keeps 16 x 2048 scores per token twice, 2 B (the product's input) and
  // 4 B (softmax's output). The backend's math kernel keeps the 2 B copy only.
  const ModelSpec m = model("gpt-j-6b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(0, 1);
  c.micro_batch = 2;
  c.attention = AttentionKind::kMath;
  const double ours = make_features(m, hw, c).memory.act_bytes;
  c.engine = Engine::kDeepSpeed;
  const double tokens = 2.0 * 2048.0;
  CHECK(make_features(m, hw, c).memory.act_bytes - ours ==
        doctest::Approx(tokens * 4.0 * 16.0 * 2048.0 * 28.0));  // 15.0 GB
  // Its backward, one layer at a time, holds more per score (step_features.cpp, by hand): the
  // probabilities' gradient 2 B, its fp32 cast 4 B, softmax's input gradient 4 B, and GPT-J's
  // scaled gradient in fp32 4 B, less the 2 B probabilities already freed: 12 B a score, in the
  // place of the loss's buffers (recompute_layer_bytes), checkpointed or not.
  const double scores = tokens * 16.0 * 2048.0;
  CHECK(make_features(m, hw, c).memory.recompute_layer_bytes == doctest::Approx(12.0 * scores));
  // With checkpointing one recomputed layer holds the fp32 softmax too: 1/28 of it.
  c.activation_checkpointing = true;
  const double ckpt = make_features(m, hw, c).memory.recompute_layer_bytes;
  c.engine = Engine::kStepcast;
  CHECK(ckpt - make_features(m, hw, c).memory.recompute_layer_bytes == doctest::Approx(4.0 * scores + 12.0 * scores));
  // pythia-2.8b (32 heads) casts nothing to fp32 before softmax: 2 + 4 + 4 + 2 - 2 = 10 B a score.
  {
    const ModelSpec p = model("pythia-2.8b");
    TrainConfig d = config(0, 1);
    d.micro_batch = 2;
    d.attention = AttentionKind::kMath;
    d.engine = Engine::kDeepSpeed;
    CHECK(make_features(p, hw, d).memory.recompute_layer_bytes == doctest::Approx(10.0 * tokens * 32.0 * 2048.0));
  }
  // fp32 training has one fp32 copy already: nothing more.
  c.precision = Precision::kFp32;
  c.activation_checkpointing = false;
  const double fp32_ours = make_features(m, hw, c).memory.act_bytes;
  c.engine = Engine::kDeepSpeed;
  CHECK(make_features(m, hw, c).memory.act_bytes == fp32_ours);
}

TEST_CASE("activations: checkpointing keeps one input per layer, and later one recomputed layer") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(0, 1);
  c.micro_batch = 2;
  const double tokens = 2.0 * 2048.0, h = 4096.0, L = 32.0, per_layer = 76800.0;
  Features plain = make_features(m, hw, c);
  CHECK(plain.memory.act_bytes == doctest::Approx(tokens * 2.0 * (L * per_layer + 2 * h)));
  CHECK(plain.memory.ckpt_bytes == 0.0);
  CHECK(plain.memory.recompute_layer_bytes == 0.0);
  c.activation_checkpointing = true;
  Features ckpt = make_features(m, hw, c);
  CHECK(ckpt.memory.ckpt_bytes == doctest::Approx(tokens * 2.0 * L * h));
  CHECK(ckpt.memory.act_bytes == doctest::Approx(tokens * 2.0 * (L * h + 2 * h)));
  CHECK(ckpt.memory.recompute_layer_bytes == doctest::Approx(tokens * 2.0 * per_layer));
  // Linear in the micro-batch.
  c.micro_batch = 4;
  CHECK(make_features(m, hw, c).memory.act_bytes == doctest::Approx(2.0 * ckpt.memory.act_bytes));
}

TEST_CASE("activations: our backend keeps grouped-query attention's repeated keys and values") {
  // llama-3-8b: 32 query heads, 8 KV heads of 128: q_dim 4096, kv_dim 1024. The backend repeats
  // K and V to 32 heads before the fused attention, which saves them for its backward:
  // 2 x (4096 - 1024) = 6144 elements more per token and layer; a transformers peer does not.
  const ModelSpec m = model("llama-3-8b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(3, 1);
  const double tokens = 2048.0, L = 32.0;
  const double ours = make_features(m, hw, c).memory.act_bytes;
  c.engine = Engine::kFsdp2;
  CHECK(ours - make_features(m, hw, c).memory.act_bytes == doctest::Approx(tokens * 2.0 * L * 6144.0));
  // A model without grouped queries (llama-2-7b) is the same for both.
  const ModelSpec mha = model("llama-2-7b");
  const double peer = make_features(mha, hw, c).memory.act_bytes;
  c.engine = Engine::kStepcast;
  CHECK(make_features(mha, hw, c).memory.act_bytes == peer);
}

TEST_CASE("memory model: the loss copies 16-bit logits to fp32, not fp32 ones") {
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(0, 1);
  const MemoryFeatures bf16 = make_features(m, hw, c).memory;
  CHECK(bf16.loss_copy_absent_bytes == 0.0);
  c.precision = Precision::kFp32;
  const MemoryFeatures fp32 = make_features(m, hw, c).memory;
  CHECK(fp32.loss_copy_absent_bytes == 4.0);
  // Per logit at the loss, with 10 B beyond the logits for bf16: 2 + 10 = 12 B; fp32: 4 + 6 = 10 B;
  // a habit below the copy (2 B, a fused cross-entropy) leaves fp32 logits alone: 4 B.
  CoefVector k = default_coefs();
  k[kActBytesMult] = 0.0;
  k[kGpuFragFrac] = 0.0;
  k[kLossExtraBytesPerLogit] = 10.0;
  const auto live = [&](const MemoryFeatures& f) { return predict_memory(f, k.data()).gpu_live_bytes; };
  CHECK(live(bf16) == doctest::Approx(12.0 * bf16.logits_elems));
  CHECK(live(fp32) == doctest::Approx(10.0 * fp32.logits_elems));
  k[kLossExtraBytesPerLogit] = 2.0;
  CHECK(live(fp32) == doctest::Approx(4.0 * fp32.logits_elems));
}

TEST_CASE("memory model: peak allocated and reserve by hand") {
  // Hand-made features and coefficients: every term of memory_model.h checked once.
  MemoryFeatures f;
  f.gpu_params_bytes = 10e9;
  f.gpu_grads_bytes = 5e9;
  f.gpu_opt_states_bytes = 20e9;
  f.gpu_buffers_bytes = 1e9;
  f.act_bytes = 8e9;
  f.logits_elems = 1e9;
  f.logit_bytes = 2.0;
  CoefVector c = memory_coefs({.act_mult = 1.0, .loss_extra_per_logit = 10.0, .frag_frac = 0.05,
                               .ckpt_reserve_mult = 1.0, .workspace_bytes = 0.5e9, .loss_reserve_per_logit = 0.5});
  // Without checkpointing: live = 8 GB + 1e9 x (2 + 4 + 6) = 20 GB; allocated = 36 + 20 + 0.5;
  // reserve = 5 % of 20 GB, more than the loss's 0.5 B x 1e9 logits.
  MemoryEstimate<double> e = predict_memory(f, c.data());
  CHECK(e.gpu_allocated_bytes == doctest::Approx(56.5e9));
  CHECK(e.gpu_reserve_bytes == doctest::Approx(1e9));
  CHECK(e.gpu_total_bytes == doctest::Approx(57.5e9));
  // The loss's freed buffers at 3 B a logit, 3 GB, exceed the 1 GB of holes: they set the reserve.
  c[kLossReserveBytesPerLogit] = 3.0;
  e = predict_memory(f, c.data());
  CHECK(e.gpu_allocated_bytes == doctest::Approx(56.5e9));
  CHECK(e.gpu_reserve_bytes == doctest::Approx(3e9));
  c[kLossReserveBytesPerLogit] = 0.5;
  // Checkpointed: 4 GB of checkpoints (in act_bytes) and a recomputed layer of 15 GB, larger
  // than the 12 GB at the loss: the layer sets the peak, not the two summed; the checkpoints are
  // reserved once more.
  f.act_bytes = 4e9;
  f.ckpt_bytes = 4e9;
  f.recompute_layer_bytes = 15e9;
  e = predict_memory(f, c.data());
  CHECK(e.gpu_allocated_bytes == doctest::Approx(36e9 + 19e9 + 0.5e9));
  CHECK(e.gpu_reserve_bytes == doctest::Approx(0.05 * 19e9 + 4e9));
  // 6 B a logit (6 GB) passes the 4.95 GB of holes and checkpoints.
  c[kLossReserveBytesPerLogit] = 6.0;
  CHECK(predict_memory(f, c.data()).gpu_reserve_bytes == doctest::Approx(6e9));
  c[kLossReserveBytesPerLogit] = 0.5;
  f.recompute_layer_bytes = 3e9;
  CHECK(predict_memory(f, c.data()).gpu_allocated_bytes == doctest::Approx(36e9 + 16e9 + 0.5e9));
}

TEST_CASE("properties: memory never rises with the stage; offload moves bytes to the host") {
  const HardwareProfile hw = hardware("h200-sxm");
  for (const char* name : {"gpt-j-6b", "llama-3-8b", "qwen2.5-14b", "pythia-2.8b"}) {
    const ModelSpec m = model(name);
    for (int gpus : {1, 2, 8}) {
      for (bool ckpt : {false, true}) {
        CAPTURE(name);
        CAPTURE(gpus);
        double previous = 1e300;
        for (int stage = 0; stage <= 3; ++stage) {
          TrainConfig c = config(stage, gpus);
          c.activation_checkpointing = ckpt;
          const Prediction p = evaluate(m, hw, c);
          CHECK(p.memory.gpu_params_bytes + p.memory.gpu_grads_bytes + p.memory.gpu_opt_states_bytes <= previous * (1 + 1e-12));
          previous = p.memory.gpu_params_bytes + p.memory.gpu_grads_bytes + p.memory.gpu_opt_states_bytes;
          if (stage >= 1) {
            TrainConfig o = c;
            o.offload_optimizer = OffloadDevice::kCpu;
            const Prediction q = evaluate(m, hw, o);
            CHECK(q.memory.gpu_total_bytes < p.memory.gpu_total_bytes);
            CHECK(q.memory.host_node_total_bytes > p.memory.host_node_total_bytes);
          }
        }
      }
    }
  }
}

TEST_CASE("8-bit AdamW saves 6 of 12 bytes per sharded parameter on the GPU") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const Prediction a = evaluate(m, hw, config(0, 1));
  const Prediction b = evaluate(m, hw, config(0, 1, OffloadDevice::kNone, OptimizerKind::kAdamW8bit));
  const double psi = static_cast<double>(m.total_params());
  CHECK(a.memory.gpu_opt_states_bytes - b.memory.gpu_opt_states_bytes == doctest::Approx(psi * (6.0 - 8.0 / 2048.0)));
}

TEST_CASE("8-bit AdamW offloaded in bf16: split master weights, pinned buffers per unit rounded to powers of two") {
  // Per 8-bit parameter of the shard, host bytes (backend/engine.cpp's buffers):
  //   fp32 master weights: master 4 + codes 2 + staging 2 (+ host parameters 2 with parameter offload)
  //   split master weights: remainder 2 + codes 2 + staging 2 + the bf16 upper half 2, which is
  //   the host parameter shard with parameter offload, else a pinned upload buffer of its own.
  // Ordinary host memory: remainder 2 + codes 2 + two fp32 absmax per 2048-block (8 / 2048 B);
  // the small tensors keep fp32 master and moments (12 B). Pinned, two bf16 buffers per unit
  // (staging, and the upload buffer or the parameter shard), each rounded up to a power of two
  // by torch's caching host allocator. llama-2-7b on 2 ranks (units padded to 4096 elements):
  //   embedding 32000 x 4096 = 131,072,000 -> a 65,536,000-element shard, 125 MiB -> 128 MiB
  //   layer 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096 = 202,383,360 -> 193 MiB -> 256 MiB (x 32)
  //   head 131,072,000 + 4096 (final norm) = 131,076,096 -> 125.0 MiB -> 128 MiB
  // so 2 x 128 + 32 x 256 = 8448 MiB per buffer, where the bytes alone are 6.28 GiB.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double psi = static_cast<double>(m.total_params());
  const double small = static_cast<double>(small_tensor_params(m));
  const double pinned_per_buffer = 8448.0 * 1048576.0;
  for (bool param_offload : {false, true}) {
    CAPTURE(param_offload);
    TrainConfig c = config(3, 2, OffloadDevice::kCpu, OptimizerKind::kAdamW8bit);
    c.offload_params = param_offload ? OffloadDevice::kCpu : OffloadDevice::kNone;
    const double host = evaluate(m, hw, c).memory.host_per_rank_bytes - hw.coefs[kHostBytesPerRank];
    const double expected = (psi - small) / 2 * (2 + 2 + 8.0 / 2048) + small / 2 * 12 + 2 * pinned_per_buffer;
    CHECK(host == doctest::Approx(expected).epsilon(1e-9));
  }
  CHECK(optimizer_traffic_bytes(OptimizerKind::kAdamW8bit, Precision::kBf16, true) == doctest::Approx(14 + 16.0 / 2048));
  CHECK(optimizer_traffic_bytes(OptimizerKind::kAdamW8bit, Precision::kBf16, false) == doctest::Approx(16 + 16.0 / 2048));
  CHECK(optimizer_traffic_bytes(OptimizerKind::kAdamW, Precision::kBf16, true) == 28.0);
}

TEST_CASE("host: llama-2-13b at stage 3 with both offloads needs 1 GiB pinned per layer buffer on one rank") {
  // The measured case (docs/calibration.md): one H200 on a 125 GiB host, 8-bit AdamW, bf16.
  // A layer of 4 x 5120^2 + 3 x 5120 x 13824 + 2 x 5120 = 317,204,480 parameters is 605 MiB in
  // bf16, a 1 GiB pinned buffer; the embedding (32000 x 5120, 312.5 MiB) and the head (plus the
  // final norm) take 512 MiB each: 41 GiB per buffer, two buffers (staging, parameter shard).
  // Ordinary memory: 4 B per 8-bit parameter (remainder, codes) and 12 for the small tensors.
  const ModelSpec m = model("llama-2-13b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(3, 1, OffloadDevice::kCpu, OptimizerKind::kAdamW8bit);
  c.offload_params = OffloadDevice::kCpu;
  c.micro_batch = 4;
  c.seq_len = 4096;
  c.activation_checkpointing = true;
  const Prediction p = evaluate(m, hw, c);
  const double psi = static_cast<double>(m.total_params()), small = static_cast<double>(small_tensor_params(m));
  const double expected = (psi - small) * (4 + 8.0 / 2048) + small * 12 + 2 * 41.0 * 1073741824.0;
  CHECK(p.memory.host_per_rank_bytes - hw.coefs[kHostBytesPerRank] == doctest::Approx(expected).epsilon(1e-9));
  // 130 GiB and more: the 125 GiB host the run was killed on cannot hold it.
  CHECK(p.memory.host_node_total_bytes > 125.0 * 1073741824.0);
  CHECK_FALSE(evaluate(m, hw, c, ResourceLimits{0, 125.0 * 1073741824.0, 0}).fits);
}

TEST_CASE("fits: 70B does not fit on one H200 without offload, fits with stage-3 CPU offload of both") {
  const ModelSpec m = model("llama-2-70b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(0, 1);
  const Prediction plain = evaluate(m, hw, c);
  CHECK_FALSE(plain.fits);
  CHECK(plain.reason.find("GiB per GPU") != std::string::npos);
  // 70B x 16 B = 1.1 TB of states: even with everything offloaded it needs
  // 70e9 x (12 + 4 + 2) B = 1.26 TB of host memory, more than the H200 host's 125.8 GiB.
  c.zero_stage = 3;
  c.offload_optimizer = OffloadDevice::kCpu;
  c.offload_params = OffloadDevice::kCpu;
  c.activation_checkpointing = true;
  const Prediction off = evaluate(m, hw, c);
  CHECK_FALSE(off.fits);
  CHECK(off.reason.find("host memory") != std::string::npos);
  // With 2 TB of host memory it fits.
  const Prediction big = evaluate(m, hw, c, ResourceLimits{0, 2048.0 * 1073741824.0, 0});
  CHECK(big.fits);
}

TEST_CASE("fits: a plan the card holds but not its 5 % headroom is tight: not ranked, not \"does not fit\"") {
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h200-sxm");
  const TrainConfig c = config(0, 1);
  const double need = evaluate(m, hw, c).memory.gpu_required_bytes;
  REQUIRE(need > 0);
  // A card 2 % larger than the need: inside the card, over the 95 % of it that the planner ranks by.
  const Prediction tight = evaluate(m, hw, c, ResourceLimits{need / 0.98, 0, 0});
  CHECK_FALSE(tight.fits);
  CHECK(tight.tight);
  CHECK(fit_verdict(tight).rfind("tight, not ranked: needs", 0) == 0);
  CHECK(tight.reason.find("not its headroom") != std::string::npos);
  // A card 2 % smaller than the need does not hold it.
  const Prediction over = evaluate(m, hw, c, ResourceLimits{need / 1.02, 0, 0});
  CHECK_FALSE(over.fits);
  CHECK_FALSE(over.tight);
  CHECK(fit_verdict(over).rfind("does not fit: needs", 0) == 0);
  // 10 % larger: inside the headroom too.
  const Prediction roomy = evaluate(m, hw, c, ResourceLimits{need / 0.9, 0, 0});
  CHECK(roomy.fits);
  CHECK_FALSE(roomy.tight);
  CHECK(fit_verdict(roomy).empty());
  // A tight GPU does not hide a host that cannot hold the plan: that does not fit.
  const Prediction host = evaluate(m, hw, c, ResourceLimits{need / 0.98, 1.0, 0});
  CHECK_FALSE(host.fits);
  CHECK_FALSE(host.tight);
  CHECK(host.reason.find("host memory") != std::string::npos);
}

TEST_CASE("PEFT: LoRA's trainable parameters match Hugging Face PEFT's count; frozen storage by hand") {
  // Hugging Face PEFT's print_trainable_parameters() for llama-2-7b with LoraConfig(r=16,
  // target_modules=q,k,v,o,gate,up,down) reads "trainable params: 39,976,960 || all params:
  // 6,778,392,576" (a figure that recurs in PEFT's issue tracker and tutorials). By hand: per
  // layer 16 x [q (4096 + 4096) + k, v (4096 + 4096 each) + o (4096 + 4096) + gate, up (4096 +
  // 11008 each) + down (11008 + 4096)] = 16 x 78 080 = 1 249 280; x 32 layers = 39 976 960.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig c = config(0, 1);
  c.peft = PeftKind::kLora;
  c.lora_rank = 16;
  c.lora_targets = LoraTargets::kAll;
  CHECK(lora_params(m, c) == 39976960.0);
  CHECK(static_cast<double>(m.total_params()) + lora_params(m, c) == 6778392576.0);
  // Attention only: 16 x 4 x (4096 + 4096) x 32 = 16 777 216; MLP only: the rest.
  c.lora_targets = LoraTargets::kAttention;
  CHECK(lora_params(m, c) == 16777216.0);
  c.lora_targets = LoraTargets::kMlp;
  CHECK(lora_params(m, c) == 39976960.0 - 16777216.0);
  c.lora_targets = LoraTargets::kAll;

  // LoRA, stage 0, bf16 AdamW: frozen base 2 B per weight, adapters 2 (weights) + 2 (gradients) +
  // 12 (fp32 master + two moments) B each.
  const double psi = 6738415616.0, lora = 39976960.0;
  MemoryFeatures f = make_features(m, hw, c).memory;
  CHECK(f.gpu_params_bytes == doctest::Approx(2.0 * psi + 2.0 * lora));
  CHECK(f.gpu_grads_bytes == doctest::Approx(2.0 * lora));
  CHECK(f.gpu_opt_states_bytes == doctest::Approx(12.0 * lora));

  // QLoRA: the 32 layers' projection weights in NF4 (0.5 B + one fp32 scale per 64 values =
  // 0.5625 B): 32 x 4096 x (12288 + 4096 + 22016 + 11008) = 6 476 005 376 weights; embeddings,
  // head and norms (262 410 240) stay 2 B.
  c.peft = PeftKind::kQlora;
  CHECK(nf4_params(m, c) == 6476005376.0);
  CHECK(frozen_weight_bytes(m, c) == doctest::Approx(6476005376.0 * 0.5625 + 262410240.0 * 2.0));
  f = make_features(m, hw, c).memory;
  CHECK(f.gpu_params_bytes == doctest::Approx(6476005376.0 * 0.5625 + 262410240.0 * 2.0 + 2.0 * lora));

  // Stage 3 on 8 GPUs shards the frozen base and the adapters' states alike.
  c.zero_stage = 3;
  c.gpus_per_node = 8;
  f = make_features(m, hw, c).memory;
  CHECK(f.gpu_params_bytes == doctest::Approx((6476005376.0 * 0.5625 + 262410240.0 * 2.0 + 2.0 * lora) / 8.0));
  CHECK(f.gpu_opt_states_bytes == doctest::Approx(12.0 * lora / 8.0));
}

TEST_CASE("PEFT: no weight gradients for frozen weights; the dequantisation adds traffic; 70B QLoRA fits one H200") {
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  TrainConfig full = config(0, 1);
  full.micro_batch = 4;
  full.gas = 4;
  TrainConfig lora = full;
  lora.peft = PeftKind::kLora;
  TrainConfig qlora = full;
  qlora.peft = PeftKind::kQlora;
  const StepFeatures fl = make_features(m, hw, lora).step;
  CHECK(fl.weight_grad_frac == 0.0);
  CHECK(make_features(m, hw, full).step.weight_grad_frac == 1.0);
  // One pass over the NF4 weights reads 0.5625 B and writes a 2 B weight each.
  CHECK(make_features(m, hw, qlora).step.dequant_bytes_pass == doctest::Approx(6476005376.0 * 2.5625));
  const Prediction pf = evaluate(m, hw, full), pl = evaluate(m, hw, lora), pq = evaluate(m, hw, qlora);
  // Without weight gradients the backward's GEMMs halve: LoRA is faster than full fine-tuning,
  // QLoRA slower than LoRA (the dequantisation) and lighter on memory.
  CHECK(pl.time.backward_s < 0.8 * pf.time.backward_s);
  CHECK(pq.time.step_s > pl.time.step_s);
  CHECK(pq.memory.gpu_total_bytes < pl.memory.gpu_total_bytes - 8e9);
  // MFU's numerator: 4 N for frozen weights + 6 N_lora + attention.
  CHECK(model_flops_per_token(m, lora) ==
        doctest::Approx(model_flops_per_token(m, full) - 2.0 * 6738415616.0 + 6.0 * 39976960.0));

  // GPT-NeoX keeps q, k, v in one module (query_key_value), which PEFT adapts as one: pythia-2.8b
  // (h 2560, i 10240, 32 layers) at r 8 on query_key_value, dense, dense_h_to_4h, dense_4h_to_h:
  // 8 x [(2560 + 7680) + (2560 + 2560) + (2560 + 10240) + (10240 + 2560)] x 32 = 10 485 760.
  TrainConfig neox = lora;
  neox.lora_rank = 8;
  CHECK(lora_params(model("pythia-2.8b"), neox) == 10485760.0);

  // 70B: full fine-tuning and 16-bit LoRA do not fit one H200 without offload; QLoRA does.
  const ModelSpec big = model("llama-2-70b");
  TrainConfig q70 = config(0, 1);
  q70.peft = PeftKind::kQlora;
  q70.activation_checkpointing = true;
  CHECK(evaluate(big, hw, q70).fits);
  q70.peft = PeftKind::kLora;
  CHECK(!evaluate(big, hw, q70).fits);
}

TEST_CASE("DeepSpeed ZeRO-1/2 with CPU offload: the step's 4 B fp32 partition on the GPU, after the gradients left") {
  // stage_1_and_2.py (v0.14.5), step: the updated fp32 partition comes to the GPU whole (4 B per
  // partition parameter) once the boundary has copied the gradients to the host; stage 2 keeps no
  // GPU accumulator (copy_grads_in_partition adds each reduced bucket into the host's copy), stage
  // 1 holds the 16-bit gradients (2 B per parameter) through the backward only.
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double psi = static_cast<double>(m.total_params());
  for (int gpus : {1, 2}) {
    for (int stage : {1, 2}) {
      CAPTURE(gpus);
      CAPTURE(stage);
      TrainConfig c = config(stage, gpus, OffloadDevice::kCpu);
      c.engine = Engine::kDeepSpeed;
      c.offload_pipeline = false;
      c.gas = 4;
      const Features f = make_features(m, hw, c);
      CHECK(f.memory.gpu_step_bytes == doctest::Approx(4.0 * psi / gpus));
      CHECK(f.memory.gpu_step_reclaimable_bytes == doctest::Approx(4.0 * psi / gpus));
      CHECK(f.memory.gpu_grads_bytes == 0.0);
      CHECK(f.memory.gpu_backward_bytes == doctest::Approx(stage == 1 ? 2.0 * psi : 0.0));
      // A smaller card takes the step's buffer from the backward's freed segments: the plan needs
      // the reserved peak less the smaller of the two phases' own bytes.
      const MemoryEstimate<double> e = predict_memory(f.memory, hw.coefs.data());
      CHECK(e.gpu_total_bytes - e.gpu_required_bytes ==
            doctest::Approx(std::min(4.0 * psi / gpus, e.gpu_backward_bytes + e.gpu_live_bytes)));
      // Our backend's offload keeps neither.
      c.engine = Engine::kStepcast;
      c.offload_pipeline = true;
      CHECK(make_features(m, hw, c).memory.gpu_step_bytes == 0.0);
    }
  }
  TrainConfig s3 = config(3, 1, OffloadDevice::kCpu);
  s3.engine = Engine::kDeepSpeed;
  s3.offload_pipeline = false;
  CHECK(make_features(m, hw, s3).memory.gpu_step_bytes == 0.0);
}

TEST_CASE("DeepSpeed without offload, bf16: the step's fp32 gradients come after the backward; 22 B a parameter at stages 1-2") {
  // Per parameter P on one rank, AdamW (12 B of fp32 master weights and moments):
  //   stage 0 (BF16_Optimizer): 2 B weights + 2 B gradients + 4 B flat fp32 gradients + 12 B,
  //     all held through the backward and the step: 20 B; 2 B a parameter of cache besides.
  //   stages 1-2: backward 2 + 2 + 12 = 16 B; step + 4 B fp32 gradient partition + 2 B flattened
  //     16-bit copy = 22 B (measured 56.9 GiB = 22 x 2.775 G for pythia-2.8b on one H200).
  //   stage 3: 16 B; the step casts one sub-group (1e9 parameters) at a time: 6 x 1e9 B.
  const ModelSpec m = model("pythia-2.8b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double P = static_cast<double>(m.total_params());
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    TrainConfig c = config(stage, 1);
    c.engine = Engine::kDeepSpeed;
    const MemoryFeatures mem = make_features(m, hw, c).memory;
    const double states = model_states(mem);
    CHECK(states == doctest::Approx((stage == 0 ? 20.0 : 16.0) * P));
    CHECK(mem.gpu_step_bytes == doctest::Approx(stage == 0 ? 0.0 : stage == 3 ? 6.0 * 1e9 : 6.0 * P));
    CHECK(mem.gpu_engine_cache_bytes == doctest::Approx(stage == 3 ? 0.0 : 2.0 * P));
    // With no activations the step is the peak allocated.
    CoefVector k = hw.coefs;
    k[kActBytesMult] = 0.0;
    k[kLossExtraBytesPerLogit] = 0.0;
    k[kGpuWorkspaceBytes] = 0.0;
    MemoryFeatures small = mem;
    small.logits_elems = 0.0;
    small.gpu_buffers_bytes = 0.0;
    const MemoryEstimate<double> e = predict_memory(small, k.data());
    CHECK(e.gpu_allocated_bytes == doctest::Approx(states + small.gpu_step_bytes));
  }
}

TEST_CASE("memory model: the backward's and the step's peaks, the reserved sum, and what a smaller card needs") {
  // Hand numbers: static 40 GB, backward-only accumulators 4 GB, live 10 GB, step buffers 6 GB.
  //   allocated = max(40 + 4 + 10, 40 + 6) = 54 GB; reserved = 40 + 4 + 10 + 6 + pool reserve
  //   (5 % x 10 GB = 0.5 GB) + engine cache 1 GB = 61.5 GB; required = 61.5 - min(6, 14) = 55.5 GB.
  MemoryFeatures f = two_phase_case();
  const CoefVector c = two_phase_coefs();
  MemoryEstimate<double> e = predict_memory(f, c.data());
  CHECK(e.gpu_allocated_bytes == doctest::Approx(54e9));
  CHECK(e.gpu_total_bytes == doctest::Approx(61.5e9));
  CHECK(e.gpu_reserve_bytes == doctest::Approx(7.5e9));
  CHECK(e.gpu_required_bytes == doctest::Approx(55.5e9));
  // A step larger than the backward's own bytes sets the peak allocated: 40 + 20 = 60 GB; the
  // smaller card reuses the backward's 14 GB of segments: 75.5 - 14 = 61.5 GB.
  f.gpu_step_bytes = 20e9;
  f.gpu_step_reclaimable_bytes = 20e9;
  e = predict_memory(f, c.data());
  CHECK(e.gpu_allocated_bytes == doctest::Approx(60e9));
  CHECK(e.gpu_total_bytes == doctest::Approx(75.5e9));
  CHECK(e.gpu_required_bytes == doctest::Approx(61.5e9));
  // Step buffers a smaller card cannot take from the backward's segments (FSDP2's, made unit by
  // unit): it needs the whole reserved peak.
  f.gpu_step_reclaimable_bytes = 0.0;
  CHECK(predict_memory(f, c.data()).gpu_required_bytes == doctest::Approx(75.5e9));
}

TEST_CASE("memory model with expandable segments: the loss's buffers stay whole, the rest of the cache keeps its share") {
  // The hand case above (allocated 54 GB, reserved 61.5, required 55.5), with expandable segments
  // and a share of 0.4: the cache above the peak is the pool's holes 0.5 GB (the loss's buffers,
  // 0 here) and the rest 7.5 - 0.5 = 7 GB (the step's segments 6, the engine's cache 1), so
  // reserved = 54 + 0.4 x 7 + 0.4 x 0.5 = 57 GB; a card without room frees and remaps every
  // cached page: required = the peak allocated, 54 GB.
  MemoryFeatures f = two_phase_case();
  f.expandable_segments = 1.0;
  CoefVector c = two_phase_coefs();
  c[kExpandableReserveFrac] = 0.4;
  MemoryEstimate<double> e = predict_memory(f, c.data());
  CHECK(e.gpu_allocated_bytes == doctest::Approx(54e9));
  CHECK(e.gpu_total_bytes == doctest::Approx(57e9));
  CHECK(e.gpu_reserve_bytes == doctest::Approx(3e9));
  CHECK(e.gpu_required_bytes == doctest::Approx(54e9));
  // The loss's freed buffers (2 B a logit x 1e9 logits = 2 GB, above the holes' share 0.2 GB)
  // stay whole: reserved = 54 + 2.8 + 2 = 58.8 GB. Share 1 gives back the default allocator's
  // reserve; share 0 leaves only the loss's buffers above the peak.
  f.logits_elems = 1e9;
  f.logit_bytes = 0.0;
  c[kLossReserveBytesPerLogit] = 2.0;
  e = predict_memory(f, c.data());
  CHECK(e.gpu_total_bytes == doctest::Approx(58.8e9));
  c[kExpandableReserveFrac] = 1.0;
  MemoryFeatures def = f;
  def.expandable_segments = 0.0;
  CHECK(predict_memory(f, c.data()).gpu_total_bytes == doctest::Approx(predict_memory(def, c.data()).gpu_total_bytes));
  CHECK(predict_memory(f, c.data()).gpu_required_bytes == doctest::Approx(54e9));
  c[kExpandableReserveFrac] = 0.0;
  e = predict_memory(f, c.data());
  CHECK(e.gpu_total_bytes == doctest::Approx(e.gpu_allocated_bytes + 2e9));
  CHECK(e.gpu_required_bytes == doctest::Approx(e.gpu_allocated_bytes));
}

TEST_CASE("FSDP2 model states: fp32 shards as the master copy, fp32 gradient shards, stage 2's unsharded bf16 copy") {
  // llama-2-7b, bf16, AdamW, n ranks (T trainable parameters). fully_shard keeps an fp32 shard
  // (4 T / n, the optimizer's parameter), an fp32 gradient shard (4 T / n) and the moments
  // (8 T / n); stage 2 keeps every unit's unsharded bf16 copy from forward to backward (2 T).
  // Stage 2: 16 T / n + 2 T in all; stage 3: 16 T / n (its gathered units are buffers).
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double T = static_cast<double>(m.total_params());
  for (int n : {1, 2}) {
    for (int stage : {2, 3}) {
      TrainConfig c = config(stage, n);
      c.engine = Engine::kFsdp2;
      const MemoryFeatures mem = make_features(m, hw, c).memory;
      CHECK(mem.gpu_params_bytes == doctest::Approx(4.0 * T / n + (stage == 2 ? 2.0 * T : 0.0)));
      CHECK(mem.gpu_grads_bytes == doctest::Approx(4.0 * T / n));
      CHECK(mem.gpu_opt_states_bytes == doctest::Approx(8.0 * T / n));
    }
  }
  // fp32: no master copy either way, and stage 2's unsharded copy is fp32 (4 T).
  TrainConfig c = config(2, 1);
  c.engine = Engine::kFsdp2;
  c.precision = Precision::kFp32;
  const MemoryFeatures fp32 = make_features(m, hw, c).memory;
  CHECK(fp32.gpu_params_bytes == doctest::Approx(4.0 * T + 4.0 * T));
  CHECK(fp32.gpu_opt_states_bytes == doctest::Approx(8.0 * T));
  // Our backend's stage 2 on one rank is unchanged: 2 T of bf16 weights, 2 T of gradients, 12 T.
  c = config(2, 1);
  const MemoryFeatures ours = make_features(m, hw, c).memory;
  CHECK(ours.gpu_params_bytes == doctest::Approx(2.0 * T));
  CHECK(ours.gpu_grads_bytes == doctest::Approx(2.0 * T));
  CHECK(ours.gpu_opt_states_bytes == doctest::Approx(12.0 * T));
}

TEST_CASE("FSDP2 without gradient sync: the unsharded fp32 accumulators are the backward's, the sharded gradients the step's") {
  // llama-2-7b, bf16, GAS 4, no sync before the last micro-batch: 4 T of fp32 accumulators through
  // the backward, turned unit by unit into the 4 T / n sharded gradients the step uses.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double T = static_cast<double>(m.total_params());
  for (int n : {1, 2}) {
    TrainConfig c = config(3, n);
    c.engine = Engine::kFsdp2;
    c.gas = 4;
    const MemoryFeatures mem = make_features(m, hw, c).memory;
    CHECK(mem.gpu_grads_bytes == 0.0);
    CHECK(mem.gpu_backward_bytes == doctest::Approx(4.0 * T));
    CHECK(mem.gpu_step_bytes == doctest::Approx(4.0 * T / n));
    // Not reclaimed from the backward's segments on a smaller card: it needs the reserved peak.
    CHECK(mem.gpu_step_reclaimable_bytes == 0.0);
  }
}

TEST_CASE("FSDP2's root module: its parameters gathered through the backward at stage 3, the head's gradient held at both") {
  // llama-2-7b, bf16, one rank (no reduce-scatter buckets). The root holds the embedding and the
  // untied head (32000 x 4096 each) and the final norm (4096): R = 262,148,096 parameters. At
  // stage 3 the gathered root (2 R B) and the head's unsharded gradient (2 x 131,072,000 B) sit
  // beside the layers' units: two gathered layers and one layer's gradient (3 x 2 x 202,383,360 B).
  // At stage 2 every parameter is already unsharded (model states); the head's gradient remains.
  const ModelSpec m = model("llama-2-7b");
  const HardwareProfile hw = hardware("h200-sxm");
  const double layer = 202383360.0, head = 32000.0 * 4096.0, root = 2.0 * head + 4096.0;
  REQUIRE(static_cast<double>(m.params_per_layer()) == layer);
  TrainConfig c = config(3, 1);
  c.engine = Engine::kFsdp2;
  CHECK(make_features(m, hw, c).memory.gpu_buffers_bytes == doctest::Approx(2.0 * root + 2.0 * head + 3.0 * 2.0 * layer));
  c = config(2, 1);
  c.engine = Engine::kFsdp2;
  CHECK(make_features(m, hw, c).memory.gpu_buffers_bytes == doctest::Approx(2.0 * head));
  // Our backend and DeepSpeed keep their own units: the larger of a layer and the embedding.
  c = config(3, 1);
  CHECK(make_features(m, hw, c).memory.gpu_buffers_bytes == doctest::Approx(3.0 * 2.0 * layer));
}
