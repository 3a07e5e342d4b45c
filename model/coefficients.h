// The cost model's coefficients: every efficiency, latency and overhead that
// a datasheet cannot give and a fit (calibrate/) can replace. Each has a name
// (with its unit), physical bounds and a default. The templated formulas in
// step_time.h and memory.h read them from a plain array indexed by Coef, so
// the same code runs on double (planner) and on ceres::Jet (fit).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stepcast {

enum Coef : int {
  // --- compute --------------------------------------------------------------
  kGemmEffMaxFrac,           // best fraction of the dense peak a large GEMM reaches
  kGemmHalfDim,              // GEMM dimension (elements) at which that dimension halves efficiency
  kFp32GemmEffMaxFrac,       // best fraction of the fp32 (CUDA-core) peak a large fp32 GEMM reaches
  kAttnEffMaxFrac,           // best fraction of peak of fused (flash) attention
  kAttnHalfSeqTokens,        // sequence length at which attention runs at half its best efficiency
  kBackwardSlowdownMult,     // the backward's element-wise time / twice the forward's
  kWeightGradGemmMult,       // a weight-gradient GEMM's time / its forward GEMM's
  kAttnBwdEffMaxFrac,        // best fraction of peak of the fused attention backward
  kAttnBwdHalfSeqTokens,     // sequence length at which the attention backward runs at half its best
  kElementwiseTrafficMult,   // HBM bytes moved by non-GEMM ops per byte of saved activation
  kElementwiseBwEffFrac,     // the layers' element-wise kernels' rate over the HBM rate that term assumes (microbench)
  kLayerOverheadS,           // fixed launch and sync time per layer per pass (forward or backward)
  kParamFetchOverheadS,      // host time of one hooked parameter fetch (peer engines' ZeRO-3 / FSDP2 units)
  kGradHookOverheadS,        // a peer engine's gradient reduction hook per parameter tensor in the backward (host)
  kParamFetchBytesPerS,      // parameter bytes a peer engine's ZeRO-3 fetch makes available per second (on the hooks' thread)
  kHostLayerFwdS,            // host time to issue one layer's forward (the floor of a launch-bound forward)
  kHostLayerBwdS,            // host time to issue one layer's backward (the floor of a launch-bound backward)
  // --- communication --------------------------------------------------------
  kCollLatencyS,             // latency of one NCCL collective call
  kIntraBusEffFrac,          // achieved bus bandwidth / intra-node link bandwidth
  kInterBusEffFrac,          // achieved bus bandwidth / inter-node bandwidth per GPU
  kRsAgBusEffMult,           // reduce-scatter and all-gather bus bandwidth relative to all-reduce
  kGradCommOverlapFrac,      // share of backward time that can hide gradient reduction
  kGatherOverlapFrac,        // share of compute time that can hide stage-3 gathers and param upload
  kCommInterferenceFrac,     // compute time a hidden collective still adds, per second of it (NCCL's SMs and HBM traffic)
  // --- offload --------------------------------------------------------------
  kPcieEffFrac,              // achieved fraction of the pinned PCIe bandwidth
  kOffloadOverlapFrac,       // share of backward time that can hide gradient copies to the host
  kCpuOptOverlapFrac,        // share of the last backward that hides the pipelined CPU optimizer
  kFwdUploadOverlapFrac,     // share of the next forward that hides the rest (offload pipeline "full")
  kStagedCopyBytesPerS,      // blocking device-to-host copy into a new pageable host tensor (torch's temporaries)
  kHostCopyBytesPerSPerThread,  // host memory copied (or converted) by one CPU thread: torch's CPU copy_, pageable staging
  // --- optimizer ------------------------------------------------------------
  kGpuOptBwEffFrac,          // GPU optimizer: achieved fraction of HBM bandwidth
  kGpuOptFlopsPerS,          // GPU optimizer: arithmetic rate of its kernels (8-bit decode/encode)
  kCpuCoreBytesPerSPerLane,  // CPU optimizer: streaming rate of one core per fp32 SIMD lane
  kCpuLaneFlopsPerS,         // CPU optimizer: arithmetic rate of one fp32 SIMD lane
  kCpuDramEffFrac,           // CPU optimizer: achievable fraction of host DRAM bandwidth
  kOptStepOverheadS,         // fixed time of one GPU optimizer step (kernel launches)
  kCpuOptStepOverheadS,      // fixed time of one CPU optimizer step (thread wake-up, sync)
  // --- memory ---------------------------------------------------------------
  kGpuWorkspaceBytes,        // CUDA context, cuBLAS/NCCL workspaces, allocator reserve
  kGpuFragFrac,              // caching-allocator reserve above the peak, per byte of activations and temporaries
  kCkptReserveMult,          // caching-allocator reserve above the peak, per byte of checkpointed layer inputs
  kActBytesMult,             // saved activations relative to the analytic count
  kLossExtraBytesPerLogit,   // bytes per logit beyond the logits themselves (fp32 log-softmax, grad)
  kLossReserveBytesPerLogit, // caching-allocator reserve the loss's freed buffers leave, per logit
  kHostBytesPerRank,         // host memory of one rank process beyond its buffers
  kExpandableReserveFrac,    // with expandable segments: the share of the default allocator's cache above the peak left
  kNumCoefs
};

struct CoefInfo {
  Coef id;
  std::string_view name;  // as written in hardware profiles and fit reports
  double lower;
  double upper;
  double default_value;
  std::string_view unit;
  std::string_view meaning;
};

// The table, in Coef order.
const std::array<CoefInfo, kNumCoefs>& coef_table();

// The coefficients that belong to the training engine rather than to the hardware: how its
// model implementation and kernels use the GPU (element-wise traffic, launch overheads,
// backward slowdown), how it overlaps collectives and copies, its optimizers' rates, its
// host copies' efficiency, and its memory habits (activations, loss, allocator, workspace).
// A profile's [engines.NAME] section sets these for DeepSpeed or FSDP2; the rest (GEMM and
// attention kernels, NCCL, PCIe, DRAM) are the hardware's and are shared by every engine.
// The memory coefficients among engine_coefs: workspace, fragmentation, activation and loss
// multipliers and host bytes per rank.
bool is_memory_coef(Coef c);
const std::vector<Coef>& engine_coefs();
bool is_engine_coef(Coef c);

// Looks a coefficient up by its name; nullopt when unknown.
std::optional<Coef> coef_by_name(std::string_view name);

// A full coefficient vector, defaults unless overridden.
using CoefVector = std::array<double, kNumCoefs>;
CoefVector default_coefs();

}  // namespace stepcast
