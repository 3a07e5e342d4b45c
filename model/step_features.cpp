#include "model/step_features.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"
#include "model/metrics.h"

namespace stepcast {

namespace {

// Bytes of one element of the working (compute) precision.
double working_bytes(Precision p) { return p == Precision::kFp32 ? 4.0 : 2.0; }

// 8-bit AdamW (Dettmers et al. 2022): one byte per moment plus one fp32 absmax
// per block of 2048 values, for each of the two moments.
constexpr double k8bitBlock = 2048.0;
constexpr double k8bitStateBytes = 2.0 + 2.0 * 4.0 / k8bitBlock;

}  // namespace

// Memory traffic of one AdamW update, per parameter (DRAM-bound on the CPU; docs/h200_measurements.md):
// read master, m, v and the gradient; write master, m, v; plus the 16-bit copy
// of the updated parameter when training in mixed precision. On the CPU the
// gradient is read as it came down (working precision, no host accumulator)
// and the updated parameter is written over it in the pinned buffer: 28 B
// for bf16 AdamW. 8-bit AdamW offloaded in bf16 keeps split master weights
// (backend/cpu_adamw.h: the bf16 upper half, which is the copy, and a 16-bit
// remainder): 14 B, where fp32 master weights and a copy would be 16 B.
bool splits_master(OptimizerKind opt, Precision precision, bool on_cpu, bool split_master) {
  return split_master && opt == OptimizerKind::kAdamW8bit && precision == Precision::kBf16 && on_cpu;
}

double optimizer_traffic_bytes(OptimizerKind opt, Precision precision, bool on_cpu, bool split_master) {
  const bool mixed = precision != Precision::kFp32;
  const double grad = working_bytes(precision);
  const double moments = opt == OptimizerKind::kAdamW ? 8.0 : k8bitStateBytes;
  double bytes = grad + 4.0 /*master read*/ + 4.0 /*master write*/ + 2.0 * moments;
  if (splits_master(opt, precision, on_cpu, split_master)) return bytes;  // halves read and written; the upper one is the copy
  if (mixed) bytes += 2.0;          // 16-bit copy of the updated parameter
  else if (on_cpu) bytes += 4.0;    // fp32 copy into the pinned upload buffer
  return bytes;
}

// DeepSpeed's ZeRO-3 optimizer steps its partition in sub-groups of at most this many elements
// (sub_group_size, runtime/zero/config.py, default 1e9; our config leaves it).
constexpr double kDeepSpeedSubGroupElems = 1e9;

// HBM bytes per parameter of DeepSpeed's (v0.14.5) optimizer step on the GPU, counted from its
// source for the gradient clipping our DeepSpeed config sets (deepspeed_config.cpp), fused Adam
// (FusedAdam: parameter, first and second moment read and written, gradient read: 28 B in fp32):
// - 16-bit at stages 0-1, BF16_Optimizer (bf16_optimizer.py, step): the global norm of the fp32
//   gradients (read 4), clipping in place (read and write 4), Adam (28), the 16-bit copy of the
//   updated parameters (read 4, write 2), clearing the fp32 gradients (write 4): 50 B;
// - 16-bit at stages 2-3 (stage_1_and_2.py, stage3.py, step): the norm of each 16-bit gradient
//   through a float64 copy (read 2, write 8, read 8), the partition flattened (read 2, write 2)
//   and cast to fp32 (read 2, write 4), clipping (8), Adam (28), the 16-bit copy back (6): 70 B;
// - fp32 at stage 0 (the engine's clip_grad_norm_ and the optimizer): norm 4, clipping 8, Adam
//   28: 40 B; at stages 1-3 the float64 norm (4 + 8 + 8), the flattening (8), clipping (8), Adam
//   (28) and the copy back into the partition (8): 72 B.
// Measured on one H200 (pythia-2.8b, the optimizer phase of the peer harness): 0.042-0.046 s at
// stages 0-2 and 0.080-0.093 s at stage 3, where 28 B a parameter at the fitted bandwidth gives
// 0.022 s (data/runs/h200-sxm/2026-12-02_peers_deepspeed_1gpu_zero3_curve.jsonl).
double deepspeed_gpu_step_bytes(int zero_stage, Precision precision) {
  if (precision == Precision::kFp32) return zero_stage == 0 ? 40.0 : 72.0;
  return zero_stage <= 1 ? 50.0 : 70.0;
}

// Arithmetic per parameter of one update: AdamW is ~15 FLOPs (two moment
// updates, bias corrections, sqrt, division, weight decay); block-wise 8-bit
// adds dequantisation, absmax and a search in the 256-entry dynamic map.
double optimizer_flops(OptimizerKind opt) { return opt == OptimizerKind::kAdamW ? 15.0 : 60.0; }


std::array<GemmShape, kNumGemmClasses> gemm_classes(const ModelSpec& spec, double tokens) {
  const double h = static_cast<double>(spec.hidden_size), L = static_cast<double>(spec.num_layers);
  const double qkv_n = static_cast<double>(spec.q_dim() + 2 * spec.kv_dim());
  const double i = static_cast<double>(spec.intermediate_size);
  return {GemmShape{tokens, qkv_n, h, L}, GemmShape{tokens, h, static_cast<double>(spec.q_dim()), L},
          GemmShape{tokens, spec.gated_mlp ? 2.0 * i : i, h, L}, GemmShape{tokens, h, i, L},
          GemmShape{tokens, static_cast<double>(spec.vocab_size), static_cast<double>(spec.embed_dim()), 1.0}};
}

double causal_attention_fwd_flops(double batch, double seq_len, double q_dim, AttentionKind attention) {
  const double full_square = 4.0 * batch * seq_len * seq_len * q_dim;
  return attention == AttentionKind::kFlash ? 0.5 * full_square : full_square;
}

double master_weight_bytes_per_param(Precision precision) {
  return precision == Precision::kFp32 ? 0.0 : 4.0;  // fp32 copy of 16-bit weights
}

double optimizer_state_bytes_per_param(OptimizerKind opt, Precision precision) {
  const double master = master_weight_bytes_per_param(precision);
  const double moments = opt == OptimizerKind::kAdamW ? 8.0 : k8bitStateBytes;
  return master + moments;
}

int64_t small_tensor_params(const ModelSpec& m, int64_t min_size) {
  auto small = [&](int64_t n) { return n < min_size ? n : 0; };
  const int64_t h = m.hidden_size;
  const int64_t norm_tensors = m.norm == NormKind::kLayer ? 2 : 1;  // weight (+ bias)
  int64_t per_layer = m.norms_per_layer * norm_tensors * small(h);
  if (m.qkv_bias) per_layer += small(m.q_dim()) + 2 * small(m.kv_dim());
  if (m.attn_out_bias) per_layer += small(h);
  if (m.mlp_bias) per_layer += (m.gated_mlp ? 2 : 1) * small(m.intermediate_size) + small(h);
  int64_t total = m.num_layers * per_layer;
  if (m.final_norm) total += norm_tensors * small(h);
  if (m.lm_head_bias) total += small(m.vocab_size);
  return total;
}

// Saved activations per token per layer, in elements, following the
// accounting of Korthikanti et al. 2022 ("Reducing Activation Recomputation in
// Large Transformer Models", section 4.1), generalised to grouped-query
// attention and gated MLPs, without dropout masks (fine-tuning runs with
// dropout off):
//   norms      the input of each norm                        norms_per_layer * h
//   attention  the q/k/v projection input (norm output)       h
//              q, k, v after rotary                           q_dim + 2 kv_dim
//              attention output = out-projection input        q_dim
//              math attention only: softmax probabilities     heads * s
//   MLP        its input (norm output; shared with attention  h (0 for GPT-J)
//              when one norm feeds both)
//              gated: gate, up, silu(gate), gate*up           4 i
//              plain: pre- and post-activation                2 i
// tests/test_memory.cpp derives it by hand for llama-2-7b and sets it beside
// Korthikanti's 34 s b h bytes per layer.
double activation_elems_per_token_per_layer(const ModelSpec& m, AttentionKind attention,
                                            double seq_len) {
  const double h = static_cast<double>(m.hidden_size);
  double elems = static_cast<double>(m.norms_per_layer) * h;
  elems += h + m.q_dim() + 2.0 * m.kv_dim() + m.q_dim();
  if (attention == AttentionKind::kMath) elems += static_cast<double>(m.num_heads) * seq_len;
  const bool shared_input = m.parallel_residual && m.norms_per_layer == 1;
  if (!shared_input) elems += h;
  elems += (m.gated_mlp ? 4.0 : 2.0) * static_cast<double>(m.intermediate_size);
  return elems;
}

namespace {

// DeepSpeed ZeRO-3's default sub_group_size (runtime/zero/config.py): the optimizer steps over
// sub-groups of at most this many parameters, each with its own fp32 buffers.
constexpr double kDeepSpeedSubGroupParams = 1e9;

// Bytes torch's caching host allocator pins for a request: the next power of two.
double pinned_host_bytes(double bytes) {
  return bytes <= 0.0 ? 0.0 : std::exp2(std::ceil(std::log2(bytes)));
}

// glibc's malloc maps a request at or above its mmap threshold to fresh pages, which fault on first
// touch; the threshold rises with the sizes freed up to DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on
// 64-bit targets (malloc/malloc.c), so a smaller request reuses the heap once one its size has
// been freed. Measured on one H100 host, fp32 GPU tensors copied with .to("cpu"): 11.1-11.4 GB/s
// at 16 and 25 MiB, 1.13-1.21 GB/s from 48 MiB to 1 GiB, 2 % of a pinned copy
// (bench/fsdp2_offload_copy.py, data/bench/h100-sxm/2026-12-07_fsdp2_offload_copy.json).
constexpr double kFreshPagesMinBytes = 32.0 * 1024.0 * 1024.0;

// Calls visit(numel, copies) for each weight matrix of the model as Hugging Face registers it
// (q, k, v, gate and up apart: the parts of the layer's projections, once per layer; the
// embedding, and the head when untied). Norms and biases are not visited.
template <class Visit>
void for_each_weight_matrix(const ModelSpec& spec, Visit visit) {
  const double layers = static_cast<double>(spec.num_layers);
  for (const LayerProjection& p : layer_projections(spec))
    for (int64_t rows : p.part_rows) visit(static_cast<double>(rows) * static_cast<double>(p.in), layers);
  visit(static_cast<double>(spec.vocab_size) * static_cast<double>(spec.embed_dim()), spec.tied_embeddings ? 1.0 : 2.0);
}

// Elements of the model's parameters whose tensor cut into `parts` makes pieces smaller than
// `min_bytes` at `bytes_per_param`: the norms and biases, and the weight matrices by size.
double elems_in_pieces_below(const ModelSpec& spec, double bytes_per_param, double parts, double min_bytes) {
  double large = 0.0;
  for_each_weight_matrix(spec, [&](double numel, double copies) {
    if (numel / parts * bytes_per_param >= min_bytes) large += numel * copies;
  });
  return static_cast<double>(spec.total_params()) - large;
}

// Bytes pinned for one host tensor of `bytes_per_param` per parameter for every weight of the
// model as Hugging Face registers it (q, k, v, gate and up apart: the parts of the layer's
// projections; embeddings), each tensor cut into `parts` equal partitions (ceil(numel / parts)
// elements, DeepSpeed's padded partition) and each partition rounded up by the allocator on its own.
double pinned_per_tensor_bytes(const ModelSpec& spec, double bytes_per_param, double parts = 1.0) {
  double bytes = 0.0;
  for_each_weight_matrix(spec, [&](double numel, double copies) {
    bytes += copies * pinned_host_bytes(std::ceil(numel / parts) * bytes_per_param);
  });
  return bytes;
}

// Bytes pinned by our backend for one host buffer per parameter unit (backend/engine/layout.cpp:
// the embedding, each layer, the head with the final norm; each unit's flat buffer padded to a
// multiple of world x 2048 elements), holding `elems_div`-th of each unit at `bytes_per_elem`,
// each buffer rounded up to a power of two by torch's caching host allocator. A PEFT run's units
// hold its adapters, all in the layers. llama-2-13b's layer (317 M parameters) takes a 1 GiB bf16
// buffer where its bytes are 605 MiB.
double backend_pinned_unit_bytes(const ModelSpec& spec, double trainable, bool peft, double world, double elems_div,
                                 double bytes_per_elem) {
  const double align = world * 2048.0;
  const auto unit = [&](double numel) {
    const double padded = std::max(align, std::ceil(numel / align) * align);
    return pinned_host_bytes(padded / elems_div * bytes_per_elem);
  };
  const double L = static_cast<double>(spec.num_layers);
  if (peft) return L * unit(trainable / L) + 2.0 * unit(0.0);
  const double head = static_cast<double>(spec.lm_head_params() + spec.final_norm_params());
  return unit(static_cast<double>(spec.embedding_params())) + L * unit(static_cast<double>(spec.params_per_layer())) +
         unit(head);
}

// The projections of one layer (model_spec.h layer_projections) as the cost model uses them:
// (out, in), whether LoRA adapts each, and the adapters a fused one carries.
struct Projection {
  double out = 0, in = 0;
  bool adapted = false;
  double segments = 1;
};
std::array<Projection, 4> projections(const ModelSpec& m, const TrainConfig& c) {
  std::array<Projection, 4> out{};
  const auto layer = layer_projections(m);
  for (size_t k = 0; k < out.size(); ++k)
    out[k] = Projection{static_cast<double>(layer[k].out), static_cast<double>(layer[k].in),
                        lora_adapts(layer[k].attention, c.lora_targets),
                        static_cast<double>(layer[k].part_rows.size())};
  return out;
}

}  // namespace

bool fsdp2_uploads_block(const TrainConfig& c) {
  return c.engine == Engine::kFsdp2 && c.offload_optimizer == OffloadDevice::kCpu && c.world_size() == 1;
}

double lora_params(const ModelSpec& spec, const TrainConfig& c) {
  if (!c.peft_enabled()) return 0.0;
  double per_layer = 0.0;
  for (const Projection& p : projections(spec, c))
    if (p.adapted) per_layer += static_cast<double>(c.lora_rank) * (p.segments * p.in + p.out);
  return per_layer * static_cast<double>(spec.num_layers);
}

double nf4_params(const ModelSpec& spec, const TrainConfig& c) {
  if (c.peft != PeftKind::kQlora) return 0.0;
  double per_layer = 0.0;
  for (const Projection& p : projections(spec, c)) per_layer += p.out * p.in;
  return per_layer * static_cast<double>(spec.num_layers);
}

double frozen_weight_bytes(const ModelSpec& spec, const TrainConfig& c) {
  if (!c.peft_enabled()) return 0.0;
  const double params = static_cast<double>(spec.total_params()), nf4 = nf4_params(spec, c);
  return nf4 * kNf4BytesPerParam + (params - nf4) * working_bytes(c.precision);
}

double model_flops_per_token(const ModelSpec& spec, const TrainConfig& c) {
  const double params = static_cast<double>(spec.total_params());
  const double full = model_flops_per_token(params, static_cast<double>(spec.num_layers),
                                            static_cast<double>(spec.q_dim()), static_cast<double>(c.seq_len));
  if (!c.peft_enabled()) return full;
  return full - 2.0 * params + 6.0 * lora_params(spec, c);
}

double peer_cpu_optimizer_threads(const TrainConfig& config, const ResourceLimits& limits, double node_cores) {
  if (limits.cpu_threads_per_rank > 0) return limits.cpu_threads_per_rank;
  return config.gpus_per_node > 1 ? 1.0 : node_cores;
}

double node_cpu_cores(const HardwareProfile& hw, const TrainConfig& config, const ResourceLimits& limits) {
  return limits.cpu_cores_node > 0 ? limits.cpu_cores_node : hw.host.cpu_cores_per_gpu * config.gpus_per_node;
}

double bucket_elems(const ModelSpec& spec) {
  return static_cast<double>(spec.hidden_size) * static_cast<double>(spec.hidden_size);
}

Features make_features(const ModelSpec& spec, const HardwareProfile& hw, const TrainConfig& c,
                       const ResourceLimits& limits) {
  validate_config(c);
  Features out;
  StepFeatures& f = out.step;
  MemoryFeatures& mem = out.memory;

  const double n = c.world_size();
  const double params = static_cast<double>(spec.total_params());
  const double b = static_cast<double>(c.micro_batch);
  const double s = static_cast<double>(c.seq_len);
  const double tokens = b * s;
  const double L = static_cast<double>(spec.num_layers);
  const double h = static_cast<double>(spec.hidden_size);
  const double wb = working_bytes(c.precision);  // parameter, gradient and activation bytes
  const bool offload_opt = c.offload_optimizer == OffloadDevice::kCpu;
  const bool offload_par = c.offload_params == OffloadDevice::kCpu;
  const bool multi_rank = n > 1;
  const int stage = c.zero_stage;
  // PEFT: the adapters are what is reduced, partitioned and updated; the frozen base is stored
  // (sharded at stage 3 and gathered with the adapters) and computed with, never updated.
  const bool peft = c.peft_enabled();
  const double trainable = peft ? lora_params(spec, c) : params;
  const double frozen_bytes = frozen_weight_bytes(spec, c);
  // The peers run transformers' eager attention when the plan says math: its score matrix costs
  // traffic (below) and memory (the activations').
  const bool peer_eager_attention = c.attention == AttentionKind::kMath && c.engine != Engine::kStepcast;

  // --- compute ---------------------------------------------------------------
  f.gemms = gemm_classes(spec, tokens);
  // Causal attention: QK^T and PV are 2 b s^2 d_attn FLOPs each per layer for
  // the full square; flash kernels skip the masked half, the math path does not.
  f.attn_fwd_flops = causal_attention_fwd_flops(b, s, static_cast<double>(spec.q_dim()), c.attention) * L;
  if (c.attention == AttentionKind::kFlash) {
    f.attn_bwd_flops_mult = kFlashAttnBwdFlopsMult;
    f.attn_uses_gemm_eff = 0;
    const AttnHeadDimRel rel = attention_head_dim_rel(hw.gpu, static_cast<double>(spec.head_dim));
    f.attn_head_dim_rel_fwd = rel.fwd;
    f.attn_head_dim_rel_bwd = rel.bwd;
  } else {
    f.attn_bwd_flops_mult = 2.0;
    f.attn_uses_gemm_eff = 1;
  }
  // transformers' eager attention, the peers' math path, is a chain of kernels over the full
  // b x heads x s x s score matrix, each reading and writing it in HBM. Counted per score from
  // transformers 5.17's code, 16-bit activations (llama's eager_attention_forward): QK^T writes 2 B;
  // the scaling multiply and the causal-mask add read and write 2 + 2 each; softmax in fp32 reads 2,
  // writes 4; the cast back reads 4, writes 2; PV reads 2: 24 B forward. Backward: dP written 2 and
  // P read 2 (for dV); the cast's backward reads 2, writes 4; softmax's reads 4 + 4, writes 2; the
  // scaling's reads 2, writes 2; QK^T's two products read 2 + 2: 28 B. GPT-J upcasts query and key
  // to fp32 (modeling_gptj.py, _attn), so its scores are fp32 up to the cast: 36 B forward (4 +
  // 8 + 8 + 8 + 6 + 2), 42 B backward; an fp32 run's are fp32 throughout (no cast: 32 B forward),
  // counted as GPT-J's. Measured with DeepSpeed ZeRO-3 on one H200, llama-2-7b with
  // checkpointing: the eager path costs 0.24 s over SDPA at micro-batch 2, sequence 2048, where
  // 78 B per score (forward, recompute, backward) at HBM bandwidth is 0.29 s
  // (data/runs/h200-sxm/2026-12-02_peers_deepspeed_1gpu_attention.jsonl).
  if (peer_eager_attention) {
    const bool fp32_query_key = transformers_impl(spec).fp32_query_key;
    const bool fp32_scores = fp32_query_key || wb >= 4.0;
    // GPT-J's fp32 query and key make QK^T (2 b s^2 d_attn of the 4 b s^2 d_attn) and, in the
    // backward, its two gradient products fp32 matrix products. Measured with DeepSpeed ZeRO-2 on
    // two H200s, micro-batch 2 at 2048 tokens: 0.189 s forward and 0.358 s backward a
    // micro-batch, where the bf16 count predicted 0.129 and 0.233; 3.9 TFLOP of QK^T at 0.86 of
    // the H200's 67 TFLOP/s fp32 is 0.067 s (data/runs/h200-sxm/2026-12-04_peers_deepspeed_2gpu_recommend.jsonl).
    if (fp32_query_key && wb < 4.0) f.attn_fp32_flops_frac = 0.5;
    const double scores = b * static_cast<double>(spec.num_heads) * s * s * L;
    f.attn_score_bytes_fwd = scores * (fp32_scores ? 36.0 : 24.0);
    f.attn_score_bytes_bwd = scores * (fp32_scores ? 42.0 : 28.0);
  }
  f.seq_len = s;
  f.weight_grad_frac = peft ? 0.0 : 1.0;
  // LoRA's work per adapted projection (out x in, S segments) and micro-batch, as transformer.cpp
  // runs it: x A^T (tokens x S r x in), then one GEMM y + scale low B^T against B's segments as a
  // block-diagonal (out x S r) matrix, which reads the base output and writes the sum. Its
  // forward traffic beyond the GEMMs' operands: read x (in), read y and write the sum (2 out).
  // Its backward: the output gradient passes to y as it is; B's and low's gradients read it
  // (2 out), A's gradient reads x and writes its input gradient, added into the base's (read two,
  // write one in): 5 in + 2 out. A dropout on the adapter input reads and writes in once more each way.
  double lora_act_per_layer = 0.0;
  if (peft) {
    const double r = static_cast<double>(c.lora_rank);
    size_t k = 0;
    for (const Projection& p : projections(spec, c)) {
      if (!p.adapted) continue;
      f.adapter_gemms[k++] = GemmShape{tokens, p.segments * r, p.in, L};
      f.adapter_gemms[k++] = GemmShape{tokens, p.out, p.segments * r, L};
      const double drop = c.lora_dropout > 0.0 ? 2.0 * p.in : 0.0;
      f.adapter_bytes_fwd += tokens * L * wb * (p.in + 2.0 * p.out + drop);
      f.adapter_bytes_bwd += tokens * L * wb * (5.0 * p.in + 2.0 * p.out + drop);
      // Saved for the backward: A's output (r) and, with dropout, the dropped input (in).
      lora_act_per_layer += p.segments * r + (c.lora_dropout > 0.0 ? p.in : 0.0);
    }
    f.dequant_bytes_pass = nf4_params(spec, c) * (kNf4BytesPerParam + wb);
    // A frozen projection without an adapter needs no weight gradient, so autograd keeps no
    // copy of its input (its input gradient needs the weight only): the activation count
    // (activation_elems_per_token_per_layer) loses that input, as measured with attention-only
    // adapters (docs/peft.md). Where one norm feeds attention and MLP (GPT-J) their input is one
    // tensor, kept while either projection has an adapter.
    const auto proj = projections(spec, c);
    double unsaved = 0.0;
    for (const Projection& p : proj)
      if (!p.adapted) unsaved += p.in;
    const bool shared_input = spec.parallel_residual && spec.norms_per_layer == 1;
    if (shared_input && (!proj[0].adapted || !proj[2].adapted)) unsaved -= h;
    lora_act_per_layer -= unsaved;
  }
  const double act_per_layer = activation_elems_per_token_per_layer(spec, c.attention, s);
  f.elementwise_bytes_fwd = tokens * L * act_per_layer * wb;
  f.num_layers = L;
  // The family's host time relative to the profiled families' mean: what separates GPT-J's
  // eager attention (2.97 ms a layer forward on the H200's host) from pythia's (1.27 ms).
  const auto& rel = hw.host.transformers_layer_rel;
  if (c.engine != Engine::kStepcast) {
    if (const auto it = rel.find(spec.model_type); it != rel.end()) {
      f.impl_host_fwd_rel = it->second.fwd_rel;
      f.impl_host_bwd_rel = it->second.bwd_rel;
    }
  }
  f.recompute = c.activation_checkpointing ? 1.0 : 0.0;
  f.gas = static_cast<double>(c.gas);
  f.peak_flops_per_s = hw.gpu.peak_flops_per_s(c.precision);
  f.fp32_peak_flops_per_s = hw.gpu.peak_fp32_flops_per_s;
  // The GEMM efficiencies are fitted on the H200; another GPU's GEMMs reach its own share of
  // its peak (hardware.h matmul_eff_rel_h200).
  f.gemm_peak_flops_per_s = f.peak_flops_per_s * hw.gpu.matmul_eff_rel_h200;
  f.gemm_fp32 = c.precision == Precision::kFp32 ? 1.0 : 0.0;
  f.hbm_bytes_per_s = hw.gpu.memory_bytes_per_s;

  // --- collectives -------------------------------------------------------------
  const double bucket = bucket_elems(spec);
  const double grad_bytes_full = trainable * wb;
  const double param_bytes_full = trainable * wb + frozen_bytes;  // what a stage-3 gather brings
  const double grad_calls = std::ceil(trainable / bucket);
  const double units = L + 2.0;  // stage-3 gather units: layers, embedding, head
  // Modules with parameters (DeepSpeed's fetch granularity under ZeRO-3).
  const double modules = static_cast<double>(spec.param_modules_per_layer()) * L +
                         static_cast<double>(spec.param_modules_outside_layers());
  // DeepSpeed's ZeRO-3 fetches per micro-batch: every module with parameters before its forward
  // and before its backward, from Python hooks on the launching thread, one rank or many
  // (runtime/zero/parameter_offload.py); it releases a module's parameters after each forward,
  // the checkpointed recompute's too, so checkpointing adds a third round. FSDP2 fetches per
  // fully_shard unit, which the layer overhead already carries: the same term for it made its
  // cross-validated error worse (docs/engines.md), so its feature stays 0.
  const double fetch_rounds = 2.0 + (c.activation_checkpointing ? 1.0 : 0.0);
  if (stage == 3 && c.engine == Engine::kDeepSpeed) {
    f.param_fetches_micro = fetch_rounds * modules;
    f.param_fetch_bytes_micro = fetch_rounds * param_bytes_full;  // each round makes the whole model available
  }
  // One round of the fetches (and of the stage-3 gathers) precedes the forward's modules; the
  // peer harness's forward holds it (measured on one H200: ZeRO-3's forward is 0.09-0.10 s per
  // micro-batch longer than ZeRO-1's for pythia-2.8b, 195 modules, at micro-batch 1, 4 and 8).
  if (stage == 3) f.fetch_fwd_frac = 1.0 / (c.engine == Engine::kDeepSpeed ? fetch_rounds : 2.0);
  // DeepSpeed's ZeRO optimizers hook every trainable tensor's gradient: stage 3
  // (runtime/zero/stage3.py) and stages 1-2 alike (runtime/zero/stage_1_and_2.py,
  // create_reduce_and_remove_grad_hooks, registered at stage 1 because the config we write sets
  // overlap_comm). Stage 2's hooks bucket, reduce and copy every micro-batch; stage 1's do that
  // work only on the last micro-batch (reduce_ready_partitions_and_remove_grads tests
  // is_gradient_accumulation_boundary) and return at once before it. Stage 0 runs
  // BF16_Optimizer without hooks. Measured on one H200, pythia-2.8b (388 tensors) at micro-batch
  // 1: the backward is 0.035 s a micro-batch longer at stage 1, GAS 2, and 0.056 s at stage 2
  // than at stage 0, hidden behind the GPU's backward from micro-batch 4
  // (data/runs/h200-sxm/2026-12-01_peers_deepspeed_1gpu*.jsonl); at stage 1, GAS 4, sequence
  // 1024 it is 0.092 s a micro-batch in all (2026-12-02_peers_deepspeed_1gpu_holdout5.jsonl).
  const double hooked_tensors = static_cast<double>(spec.param_tensors_per_layer()) * L +
                                static_cast<double>(spec.param_tensors_outside_layers());
  if (c.engine == Engine::kDeepSpeed && stage >= 2) f.grad_hooks_micro = hooked_tensors;
  if (c.engine == Engine::kDeepSpeed && stage == 1) f.grad_hooks_boundary = hooked_tensors;
  // FSDP2 spends host time once a step per parameter tensor in a backward, whether it reduces
  // after every micro-batch or after the last only (the post-backward's per-tensor Python in
  // torch fsdp/_fully_shard: foreach_reduce and the gradients' DTensor wrapping). Measured on one
  // H200, pythia-2.8b at micro-batch 1: the backward is 3.4 ms a layer a micro-batch at GAS 2 and
  // 2.2 ms at GAS 4, i.e. 1.0 ms plus 4.8 ms once a step (2026-12-02_peers_fsdp2_1gpu_holdout4
  // .jsonl); reducing after each of the two micro-batches took the same 0.221 s of backward as
  // reducing after the last (holdout5), so the cost is not the reduce's on each micro-batch.
  if (c.engine == Engine::kFsdp2) f.grad_hooks_boundary = hooked_tensors;
  // The Stepcast backend's host work per unit (layers, embedding, head) beyond its launches
  // (backend/engine/engine.cpp): from stage 2, each unit's backward allocates its flat gradient,
  // reduce-scatters it, adds the shard into the accumulator and records an event, every
  // micro-batch (reduce_unit; stages 0-1 accumulate in place until the last); at stage 3 each
  // unit is gathered and released in the forward and again in the backward (gather, release).
  // On one H200 machine, llama-2-7b at micro-batch 1, 512 tokens, GAS 16, the step took 1.268 s
  // at stage 0, 1.445 s at stage 2 and 1.636 s at stage 3: 0.33 ms a unit a micro-batch from
  // stage 2, 0.34 ms more at stage 3 (2026-12-03_host_floor_by_stage_1gpu.jsonl); the model had
  // none of it. The rates are fitted as the peers' hook and fetch costs are.
  if (c.engine == Engine::kStepcast && stage >= 2) f.grad_hooks_micro = units;
  if (c.engine == Engine::kStepcast && stage == 3) f.param_fetches_micro = 2.0 * units;
  if (multi_rank) {
    f.gather_bus_factor = all_gather_bus_factor(n);
    if (stage == 0) {
      f.grad_comm_bus_factor = allreduce_bus_factor(n);
      f.grad_comm_is_allreduce = 1.0;
    } else {
      f.grad_comm_bus_factor = reduce_scatter_bus_factor(n);
    }
    // FSDP2 without gradient sync before the last micro-batch holds the whole gradients and
    // reduce-scatters them once, on the last.
    const bool fsdp2_sync_last = c.engine == Engine::kFsdp2 && c.gas > 1 && !c.grad_sync_each_micro;
    if (stage <= 1 || fsdp2_sync_last) {
      // Gradients accumulate locally; one reduction on the last micro-batch.
      f.grad_comm_bytes_boundary = grad_bytes_full;
      f.grad_comm_calls_boundary = grad_calls;
    } else {
      // Stages 2 and 3 cannot hold full gradients: reduce-scatter every micro-batch.
      f.grad_comm_bytes_micro = grad_bytes_full;
      f.grad_comm_calls_micro = grad_calls;
    }
    if (stage == 3) {
      // Gather each unit before its forward and again before its backward (a
      // checkpointed recompute runs inside the backward gather window).
      f.gather_bytes_micro = 2.0 * param_bytes_full;
      f.gather_calls_micro = 2.0 * units;
      if (c.engine == Engine::kDeepSpeed) {
        f.gather_bytes_micro = fetch_rounds * param_bytes_full;
        f.gather_calls_micro = fetch_rounds * modules;
      }
    } else if (stage >= 1) {
      // Each rank updated its shard: all-gather the new parameters.
      f.post_step_gather_bytes = trainable * wb;
      f.post_step_gather_calls = grad_calls;
    }
  }
  if (c.engine == Engine::kStepcast) {
    // backend/engine/engine.cpp: prepare_grads zeroes a unit's whole gradient buffer (one
    // write) and reduce_unit adds the reduced shard into the accumulator (two reads, one write
    // of the shard); without GAS > 1 an offloaded shard goes straight to the host.
    if (stage >= 2) {
      const bool accumulates = !offload_opt || c.gas > 1;
      f.grad_accum_bytes_micro = grad_bytes_full * (1.0 + (accumulates ? 3.0 / n : 0.0));
    }
    // One rank's stage-3 gather copies each unit's shard into its full buffer (read and write).
    if (stage == 3 && !multi_rank) f.local_gather_bytes_micro = 2.0 * 2.0 * param_bytes_full;
  }
  if (c.engine == Engine::kFsdp2) {
    // torch 2.11 fully_shard (_fsdp_collectives.py), per parameter, wb the compute dtype's bytes.
    // On the compute stream, where they delay the layers: each all-gather's copy-out of the full
    // output into the unsharded parameters (split_with_sizes_copy: read and write wb), and each
    // reduction's copy of the gradients into its fp32 input (chunk_cat: read wb, write 4; read
    // and write 4 for fp32 gradients). Stage 3 gathers before the forward and again before the
    // backward; stage 2 (reshard_after_forward off) before the forward only. Without sync the
    // post-backward casts the first micro-batch's unsharded gradients to fp32 (read wb, write 4),
    // adds each later one into that sum (read 4 + wb, write 4), and the last reduces it once.
    // Not charged: the cast of the fp32 shard and its copy into the all-gather input (on the
    // all-gather copy-in stream), the one-rank copy and the sharded gradient's accumulation (on
    // the reduce-scatter stream), which overlap the layers. Charging those too took the FSDP2
    // section's leave-one-configuration-out step error from 10.6 to 14.8 % mean; the
    // compute-stream copies alone: 6.9 -> 6.6 % mean, 19.6 -> 15.4 % max on its GPU-bound
    // configurations; with the unsynced accumulation too (48 configurations) 6.3 -> 5.9 % mean
    // (docs/engines.md).
    const double copy_out_bytes = 2.0 * wb;
    const double gathers_bwd = stage == 3 ? 1.0 : 0.0;
    f.fsdp_copy_bytes_fwd_micro = params * copy_out_bytes;
    const double g = static_cast<double>(c.gas);
    const bool sync_last = c.gas > 1 && !c.grad_sync_each_micro;
    const double reduce_bytes_step = sync_last ? (wb + 4.0) + (g - 1.0) * (8.0 + wb) + 8.0 : g * (wb + 4.0);
    f.fsdp_copy_bytes_bwd_micro = params * copy_out_bytes * gathers_bwd + trainable * reduce_bytes_step / g;
  }
  const bool multi_node = c.nodes > 1;
  const CollectiveLink link = collective_link(hw, c.gpus_per_node, c.nodes);
  f.link_is_inter_node = link.inter_node ? 1.0 : 0.0;
  f.link_bytes_per_s = link.bytes_per_s;
  f.extra_latency_s = link.extra_latency_s;
  // Without NVLink, a node's GPUs reduce over PCIe, the link their host copies take too.
  f.pcie_shared_link = multi_rank && !multi_node && hw.links.intra_node == "pcie" ? 1.0 : 0.0;

  // --- offload -----------------------------------------------------------------
  const double shard_params = stage >= 1 ? trainable / n : trainable;
  if (offload_opt) {
    // The backend accumulates gradients on the GPU and copies each shard down once, on the
    // last micro-batch, where the CPU optimizer pipelines over the units as they arrive.
    f.d2h_bytes_boundary = shard_params * wb;
    f.h2d_bytes_step = offload_par ? 0.0 : shard_params * wb;  // with param offload, the update lands on the host copy
    f.opt_pipeline_units = L + 2.0;
  }
  if (offload_par) f.param_h2d_bytes_micro = 2.0 * (params / n) * wb;
  // The peers' offload traffic, read from their sources (DeepSpeed v0.14.5, torch 2.11):
  if (offload_opt && c.engine == Engine::kDeepSpeed) {
    const double g = static_cast<double>(c.gas);
    if (stage == 1) {
      // runtime/zero/stage_1_and_2.py: stage 1 leaves the 16-bit gradients summing on the GPU and
      // reaches copy_grads_in_partition only on the last micro-batch, where
      // async_accumulate_grad_in_cpu_via_gpu brings its (never written, zero) host buffer up to
      // add (GAS > 1) and the sum goes down as fp32.
      f.grad_host_bytes_micro = 0.0;
      f.d2h_bytes_boundary = shard_params * (4.0 + (g > 1.0 ? wb : 0.0));
      f.h2d_bytes_step = shard_params * 4.0;
    } else if (stage == 2) {
      // runtime/zero/stage_1_and_2.py, async_accumulate_grad_in_cpu_via_gpu: every micro-batch but
      // the last copies its 16-bit gradient partition to a host buffer and, from the second on,
      // first brings the host sum back to add to it; the last sends the sum as fp32
      // (async_inplace_copy_grad_to_fp32_buffer_from_gpu). update_lp_params then copies the
      // fp32 partition into the 16-bit one on the GPU (fp32 over the link).
      f.grad_host_bytes_micro = g > 1.0 ? shard_params * wb * (1.0 + (g - 2.0) / (g - 1.0)) : 0.0;
      f.d2h_bytes_boundary = shard_params * (4.0 + (g > 1.0 ? wb : 0.0));
      f.h2d_bytes_step = shard_params * 4.0;
    } else {
      // runtime/zero/stage3.py, partition_grads: every micro-batch's reduced partition goes to the
      // pinned 16-bit host buffer and comes back to the GPU (to be summed there from the second
      // on); on the last, a blocking copy_ writes it into the fp32 host gradient. From a 16-bit
      // source that copy changes dtype across devices, which torch stages through a pageable host
      // temporary and converts on the CPU (staged_d2h_bytes_boundary); an fp32 run copies directly.
      // The update reaches the GPU's 16-bit partition (or stays on the host with parameter offload).
      const bool sixteen_bit = wb < 4.0;
      f.grad_host_bytes_micro = shard_params * 2.0 * wb;
      f.d2h_bytes_boundary = shard_params * (2.0 * wb + (sixteen_bit ? 0.0 : 4.0));
      f.staged_d2h_bytes_boundary = sixteen_bit ? shard_params * wb : 0.0;
      // step(), per sub-group, _reassign_or_swap_out_partitioned_parameters: the fp32 partition
      // (pinned host memory) is copied into the 16-bit one. Into a 16-bit GPU partition torch
      // converts on the CPU threads into a pageable temporary (read 4 B, write wb) that the
      // copying thread stages to the GPU; with parameter offload the 16-bit partition is on
      // the host and the copy stays there. An fp32 run copies pinned memory over PCIe, or on
      // the host with parameter offload.
      if (sixteen_bit || offload_par) f.host_convert_bytes_step = host_convert_bytes(shard_params, wb);
      f.pageable_h2d_bytes_step = sixteen_bit && !offload_par ? shard_params * wb : 0.0;
      f.h2d_bytes_step = offload_par || sixteen_bit ? 0.0 : shard_params * wb;
    }
  }
  if (offload_opt && c.engine == Engine::kDeepSpeed && !c.offload_pinned) {
    // "pin_memory": false (DeepSpeed's default). stage_1_and_2.py: the host sums of the gradients
    // (buffer_to_accumulate_to_in_cpu) and the fp32 partition's gradient (initialize_optimizer_states)
    // are then pageable, the fp32 weights stay pinned (pinned whatever the setting), so their copy
    // up after the step is unchanged. stage3.py: the 16-bit gradient buffer
    // (grad_partitions_flat_buffer) and the fp32 sub-groups' gradients are pageable; the
    // parameters it fetches with parameter offload come from its flat buffer, pinned whatever
    // the setting (param_groups_fp16_flat_cpu_memory). A copy into or out of pageable memory
    // is synchronous for the thread that issues it (the CUDA driver stages it through its own
    // pinned buffers), so the backward waits for each: the bytes leave the overlapped copies.
    f.pageable_bytes_micro = f.grad_host_bytes_micro;
    f.pageable_bytes_boundary = f.d2h_bytes_boundary;
    f.grad_host_bytes_micro = 0.0;
    f.d2h_bytes_boundary = 0.0;
    f.pageable_bytes_per_s = hw.host.pageable_bytes_per_s;
    if (!(f.pageable_bytes_per_s > 0.0))
      throw InputError("hardware profile '" + hw.name +
                       "': host.pageable_bytes_per_s is not given, so DeepSpeed's unpinned offload copies "
                       "(--offload-pin-memory off) cannot be timed (microbench --suite offload measures it)");
  }
  if (offload_opt && c.engine == Engine::kFsdp2) {
    // fully_shard with CPUOffloadPolicy: the fp32 parameter shard lives on the host and each
    // all-gather copies it up before casting (forward and, resharded, backward); gradients
    // accumulate unsharded on the GPU without sync and the last micro-batch's fp32 reduced
    // shard goes down; the fused CPU AdamW updates the host shard in place (nothing goes up).
    f.param_h2d_bytes_micro = 2.0 * shard_params * 4.0;
    // On one rank fully_shard skips the all-gather: each unit's unshard copies its host shard to
    // the GPU with a blocking copy_ on the compute stream (FSDPParamGroup.wait_for_unshard, the
    // world-size-1 path of torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py since
    // pytorch/pytorch#160135, 2025-08; moved onto the copy-in stream by #178861/#178862 from
    // 2026-03-31, for torchtitan#2749; torch 2.11 runs behave as the blocking form). The uploads
    // add to the pass instead of hiding under the layers, at the link's pinned rate (a bare copy of
    // a whole pinned tensor): on one H100 (torch 2.11), llama-3.2-3b at 16 x 1024 checkpointed
    // carries about one pass of its fp32 shards (0.23 s at 55 GB/s) in its forward and again in
    // its backward (data/runs/h100-sxm/2026-12-07_session53_fsdp2_offload_1gpu.jsonl;
    // docs/engines.md, "FSDP2's offloaded uploads block the compute stream on one rank").
    if (fsdp2_uploads_block(c)) f.param_h2d_blocking = 1.0;
    f.d2h_bytes_boundary = shard_params * 4.0;
    f.h2d_bytes_step = 0.0;
    if (c.grad_sync_each_micro && c.gas > 1) {
      // Reducing every micro-batch (foreach_reduce in torch/distributed/fsdp/_fully_shard/
      // _fsdp_collectives.py): a reduced shard goes down without blocking, into pinned memory, only
      // while its parameter has no gradient, i.e. on the first micro-batch. From the second on,
      // `.to("cpu")` copies it blocking into a new pageable tensor, whose pages fault on first
      // touch as the staged copies' temporaries do (a staged copy here), and the thread
      // then adds it into the host gradient (read 4 + 4 B, write 4 B a parameter): for each of
      // those micro-batches the GPU waits for the copy and the sum. Of the GAS - 1 micro-batches
      // before the last, the first copies pinned and the other GAS - 2 sum; the last sums.
      // Each parameter's shard is its own tensor: below glibc's mmap threshold its destination
      // reuses heap pages and the copy runs at the pageable rate (PEFT's adapters all do).
      const double g = static_cast<double>(c.gas);
      const double summing = (g - 2.0) / (g - 1.0);
      const double reused_frac =
          peft ? 1.0 : elems_in_pieces_below(spec, 4.0, n, kFreshPagesMinBytes) / static_cast<double>(spec.total_params());
      const double fresh = shard_params * 4.0 * (1.0 - reused_frac), reused = shard_params * 4.0 * reused_frac;
      f.grad_host_bytes_micro = shard_params * 4.0 / (g - 1.0);
      f.staged_d2h_bytes_micro = fresh * summing;
      f.pageable_bytes_micro = reused * summing;
      f.host_accum_bytes_micro = shard_params * 12.0 * summing;
      f.d2h_bytes_boundary = 0.0;
      f.staged_d2h_bytes_boundary = fresh;
      f.pageable_bytes_boundary = reused;
      f.pageable_bytes_per_s = hw.host.pageable_bytes_per_s;
      if (!(f.pageable_bytes_per_s > 0.0)) {  // the profile does not give the rate: time them as fresh pages
        f.staged_d2h_bytes_micro += f.pageable_bytes_micro;
        f.staged_d2h_bytes_boundary += f.pageable_bytes_boundary;
        f.pageable_bytes_micro = f.pageable_bytes_boundary = 0.0;
      }
      f.host_accum_bytes_boundary = shard_params * 12.0;
    }
  }
  f.h2d_bytes_per_s = hw.host.h2d_bytes_per_s;
  f.d2h_bytes_per_s = hw.host.d2h_bytes_per_s;

  // --- optimizer ---------------------------------------------------------------
  f.opt_on_cpu = offload_opt ? 1.0 : 0.0;
  f.opt_pipelined = c.offload_pipeline ? 1.0 : 0.0;
  f.opt_overlap_fwd = c.offload_pipeline && c.offload_overlap_forward ? 1.0 : 0.0;
  f.opt_uploads_in_bwd = pipelined_offload_uploads(c) && !c.offload_uploads_in_backward ? 0.0 : 1.0;
  f.opt_params_rank = shard_params;
  f.opt_bytes_per_param = optimizer_traffic_bytes(c.optimizer, c.precision, offload_opt, c.split_master);
  // The peers' CPU optimizers keep fp32 parameters, gradients and moments on the host: 4 B read
  // of the gradient, 8 B read and write of the parameter, 16 B of the moments.
  if (offload_opt && c.engine != Engine::kStepcast) f.opt_bytes_per_param = 28.0;
  if (!offload_opt && c.engine == Engine::kDeepSpeed) f.opt_bytes_per_param = deepspeed_gpu_step_bytes(stage, c.precision);
  f.opt_flops_per_param = optimizer_flops(c.optimizer);
  f.ranks_per_node = c.gpus_per_node;
  f.cpu_cores_node = node_cpu_cores(hw, c, limits);
  // The peers' CPU optimizers (DeepSpeed's cpu_adam, torch's CPU AdamW) run on OpenMP threads.
  // torchrun, and accelerate launch through it, sets OMP_NUM_THREADS=1 in every rank when it starts
  // more than one per node and the variable is unset (torch/distributed/run.py, config_from_args):
  // the node's ranks then update on one core each. Measured on one H200 host with DeepSpeed ZeRO-2
  // offload, pythia-2.8b: 1.03 s at 16 threads, 4.6-5.8 s at OMP_NUM_THREADS=1 (docs/engines.md).
  // A launch that sets the threads (limits.cpu_threads_per_rank) uses that many per rank, up to
  // the node's cores.
  if (offload_opt && c.engine != Engine::kStepcast)
    f.cpu_cores_node = std::min(f.cpu_cores_node, peer_cpu_optimizer_threads(c, limits, f.cpu_cores_node) *
                                                      static_cast<double>(c.gpus_per_node));
  f.cpu_simd_lanes = hw.host.simd_fp32_lanes;
  f.dram_bytes_per_s = hw.host.dram_bytes_per_s;

  f.world_size = n;
  f.tokens_per_micro = tokens;
  // model/metrics.h: 6 N (Kaplan et al. 2020) plus causal attention 6 L d_attn s.
  f.model_flops_per_token = model_flops_per_token(spec, c);

  // --- memory ------------------------------------------------------------------
  // Optimizer states of 8-bit AdamW: tensors under 4096 elements stay 32-bit.
  double state_bytes = optimizer_state_bytes_per_param(c.optimizer, c.precision);
  if (c.optimizer == OptimizerKind::kAdamW8bit && !peft) {  // adapters: no tensor under 4096 values
    const double small = static_cast<double>(small_tensor_params(spec));
    const double fp32_state = optimizer_state_bytes_per_param(OptimizerKind::kAdamW, c.precision);
    state_bytes = (state_bytes * (params - small) + fp32_state * small) / params;
  }
  // ZeRO model states (Rajbhandari et al. 2020, section 5): stage 1 partitions
  // optimizer states, stage 2 also gradients, stage 3 also parameters.
  const double p_shard = stage == 3 ? trainable / n : trainable;
  const double g_shard = stage >= 2 ? trainable / n : trainable;
  const double os_shard = stage >= 1 ? trainable / n : trainable;
  mem.gpu_params_bytes = offload_par ? 0.0 : p_shard * wb + (stage == 3 ? frozen_bytes / n : frozen_bytes);
  // With offload at stages 2-3 a gradient shard stays on the GPU only to accumulate over GAS;
  // DeepSpeed's stage 2 accumulates on the host instead: each bucket's reduced gradient is added
  // to the host's copy through one GPU buffer the size of the largest parameter
  // (stage_1_and_2.py at v0.14.5: copy_grads_in_partition, async_accumulate_grad_in_cpu_via_gpu),
  // its stage 1 only at the boundary. Measured on one H200, the founding report's job at GAS 5:
  // 26.5 GiB allocated at stage 2, 29.6 at stage 1.
  const bool host_accumulates = c.engine == Engine::kDeepSpeed && offload_opt && stage == 2;
  mem.gpu_grads_bytes = ((offload_opt && stage >= 2 && c.gas == 1) || host_accumulates) ? 0.0 : g_shard * wb;
  // DeepSpeed ZeRO-3 with optimizer offload keeps its gradient partitions in a host buffer
  // (runtime/zero/stage3.py, grad_partitions_flat_buffer on the offload device) and sums them there.
  if (offload_opt && stage == 3 && c.engine == Engine::kDeepSpeed) mem.gpu_grads_bytes = 0.0;
  // FSDP2 with CPUOffloadPolicy sends each reduced shard to the host, where the sharded gradient
  // lives and sums (foreach_reduce in torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):
  // no shard stays on the GPU (what it accumulates without sync is counted below).
  if (offload_opt && c.engine == Engine::kFsdp2) mem.gpu_grads_bytes = 0.0;
  // DeepSpeed keeps 16-bit runs' gradients in fp32 for the update, on the GPU without offload. At
  // stage 0 its BF16_Optimizer holds a flat fp32 gradient buffer the size of the whole model
  // through the backward and the step (bf16_optimizer.py: zeros_like(bf16_groups_flat)); at stages
  // 1-2 the step casts the rank's gradient partition to fp32 (stage_1_and_2.py:
  // single_grad_partition) after flattening its 16-bit gradients into one more buffer (2 B a
  // parameter), once the backward is over; ZeRO-3 does the same one sub-group at a time (stage3.py,
  // _prepare_fp32_grad_for_sub_group), freeing each after its update. Measured on one H200 with
  // pythia-2.8b (data/runs/h200-sxm/2026-12-0*_peers_deepspeed_1gpu*.jsonl), the peak allocated:
  // at stages 1-2, 56.9 GiB at micro-batches 1-2 and any checkpointed one, 22 B a parameter (16 B
  // of model states, the step's 4 B of fp32 gradients and 2 B of the flattened copy), and above
  // that 43.1 GiB (16.7 B a parameter) + 6.6 GiB a micro-batch of 2048 tokens, the backward's
  // (63.8 / 69.5 / 95.9 GiB at micro-batches 3 / 4 / 8); at stage 0, 20 B a parameter + the same
  // activations at every micro-batch (58.4 / 78.2 / 104.7 GiB at 1 / 4 / 8); at stage 3, 16 B a
  // parameter + the activations (48.2 / 55.0 / 68.6 / 95.9 GiB at 1 / 2 / 4 / 8), the 6 GB
  // sub-group cast coming after them. The reserved peak holds the step's buffers beside the
  // backward's cached segments (memory_model.h): 65.0 / 70.7 / 70.4 GiB at stages 0 / 1 / 2 at
  // micro-batch 1. Stage 0's 2 B a parameter more than its buffers is cache (below).
  if (c.engine == Engine::kDeepSpeed && !offload_opt && wb < 4.0) {
    if (stage == 0) {
      mem.gpu_grads_bytes += 4.0 * trainable;
      mem.gpu_engine_cache_bytes += wb * trainable;
    } else {
      const double step_grad_elems = stage == 1   ? trainable
                                     : stage == 2 ? trainable / n
                                                  : std::min(kDeepSpeedSubGroupElems, trainable / n);
      mem.gpu_step_bytes += (4.0 + wb) * step_grad_elems;
    }
  }
  mem.gpu_opt_states_bytes = offload_opt ? 0.0 : os_shard * state_bytes;
  // FSDP2 (fully_shard with the mixed-precision policy we write) keeps each parameter's shard in
  // fp32 as the optimizer's parameter (no master copy beside it) and its sharded gradient in fp32
  // (the reduce dtype), and computes on an unsharded copy in the compute dtype that each all-gather
  // writes to a buffer of its own, on one rank too (torch/distributed/fsdp/_fully_shard/
  // _fsdp_param.py: _sharded_param_data, init_all_gather_outputs). Stage 3 (reshard_after_forward)
  // frees each unit's copy after use (the gather buffers below); stage 2 keeps every unit's from
  // its forward to its backward, wb a parameter on every rank. Per parameter: 16 B / n at stage 3,
  // as before; 16 B / n + wb at stage 2, where 16-bit weights, 16-bit gradient shards and 12 B of
  // master weights and moments had given wb + 14 B / n. Measured on one H200 at stage 2, the
  // reserve was 6.3-16 GiB (1.9-2.4 B a parameter) above that for pythia-2.8b, mistral-7b and
  // llama-2-7b, and llama-2-7b at micro-batch 2, GAS 32 ran out of the card's 139.8 GiB where
  // 125.8 GiB had been predicted (data/runs/h200-sxm/2026-12-04_peers_fsdp2_1gpu_recommend_7b.jsonl).
  const bool fsdp2_shards = c.engine == Engine::kFsdp2 && !offload_opt && !peft && (stage == 2 || stage == 3);
  if (fsdp2_shards) {
    mem.gpu_params_bytes = 4.0 * trainable / n + (stage == 2 ? wb * trainable : 0.0);
    mem.gpu_grads_bytes = 4.0 * trainable / n;
    mem.gpu_opt_states_bytes = (state_bytes - master_weight_bytes_per_param(c.precision)) * trainable / n;
  }
  // FSDP2 without gradient sync on the micro-batches before the last (set_requires_gradient_sync
  // (False), as the harness and Accelerate's accumulation run it; grad_sync_each_micro off) keeps every parameter's whole,
  // unsharded gradient cast to the reduce dtype, fp32 in the policy we write, until the last
  // micro-batch's reduce-scatter consumes it (torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
  // to_accumulated_grad_if_needed): 4 B per trainable parameter on every rank, on the GPU with
  // CPUOffloadPolicy too. Measured on one H200 at GAS 2: reserved 137.1 GiB for llama-2-7b
  // checkpointed at micro-batch 2 where 16 B a parameter and the activations make 105
  // (data/runs/h200-sxm/2026-12-02_peers_fsdp2_1gpu_holdout.jsonl).
  // They are the backward's alone where the shards are on the GPU: the last micro-batch's
  // reduce-scatter turns them, unit by unit, into the sharded gradients the step uses (4 B / n),
  // and zero_grad frees those after it (small, unit by unit: not reclaimed from the backward's
  // segments on a card without room, memory_model.h): measured with the allocator's events on one H100, FSDP2
  // pythia-2.8b stage 3, GAS 2: at the peak allocated (69.2 GiB) the accumulated fp32 gradient is
  // live and no sharded one (data/memory_traces/h100-sxm/2026-12-06_fsdp2_s3_mb4_gas2.json).
  if (c.engine == Engine::kFsdp2 && c.gas > 1 && !c.grad_sync_each_micro) {
    if (fsdp2_shards) {
      mem.gpu_backward_bytes += 4.0 * trainable;
      mem.gpu_step_bytes += mem.gpu_grads_bytes;
      mem.gpu_grads_bytes = 0.0;
    } else {
      mem.gpu_grads_bytes += 4.0 * trainable;
    }
  }
  double buffers = 0.0;
  if (multi_rank && stage >= 2) buffers += 2.0 * bucket * wb;  // reduce-scatter buckets in flight
  // FSDP2's root module (fully_shard(model) after each layer's) holds the embedding, the final
  // norm and an untied head. Its pre-backward hook gathers them for the whole backward: they are
  // resharded only by its post-backward, once the embedding's gradient, the backward's last, has
  // been reduced; and the head's gradient, the backward's first, stays unsharded in the compute
  // dtype until then (torch 2.11 _fully_shard/_fsdp_state.py: _pre_backward, _root_post_backward_
  // final_callback; _fsdp_param_group.py: post_backward). Our harness passes reshard_after_forward
  // to the root as to the layers (bench/peers/peer.py): at stage 2 the root's parameters are
  // already among the unsharded ones above, so only the head's gradient is added.
  const bool fsdp2_root = c.engine == Engine::kFsdp2 && !peft && (stage == 2 || stage == 3);
  if (fsdp2_root) {
    const double root_params = static_cast<double>(spec.embedding_params() + spec.lm_head_params() +
                                                   spec.final_norm_params());
    const double head_grad = static_cast<double>(spec.tied_embeddings ? spec.embedding_params() : spec.lm_head_params());
    buffers += (stage == 3 ? root_params * wb : 0.0) + head_grad * wb;
  }
  if (stage == 3) {
    // FSDP2's units are the layers; the root's are above.
    const double unit = fsdp2_root ? static_cast<double>(spec.params_per_layer())
                                   : std::max(static_cast<double>(spec.params_per_layer()),
                                              static_cast<double>(spec.vocab_size) * spec.embed_dim());
    // Gathered unit in use + the one prefetched; the full gradient of one unit before its
    // reduce-scatter (PEFT: the frozen weights' bytes per unit, and the adapters' gradient).
    const double unit_bytes = peft ? std::max(frozen_bytes / L, static_cast<double>(spec.vocab_size) *
                                                                    spec.embed_dim() * wb)
                                   : unit * wb;
    buffers += 2.0 * unit_bytes;
    buffers += peft ? trainable / L * wb : unit * wb;
    // DeepSpeed with its parameters offloaded keeps what it fetched on the GPU until it holds
    // stage3_max_live_parameters (partitioned_param_coordinator.py: fetched parameters are
    // released after use only above that count or beyond max_reuse_distance; our config sets both
    // to 1e9), so a checkpointed backward, which uses every layer twice, keeps about that many.
    // Measured with the allocator's sizes on one H100, fp32 pythia-2.8b, micro-batch 2: 8.0 GiB
    // allocated at the peak, 5.2 of it fetched weights (100 MiB blocks, the MLP's fp32
    // matrices), where three layers' worth (0.9 GiB) had been counted (data/memory_traces/
    // h100-sxm/2026-12-06_deepspeed_fp32_s3_offload_params_mb2_gas2_ckpt_sizes.json).
    if (c.engine == Engine::kDeepSpeed && offload_par && !peft) buffers += std::min(kDeepSpeedMaxLiveParams, trainable) * wb;
  }
  if (c.peft == PeftKind::kQlora) {
    // One dequantised weight alive at a time: the largest projection's.
    double largest = 0.0;
    for (const Projection& p : projections(spec, c)) largest = std::max(largest, p.out * p.in);
    buffers += largest * wb;
  }
  // DeepSpeed's ZeRO optimizer at stages 1-2 (no offload) gathers each micro-batch's gradients
  // into a 16-bit partition buffer during the backward (stage_1_and_2.py: grads_in_partition at
  // stage 2, the averaged_gradients partitions at stage 1), the gradients above; the segments
  // the gathering leaves serve neither the activations nor the step's larger fp32 buffers.
  // Measured on one H200, pythia-2.8b: the reserve above model states and step buffers is 6.5 GiB
  // plus 6.8 GiB a micro-batch at stages 1-2, against 0-0.5 GiB plus 6.3-7 at stages 0 and 3
  // (data/runs/h200-sxm/2026-12-0*_peers_deepspeed_1gpu*.jsonl): 2.3 B a parameter of cache.
  if (c.engine == Engine::kDeepSpeed && (stage == 1 || stage == 2) && !offload_opt)
    mem.gpu_engine_cache_bytes += wb * trainable / n;
  // With CPU offload at stages 1-2 its caching allocator keeps about 4 B per parameter of the
  // rank's partition above the peak allocated, in bf16 and fp32 alike: pythia-2.8b reserved
  // 12.6-14.4 GiB above its peak allocated on one H200 and 8.2 GiB on two, at micro-batches 2-8
  // (data/runs/h200-sxm/2026-12-0*_peers_deepspeed*.jsonl). It is one segment: the step copies
  // the updated fp32 partition to the GPU whole before casting it into the 16-bit one
  // (stage_1_and_2.py at v0.14.5, step: fp32_partition.to(device)), and the allocator keeps the
  // freed segment through the next forward and backward (the allocator's events, data/
  // memory_traces/h100-sxm/2026-12-06_deepspeed_s1_offload_mb2_gas4_segments.json: a 10.34 GiB
  // segment, 2.78 G parameters x 4 B, made there and free at the peak): the step's own buffer
  // (memory_model.h), which a smaller card takes from the backward's freed segments: torch's
  // caching allocator frees its unused cached blocks and retries before it reports an allocation
  // as out of memory.
  // The GPU's gradient accumulators have gone to the host by then (the boundary's copy into the
  // CPU optimizer's fp32 gradients): measured with fp32 pythia-2.8b, 21.2 GiB allocated at its
  // peak, its 4 B parameters and the step's 4 B copy, not the 4 B of gradients besides.
  if (c.engine == Engine::kDeepSpeed && (stage == 1 || stage == 2) && offload_opt) {
    mem.gpu_step_bytes += 4.0 * trainable / n;
    mem.gpu_backward_bytes += mem.gpu_grads_bytes;
    mem.gpu_grads_bytes = 0.0;
  }
  // DeepSpeed's step buffers are whole-partition tensors a card without room takes from the
  // backward's freed segments (memory_model.h); FSDP2's sharded gradients are not.
  if (c.engine == Engine::kDeepSpeed) mem.gpu_step_reclaimable_bytes = mem.gpu_step_bytes;
  mem.expandable_segments = c.gpu_expandable_segments ? 1.0 : 0.0;
  mem.gpu_buffers_bytes = buffers;
  // Our backend repeats each KV head for the query heads it serves before the fused attention
  // (backend/engine/transformer.cpp), which keeps the repeated keys and values for its backward:
  // 2 (q_dim - kv_dim) more per token and layer than the model's own K and V.
  const double repeated_kv = c.engine == Engine::kStepcast ? 2.0 * static_cast<double>(spec.q_dim() - spec.kv_dim()) : 0.0;
  const double layer_elems = act_per_layer + lora_act_per_layer + repeated_kv;
  // Without checkpointing every layer's activations are live at the start of the backward;
  // with it, each layer's input, and later one recomputed layer (memory_model.h).
  if (c.activation_checkpointing) {
    mem.ckpt_bytes = tokens * wb * L * h;
    mem.recompute_layer_bytes = tokens * wb * layer_elems;
    mem.act_bytes = mem.ckpt_bytes + tokens * wb * 2.0 * h /*final norm, head input*/;
  } else {
    mem.act_bytes = tokens * wb * (L * layer_elems + 2.0 * h);
  }
  // transformers' eager attention, the peers' math path, takes the softmax in fp32 and casts the
  // probabilities to the value's dtype for their product with V (llama: softmax(dtype=float32)
  // then .to(query.dtype); GPT-J upcasts query and key to fp32): softmax keeps its fp32 output for
  // the backward beside the 16-bit copy, 4 B more per score. Measured: DeepSpeed with GPT-J on one
  // H200 ran out of its 139.8 GiB at micro-batch 2 where 121 GiB had been predicted without it
  // (docs/engines.md).
  if (peer_eager_attention && wb < 4.0) {
    const double fp32_scores = tokens * 4.0 * static_cast<double>(spec.num_heads) * s;
    if (c.activation_checkpointing)
      mem.recompute_layer_bytes += fp32_scores;
    else
      mem.act_bytes += fp32_scores * L;
  }
  // The eager attention's backward, one layer at a time, holds more per score than the layer
  // saved: the probabilities' gradient (wb B, from the product with V), its cast to fp32 (4 B;
  // none in fp32), softmax's input gradient (4 B) and that gradient scaled by 1/sqrt(d) (wb B;
  // 4 B with GPT-J's fp32 query and key) while the saved fp32 softmax output is still live and
  // the saved 16-bit probabilities (wb B) are already freed: 16-bit, wb + 8 B per score above
  // what the layer saved (12 with GPT-J's fp32 query and key); fp32, 12 B. Measured with the caching allocator's events
  // (bench/peer_memory_trace.sh, data/memory_traces/h100-sxm/2026-12-06_deepspeed_s1_offload_
  // mb8_gas5_ckpt_math.json: pythia-2.8b, 8 x 2048, 2^30 scores a layer): at the step's peak, in a
  // recomputed layer's attention backward, 4.0 GiB of softmax output and 12.2 GiB the backward
  // allocated beside the model's 5.2 GiB of gradients, 16 B a score against the 6 B it saves.
  // It takes the place of the loss's buffers (which the backward has freed by then) in the live
  // bytes, checkpointed or not.
  if (peer_eager_attention) {
    const bool half = wb < 4.0;
    const double scaled_grad = transformers_impl(spec).fp32_query_key ? 4.0 : wb;
    const double per_score = wb + (half ? 4.0 : 0.0) + 4.0 + scaled_grad - (half ? wb : 0.0);
    mem.recompute_layer_bytes += tokens * static_cast<double>(spec.num_heads) * s * per_score;
  }
  mem.logits_elems = tokens * static_cast<double>(spec.vocab_size);
  mem.logit_bytes = wb;
  // The loss runs in fp32 (our backend: logits.to(kFloat) before cross_entropy; transformers'
  // causal-LM loss: logits.float()): a copy of 16-bit logits, which loss_extra_bytes_per_logit
  // counts; fp32 logits are their own copy.
  mem.loss_copy_absent_bytes = wb < 4.0 ? 0.0 : 4.0;
  // Our backend's pinned host buffers, one per unit (backend/engine/engine.cpp init_parameters).
  const double os_div = stage >= 1 ? n : 1.0;
  // The peers' buffers are overridden below (DeepSpeed), or taken flat (FSDP2's parameter shard).
  const auto pinned_units = [&](double elems_div) {
    return c.engine == Engine::kStepcast ? backend_pinned_unit_bytes(spec, trainable, peft, n, elems_div, wb)
                                         : trainable / elems_div * wb;
  };
  if (offload_opt) {
    mem.host_opt_states_bytes = os_shard * state_bytes;
    mem.host_grads_bytes = 0.0;  // the gradient lands in the pinned staging shard below
    // Gradients down, updated parameters up, in place.
    mem.host_pinned_buffers_bytes = pinned_units(os_div);
    if (splits_master(c.optimizer, c.precision, true, c.split_master)) {
      // Split master weights (8-bit tensors only): the fp32 master becomes a 16-bit remainder
      // beside the bf16 upper half, which is the host parameter shard with parameter offload
      // (2 B saved), else a pinned upload buffer of its own per unit (the staging shard then
      // holds gradients only). Every unit of a model holds an 8-bit tensor.
      const double eight_bit = peft ? 1.0 : (params - static_cast<double>(small_tensor_params(spec))) / params;
      mem.host_opt_states_bytes -= os_shard * eight_bit * 2.0;
      if (!offload_par) mem.host_pinned_buffers_bytes += pinned_units(os_div);
    }
  }
  // The parameter shard of each unit, pinned (PEFT keeps its base weights on the GPU: train_config.cpp).
  if (offload_par) mem.host_params_bytes = pinned_units(n);
  if (offload_opt && c.engine != Engine::kStepcast) {
    // The peers keep fp32 parameters, fp32 gradients and two fp32 moments of their shard on the host
    // (16 B per parameter). Pinned buffers come from torch's caching host allocator, which rounds each
    // allocation up to a power of two bytes (c10 CachingHostAllocator): measured host RSS of
    // DeepSpeed ZeRO-1/2 offload matches the rounded sum within 3 % (docs/engines.md).
    const double moments = os_shard * 8.0;
    if (c.engine == Engine::kDeepSpeed && stage <= 2) {
      // runtime/zero/stage_1_and_2.py: the fp32 partition and its fp32 gradient, pinned, and with
      // GAS > 1 the 16-bit accumulation buffers (accumulated_grads_in_cpu), one pinned tensor per
      // parameter of the partition.
      // Unpinned ("pin_memory": false), the two gradient buffers are plain allocations, not rounded.
      const double fp32_partition = pinned_host_bytes(os_shard * 4.0);
      const double fp32_grad = c.offload_pinned ? fp32_partition : os_shard * 4.0;
      const double grad_sums = c.offload_pinned ? pinned_per_tensor_bytes(spec, wb) / n : trainable * wb / n;
      mem.host_opt_states_bytes = moments;
      mem.host_grads_bytes = fp32_grad + (c.gas > 1 && !peft ? grad_sums : 0.0);
      mem.host_pinned_buffers_bytes = fp32_partition;
    } else if (c.engine == Engine::kDeepSpeed) {
      // runtime/zero/stage3.py: the fp32 partition, its fp32 gradient pinned per sub-group of at
      // most sub_group_size (1e9) parameters, and the pinned 16-bit gradient partition buffer.
      const double groups = std::ceil(os_shard / kDeepSpeedSubGroupParams);
      mem.host_opt_states_bytes = moments;
      mem.host_grads_bytes = c.offload_pinned ? groups * pinned_host_bytes(os_shard / groups * 4.0) +
                                                    pinned_host_bytes(os_shard * wb)
                                              : os_shard * (4.0 + wb);  // unpinned: not rounded
      mem.host_pinned_buffers_bytes = os_shard * 4.0;
      // With parameter offload the 16-bit partitions live in one pinned flat buffer per parameter
      // group (param_groups_fp16_flat_cpu_memory). zero.Init first pins each weight's partition on
      // its own (partition_parameters.py, _partition_param: pin_memory on the remote device); the
      // optimizer copies them into the flat buffer and drops them (stage3.py,
      // _move_to_flat_buffer), and torch's caching host allocator keeps the freed pinned blocks.
      // Measured on one H200, pythia-2.8b both offloads: host RSS 8.1 GB (bf16) and 15.1 GB (fp32)
      // above the flat buffer and optimizer buffers; the rounded partitions are 7.5 and 15.0 GB
      // (2026-12-01_peers_deepspeed_1gpu_c.jsonl, _zero3.jsonl).
      // Unpinned, zero.Init's partitions are pageable and not kept by the pinned cache.
      if (offload_par)
        mem.host_params_bytes =
            pinned_host_bytes((params / n) * wb) + (c.offload_pinned ? pinned_per_tensor_bytes(spec, wb, n) : 0.0);
    } else {
      // FSDP2 CPUOffloadPolicy: the fp32 shard of each parameter and its fp32 gradient on the host.
      mem.host_opt_states_bytes = moments;
      mem.host_grads_bytes = os_shard * 4.0;
      mem.host_pinned_buffers_bytes = os_shard * 4.0;
    }
  }
  // DeepSpeed's placement: ZeRO-1/2 moves each rank's 16-bit parameters to the host to flatten
  // them there (stage_1_and_2.py: move_to_cpu before flatten_dense_tensors_aligned, "to free up GPU
  // space"), the whole model twice over for a moment; ZeRO-3 builds its partitions under
  // zero.Init through the host. Measured host high-water marks on one H200 (bf16, no offload,
  // 2026-12-01/02 peers_deepspeed files): pythia-2.8b 11.7 GiB at stages 1-2 (4 B a parameter
  // and 1.3 GiB), 6.6 at stage 3 (2 B); llama-2-7b 26.5 GiB at stage 2 on each of two ranks, 13.9
  // at stage 3 on one and 7.7 on each of two; 2.0 GiB at stage 0. Users meet it as host memory
  // that grows with the node's GPUs (deepspeedai/DeepSpeed issues #1611, #4148, #7677); releases
  // after PR #7828 flatten on the GPU where it has room for a second copy: this models 0.14.5, the
  // version measured.
  if (c.engine == Engine::kDeepSpeed && stage >= 1) mem.host_placement_bytes = stage <= 2 ? 2.0 * wb * params : wb * params / n;
  mem.ranks_per_node = c.gpus_per_node;
  return out;
}

}  // namespace stepcast
