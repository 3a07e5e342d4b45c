// microbench: times each component of a training step alone, on the backend's
// own code paths, for calibrate's component fit (calibrate/micro_record.h):
//   compute     bf16 GEMMs of the shapes the model families run (the cost
//               model's own GEMM classes, from make_features), causal flash
//               attention by sequence length (forward, and backward alone),
//               a decoder layer's element-wise work (forward and backward)
//   collectives all-reduce, reduce-scatter, all-gather by size, over NCCL on
//               the GPU or Gloo on the CPU; each result is checked once
//   offload     host <-> device copies by size, pinned and pageable (GPU only)
//   optimizer   CPU AdamW fp32 and 8-bit by thread count; the GPU kernels
//
//   microbench --out micro.jsonl [--suite compute,collectives,offload,optimizer] [--nproc 2] [--quick]
//
// Rank 0 appends one JSON line per measurement ("kind": "micro", the median of
// timed repetitions in "seconds"), after a "micro_env" line with the
// environment, and a "micro_done" line at the end. Progress goes to stderr.
#include <array>
#include <CLI/CLI.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/units.h"
#include "backend/comm/collectives.h"
#include "backend/runtime/compat.h"
#include "backend/optim/cpu_adamw.h"
#include "backend/cuda/kernels.h"
#include "backend/engine/transformer.h"
#include "backend/comm/launcher.h"
#include "backend/optim/quant8.h"
#include "backend/runtime/runtime.h"
#include "common/cli.h"
#include "common/atomic_file.h"
#include "common/errors.h"
#include "common/run_main.h"
#include "common/stats.h"
#include "model/model_spec.h"
#include "model/step_features.h"

#include "stepcast_git_commit.h"  // generated at every build (cmake/GitCommit.cmake)

namespace stepcast::backend {
namespace {


struct Flags {
  std::string out, suites = "compute,collectives,offload,optimizer", device = "auto", data_dir;
  std::string models = "pythia-2.8b,llama-2-7b,qwen2.5-7b,gpt-j-6b";
  int nproc = 1, repeats = 5;
  int emulate_nodes = 1;   // --nproc ranks as this many nodes on this host (launcher.h)
  int emulated_node = -1;  // set by the launcher
  bool quick = false;
};

class Bench {
 public:
  // `out`: the JSONL records are appended to (rank 0), empty on the other ranks.
  Bench(Runtime& rt, int repeats, std::string out) : rt_(rt), repeats_(repeats), out_(std::move(out)) {}

  // Median seconds of one call of fn: one warm-up, then `repeats` timings of
  // `inner` back-to-back calls each (short operations amortise the sync).
  template <class Fn>
  double time_s(int inner, Fn&& fn) {
    fn();
    rt_.synchronize();
    std::vector<double> t;
    for (int r = 0; r < repeats_; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < inner; ++i) fn();
      rt_.synchronize();
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / inner);
    }
    return median(t);
  }

  // Writes one record (rank 0 only) and a progress line.
  void emit(nlohmann::json j, const std::string& label) {
    ++count_;
    if (out_.empty()) return;
    j["kind"] = "micro";
    j["repeats"] = repeats_;
    records_.push_back(j);
    append_lines(out_, j.dump() + "\n");  // one write per record: a killed run leaves whole lines
    std::fprintf(stderr, "microbench: [%3d] %-44s %10.3f ms\n", count_, label.c_str(), 1e3 * j["seconds"].get<double>());
  }

  Runtime& rt_;
  int repeats_;
  std::string out_;
  int count_ = 0;
  std::vector<nlohmann::json> records_;  // rank 0's records, for the ratios at the end
};

// Ratios between measurements of this run: each component against its own
// reference, so that runs on different machines compare.
void print_ratios(const std::vector<nlohmann::json>& recs) {
  auto find = [&](const std::function<bool(const nlohmann::json&)>& pred) -> const nlohmann::json* {
    const nlohmann::json* best = nullptr;
    for (const auto& r : recs)
      if (pred(r) && (!best || r.value("bytes", 0.0) + r.value("params", 0.0) >
                                   best->value("bytes", 0.0) + best->value("params", 0.0)))
        best = &r;  // the largest size of its kind
    return best;
  };
  auto is = [](const char* bench) { return [bench](const nlohmann::json& r) { return r["bench"] == bench; }; };
  std::fprintf(stderr, "microbench: ratios within this run\n");
  // GEMMs: the spread of achieved rates.
  std::vector<double> rates;
  for (const auto& r : recs)
    if (r["bench"] == "gemm")
      rates.push_back(2.0 * r["m"].get<double>() * r["n"].get<double>() * r["k"].get<double>() / r["seconds"].get<double>());
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    std::fprintf(stderr, "  gemm: slowest shape at %.2fx, median at %.2fx the fastest's %.3g TFLOP/s\n",
                 rates.front() / rates.back(), rates[rates.size() / 2] / rates.back(), rates.back() / 1e12);
  }
  // Collectives: bus bandwidth of reduce-scatter and all-gather against all-reduce, largest size.
  if (const auto* ar = find(is("all_reduce")))
    for (const char* other : {"reduce_scatter", "all_gather"})
      if (const auto* o = find(is(other)))
        std::fprintf(stderr, "  %s bus bandwidth vs all-reduce (%.0f MiB): %.2fx\n", other,
                     (*o)["bytes"].get<double>() / kBytesPerMiB,
                     ar->at("seconds").get<double>() / (2.0 * (*o)["seconds"].get<double>()));
  if (const auto* up = find(is("h2d")))
    if (const auto* down = find(is("d2h")))
      std::fprintf(stderr, "  d2h vs h2d (%.0f MiB): %.2fx\n", (*up)["bytes"].get<double>() / kBytesPerMiB,
                   (*up)["seconds"].get<double>() / (*down)["seconds"].get<double>());
  for (const char* dir : {"h2d", "d2h"})
    if (const auto* pinned = find(is(dir)))
      if (const auto* pageable = find(is(dir == std::string("h2d") ? "h2d_pageable" : "d2h_pageable")))
        std::fprintf(stderr, "  %s pageable vs pinned (%.0f MiB): %.2fx, %.1f GB/s\n", dir,
                     (*pageable)["bytes"].get<double>() / kBytesPerMiB,
                     (*pinned)["seconds"].get<double>() / (*pageable)["seconds"].get<double>(),
                     (*pageable)["bytes"].get<double>() / (*pageable)["seconds"].get<double>() / 1e9);
  // DeepSpeed ZeRO-3's staged cross-dtype copies against the plain pageable ones, largest size.
  for (const auto& [dir, staged_name, pageable_name] :
       {std::array<const char*, 3>{"d2h", "d2h_staged", "d2h_pageable"}, {"h2d", "h2d_staged", "h2d_pageable"}})
    if (const auto* staged = find(is(staged_name)))
      if (const auto* pageable = find(is(pageable_name)))
        std::fprintf(stderr, "  %s staged vs pageable (%.0f MiB of 16-bit): %.2fx the time, %.2f GB/s of 16-bit bytes\n", dir,
                     (*staged)["bytes"].get<double>() / kBytesPerMiB,
                     (*staged)["seconds"].get<double>() / (*pageable)["seconds"].get<double>() *
                         (*pageable)["bytes"].get<double>() / (*staged)["bytes"].get<double>(),
                     (*staged)["bytes"].get<double>() / (*staged)["seconds"].get<double>() / 1e9);
  // Optimizers: 8-bit against fp32 AdamW on the same size (and threads).
  for (const auto& r : recs) {
    if (r["bench"] != "cpu_optimizer" && r["bench"] != "gpu_optimizer") continue;
    if (r["optimizer"] != "adamw8bit") continue;
    const auto* fp32 = find([&](const nlohmann::json& q) {
      return q["bench"] == r["bench"] && q["optimizer"] == "adamw" && q["params"] == r["params"] &&
             q.value("threads", 0) == r.value("threads", 0);
    });
    if (fp32)
      std::fprintf(stderr, "  %s 8-bit vs fp32 AdamW (%.0f Mi params%s): %.2fx\n", r["bench"].get<std::string>().c_str(),
                   r["params"].get<double>() / 1048576.0,
                   r.contains("threads") ? (", " + std::to_string(r["threads"].get<int>()) + " threads").c_str() : "",
                   (*fp32)["seconds"].get<double>() / r["seconds"].get<double>());
  }
  // The layers' element-wise work: time per analytic byte of each family against the family of the
  // largest record, at the same tokens (the kernels differ by family; the model's bytes should
  // carry that difference).
  const nlohmann::json* ew_ref = find(is("elementwise"));
  for (const auto& r : recs) {
    if (r["bench"] != "elementwise" || ew_ref == nullptr || r["model"] == (*ew_ref)["model"]) continue;
    const auto* ref = find([&](const nlohmann::json& q) {
      return q["bench"] == "elementwise" && q["model"] == (*ew_ref)["model"] && q["tokens"] == r["tokens"];
    });
    if (!ref) continue;
    std::fprintf(stderr, "  elementwise %s vs %s (%.0f tokens): %.2fx time per analytic byte\n",
                 r["model"].get<std::string>().c_str(), (*ref)["model"].get<std::string>().c_str(),
                 r["tokens"].get<double>(),
                 (r["seconds"].get<double>() / r["bytes"].get<double>()) /
                     ((*ref)["seconds"].get<double>() / (*ref)["bytes"].get<double>()));
  }
  // Attention: time per FLOP at each head dimension against the sequence sweep's head (the first
  // attention record's) at the same sequence length and batch.
  const nlohmann::json* first = find(is("attention"));
  if (first == nullptr) return;
  const double ref_dim = (*first)["head_dim"].get<double>();
  for (const auto& r : recs) {
    if (r["bench"] != "attention" || r["head_dim"].get<double>() == ref_dim) continue;
    const auto same = [&](const char* bench, double dim) {
      return find([&](const nlohmann::json& q) {
        return q["bench"] == bench && q["head_dim"].get<double>() == dim && q["seq_len"] == r["seq_len"] &&
               q["batch"] == r["batch"];
      });
    };
    const auto* ref = same("attention", ref_dim);
    const auto* bwd = same("attention_bwd", r["head_dim"].get<double>());
    const auto* ref_bwd = same("attention_bwd", ref_dim);
    if (!ref || !bwd || !ref_bwd) continue;
    const double d = r["head_dim"].get<double>(), flops = ref_dim / d;
    std::fprintf(stderr, "  attention head %.0f vs %.0f (s %.0f): %.2fx forward, %.2fx backward time per FLOP\n", d,
                 ref_dim, r["seq_len"].get<double>(), r["seconds"].get<double>() / (*ref)["seconds"].get<double>() * flops,
                 (*bwd)["seconds"].get<double>() / (*ref_bwd)["seconds"].get<double>() * flops);
  }
}

// GEMM shapes of the cost model's five classes for each model at a few token
// counts, deduplicated.
std::set<std::array<int64_t, 3>> gemm_shapes(const Flags& f, const std::filesystem::path& dir) {
  std::set<std::array<int64_t, 3>> shapes;
  const std::vector<std::string> models = f.quick ? std::vector<std::string>{"test-llama-tiny"} : split_comma_list(f.models);
  const std::vector<int64_t> tokens = f.quick ? std::vector<int64_t>{64, 256} : std::vector<int64_t>{2048, 8192, 16384};
  for (const auto& name : models) {
    const ModelSpec spec = resolve_model(name, dir);
    for (int64_t t : tokens)
      for (const GemmShape& g : gemm_classes(spec, static_cast<double>(t)))
        shapes.insert({static_cast<int64_t>(g.m), static_cast<int64_t>(g.n), static_cast<int64_t>(g.k)});
  }
  return shapes;
}

void run_attention(Bench& b, Runtime& rt, const Flags& f);
void run_elementwise(Bench& b, Runtime& rt, const Flags& f, const std::filesystem::path& dir);

void run_compute(Bench& b, Runtime& rt, const Flags& f, const std::filesystem::path& dir) {
  // bf16 on the GPU as in training; fp32 on the CPU (its bf16 GEMMs are not what a CPU run measures).
  const auto opts = torch::TensorOptions().dtype(rt.is_cuda() ? torch::kBFloat16 : torch::kFloat).device(rt.device());
  const std::string dtype = rt.is_cuda() ? "bf16" : "fp32";
  for (const auto& s : gemm_shapes(f, dir)) {
    auto a = torch::randn({s[0], s[2]}, opts), w = torch::randn({s[2], s[1]}, opts);
    torch::Tensor c;
    const double sec = b.time_s(3, [&] { c = torch::matmul(a, w); });
    b.emit({{"bench", "gemm"}, {"m", s[0]}, {"n", s[1]}, {"k", s[2]}, {"dtype", dtype}, {"seconds", sec}},
           "gemm " + std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]));
  }
  run_attention(b, rt, f);
  run_elementwise(b, rt, f, dir);
}

// Causal attention forward, and its backward alone, on `tokens` tokens per call of `batch` x `s`.
void time_attention(Bench& b, const torch::TensorOptions& opts, const std::string& dtype, int64_t heads,
                    int64_t head_dim, int64_t s, int64_t batch) {
  auto q = torch::randn({batch, heads, s, head_dim}, opts), k = torch::randn_like(q), v = torch::randn_like(q);
  torch::Tensor o;
  const double sec = b.time_s(3, [&] { o = compat::causal_attention(q, k, v); });
  const nlohmann::json shape = {{"batch", batch}, {"heads", heads}, {"seq_len", s}, {"head_dim", head_dim},
                                {"causal", true}, {"kernel", compat::kTorch2 ? "sdpa" : "math"}, {"dtype", dtype}};
  const std::string what = "s" + std::to_string(s) + " b" + std::to_string(batch) + " d" + std::to_string(head_dim);
  nlohmann::json j = shape;
  j["bench"] = "attention";
  j["seconds"] = sec;
  b.emit(j, "attention " + what);
  // Backward alone: forward + backward, less the forward.
  q.requires_grad_(true);
  k.requires_grad_(true);
  v.requires_grad_(true);
  auto grad_o = torch::randn_like(q);
  const double both = b.time_s(2, [&] {
    auto out = compat::causal_attention(q, k, v);
    out.backward(grad_o);
  });
  j = shape;
  j["bench"] = "attention_bwd";
  j["seconds"] = std::max(both - sec, 1e-9);
  j["forward_backward_seconds"] = both;
  b.emit(j, "attention backward " + what);
}

void run_attention(Bench& b, Runtime& rt, const Flags& f) {
  const auto opts = torch::TensorOptions().dtype(rt.is_cuda() ? torch::kBFloat16 : torch::kFloat).device(rt.device());
  const std::string dtype = rt.is_cuda() ? "bf16" : "fp32";
  // By sequence: 16 Ki tokens (quick: 512) per call, 32 heads of 128.
  const int64_t heads = f.quick ? 4 : 32, head_dim = f.quick ? 32 : 128, tokens = f.quick ? 512 : 16384;
  const std::vector<int64_t> seqs = f.quick ? std::vector<int64_t>{64, 128, 256} : std::vector<int64_t>{512, 1024, 2048, 4096, 8192};
  for (int64_t s : seqs) time_attention(b, opts, dtype, heads, head_dim, s, std::max<int64_t>(1, tokens / s));
  // By head dimension, at a short and a long sequence (the kernels pad a head to their tile and
  // spend per score on the softmax what does not scale with it): the families' heads of 64-256.
  const std::vector<int64_t> dims = f.quick ? std::vector<int64_t>{16, 24} : std::vector<int64_t>{64, 80, 96, 128, 256};
  const std::vector<int64_t> dim_seqs = f.quick ? std::vector<int64_t>{128} : std::vector<int64_t>{2048, 16384};
  for (int64_t s : dim_seqs)
    for (int64_t d : dims)
      if (d != head_dim || std::find(seqs.begin(), seqs.end(), s) == seqs.end())
        time_attention(b, opts, dtype, heads, d, s, std::max<int64_t>(1, tokens / s));
}

// The decoder layer's element-wise work alone, forward and backward, as backend/engine/
// transformer.cpp runs it around its GEMMs and attention: the norms, rotary on the queries and
// keys, the copies into and out of the attention kernel's layout (and GQA's repeated keys and
// values), the MLP's activation and the residual adds. Random tensors stand in for the
// projections' outputs. The record's "bytes" is the cost model's element-wise traffic of one
// layer's forward (activation_elems_per_token_per_layer x tokens x the element's bytes): the
// rate it implies, on two GPUs, is how the model's element-wise term moves between them
// (calibrate fit's measured components).
void run_elementwise(Bench& b, Runtime& rt, const Flags& f, const std::filesystem::path& dir) {
  const auto dt = rt.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  const double elem_bytes = rt.is_cuda() ? 2.0 : 4.0;
  const auto opts = torch::TensorOptions().dtype(dt).device(rt.device());
  // Quick: the three tiny families (GQA with RMSNorm; GPT-J's interleaved partial rotary; NeoX's
  // two LayerNorms), so that the CPU tests run every path.
  const std::vector<std::string> models =
      f.quick ? std::vector<std::string>{"test-llama-tiny", "test-gptj-tiny", "test-neox-tiny"} : split_comma_list(f.models);
  const std::vector<int64_t> token_counts = f.quick ? std::vector<int64_t>{256} : std::vector<int64_t>{8192, 16384};
  const int64_t seq = f.quick ? 128 : 2048;
  for (const auto& name : models) {
    const ModelSpec spec = resolve_model(name, dir);
    const int64_t h = spec.hidden_size, nh = spec.num_heads, nkv = spec.num_kv_heads, d = spec.head_dim;
    const int64_t inter = spec.intermediate_size;
    for (int64_t tokens : token_counts) {
      const int64_t bsz = std::max<int64_t>(1, tokens / seq), s = tokens / bsz;
      const auto leaf = [&](std::vector<int64_t> shape) { return torch::randn(shape, opts).requires_grad_(true); };
      auto x = leaf({bsz, s, h});
      auto qkv = leaf({bsz, s, (nh + 2 * nkv) * d});
      auto attn_out = leaf({bsz, nh, s, d});                       // the attention kernel's output
      auto up = leaf({bsz, s, spec.gated_mlp ? 2 * inter : inter});  // the up (and gate) projection
      auto attn_proj = leaf({bsz, s, h}), mlp_proj = leaf({bsz, s, h});  // the o and down projections
      auto w1 = torch::ones({h}, opts).requires_grad_(true), w2 = torch::ones({h}, opts).requires_grad_(true);
      auto b1 = torch::zeros({h}, opts).requires_grad_(true), b2 = torch::zeros({h}, opts).requires_grad_(true);
      const Transformer model(spec, rt.device());  // its norm and rotary, as the layers run them
      const auto norm = [&](const torch::Tensor& in, const torch::Tensor& w, const torch::Tensor& bias) {
        return model.norm(in, w, bias);
      };
      const auto rotary = [&](const torch::Tensor& in) { return model.rotary(in, s); };
      std::vector<torch::Tensor> grads;
      const auto layer = [&] {
        std::vector<torch::Tensor> outs;
        auto n1 = norm(x, w1, b1);
        outs.push_back(n1);  // the qkv projection's input
        auto q = rotary(qkv.narrow(-1, 0, nh * d).view({bsz, s, nh, d})).transpose(1, 2);
        auto k = rotary(qkv.narrow(-1, nh * d, nkv * d).view({bsz, s, nkv, d})).transpose(1, 2);
        auto v = qkv.narrow(-1, (nh + nkv) * d, nkv * d).view({bsz, s, nkv, d}).transpose(1, 2);
        if (nkv != nh) {
          k = k.repeat_interleave(nh / nkv, 1);
          v = v.repeat_interleave(nh / nkv, 1);
        }
        outs.push_back(q.contiguous());
        outs.push_back(k.contiguous());
        outs.push_back(v.contiguous());
        outs.push_back(attn_out.transpose(1, 2).reshape({bsz, s, nh * d}));  // the o projection's input
        torch::Tensor act;
        if (spec.gated_mlp) {
          auto gu = up.chunk(2, -1);
          act = torch::silu(gu[0]) * gu[1];
        } else {
          act = torch::gelu(up, spec.model_type == "gptj" ? "tanh" : "none");
        }
        outs.push_back(act);  // the down projection's input
        if (spec.parallel_residual) {
          if (spec.norms_per_layer == 2) outs.push_back(norm(x, w2, b2));
          outs.push_back(x + attn_proj + mlp_proj);
        } else {
          auto mid = x + attn_proj;
          outs.push_back(norm(mid, w2, b2));
          outs.push_back(mid + mlp_proj);
        }
        if (grads.empty())
          for (const auto& o : outs) grads.push_back(torch::randn_like(o));
        torch::autograd::backward(outs, grads);
      };
      const double sec = b.time_s(2, layer);
      const double bytes = static_cast<double>(tokens) *
                           activation_elems_per_token_per_layer(spec, AttentionKind::kFlash, static_cast<double>(s)) *
                           elem_bytes;
      b.emit({{"bench", "elementwise"}, {"model", name}, {"tokens", tokens}, {"seq_len", s}, {"bytes", bytes},
              {"dtype", rt.is_cuda() ? "bf16" : "fp32"}, {"seconds", sec}},
             "elementwise " + name + " " + std::to_string(tokens) + " tokens");
    }
  }
}

// Each collective on buffers of 1 MiB to 1 GiB (quick: 64 KiB to 4 MiB); the
// result of the first call is checked against its closed form.
void run_collectives(Bench& b, Runtime& rt, Collectives& comm, const Flags& f) {
  const int w = comm.world(), r = comm.rank();
  if (w < 2) return;
  const auto dt = rt.is_cuda() ? torch::kBFloat16 : torch::kFloat;
  const auto opts = torch::TensorOptions().dtype(dt).device(rt.device());
  const double elem = rt.is_cuda() ? 2.0 : 4.0;
  std::vector<double> sizes;
  for (double s = f.quick ? 64 * 1024.0 : kBytesPerMiB; s <= (f.quick ? 4 * kBytesPerMiB : 1024 * kBytesPerMiB); s *= 4) sizes.push_back(s);
  auto check = [&](bool ok, const char* what, double bytes) {
    if (!ok)
      throw std::runtime_error(std::string("microbench: ") + what + " of " + std::to_string(bytes) +
                               " bytes returned a wrong result on rank " + std::to_string(r));
  };
  const double rank_sum = w * (w + 1) / 2.0;  // sum over ranks of (rank + 1)
  for (double bytes : sizes) {
    const int64_t n = static_cast<int64_t>(bytes / elem) / w * w, shard = n / w;
    {
      auto t = torch::full({n}, r + 1.0, opts);
      rt.comm_waits_for_compute();
      comm.all_reduce_sum(t);
      rt.synchronize();
      check(t[n - 1].item<double>() == rank_sum && t[0].item<double>() == rank_sum, "all-reduce", bytes);
      const double sec = b.time_s(5, [&] { comm.all_reduce_sum(t); });
      b.emit({{"bench", "all_reduce"}, {"bytes", n * elem}, {"world", w}, {"nodes", f.emulate_nodes}, {"backend", comm.name()}, {"seconds", sec}},
             "all_reduce " + std::to_string(static_cast<int64_t>(bytes / kBytesPerMiB * 1024)) + " KiB");
    }
    {
      auto full = torch::full({n}, r + 1.0, opts), out = torch::empty({shard}, opts);
      rt.comm_waits_for_compute();
      comm.reduce_scatter_sum(full, out);
      rt.synchronize();
      check(out[0].item<double>() == rank_sum && out[shard - 1].item<double>() == rank_sum, "reduce-scatter", bytes);
      const double sec = b.time_s(5, [&] { comm.reduce_scatter_sum(full, out); });
      b.emit({{"bench", "reduce_scatter"}, {"bytes", n * elem}, {"world", w}, {"nodes", f.emulate_nodes}, {"backend", comm.name()}, {"seconds", sec}},
             "reduce_scatter " + std::to_string(static_cast<int64_t>(bytes / kBytesPerMiB * 1024)) + " KiB");
    }
    {
      auto mine = torch::full({shard}, r + 1.0, opts), full = torch::empty({n}, opts);
      rt.comm_waits_for_compute();
      comm.all_gather(mine, full);
      rt.synchronize();
      for (int q = 0; q < w; ++q) check(full[q * shard].item<double>() == q + 1.0, "all-gather", bytes);
      const double sec = b.time_s(5, [&] { comm.all_gather(mine, full); });
      b.emit({{"bench", "all_gather"}, {"bytes", n * elem}, {"world", w}, {"nodes", f.emulate_nodes}, {"backend", comm.name()}, {"seconds", sec}},
             "all_gather " + std::to_string(static_cast<int64_t>(bytes / kBytesPerMiB * 1024)) + " KiB");
    }
  }
}

// One size of host <-> device copies, both ways: "h2d"/"d2h" from pinned host memory, or
// "h2d_pageable"/"d2h_pageable" from pageable memory (DeepSpeed's offload buffers with
// "pin_memory": false; HostSpec::pageable_bytes_per_s), which the driver stages through its own
// pinned buffers while the calling thread waits. The host pages are touched first.
void time_copies(Bench& b, Runtime& rt, double bytes, bool pinned) {
  const int64_t n = static_cast<int64_t>(bytes) / 2;
  auto host = torch::empty({n}, torch::dtype(torch::kBFloat16).pinned_memory(pinned));
  auto dev = torch::empty({n}, torch::dtype(torch::kBFloat16).device(rt.device()));
  host.fill_(1.0);
  const std::string suffix = pinned ? "" : "_pageable";
  const std::string mib = std::to_string(static_cast<int64_t>(bytes / kBytesPerMiB)) + " MiB";
  const double up = b.time_s(2, [&] { rt.copy_to_device(dev, host); });
  b.emit({{"bench", "h2d" + suffix}, {"bytes", bytes}, {"pinned", pinned}, {"seconds", up}},
         (pinned ? "h2d " : "h2d pageable ") + mib);
  const double down = b.time_s(2, [&] { rt.copy_to_host_on_comm(host, dev); });
  b.emit({{"bench", "d2h" + suffix}, {"bytes", bytes}, {"pinned", pinned}, {"seconds", down}},
         (pinned ? "d2h " : "d2h pageable ") + mib);
}

// One size of DeepSpeed ZeRO-3 offload's cross-dtype copies (runtime/zero/stage3.py): the 16-bit
// gradient partition into its fp32 host buffer (partition_grads: fp32_grad_tensor.copy_), and
// after the CPU step the fp32 partition into the 16-bit GPU parameter. Torch stages a copy between
// devices and dtypes through a fresh temporary on the host, converting there
// (aten/src/ATen/native/cuda/Copy.cu, copy_requires_temporaries), and the calling thread waits:
// "d2h_staged" / "h2d_staged", `bytes` counting the 16-bit side as the DeepSpeed section's
// staged_copy_bytes_per_s does. The fp32 host buffer is pageable, as with "pin_memory": false.
void time_staged_copies(Bench& b, Runtime& rt, double bytes) {
  const int64_t n = static_cast<int64_t>(bytes) / 2;
  auto dev = torch::full({n}, 1.5, torch::dtype(torch::kBFloat16).device(rt.device()));
  auto host = torch::zeros({n}, torch::kFloat32);
  const std::string mib = std::to_string(static_cast<int64_t>(bytes / kBytesPerMiB)) + " MiB";
  const int threads = torch::get_num_threads();
  const double down = b.time_s(1, [&] { host.copy_(dev); });
  if (host[n - 1].item<float>() != 1.5f) throw std::runtime_error("microbench: d2h_staged copy lost its values");
  b.emit({{"bench", "d2h_staged"}, {"bytes", bytes}, {"threads", threads}, {"seconds", down}},
         "d2h staged bf16->fp32 " + mib);
  host.fill_(2.5);
  const double up = b.time_s(1, [&] { dev.copy_(host); });
  if (dev[0].item<float>() != 2.5f) throw std::runtime_error("microbench: h2d_staged copy lost its values");
  b.emit({{"bench", "h2d_staged"}, {"bytes", bytes}, {"threads", threads}, {"seconds", up}},
         "h2d staged fp32->bf16 " + mib);
}

// Pinned copies of 64 MiB to 1 GiB, the engine's per-unit sizes; pageable and staged ones from
// 4 MiB (a small layer's gradient) to 1 GiB.
void run_offload(Bench& b, Runtime& rt) {
  if (!rt.is_cuda()) return;
  for (double bytes = 64 * kBytesPerMiB; bytes <= 1024 * kBytesPerMiB; bytes *= 4) time_copies(b, rt, bytes, true);
  for (double bytes = 4 * kBytesPerMiB; bytes <= 1024 * kBytesPerMiB; bytes *= 4) time_copies(b, rt, bytes, false);
  for (double bytes = 4 * kBytesPerMiB; bytes <= 1024 * kBytesPerMiB; bytes *= 4) time_staged_copies(b, rt, bytes);
}

// CPU AdamW (fp32 states, and 8-bit) by thread count on 64 Mi parameters
// (quick: 1 Mi), bf16 gradient in and bf16 parameter out as in offload; the
// GPU kernels on 1 Mi to 256 Mi parameters.
void run_optimizer(Bench& b, Runtime& rt, const Flags& f) {
  const int64_t n = f.quick ? (int64_t{1} << 20) : (int64_t{1} << 26);
  kernels::AdamWArgs args;
  args.lr = 1e-4f;
  {
    std::vector<float> master(n, 0.01f), m(n, 0.0f), v(n, 0.0f), absm(quant8::num_blocks(n)), absv(quant8::num_blocks(n));
    std::vector<uint8_t> qm(n, 0), qv(n, 0);
    std::vector<uint16_t> grad(n), param(n);
    for (int64_t i = 0; i < n; ++i) grad[i] = float_to_bf16(1e-3f * static_cast<float>((i * 2654435761u) % 2001 - 1000) / 1000.0f);
    const int hw_threads = static_cast<int>(std::thread::hardware_concurrency());
    std::vector<int> threads;
    for (int t = 1; t <= hw_threads; t *= 2) threads.push_back(t);
    if (threads.back() != hw_threads) threads.push_back(hw_threads);
    for (OptimizerKind opt : {OptimizerKind::kAdamW, OptimizerKind::kAdamW8bit}) {
      for (int t : threads) {
        set_cpu_threads(t);
        int64_t step = 0;
        const double sec = b.time_s(1, [&] {
          args.step = ++step;
          if (opt == OptimizerKind::kAdamW)
            cpu_adamw(master.data(), m.data(), v.data(), grad.data(), kernels::DType::kBFloat16, param.data(),
                      kernels::DType::kBFloat16, n, args);
          else
            cpu_adamw8bit(master.data(), qm.data(), qv.data(), absm.data(), absv.data(), grad.data(),
                          kernels::DType::kBFloat16, param.data(), kernels::DType::kBFloat16, n, args);
        });
        b.emit({{"bench", "cpu_optimizer"}, {"optimizer", optimizer_name(opt)}, {"params", n}, {"threads", t},
                {"simd", simd_name(selected_simd())}, {"seconds", sec}},
               std::string("cpu ") + optimizer_name(opt) + " " + std::to_string(t) + " threads");
      }
    }
  }
  if (!rt.is_cuda()) return;
#ifdef STEPCAST_BACKEND_CUDA
  // 1 Mi to 256 Mi parameters: the launch-bound end fixes the per-step overhead.
  for (const int64_t g : {int64_t{1} << 20, int64_t{1} << 24, int64_t{1} << 28}) {
    const auto f32 = torch::dtype(torch::kFloat).device(rt.device());
    auto grad = (torch::randn({g}, f32) * 1e-3).to(torch::kBFloat16);
    auto master = torch::randn({g}, f32) * 0.02, out = torch::empty({g}, grad.options());
    const int inner = g < (int64_t{1} << 26) ? 20 : 2;
    int64_t step = 0;
    {
      auto m = torch::zeros({g}, f32), v = torch::zeros({g}, f32);
      const double sec = b.time_s(inner, [&] {
        args.step = ++step;
        kernels::adamw(master.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), grad.data_ptr(),
                       kernels::DType::kBFloat16, out.data_ptr(), kernels::DType::kBFloat16, g, args, nullptr);
      });
      b.emit({{"bench", "gpu_optimizer"}, {"optimizer", "adamw"}, {"params", g}, {"seconds", sec}},
             "gpu adamw " + std::to_string(g >> 20) + " Mi");
    }
    {
      auto u8 = torch::dtype(torch::kByte).device(rt.device());
      auto qm = torch::zeros({g}, u8), qv = torch::zeros({g}, u8);
      auto am = torch::zeros({quant8::num_blocks(g)}, f32), av = torch::zeros({quant8::num_blocks(g)}, f32);
      const double sec = b.time_s(inner, [&] {
        args.step = ++step;
        kernels::adamw8bit(master.data_ptr<float>(), qm.data_ptr<uint8_t>(), qv.data_ptr<uint8_t>(),
                           am.data_ptr<float>(), av.data_ptr<float>(), grad.data_ptr(), kernels::DType::kBFloat16,
                           out.data_ptr(), kernels::DType::kBFloat16, g, args, quant8::signed_magnitudes(),
                           quant8::unsigned_map(), nullptr);
      });
      b.emit({{"bench", "gpu_optimizer"}, {"optimizer", "adamw8bit"}, {"params", g}, {"seconds", sec}},
             "gpu adamw8bit " + std::to_string(g >> 20) + " Mi");
    }
  }
#endif
}

int run_rank(const Flags& f) {
  const Rendezvous rv = rendezvous_from_env(300);
  const bool lead = rv.rank == 0;
  const auto dir = resolve_data_dir(f.data_dir);

  std::unique_ptr<Runtime> rt = Runtime::from_flag(f.device, rv.local_rank);

  const std::vector<std::string> suites = split_comma_list(f.suites);
  for (const auto& s : suites)
    if (s != "compute" && s != "attention" && s != "elementwise" && s != "collectives" && s != "offload" && s != "optimizer")
      throw InputError("--suite \"" + s +
                       "\" is not valid (valid: compute, attention, elementwise, collectives, offload, optimizer)");
  auto has = [&](const char* s) { return std::find(suites.begin(), suites.end(), s) != suites.end(); };

  if (lead) append_lines(f.out, "");  // fails now, naming --out's path
  const auto t0 = std::chrono::steady_clock::now();
  Bench b(*rt, f.repeats, lead ? f.out : std::string());
  Connection conn = connect(rv, *rt);
  Collectives* comm = conn.comm.get();
  const c10::intrusive_ptr<c10d::Store>& store = conn.store;
  if (lead) {
    nlohmann::json env = {{"kind", "micro_env"},
                          {"device", rt->device_name()},
                          {"driver", rt->driver_version()},
                          {"libtorch", TORCH_VERSION},
                          {"collectives", comm->name()},
                          {"world_size", rv.world},
                          {"nodes", f.emulate_nodes},
                          {"hardware_threads", std::thread::hardware_concurrency()},
                          {"git_commit", STEPCAST_GIT_COMMIT},
                          {"suites", f.suites},
                          {"quick", f.quick}};
    append_lines(f.out, env.dump() + "\n");
  }
  // Collectives first, on every rank; the other suites on rank 0 alone.
  if (has("collectives")) run_collectives(b, *rt, *comm, f);
  if (!lead) {
    // Stay until rank 0 has finished (it serves the store; the launcher stops
    // every rank when one ends abnormally).
    store->wait({"microbench_done"}, std::chrono::milliseconds(1800 * 1000));
    return 0;
  }
  {
    if (has("compute")) run_compute(b, *rt, f, dir);
    if (has("attention") && !has("compute")) run_attention(b, *rt, f);
    if (has("elementwise") && !has("compute")) run_elementwise(b, *rt, f, dir);
    if (has("offload")) run_offload(b, *rt);
    if (has("optimizer")) run_optimizer(b, *rt, f);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    append_lines(f.out, nlohmann::json{{"kind", "micro_done"}, {"suites", f.suites}, {"records", b.count_},
                                       {"wall_s", wall}}.dump() + "\n");
    std::fprintf(stderr, "microbench: %d measurements in %.1f s, appended to %s\n", b.count_, wall, f.out.c_str());
    print_ratios(b.records_);
    if (store) store->set("microbench_done", std::vector<uint8_t>{1});
  }
  return 0;
}

int main_impl(int argc, char** argv) {
  CLI::App app{"Stepcast microbench: times GEMMs, attention, collectives, PCIe copies and optimizers alone, for calibrate's component fit."};
  Flags f;
  app.add_option("--out", f.out, "JSONL file to append the measurements to")->required();
  app.add_option("--suite", f.suites, "comma-separated: compute (GEMMs, attention, the layers' element-wise work), attention (alone), "
                 "elementwise (alone), collectives, offload, optimizer")->capture_default_str();
  app.add_option("--models", f.models, "models whose GEMM shapes to time")->capture_default_str();
  app.add_option("--nproc", f.nproc, "ranks for the collectives (one per GPU)")->capture_default_str();
  app.add_option("--emulate-nodes", f.emulate_nodes,
                 "start the --nproc ranks as this many nodes on this host (it divides --nproc), so that the "
                 "collectives between them take NCCL's network transport; recorded in each record (nodes)")
      ->capture_default_str();
  app.add_option("--emulated-node", f.emulated_node, "set by --emulate-nodes for the ranks it starts")->group("");
  app.add_option("--repeats", f.repeats, "timed repetitions per measurement (median)")->capture_default_str();
  app.add_option("--device", f.device, "auto | cpu | cuda")->capture_default_str();
  app.add_option("--data-dir", f.data_dir, "folder with models/ and hardware/");
  app.add_flag("--quick", f.quick, "small sizes (tests on the CPU)");
  int launcher_pid = 0;
  app.add_option("--launcher-pid", launcher_pid, "set by --nproc for the ranks it starts")->group("");
  if (const auto status = parse_cli(app, argc, argv, "microbench")) return *status;
  die_with_launcher(launcher_pid);
  if (f.nproc < 1) throw InputError("--nproc " + std::to_string(f.nproc) + " must be at least 1");
  if (f.repeats < 1) throw InputError("--repeats " + std::to_string(f.repeats) + " must be at least 1");
  check_emulated_nodes(f.nproc, f.emulate_nodes);
  if (f.nproc > 1 && std::getenv("RANK") == nullptr) {
    std::vector<std::string> args(argv, argv + argc);
    return launch_local_ranks(f.nproc, args, 10, f.emulate_nodes);
  }
  if (f.emulate_nodes > 1 && f.emulated_node < 0)
    throw InputError("--emulate-nodes " + std::to_string(f.emulate_nodes) + " needs --nproc to start the ranks");
  return run_rank(f);
}

}  // namespace
}  // namespace stepcast::backend

int main(int argc, char** argv) {
  return stepcast::run_main("microbench", [&] { return stepcast::backend::main_impl(argc, argv); });
}
