#include "model/train_config.h"

#include <initializer_list>
#include <string>
#include <utility>

#include "common/errors.h"
#include "common/join.h"

namespace stepcast {

namespace {

// Each enumeration's spellings, in the order error messages list them: one table serves its
// name and its parser.
template <class E>
using Spellings = std::initializer_list<std::pair<E, const char*>>;

constexpr Spellings<OffloadDevice> kOffloads = {{OffloadDevice::kNone, "none"}, {OffloadDevice::kCpu, "cpu"}};
constexpr Spellings<OptimizerKind> kOptimizers = {{OptimizerKind::kAdamW, "adamw"}, {OptimizerKind::kAdamW8bit, "adamw8bit"}};
constexpr Spellings<AttentionKind> kAttentions = {{AttentionKind::kFlash, "flash"}, {AttentionKind::kMath, "math"}};
constexpr Spellings<CpuSimd> kCpuSimds = {
    {CpuSimd::kAuto, "auto"}, {CpuSimd::kScalar, "scalar"}, {CpuSimd::kAvx2, "avx2"}, {CpuSimd::kAvx512, "avx512"}};
constexpr Spellings<Engine> kEngines = {{Engine::kStepcast, "stepcast"}, {Engine::kDeepSpeed, "deepspeed"}, {Engine::kFsdp2, "fsdp2"}};
constexpr Spellings<PeftKind> kPefts = {{PeftKind::kNone, "none"}, {PeftKind::kLora, "lora"}, {PeftKind::kQlora, "qlora"}};
constexpr Spellings<LoraTargets> kLoraTargets = {
    {LoraTargets::kAttention, "attention"}, {LoraTargets::kMlp, "mlp"}, {LoraTargets::kAll, "all"}};

template <class E>
const char* spelling(const Spellings<E>& table, E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

// `head` is what the message starts with ("--engine " or "config.optimizer = "), `is_not`
// what it says the text is not ("is not valid", "is not an optimizer").
template <class E>
E parse_spelling(const Spellings<E>& table, const std::string& text, const std::string& head, const char* is_not) {
  for (const auto& [v, name] : table)
    if (text == name) return v;
  throw InputError(head + "\"" + text + "\" " + is_not +
                   " (valid: " + join_names(table, [](const auto& entry) { return entry.second; }) + ")");
}

}  // namespace

const char* offload_name(OffloadDevice d) { return spelling(kOffloads, d); }
const char* optimizer_name(OptimizerKind o) { return spelling(kOptimizers, o); }
const char* attention_name(AttentionKind a) { return spelling(kAttentions, a); }
const char* cpu_simd_name(CpuSimd s) { return spelling(kCpuSimds, s); }

CpuSimd parse_cpu_simd(const std::string& text, const std::string& what) {
  return parse_spelling(kCpuSimds, text, what + " ", "is not valid");
}

const char* gpu_allocator_name(const TrainConfig& c) { return c.gpu_expandable_segments ? "expandable" : "default"; }

bool parse_gpu_allocator(const std::string& text, const std::string& what) {
  if (text == "default") return false;
  if (text == "expandable") return true;
  throw InputError(what + " \"" + text + "\" is not valid (valid: default, expandable)");
}

bool parse_on_off(const std::string& text, const std::string& what) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw InputError(what + " \"" + text + "\" is not valid (valid: on, off)");
}

OffloadDevice parse_offload(const std::string& text, const std::string& what) {
  return parse_spelling(kOffloads, text, what + " = ", "is not valid");
}

OptimizerKind parse_optimizer(const std::string& text, const std::string& what) {
  return parse_spelling(kOptimizers, text, what + " = ", "is not an optimizer");
}

AttentionKind parse_attention(const std::string& text, const std::string& what) {
  return parse_spelling(kAttentions, text, what + " = ", "is not valid");
}

ConfigFieldNames json_config_names(const std::string& where) {
  ConfigFieldNames n;
  n.stage = where + ".zero_stage";
  n.offload_optimizer = where + ".offload_optimizer";
  n.offload_params = where + ".offload_params";
  n.offload_pipeline = where + ".offload_overlap_forward";
  n.micro_batch = where + ".micro_batch";
  n.gas = where + ".gas";
  n.seq = where + ".seq_len";
  n.gpus = where + ".gpus";
  n.nodes = where + ".nodes";
  n.engine = where + ".engine";
  n.peft = where + ".peft";
  n.lora_rank = where + ".lora_rank";
  n.lora_alpha = where + ".lora_alpha";
  n.lora_dropout = where + ".lora_dropout";
  n.precision = where + ".precision";
  n.offload_order = where + ".offload_pipeline";
  n.grad_sync = where + ".grad_sync_each_micro";
  n.offload_pin_memory = where + ".offload_pin_memory";
  return n;
}

namespace {
// Each size: at least 1, and at most what any real job uses by orders of magnitude
// (so that products such as micro-batch x sequence x GAS x GPUs stay far inside int64).
void check_size(int64_t v, const std::string& name, int64_t hi, const char* hi_text) {
  if (v < 1) throw InputError(name + " " + std::to_string(v) + " must be at least 1");
  if (v > hi) throw InputError(name + " " + std::to_string(v) + " is out of range [1, " + hi_text + "]");
}
}  // namespace

void validate_job(const TrainConfig& c, const ConfigFieldNames& n) {
  check_size(c.seq_len, n.seq, int64_t{1} << 24, "2^24");
  check_size(c.gpus_per_node, n.gpus, 4096, "4096");
  check_size(c.nodes, n.nodes, 65536, "65536");
  if (c.engine == Engine::kStepcast && c.precision == Precision::kFp16)
    throw InputError(n.precision + " fp16: the Stepcast backend trains in bf16 or fp32; fp16 is planned for " +
                     n.engine + " deepspeed or fsdp2");
  if (!c.peft_enabled()) return;
  if (c.engine != Engine::kStepcast)
    throw InputError(n.peft + " " + peft_name(c.peft) + " is planned and run for " + n.engine + " stepcast only (got " +
                     engine_name(c.engine) + ")");
  if (c.lora_rank < 1 || c.lora_rank > 4096)
    throw InputError(n.lora_rank + " " + std::to_string(c.lora_rank) + " is out of range [1, 4096]");
  if (!(c.lora_alpha > 0.0) || c.lora_alpha > 1e6)
    throw InputError(n.lora_alpha + " " + std::to_string(c.lora_alpha) + " is out of range (0, 1e6]");
  if (!(c.lora_dropout >= 0.0 && c.lora_dropout < 1.0))
    throw InputError(n.lora_dropout + " " + std::to_string(c.lora_dropout) + " is out of range [0, 1)");
}

void validate_config(const TrainConfig& c, const ConfigFieldNames& n) {
  const std::string stage = n.stage + " " + std::to_string(c.zero_stage);
  if (c.zero_stage < 0 || c.zero_stage > 3) throw InputError(stage + " is not a ZeRO stage (valid: 0, 1, 2, 3)");
  if (c.offload_params == OffloadDevice::kCpu && c.zero_stage != 3)
    throw InputError(n.offload_params + " cpu needs " + n.stage + " 3 (got " + stage +
                     "): only stage 3 partitions parameters");
  if (c.offload_params == OffloadDevice::kCpu && c.offload_optimizer != OffloadDevice::kCpu)
    throw InputError(n.offload_params + " cpu needs " + n.offload_optimizer +
                     " cpu: the fp32 master weights of offloaded parameters are updated on the host");
  if (c.offload_optimizer == OffloadDevice::kCpu && c.zero_stage == 0)
    throw InputError(n.offload_optimizer + " cpu needs " + n.stage + " 1, 2 or 3 (got " + stage + ")");
  if (c.offload_overlap_forward && !(c.offload_optimizer == OffloadDevice::kCpu && c.offload_pipeline))
    throw InputError(n.offload_pipeline + " (--offload-pipeline full) needs the pipelined CPU optimizer offload");
  if (!c.offload_pinned && !(c.engine == Engine::kDeepSpeed && c.offload_optimizer == OffloadDevice::kCpu))
    throw InputError(n.offload_pin_memory + ": unpinned (pageable) offload buffers are DeepSpeed's setting with " +
                     n.offload_optimizer + " cpu (got engine " + engine_name(c.engine) + ", " + n.offload_optimizer +
                     " " + offload_name(c.offload_optimizer) + "): the backend and FSDP2 pin their host buffers");
  check_size(c.micro_batch, n.micro_batch, int64_t{1} << 20, "2^20");
  check_size(c.gas, n.gas, int64_t{1} << 20, "2^20");
  validate_job(c, n);
  const std::string engine = n.engine + " " + engine_name(c.engine);
  if (c.peft_enabled()) {
    const std::string peft = n.peft + " " + peft_name(c.peft);
    if (c.offload_params == OffloadDevice::kCpu)
      throw InputError(peft + " keeps the frozen base weights on the GPU: " + n.offload_params + " must be none");
  }
  if (c.grad_sync_each_micro && c.engine != Engine::kFsdp2)
    throw InputError(n.grad_sync + " (each micro-batch) is an FSDP2 setting: " + engine +
                     " reduces as its ZeRO stage says");
  if (c.engine == Engine::kDeepSpeed && c.offload_optimizer == OffloadDevice::kCpu && c.offload_pipeline)
    throw InputError(engine + " runs its CPU optimizer after the backward: " + n.offload_order +
                     " must be off (got " + offload_pipeline_name(c) + ")");
  if (c.engine == Engine::kDeepSpeed && c.offload_optimizer == OffloadDevice::kCpu &&
      c.optimizer != OptimizerKind::kAdamW)
    throw InputError(engine + " offloads to its fp32 CPU Adam: --optimizer must be adamw with " +
                     n.offload_optimizer + " cpu (got " + optimizer_name(c.optimizer) + ")");
  if (c.engine == Engine::kFsdp2) {
    if (c.zero_stage != 2 && c.zero_stage != 3)
      throw InputError(engine + " shards gradients and optimizer states: " + n.stage + " must be 2 or 3 (got " +
                       stage + ")");
    if (c.offload_optimizer != c.offload_params)
      throw InputError(engine + " offloads parameters with the optimizer (CPUOffloadPolicy): " + n.offload_optimizer +
                       " and " + n.offload_params + " must both be cpu or both none");
    if (c.offload_params == OffloadDevice::kCpu && c.zero_stage != 3)
      throw InputError(engine + " offloads sharded parameters: " + n.stage + " must be 3 with offload");
    if (c.optimizer != OptimizerKind::kAdamW)
      throw InputError(engine + " runs torch's fused AdamW: --optimizer must be adamw (got " +
                       optimizer_name(c.optimizer) + ")");
    if (c.offload_optimizer == OffloadDevice::kCpu && c.offload_pipeline)
      throw InputError(engine + " steps its CPU optimizer after the backward: " + n.offload_order +
                       " must be off (got " + offload_pipeline_name(c) + ")");
  }
}

const char* engine_name(Engine e) { return spelling(kEngines, e); }
Engine parse_engine(const std::string& text, const std::string& what) {
  return parse_spelling(kEngines, text, what + " ", "is not valid");
}

const char* peft_name(PeftKind p) { return spelling(kPefts, p); }
PeftKind parse_peft(const std::string& text, const std::string& what) {
  return parse_spelling(kPefts, text, what + " ", "is not valid");
}

const char* lora_targets_name(LoraTargets t) { return spelling(kLoraTargets, t); }
LoraTargets parse_lora_targets(const std::string& text, const std::string& what) {
  return parse_spelling(kLoraTargets, text, what + " ", "is not valid");
}

const char* offload_pipeline_name(const TrainConfig& c) {
  if (!c.offload_pipeline) return "off";
  return c.offload_overlap_forward ? "full" : "on";
}

void parse_offload_pipeline(const std::string& text, const std::string& what, TrainConfig& c) {
  if (text != "on" && text != "off" && text != "full")
    throw InputError(what + " \"" + text + "\" is not valid (valid: off, on, full)");
  c.offload_pipeline = text != "off";
  c.offload_overlap_forward = text == "full";
}

std::string offload_label(const TrainConfig& c) {
  std::string s = offload_name(c.offload_optimizer);
  if (c.offload_params == OffloadDevice::kCpu) s += "+params";
  return s;
}

std::string family_name(const TrainConfig& c) {
  std::string out = "stage " + std::to_string(c.zero_stage);
  if (c.offload_optimizer == OffloadDevice::kCpu)
    out += c.offload_pipeline ? " + CPU optimizer offload" : " + serial CPU optimizer offload";
  if (c.offload_params == OffloadDevice::kCpu) out += " + CPU parameter offload";
  out += c.optimizer == OptimizerKind::kAdamW8bit ? " + 8-bit AdamW" : " + AdamW";
  if (c.peft == PeftKind::kLora) out += " + LoRA";
  if (c.peft == PeftKind::kQlora) out += " + QLoRA";
  if (c.grad_sync_each_micro) out += " + reduce each micro-batch";
  return out;
}

}  // namespace stepcast
