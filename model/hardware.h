// HardwareProfile: a GPU, its host slice and its links, read from a TOML
// profile in data/hardware/. Every number carries its source. The cost
// model's coefficients live in the profile too, with a flag that says whether
// a fit produced them.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/coefficients.h"

namespace stepcast {

enum class Precision { kFp32, kBf16, kFp16 };

struct GpuSpec {
  std::string name;
  double memory_bytes = 0;            // total device memory
  double memory_bytes_per_s = 0;      // HBM / GDDR bandwidth
  double peak_bf16_flops_per_s = 0;   // dense tensor-core peaks
  double peak_fp16_flops_per_s = 0;
  double peak_tf32_flops_per_s = 0;
  double peak_fp32_flops_per_s = 0;   // plain fp32 (no tensor cores)
  // The largest bf16 matmul efficiency this GPU reaches (achieved over dense peak, searched over
  // shapes) relative to the H200's, on which the GEMM coefficients are fitted: 1 on the H200 and
  // where nobody published the figure. The GEMM time divides by it (step_features.cpp).
  double matmul_eff_rel_h200 = 1.0;
  // [gpu.attention_head_dim_s]: the fused (flash) causal attention kernel's forward and backward
  // seconds at one shape (heads, sequence, tokens) for each head dimension measured by
  // `microbench --suite attention`. The attention coefficients are fitted at heads of 128; a head of
  // d costs its FLOPs times attention_head_dim_rel(d). Empty: every head costs as one of 128.
  struct AttnHeadDimCost {
    double fwd_s = 0, bwd_s = 0;
  };
  std::map<int, AttnHeadDimCost> attention_head_dim_s;
  std::string attention_head_dim_source;
  double peak_flops_per_s(Precision p) const;
};

// Time per FLOP of the flash attention kernels at head dimension `head_dim` relative to a head
// of 128 (GpuSpec::attention_head_dim_s), forward and backward: the measured time scaled by
// 128 / d (the FLOPs grow with d), linear in d between measured dimensions and the nearest
// measured one's ratio outside them; 1 without a table.
struct AttnHeadDimRel {
  double fwd = 1, bwd = 1;
};
AttnHeadDimRel attention_head_dim_rel(const GpuSpec& gpu, double head_dim);

// The Hugging Face model_types the peer harness builds (bench/peers/peer.py, hf_config).
inline constexpr std::array<std::string_view, 5> kPeerModelTypes = {"llama", "mistral", "qwen2", "gpt_neox", "gptj"};

struct HostSpec {
  int pcie_gen = 0;
  double h2d_bytes_per_s = 0;         // pinned host -> device, per GPU
  double d2h_bytes_per_s = 0;         // pinned device -> host, per GPU
  // A copy between the GPU and pageable host memory (either way, per GPU): the CUDA driver stages
  // it through its own pinned buffers, one thread copying on the host, and the issuing thread
  // waits (`microbench --suite offload`, "h2d_pageable"/"d2h_pageable"). 0: not given (a plan
  // with unpinned offload buffers cannot be timed on this profile).
  double pageable_bytes_per_s = 0;
  double cpu_cores_per_gpu = 0;       // cores available to the job per GPU
  int simd_fp32_lanes = 0;            // 8 = AVX2, 16 = AVX-512
  std::string simd;                   // "avx2" or "avx512"
  double dram_bytes_per_s = 0;        // host DRAM bandwidth available to the job (per node)
  double memory_bytes_per_gpu = 0;    // host memory per GPU
  // [host.transformers_layer_s]: the host time of one Hugging Face `transformers` decoder layer's
  // forward and backward on this host, per model_type (bench/peers/host_profile.py): what the
  // peers (DeepSpeed, FSDP2), which run those models in eager PyTorch, cannot issue a layer's
  // kernels faster than. Empty: not profiled (the engine coefficient alone stands for it).
  struct LayerHostCost {
    double fwd_s = 0, bwd_s = 0;
  };
  std::map<std::string, LayerHostCost> transformers_layer_s;
  std::string transformers_layer_source;
  // Each family's cost relative to the mean over the profiled families (relate_layer_costs):
  // what a peer's fitted per-layer host time is multiplied by for that family.
  struct LayerHostRel {
    double fwd_rel = 1, bwd_rel = 1;
  };
  std::map<std::string, LayerHostRel> transformers_layer_rel;
};

// Fills host.transformers_layer_rel from host.transformers_layer_s.
void relate_layer_costs(HostSpec& host);

struct LinkSpec {
  std::string intra_node;                     // "nvlink" or "pcie"
  double intra_node_bytes_per_s = 0;          // per GPU, one direction
  double inter_node_bytes_per_s = 0;          // per GPU, one direction
  double inter_node_latency_s = 0;
  int gpus_per_node_max = 0;
};

// The step-time interval a fit calibrates on its own cross-validation (split conformal, Vovk
// et al. 2005; Lei et al. 2018): the 95 % quantile of |log(measured / predicted)| over
// predictions of configurations whose regime the fit saw (leave one configuration out), and
// over predictions in regimes it never saw (leave one group out: a model, ZeRO stage, offload,
// sequence length or GPU count held out whole); and the region its runs cover. A prediction's
// half-width grows from the first by the step to the second for each dimension outside the region.
//
// Launch-bound predictions (kLaunchBoundIssueRatio) have quantiles of their own (Mondrian
// conformal, Vovk et al. 2005, ch. 4: the guarantee holds within each class): there the step
// follows the host's single-thread speed, which differs between machines of one kind. Where a
// profile has none (log_q95_seen_launch_bound 0), one pair covers every prediction.
struct IntervalModel {
  double log_q95_seen = 0;    // 0: no interval model (covariance and model error instead)
  double log_q95_unseen = 0;
  int seen_predictions = 0, unseen_predictions = 0;  // how many cross-validated residuals each rests on
  double log_q95_seen_launch_bound = 0;  // 0: launch-bound predictions take the pair above
  double log_q95_unseen_launch_bound = 0;
  int seen_launch_bound_predictions = 0, unseen_launch_bound_predictions = 0;
  // The same for the peak reserved GPU memory: 95 % quantiles of |log(measured / predicted)|,
  // seen and unseen regimes; 0: no memory interval.
  double memory_log_q95_seen = 0, memory_log_q95_unseen = 0;
  int memory_seen_predictions = 0, memory_unseen_predictions = 0;
  std::vector<std::string> models, offloads, precisions, attentions;
  std::vector<std::string> pefts = {"none"};  // fine-tuning methods (peft_name); absent in a profile: full only
  std::vector<int64_t> zero_stages, world_sizes;
  double seq_min = 0, seq_max = 0;  // sequence lengths between them count as seen
  double micro_tokens_max = 0;      // micro-batch x sequence beyond it counts as unseen
  bool empty() const { return log_q95_seen <= 0.0; }
  bool has_launch_bound_class() const { return log_q95_seen_launch_bound > 0.0; }
  bool has_memory() const { return memory_log_q95_seen > 0.0; }
};

// [coefficients.held_out]: the interval a transferred profile takes from its own GPU kind's runs
// predicted before they ran (HardwareProfile::held_out).
struct HeldOutInterval {
  std::string source;
  std::vector<std::string> runs;             // the runs files, relative to the data folder
  std::map<std::string, double> log_q95;     // engine name -> quantile
  int64_t world_size_max = 0;                // the largest data-parallel world among the runs
  // The quantile of a plan of `engine` on `nodes` x (world_size / nodes) GPUs inside the runs'
  // region; 0 outside it or for an engine without one.
  double log_q95_for(const std::string& engine, int64_t world_size, int64_t nodes) const {
    const auto it = log_q95.find(engine);
    return it != log_q95.end() && world_size <= world_size_max && nodes <= 1 ? it->second : 0.0;
  }
};

// A prediction is launch-bound when the host needs at least this share of the GPU's time to
// issue its passes (StepTime::host_issue_ratio). Below 1 because a machine whose host is slower
// than the calibrated ones turns such a pass host-bound: the same configuration on H200 hosts
// of one kind ran 1.143-1.502 s (docs/calibration.md, the host floor at every stage), a host
// 1.3x slower, and 1 / 1.3 is about 0.75.
inline constexpr double kLaunchBoundIssueRatio = 0.75;

// The hash split a fit held out by (calibrate/run_record.h, is_holdout): frac < 0 when unknown.
struct HoldoutSplit {
  double frac = -1.0;
  uint64_t seed = 0;
};
// `calibrate fit`'s default split, and the report's for a profile written before the split was
// recorded.
inline constexpr HoldoutSplit kDefaultHoldoutSplit{0.25, 1};
// Throws InputError naming `flag` unless 0 <= split.frac < 1 (fit and report share the check).
void check_holdout_split(const HoldoutSplit& split, const char* flag);

// A profile's [engines.NAME] section: the engine coefficients (coefficients.h, engine_coefs)
// fitted to that engine's runs on this hardware.
struct EngineSection {
  bool calibrated = false;
  std::string source;
  std::vector<std::string> runs;       // the runs files it was fitted from (as [coefficients] runs)
  HoldoutSplit holdout;                // the split its fit held out
  std::map<Coef, double> values;       // engine coefficients it sets
  double model_error_frac = 0;         // RMS relative step-time residual of its fit
  IntervalModel interval;              // [engines.NAME.interval]
};

// One provider's on-demand list price for this GPU kind ([[prices]] in the profile), with the
// pod or instance size it comes with where the provider publishes one.
struct PriceOffer {
  std::string provider;           // "coreweave", "lambda", ...
  double usd_per_gpu_hour = 0;
  bool kubernetes = false;        // the provider schedules pods on Kubernetes
  bool includes_host = false;     // the price includes the host's vCPUs and memory
  double vcpus_per_gpu = 0;       // 0 = not published
  double memory_bytes_per_gpu = 0;  // host memory per GPU of the instance or pod; 0 = not published
  std::string source;             // where the number was read
  std::string date;               // when it was read (YYYY-MM-DD)
};

// [coefficients.measured]: components of this hardware that `microbench` timed on it and
// `calibrate fit` measured (its component fit, calibrate/fit.h), as ratios to the same
// component fit on the reference profile's micro-benchmarks. The reference is a calibrated
// profile: this one when it is calibrated itself, else its engines_from. On loading
// (resolve_hardware, apply_measured) each measured coefficient becomes the reference's value
// times its ratio, in [coefficients] and in every engine section that sets it: a component's
// rate moves with the hardware, and what the training step and each engine make of it (the
// reference's end-to-end fit over its component fit) carries over.
struct MeasuredComponents {
  std::string reference;           // the calibrated profile the ratios are taken against
  std::string source;              // provenance: date, commit, records, data hash, fit error
  std::vector<std::string> runs;   // the micro-benchmark files measured
  std::map<Coef, double> rel;      // coefficient -> this hardware's component value / the reference's
  bool empty() const { return rel.empty(); }
};

struct HardwareProfile {
  std::string name;
  std::string path;          // file it was read from
  std::string description;
  GpuSpec gpu;
  HostSpec host;
  LinkSpec links;
  double price_per_gpu_hour = 0;  // the first offer's price; 0 = unknown
  std::vector<PriceOffer> prices;  // [[prices]], the default first
  std::map<std::string, std::string> sources;  // dotted key -> source

  CoefVector coefs{};
  // Which of `coefs` the profile's [coefficients] sets itself; the others are defaults, or the
  // engines_from profile's fitted values (transfer_reference_coefficients).
  std::array<bool, kNumCoefs> coefs_in_file{};
  bool coefs_calibrated = false;
  std::string coefs_source;
  std::vector<double> coef_std_errors;  // from a fit's covariance; empty when not calibrated
  double model_error_frac = 0;  // RMS relative step-time residual of the fit (added to intervals)
  double max_micro_tokens = 0;  // largest micro-batch x sequence among the fitted runs; 0 = unknown
  // [coefficients] runs: the files the coefficients were fitted from, in the fit's order,
  // relative to the data folder (or absolute); `calibrate report` without --runs reads them.
  std::vector<std::string> calibration_runs;
  // Micro-benchmark files measured on this GPU after its fit, not fitted: read only as the
  // reference another GPU's measured components are taken against (calibrate fit on
  // micro-benchmarks alone). A refit lists them among its runs instead.
  std::vector<std::string> component_runs;
  // holdout_frac and holdout_seed beside runs: the configurations the fit held out (is_holdout);
  // a fraction < 0 when the profile does not say (written before they were recorded).
  HoldoutSplit calibration_holdout;
  std::vector<std::vector<double>> coef_covariance;  // kNumCoefs x kNumCoefs; empty when not calibrated
  IntervalModel interval;                             // [coefficients.interval]
  std::map<std::string, EngineSection> engines;       // [engines.deepspeed], [engines.fsdp2]
  std::string engine = "stepcast";                    // the engine `coefs` are for (for_engine)
  // [coefficients] engines_from: a calibrated profile whose engine sections this one takes for
  // the engines it has no section of (transfer_engine_sections); empty: none.
  std::string engines_from;
  // [coefficients] transferred_log_q95 of a profile that was not calibrated: the 95 % conformal
  // quantile of |log(published / predicted)| over the published throughputs of GPUs that were
  // not calibrated (`calibrate report --published`); the predictions' interval. 0: none.
  double transferred_log_q95 = 0;
  // [coefficients] transferred_log_q95_no_offload: the same quantile over the rows without CPU
  // offload, the interval of a plan without it. Such a plan rests on the GPU's datasheet and the
  // engines' transferred habits; offload adds the unnamed host's CPU and memory, which a datasheet
  // profile only guesses. 0: none (transferred_log_q95 applies to every plan).
  double transferred_log_q95_no_offload = 0;
  // [coefficients.held_out] of a profile that was not calibrated: its own GPU kind's runs, each
  // predicted before it ran and never fitted. Per engine, the 95 % split-conformal quantile of
  // |log(measured / predicted)| over those runs (`calibrate report --runs RUNS --engine E`:
  // held_out_interval.log_q95), where they are at least kConformalMinScores; the interval of a
  // plan of that engine inside their region (world size at most world_size_max, one node), in
  // place of the published one. Empty: none.
  HeldOutInterval held_out;
  CoefVector hardware_coefs{};                        // for_engine: the [coefficients] values under the section
  MeasuredComponents measured;                        // [coefficients.measured]; applied by resolve_hardware
  bool measured_applied = false;                      // apply_measured has set the measured coefficients
};

HardwareProfile parse_hardware_profile(const std::string& toml_text, const std::string& origin);

// What a fit writes into a profile's [coefficients] section (read back by parse_hardware_profile).
struct CalibratedCoefficients {
  CoefVector values;
  std::vector<double> std_errors;   // kNumCoefs; 0: not written
  std::vector<Coef> free;           // the fitted coefficients, in the covariance's order
  std::vector<std::vector<double>> covariance;  // kNumCoefs x kNumCoefs; empty: not written
  double model_error_frac = 0;
  double max_micro_tokens = 0;
  std::string source;               // provenance: date, commit, data hash, solver summary
  std::vector<std::string> runs;    // the runs files, relative to the data folder where inside it
  HoldoutSplit holdout;             // the split the fit held out (run_record.h, is_holdout)
  IntervalModel interval;           // empty: not written
};

// The profile text with its [coefficients] section (and all after it) replaced by `c`,
// marked calibrated. The writer of the section parse_hardware_profile reads.
std::string with_calibrated_coefficients(const std::string& profile_text, const CalibratedCoefficients& c);

// The profile as the cost model sees it for `engine` (train_config.h's engine_name): the
// hardware coefficients with the engine section's values over them, calibrated when both the
// hardware and the engine section are, its fit's model error and runs. Without a section the
// engine gets the hardware's (Stepcast-fitted) engine coefficients and is marked not calibrated;
// "stepcast" returns the profile unchanged.
HardwareProfile for_engine(const HardwareProfile& hw, const std::string& engine);

// The profile text with its [engines.NAME] section replaced (or added before [coefficients]),
// marked calibrated; only engine coefficients (engine_coefs) are written.
std::string with_engine_section(const std::string& profile_text, const std::string& engine,
                                const CalibratedCoefficients& c);

// True when a configuration's micro-batch x sequence lies beyond the fitted runs
// of a calibrated profile: its time and memory are extrapolated.
bool beyond_calibration(const HardwareProfile& hw, int64_t micro_batch, int64_t seq_len);
HardwareProfile load_hardware_profile(const std::filesystem::path& path);

// Names of the profiles in data_dir/hardware, sorted.
std::vector<std::string> list_hardware(const std::filesystem::path& data_dir);

// The catalog profile whose [gpu] name is the device name the CUDA driver reports (as
// cudaGetDeviceProperties and nvidia-smi print it, e.g. "NVIDIA H100 80GB HBM3"), or none.
std::optional<std::string> hardware_for_device(const std::string& device_name,
                                               const std::filesystem::path& data_dir);

// For each engine section of `ref` that `hw` lacks: the section's time coefficients (how the
// engine's implementation schedules, overlaps and runs its CPU optimizer: behaviour of its
// code, not of the GPU), marked not calibrated. Memory habits (is_memory_coef) stay `hw`'s:
// they belong to the model implementation a source ran, which another team's runs do not share.
void transfer_engine_sections(HardwareProfile& hw, const HardwareProfile& ref);

// An uncalibrated `hw` takes each coefficient its [coefficients] does not set from the calibrated
// `ref`'s fit: our engine's efficiencies, overheads and memory habits as one coherent set, the
// one its engine sections and measured ratios were fitted against (the defaults of
// coefficients.cpp are older H200 values that no longer fit together). What `hw` sets itself
// (a PCIe card's bus efficiency) stays. Nothing happens when hw is calibrated or ref is not.
void transfer_reference_coefficients(HardwareProfile& hw, const HardwareProfile& ref);

// The measured coefficients of `hw.measured` over `ref` (the profile hw.measured.reference
// names, as loaded): each becomes ref's value times its ratio, clamped to its physical bounds,
// in hw's [coefficients] and in each of hw's engine sections that sets it (transferred ones
// included, so call it after transfer_engine_sections). Throws InputError when the reference
// is not calibrated. A profile is measured once: a second call changes nothing.
void apply_measured(HardwareProfile& hw, const HardwareProfile& ref);

// The profile text with its [coefficients.measured] section replaced by `m` (or added at the end).
std::string with_measured_components(const std::string& profile_text, const MeasuredComponents& m);

// The measured tables of code that runs the same everywhere: the peers' per-layer host cost
// (a host's, not a GPU's) and the flash kernels' cost by head dimension. A profile without its
// own table takes `ref`'s, marked transferred.
void transfer_measured_tables(HardwareProfile& hw, const HardwareProfile& ref);

// A profile name from the catalog or a path to a .toml file; unknown names list the known ones.
// A catalog profile with [coefficients] engines_from takes that profile's fitted coefficients
// (transfer_reference_coefficients), its engine sections (transfer_engine_sections) and, lacking
// its own, its measured tables (transfer_measured_tables).
HardwareProfile resolve_hardware(const std::string& name_or_path,
                                 const std::filesystem::path& data_dir);

const char* precision_name(Precision p);
Precision parse_precision(const std::string& text, const std::string& what);

// The link a collective among `nodes` nodes of `gpus_per_node` GPUs runs at, for the step model
// and the micro-benchmarks alike. Within a node, the intra-node link. Across nodes a ring (NCCL
// runs one ring per channel, the channels spread over the node's NICs) crosses each node
// boundary once per channel: a node sends the collective's whole size out once, over all its
// NICs together, so each GPU's NIC carries 1/gpus_per_node of what its intra-node hop carries,
// and the ring runs at the slower of that hop and the node's NICs shared by its GPUs
// (nccl-tests doc/PERFORMANCE.md's bus bandwidth; NVIDIA/nccl#1229 reports H100 reduce-scatter
// bus bandwidth of 360 GB/s at 4 nodes of 8 with 400 Gb/s per GPU, seven times one NIC's
// 46-48 GB/s), with the inter-node latency added to each call.
struct CollectiveLink {
  double bytes_per_s = 0;
  bool inter_node = false;
  double extra_latency_s = 0;
};
CollectiveLink collective_link(const HardwareProfile& hw, int gpus_per_node, int nodes);

}  // namespace stepcast
