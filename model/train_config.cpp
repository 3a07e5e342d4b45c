#include "model/train_config.h"

#include "common/errors.h"

namespace stepcast {

const char* offload_name(OffloadDevice d) { return d == OffloadDevice::kCpu ? "cpu" : "none"; }

const char* optimizer_name(OptimizerKind o) {
  return o == OptimizerKind::kAdamW8bit ? "adamw8bit" : "adamw";
}

const char* attention_name(AttentionKind a) { return a == AttentionKind::kMath ? "math" : "flash"; }

const char* cpu_simd_name(CpuSimd s) {
  switch (s) {
    case CpuSimd::kScalar: return "scalar";
    case CpuSimd::kAvx2: return "avx2";
    case CpuSimd::kAvx512: return "avx512";
    case CpuSimd::kAuto: break;
  }
  return "auto";
}

CpuSimd parse_cpu_simd(const std::string& text, const std::string& what) {
  if (text == "auto") return CpuSimd::kAuto;
  if (text == "scalar") return CpuSimd::kScalar;
  if (text == "avx2") return CpuSimd::kAvx2;
  if (text == "avx512") return CpuSimd::kAvx512;
  throw InputError(what + " \"" + text + "\" is not valid (valid: auto, scalar, avx2, avx512)");
}

bool parse_on_off(const std::string& text, const std::string& what) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw InputError(what + " \"" + text + "\" is not valid (valid: on, off)");
}

OffloadDevice parse_offload(const std::string& text, const std::string& what) {
  if (text == "none") return OffloadDevice::kNone;
  if (text == "cpu") return OffloadDevice::kCpu;
  throw InputError(what + " = \"" + text + "\" is not valid (valid: none, cpu)");
}

OptimizerKind parse_optimizer(const std::string& text, const std::string& what) {
  if (text == "adamw") return OptimizerKind::kAdamW;
  if (text == "adamw8bit") return OptimizerKind::kAdamW8bit;
  throw InputError(what + " = \"" + text + "\" is not an optimizer (valid: adamw, adamw8bit)");
}

AttentionKind parse_attention(const std::string& text, const std::string& what) {
  if (text == "flash") return AttentionKind::kFlash;
  if (text == "math") return AttentionKind::kMath;
  throw InputError(what + " = \"" + text + "\" is not valid (valid: flash, math)");
}

void validate_config(const TrainConfig& c) {
  if (c.zero_stage < 0 || c.zero_stage > 3)
    throw InputError("--stage " + std::to_string(c.zero_stage) + " is not a ZeRO stage (valid: 0, 1, 2, 3)");
  if (c.offload_params == OffloadDevice::kCpu && c.zero_stage != 3)
    throw InputError("--offload-params cpu needs --stage 3 (got --stage " +
                     std::to_string(c.zero_stage) + "): only stage 3 partitions parameters");
  if (c.offload_params == OffloadDevice::kCpu && c.offload_optimizer != OffloadDevice::kCpu)
    throw InputError("--offload-params cpu needs --offload-optimizer cpu: the fp32 master weights of offloaded "
                     "parameters are updated on the host");
  if (c.offload_optimizer == OffloadDevice::kCpu && c.zero_stage == 0)
    throw InputError("--offload-optimizer cpu needs --stage 1, 2 or 3 (got --stage 0)");
  if (c.offload_overlap_forward && !(c.offload_optimizer == OffloadDevice::kCpu && c.offload_pipeline))
    throw InputError("offload_overlap_forward (--offload-pipeline full) needs the pipelined CPU optimizer offload");
  if (c.micro_batch < 1) throw InputError("--micro-batch " + std::to_string(c.micro_batch) + " must be at least 1");
  if (c.gas < 1) throw InputError("--gas " + std::to_string(c.gas) + " must be at least 1");
  if (c.seq_len < 1) throw InputError("--seq " + std::to_string(c.seq_len) + " must be at least 1");
  if (c.gpus_per_node < 1) throw InputError("--gpus " + std::to_string(c.gpus_per_node) + " must be at least 1");
  if (c.nodes < 1) throw InputError("--nodes " + std::to_string(c.nodes) + " must be at least 1");
  if (c.micro_batch > (1 << 20) || c.gas > (1 << 20) || c.seq_len > (1 << 24) ||
      c.gpus_per_node > 4096 || c.nodes > 65536)
    throw InputError("a size is out of range (micro-batch, GAS <= 2^20, seq <= 2^24, gpus <= 4096, nodes <= 65536)");
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

std::string family_name(const TrainConfig& c) {
  std::string out = "stage " + std::to_string(c.zero_stage);
  if (c.offload_optimizer == OffloadDevice::kCpu)
    out += c.offload_pipeline ? " + CPU optimizer offload" : " + serial CPU optimizer offload";
  if (c.offload_params == OffloadDevice::kCpu) out += " + CPU parameter offload";
  out += c.optimizer == OptimizerKind::kAdamW8bit ? " + 8-bit AdamW" : " + AdamW";
  return out;
}

}  // namespace stepcast
