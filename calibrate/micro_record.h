// Micro-benchmark records as `microbench --out` writes them (one JSON object
// per measurement, "kind": "micro"), and the cost model's prediction of each
// from the same component formulas the step model uses (model/step_time.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "model/coefficients.h"
#include "model/hardware.h"
#include "model/metrics.h"
#include "model/step_time.h"
#include "model/train_config.h"

namespace stepcast::calibrate {

// kH2DPageable, kD2HPageable: copies from and to pageable host memory, at the host's measured
// HostSpec::pageable_bytes_per_s; no coefficient reads them (the component fit skips them).
// kD2HStaged, kH2DStaged: DeepSpeed ZeRO-3 offload's cross-dtype copies between a 16-bit GPU
// tensor and a pageable fp32 host one, which torch stages through a host temporary; `bytes`
// counts the 16-bit side. Predicted at the DeepSpeed section's staged_copy_bytes_per_s and
// host_copy_bytes_per_s_per_thread (`calibrate report --engine deepspeed` compares them with the
// host's measurement); no fit reads them.
enum class MicroBench { kGemm, kAttention, kAttentionBwd, kAllReduce, kReduceScatter, kAllGather, kH2D, kD2H, kCpuOptimizer, kGpuOptimizer, kElementwise, kH2DPageable, kD2HPageable, kD2HStaged, kH2DStaged };
inline constexpr int kNumMicroBenches = 15;
const char* micro_bench_name(MicroBench b);
// DeepSpeed ZeRO-3's staged copies: the DeepSpeed section's components, not our engine's.
inline bool is_staged_copy(MicroBench b) { return b == MicroBench::kD2HStaged || b == MicroBench::kH2DStaged; }

struct MicroRecord {
  MicroBench bench{};
  std::string where;   // file:line
  double seconds = 0;  // median of the timed repetitions
  // gemm: C(m x n) = A(m x k) B(k x n), bf16
  double m = 0, n = 0, k = 0;
  // attention: causal, flash; forward, or backward alone
  double batch = 0, heads = 0, seq_len = 0, head_dim = 0;
  // collectives and copies: bytes of the full buffer; ranks, and the nodes they form
  // (microbench --emulate-nodes: nodes on one host, joined by NCCL's network transport)
  double bytes = 0, world = 1, nodes = 1;
  // elementwise: one decoder layer's element-wise work, forward and backward, on `tokens` tokens of
  // `model`; `bytes` is the cost model's element-wise traffic of that layer's forward (analytic
  // saved activations)
  std::string model;
  double tokens = 0;
  // optimizers: parameters updated, CPU threads
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  double params = 0, threads = 0;
  // The device the file's "micro_env" line names ("NVIDIA H200", "cpu"); empty where none precedes.
  std::string device;
  std::string label() const;  // e.g. "gemm 8192x11008x4096"
};

// Reads the "kind": "micro" lines of JSONL files (other lines are skipped);
// a malformed micro line fails with file:line and the key.
std::vector<MicroRecord> load_micro(const std::vector<std::filesystem::path>& files);

// The host's rate for copies between the GPU and pageable memory (HostSpec::pageable_bytes_per_s):
// the median of bytes / seconds over the h2d_pageable and d2h_pageable records of 16 MiB and up
// (the sizes of a layer's tensors, past the per-copy latency); 0 where there are none.
double pageable_copy_bytes_per_s(const std::vector<MicroRecord>& micro);

// True for the benchmarks that time the GPU or its links (all but the CPU optimizer): on a
// "cpu" device they time the CPU instead and measure nothing of the GPU.
bool times_gpu(MicroBench b);

// The coefficients a record's formula reads (those the component fit may move).
std::vector<Coef> micro_coefs(MicroBench b);
std::vector<Coef> micro_coefs(const MicroRecord& r);  // the same, with the inter-node link's across nodes

// Predicted seconds of one micro-benchmark on `hw` with coefficients `coef`.
template <class T>
T predict_micro(const MicroRecord& r, const HardwareProfile& hw, const T* coef) {
  const double bf16_peak = hw.gpu.peak_flops_per_s(Precision::kBf16);
  const double n = r.world;
  switch (r.bench) {
    case MicroBench::kGemm:
      return gemm_time_s(GemmShape{r.m, r.n, r.k, 1.0}, bf16_peak * hw.gpu.matmul_eff_rel_h200, coef);
    case MicroBench::kAttention:
    case MicroBench::kAttentionBwd: {
      const double fwd_flops =
          causal_attention_fwd_flops(r.batch, r.seq_len, r.heads * r.head_dim, AttentionKind::kFlash);
      const AttnHeadDimRel rel = attention_head_dim_rel(hw.gpu, r.head_dim);
      return r.bench == MicroBench::kAttention
                 ? attention_fwd_time_s(fwd_flops, r.seq_len, false, bf16_peak, coef) * rel.fwd
                 : attention_bwd_time_s(fwd_flops, r.seq_len, kFlashAttnBwdFlopsMult, false, bf16_peak, coef) * rel.bwd;
    }
    case MicroBench::kAllReduce:
    case MicroBench::kReduceScatter:
    case MicroBench::kAllGather: {
      const CollectiveLink link =
          collective_link(hw, static_cast<int>(r.world / r.nodes), static_cast<int>(r.nodes));
      const double bus_factor = r.bench == MicroBench::kAllReduce   ? allreduce_bus_factor(n)
                                : r.bench == MicroBench::kAllGather ? all_gather_bus_factor(n)
                                                                    : reduce_scatter_bus_factor(n);
      return collective_time_s(r.bytes, 1.0, bus_factor, r.bench == MicroBench::kAllReduce, link.bytes_per_s,
                               link.inter_node, link.extra_latency_s, coef);
    }
    case MicroBench::kH2D:
      return pcie_copy_time_s(r.bytes, hw.host.h2d_bytes_per_s, coef);
    case MicroBench::kD2H:
      return pcie_copy_time_s(r.bytes, hw.host.d2h_bytes_per_s, coef);
    case MicroBench::kH2DPageable:
    case MicroBench::kD2HPageable:  // as step_time.h times DeepSpeed's unpinned copies
      return T(r.bytes / hw.host.pageable_bytes_per_s);
    case MicroBench::kD2HStaged:  // as step_time.h times DeepSpeed ZeRO-3's gradient copy
      return T(r.bytes) / coef[kStagedCopyBytesPerS];
    case MicroBench::kH2DStaged:
      // As step_time.h times DeepSpeed ZeRO-3's parameter copy after the step: the conversion on
      // the threads, then the 16-bit bytes staged to the GPU by one thread.
      return host_copy_time_s(host_convert_bytes(r.bytes / 2.0, 2.0), r.bytes, 1.0, r.threads,
                              hw.host.dram_bytes_per_s, coef);
    case MicroBench::kCpuOptimizer:
      return cpu_optimizer_time_s(r.params, optimizer_traffic_bytes(r.optimizer, Precision::kBf16, true),
                                  optimizer_flops(r.optimizer), r.threads, hw.host.simd_fp32_lanes,
                                  hw.host.dram_bytes_per_s, coef);
    case MicroBench::kGpuOptimizer:
      return gpu_optimizer_time_s(r.params, optimizer_traffic_bytes(r.optimizer, Precision::kBf16, false),
                                  optimizer_flops(r.optimizer), hw.gpu.memory_bytes_per_s, coef);
    case MicroBench::kElementwise:
      // The step model's forward and backward element-wise time of one layer (step_time.h).
      return elementwise_time_s(r.bytes, hw.gpu.memory_bytes_per_s, coef) * (1.0 + 2.0 * coef[kBackwardSlowdownMult]);
  }
  return T(0.0);
}

}  // namespace stepcast::calibrate
