#!/usr/bin/env bash
# Table-driven bad-input test over every program (planner, calibrate, train, microbench)
# and every input kind (flags, TOML cards, config.json, hardware profiles, plan files,
# run records, checkpoints' folders, run lists). Each case expects an exit status
# (common/errors.h: 2 bad input, 3 out of memory, 5 I/O) and exactly one stderr line
# that matches a pattern naming the culprit (the flag, the file, the key or the value),
# and no output file left behind where one was asked for.
#
# Usage: bad_input.sh BUILD_DIR
set -u
BUILD="$1"
PLANNER="$BUILD/planner/planner"
CALIBRATE="$BUILD/calibrate/calibrate"
TRAIN="$BUILD/backend/train"
MICROBENCH="$BUILD/backend/microbench"
SRC="$(cd "$(dirname "$0")/.." && pwd)"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0

# t EXIT REGEX PROGRAM ARGS... : runs one case.
t() {
  local want="$1" regex="$2" prog="$3"
  shift 3
  [[ -x "$prog" ]] || return 0  # a program this build lacks (train without LibTorch)
  rm -f "$TMP/out.file"
  timeout 60 "$prog" "$@" >"$TMP/stdout" 2>"$TMP/stderr"
  local rc=$?
  local lines
  lines=$(wc -l <"$TMP/stderr")
  local what="$(basename "$prog") $*"
  if [[ $rc -ne $want ]]; then
    echo "FAIL [$what]: exit $rc, expected $want: $(head -c 400 "$TMP/stderr")"
    fail=$((fail + 1))
  elif [[ $lines -ne 1 ]]; then
    echo "FAIL [$what]: $lines stderr lines: $(head -c 600 "$TMP/stderr")"
    fail=$((fail + 1))
  elif ! grep -Eq -- "$regex" "$TMP/stderr"; then
    echo "FAIL [$what]: stderr '$(cat "$TMP/stderr")' !~ /$regex/"
    fail=$((fail + 1))
  elif [[ -e "$TMP/out.file" ]]; then
    echo "FAIL [$what]: left $TMP/out.file behind"
    fail=$((fail + 1))
  else
    pass=$((pass + 1))
  fi
}

MODEL="$SRC/data/models/test-llama-tiny.toml"
TRAIN_BASE=(--device cpu --quiet --seq 32 --precision fp32 --steps 1)

# --- numeric flags: every one, with values that are not numbers, negative, zero, huge ---
for flag in --gpus --nodes --seq; do
  for v in abc 1e999 nan 99999999999999999999 -1 0 2.5; do
    t 2 "$flag" "$PLANNER" explain --model 7b "$flag" "$v"
    t 2 "$flag" "$PLANNER" recommend --model 7b "$flag" "$v"
  done
done
for flag in --micro-batch --gas --stage; do
  for v in abc 1e999 -1 99999999999999999999 2.5; do
    t 2 "$flag" "$PLANNER" explain --model 7b "$flag" "$v"
  done
done
for flag in --gpu-mem-gib --cpu-mem-gib --cpu-cores --train-tokens; do
  for v in abc -1 nan inf 1e-300 1e300; do
    t 2 "$flag" "$PLANNER" explain --model 7b "$flag" "$v"
  done
done
for v in abc -1 5000 2.5 99999999999999999999; do  # 0 is valid: the launcher's default
  t 2 "--cpu-threads-per-rank" "$PLANNER" explain --model 7b --engine deepspeed --offload-pipeline off --stage 2 \
    --offload-optimizer cpu --gpus 2 --cpu-threads-per-rank "$v"
done
for v in abc -1 0 99999999999999999999; do
  t 2 "--top" "$PLANNER" recommend --model 7b --top "$v"
done
for v in abc -1 99999999999999999999 1099511627776; do  # 0 is valid: GAS ranges over 1..32
  t 2 "--global-batch" "$PLANNER" recommend --model 7b --global-batch "$v"
done
for flag in --micro-batch --gas --seq --steps --warmup --nproc --cpu-threads --timeout-s --emulate-nodes; do
  for v in abc -1 99999999999999999999 1e999; do
    t 2 "$flag" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" "$flag" "$v"
  done
done
for flag in --lr --weight-decay --gpu-mem-limit-gib; do
  for v in abc nan inf -1; do
    t 2 "$flag" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" "$flag" "$v"
  done
done
# Emulated nodes divide the ranks, and need the launcher (--nproc) to start them.
t 2 "--emulate-nodes 3 must divide --nproc 2" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --nproc 2 --emulate-nodes 3
t 2 "--emulate-nodes 2 must divide --nproc 1" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --emulate-nodes 2
t 2 "--emulate-nodes 3 must divide --nproc 2" "$MICROBENCH" --device cpu --suite collectives --out "$TMP/out.file" --nproc 2 --emulate-nodes 3
# A memory cap emulates a smaller GPU: there is none on the CPU; nor a CUDA allocator's segments.
t 2 "--gpu-mem-limit-gib" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --gpu-mem-limit-gib 8
t 2 "--gpu-allocator expandable .* needs a CUDA device" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --gpu-allocator expandable
t 2 "--gpu-allocator \"huge\" is not valid" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --gpu-allocator huge
for flag in --holdout-frac; do
  for v in abc -0.1 1 nan; do
    t 2 "$flag" "$CALIBRATE" fit --runs "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl" --hardware h200-sxm "$flag" "$v" --out "$TMP/out.file"
    t 2 "$flag" "$CALIBRATE" report --runs "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl" --hardware h200-sxm "$flag" "$v"
  done
done
for v in abc 0 1 -5; do
  t 2 "--steps" "$CALIBRATE" measure --list "$SRC/bench/runlists/smoke.txt" --out "$TMP/m" --steps "$v" --device cpu --no-micro
done
for flag in --repeats --nproc; do
  for v in abc -1 0; do
    t 2 "$flag" "$MICROBENCH" --device cpu --suite gemm --out "$TMP/out.file" "$flag" "$v"
  done
done

# --- word flags: values outside their set ---
for flag in --precision --attention; do
  t 2 "$flag" "$PLANNER" explain --model 7b "$flag" fp9
done
# transformers' GPT-J has no SDPA path: a peer engine cannot run it with flash attention.
t 2 "--attention" "$PLANNER" explain --model 6b --engine deepspeed --attention flash
t 2 "--attention" "$PLANNER" recommend --model 6b --gpus 2 --engine fsdp2 --attention flash
t 2 "max_position_embeddings" "$PLANNER" explain --model 6b --engine deepspeed --seq 4096
t 2 "max_position_embeddings" "$PLANNER" recommend --model 6b --gpus 2 --engine fsdp2 --seq 4096
t 2 "--precision fp16: the Stepcast backend trains in bf16 or fp32" "$PLANNER" recommend --model 7b --precision fp16
t 2 "--offload-pin-memory \"sometimes\" is not valid" "$PLANNER" explain --model 6b --engine deepspeed --stage 2 --offload-optimizer cpu --offload-pin-memory sometimes
t 2 "--offload-pin-memory: unpinned .* DeepSpeed's setting" "$PLANNER" explain --model 6b --engine fsdp2 --stage 3 --offload-optimizer cpu --offload-params cpu --offload-pin-memory off
t 2 "--offload-pin-memory: unpinned .* DeepSpeed's setting" "$PLANNER" explain --model 6b --engine deepspeed --stage 2 --offload-pin-memory off
for flag in --offload-optimizer --offload-params --optimizer --offload-pipeline --checkpointing; do
  t 2 "$flag" "$PLANNER" explain --model 7b "$flag" maybe
done
t 2 "--optimizers" "$PLANNER" recommend --model 7b --optimizers adamw,sgd
t 2 "--grad-sync \"sometimes\" is not valid" "$PLANNER" explain --model 7b --engine fsdp2 --stage 3 --gas 2 --grad-sync sometimes
t 2 "--grad-sync \(each micro-batch\) is an FSDP2 setting" "$PLANNER" explain --model 7b --engine deepspeed --stage 2 --gas 2 --grad-sync each
t 2 "--engine" "$PLANNER" recommend --model 7b --engine torch
# PEFT settings: methods, ranks, targets, what an engine or a command cannot take.
t 2 "--peft.*dora" "$PLANNER" recommend --model 7b --peft dora
t 2 "--lora-rank 0" "$PLANNER" explain --model 7b --peft lora --lora-rank 0
t 2 "--lora-targets.*ffn" "$PLANNER" explain --model 7b --peft lora --lora-targets ffn
t 2 "--lora-dropout" "$PLANNER" explain --model 7b --peft lora --lora-dropout 1.5
t 2 "--peft auto.*recommend" "$PLANNER" explain --model 7b --peft auto
t 2 "--peft lora.*--engine" "$PLANNER" explain --model 7b --peft lora --engine deepspeed --stage 2
t 2 "--peft qlora.*--offload-params" "$PLANNER" explain --model 7b --peft qlora --stage 3 --offload-optimizer cpu --offload-params cpu
t 2 "--peft.*qlora4" "$TRAIN" --model test-llama-tiny --device cpu --peft qlora4
t 2 "--lora-rank 5000" "$TRAIN" --model test-llama-tiny --device cpu --peft lora --lora-rank 5000
for flag in --offload-optimizer --offload-params --optimizer --precision --checkpointing --offload-pipeline \
            --split-master --cpu-simd --cpu-bind --device; do
  t 2 "$flag" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" "$flag" maybe
done
t 2 "--device" "$CALIBRATE" measure --list "$SRC/bench/runlists/smoke.txt" --out "$TMP/m" --device tpu --no-micro
t 2 "--suite" "$MICROBENCH" --device cpu --suite everything --out "$TMP/out.file"

# --- names: models, hardware, missing files, folders given as files ---
t 2 "unknown model 'gpt-9'" "$PLANNER" explain --model gpt-9
t 2 "unknown hardware 'tpu'" "$PLANNER" explain --model 7b --hardware tpu
t 2 "unknown model" "$TRAIN" --model gpt-9 "${TRAIN_BASE[@]}"
t 2 "unknown hardware" "$CALIBRATE" report --runs "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl" --hardware tpu
t 2 "nothing.jsonl" "$CALIBRATE" report --runs "$TMP/nothing.jsonl" --hardware h200-sxm
t 2 "is a folder" "$CALIBRATE" report --runs "$TMP" --hardware h200-sxm
t 2 "nothing.json" "$TRAIN" --model test-llama-tiny --plan "$TMP/nothing.json" "${TRAIN_BASE[@]}"
t 2 "is a folder" "$TRAIN" --model test-llama-tiny --plan "$TMP" "${TRAIN_BASE[@]}"
t 2 "nothing.txt" "$TRAIN" --model test-llama-tiny --data "$TMP/nothing.txt" "${TRAIN_BASE[@]}"
t 2 "nothing.txt" "$CALIBRATE" measure --list "$TMP/nothing.txt" --out "$TMP/m" --device cpu --no-micro
t 2 "no such checkpoint" "$TRAIN" --model test-llama-tiny --resume "$TMP/nothing" "${TRAIN_BASE[@]}"
t 2 "not a checkpoint" "$TRAIN" --model test-llama-tiny --resume "$TMP" "${TRAIN_BASE[@]}"
t 2 "a file" "$TRAIN" --model test-llama-tiny --resume "$MODEL" "${TRAIN_BASE[@]}"

# --- output paths: missing folders, folders, files under files ---
t 2 "does not exist" "$PLANNER" recommend --model 7b --deepspeed-config "$TMP/no/ds.json"
t 2 "is a folder" "$PLANNER" recommend --model 7b --deepspeed-config "$TMP"
t 2 "named for two outputs" "$PLANNER" recommend --model 7b --deepspeed-config "$TMP/out.file" --accelerate-config "$TMP/out.file"
t 2 "needs --deepspeed-config" "$PLANNER" recommend --model 7b --accelerate-config "$TMP/out.file"
t 2 "does not exist" "$CALIBRATE" fit --runs "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl" --hardware h200-sxm --out "$TMP/no/out.toml"
t 2 "does not exist" "$CALIBRATE" report --runs "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl" --hardware h200-sxm --svg "$TMP/no/x.svg"
t 2 "json-out|does not exist" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --json-out "$TMP/no/x.jsonl"
t 2 "is a folder" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --json-out "$TMP"
t 5 "Not a directory" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --save "$MODEL/ck"
t 2 "does not exist" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --dump-params "$TMP/no/p.pt"

# --- configuration combinations ---
t 2 "--offload-params cpu needs --stage 3" "$PLANNER" explain --model 7b --stage 2 --offload-params cpu
t 2 "needs --offload-optimizer cpu" "$PLANNER" explain --model 7b --stage 3 --offload-params cpu
t 2 "needs --stage 1, 2 or 3" "$PLANNER" explain --model 7b --stage 0 --offload-optimizer cpu
t 2 "--offload-params cpu needs --stage 3" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --stage 2 --offload-params cpu
t 2 "needs --stage 1, 2 or 3" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --offload-optimizer cpu
t 2 "pipelined" "$TRAIN" --model test-llama-tiny "${TRAIN_BASE[@]}" --stage 2 --offload-pipeline full
t 3 "out of host memory" "$TRAIN" --model llama-2-70b --device cpu --quiet --steps 1

# --- model cards (TOML): one broken key at a time ---
card() {  # card NAME SED-EXPRESSION: a copy of the tiny card with one edit
  sed "$2" "$MODEL" >"$TMP/$1.toml"
  echo "$TMP/$1.toml"
}
while IFS='|' read -r name edit regex; do
  [[ -z "$name" ]] && continue
  f=$(card "$name" "$edit")
  t 2 "$regex" "$PLANNER" explain --model "$f" --seq 32
done <<'EOF'
heads3|s/num_heads = 4/num_heads = 3/|num_kv_heads|must divide
heads3kv1|s/num_heads = 4/num_heads = 3/; s/num_kv_heads = 2/num_kv_heads = 1/|num_heads' = 3 must divide hidden_size
kv3|s/num_kv_heads = 2/num_kv_heads = 3/|num_kv_heads' = 3
headdim|s/num_heads = 4/num_heads = 4\nhead_dim = 99999999999/|head_dim
layers|s/num_layers = 2/num_layers = 99999999999999/|num_layers
layers0|s/num_layers = 2/num_layers = 0/|num_layers
layersneg|s/num_layers = 2/num_layers = -3/|num_layers
layersfloat|s/num_layers = 2/num_layers = 2.5/|num_layers
layersstr|s/num_layers = 2/num_layers = "2"/|num_layers
hidden|s/hidden_size = 64/hidden_size = 9223372036854775807/|hidden_size
hidden0|s/hidden_size = 64/hidden_size = 0/|hidden_size
vocab|s/vocab_size = 256/vocab_size = 1e30/|vocab_size
vocabbig|s/vocab_size = 256/vocab_size = 1099511627776/|vocab_size
inter|s/intermediate_size = 160/intermediate_size = -5/|intermediate_size
rotary|s/rotary_dim = 16/rotary_dim = 99/|rotary_dim
rotaryneg|s/rotary_dim = 16/rotary_dim = -1/|rotary_dim
eps|s/norm_eps = 1e-5/norm_eps = "small"/|norm_eps
type|s/model_type = "llama"/model_type = "mamba"/|model_type
noname|/^name = /d|name
unknown|s/gated_mlp = true/gated_mlp = true\nfamily = "x"/|family
dup|s/gated_mlp = true/gated_mlp = true\ngated_mlp = false/|gated_mlp|duplicate|redefin
syntax|s/hidden_size = 64/hidden_size = = 64/|c.toml|syntax|expected|hidden
gated|s/gated_mlp = true/gated_mlp = 1/|gated_mlp
norm|s/norm_eps = 1e-5/norm_eps = 1e-5\nnorm = "batch"/|norm
EOF

# --- Hugging Face config.json: one broken field at a time ---
mkdir -p "$TMP/hf"
base_json='{"model_type":"llama","hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":160,"vocab_size":256}'
while IFS='|' read -r name json regex; do
  [[ -z "$name" ]] && continue
  mkdir -p "$TMP/hf/$name"
  printf '%s' "$json" >"$TMP/hf/$name/config.json"
  t 2 "$regex" "$PLANNER" explain --model "$TMP/hf/$name/config.json" --seq 32
done <<EOF
empty||malformed JSON
array|[1,2]|JSON object
deep|$(python3 -c "print('['*100000 + ']'*100000)")|nested deeper
deepobj|$(python3 -c "print('{\"a\":'*5000 + '1' + '}'*5000)")|nested deeper
truncated|${base_json:0:40}|malformed JSON
nan|${base_json/\"hidden_size\":64/\"hidden_size\":NaN}|malformed JSON
huge|${base_json/\"hidden_size\":64/\"hidden_size\":1e400}|malformed JSON|hidden_size
neg|${base_json/\"hidden_size\":64/\"hidden_size\":-64}|hidden_size
float|${base_json/\"hidden_size\":64/\"hidden_size\":64.5}|hidden_size
string|${base_json/\"hidden_size\":64/\"hidden_size\":\"64\"}|hidden_size
layers|${base_json/\"num_hidden_layers\":2/\"num_hidden_layers\":99999999999}|num_hidden_layers
heads|${base_json/\"num_attention_heads\":4/\"num_attention_heads\":3}|num_attention_heads|num_key_value_heads
heads0|${base_json/\"num_attention_heads\":4/\"num_attention_heads\":0}|num_attention_heads
kv|${base_json/\"num_key_value_heads\":2/\"num_key_value_heads\":3}|num_key_value_heads|num_kv_heads
type|${base_json/llama/mamba}|model_type
notype|${base_json/\"model_type\":\"llama\",/}|model_type
novocab|${base_json/,\"vocab_size\":256/}|vocab_size
headdim|${base_json/\"vocab_size\":256/\"vocab_size\":256,\"head_dim\":99999999999}|head_dim
EOF

# Each line NAME|SED-EDIT|REGEX on stdin: the profile BASE edited so, which explain must refuse
# with exit 2 and a line matching REGEX.
profile_edits() {
  local base=$1 prefix=$2 name edit regex
  while IFS='|' read -r name edit regex; do
    [[ -z "$name" ]] && continue
    sed "$edit" "$base" >"$TMP/${prefix}_$name.toml"
    t 2 "$regex" "$PLANNER" explain --model 7b --hardware "$TMP/${prefix}_$name.toml"
  done
}

# --- hardware profiles ---
HW="$SRC/data/hardware/h200-sxm.toml"
profile_edits "$HW" hw <<'EOF'
syntax|s/^name = .*/name = = "x"/|hw_syntax.toml
noname|/^name = /d|name
enginename|s/^\[engines.fsdp2\]/[engines.megatron]/|engines.megatron.*not a peer engine
enginecoef|s/^\(\[engines.fsdp2\]\)/\1\ngemm_eff_max_frac = 0.5/|engines.fsdp2.gemm_eff_max_frac.*not an engine coefficient
enginerange|/^\[engines.deepspeed\]/,/^\[/s/^act_bytes_mult = .*/act_bytes_mult = -3/|engines.deepspeed.act_bytes_mult
intervalq|/^\[coefficients.interval\]/,/^\[/s/^log_q95_unseen = .*/log_q95_unseen = 0.001/|coefficients.interval.log_q95_unseen
intervalkey|s/^\(\[coefficients.interval\]\)/\1\nlog_q99 = 1/|log_q99
intervalmem|/^\[coefficients.interval\]/,/^\[/s/^memory_log_q95_unseen = .*/memory_log_q95_unseen = 0.000001/|coefficients.interval.memory_log_q95_unseen
matmulrel|s/^\(peak_fp32_flops_per_s.*\)/\1\nmatmul_eff_rel_h200 = { value = 9, source = "x" }/|gpu.matmul_eff_rel_h200
transferq|s/^\(\[coefficients\]\)/\1\ntransferred_log_q95 = -1/|coefficients.transferred_log_q95
transferq_no|s/^\(\[coefficients\]\)/\1\ntransferred_log_q95_no_offload = 9/|coefficients.transferred_log_q95_no_offload
pricedate|0,/^date = .*/s//date = \"Sept 2026\"/|prices\[0\].date.*not a date
priceusd|0,/^usd_per_gpu_hour = .*/s//usd_per_gpu_hour = -2/|prices\[0\].usd_per_gpu_hour
pricekey|0,/^\(usd_per_gpu_hour = .*\)/s//\1\nspot = 1/|prices\[0\].spot
pricenosrc|0,/^source = \"coreweave.*/s///|prices\[0\].source
hostfamily|s/^gptj = { fwd_s/bloom = { fwd_s/|host.transformers_layer_s.bloom.*not a model_type
hostrange|s/^llama = { fwd_s = [0-9.e-]*/llama = { fwd_s = 7/|host.transformers_layer_s.llama.fwd_s
hostkey|s/^qwen2 = { fwd_s/qwen2 = { step_s = 1, fwd_s/|host.transformers_layer_s.qwen2.step_s
EOF
# A catalog profile whose engines_from names no profile.
mkdir -p "$TMP/dd/hardware" && cp -r "$SRC/data/models" "$TMP/dd/models"
sed 's/^engines_from = .*/engines_from = "tpu-v9"/' "$SRC/data/hardware/a40.toml" >"$TMP/dd/hardware/a40.toml"
t 2 "a40.toml: key 'coefficients.engines_from' = \"tpu-v9\"" "$PLANNER" explain --model 7b --hardware a40 --data-dir "$TMP/dd"
# [coefficients.held_out] (a transferred profile's own runs, predicted before they ran).
profile_edits "$SRC/data/hardware/h100-sxm.toml" hw_held <<'EOF2'
heldengine|s/^log_q95 = { stepcast/log_q95 = { megatron = 0.1, stepcast/|coefficients.held_out.log_q95. names engine "megatron" is not valid
heldq|s/^log_q95 = { stepcast = [0-9.]*/log_q95 = { stepcast = 7/|coefficients.held_out.log_q95.stepcast
heldworld|s/^world_size_max = 1/world_size_max = 0/|coefficients.held_out.world_size_max
heldkey|s/^world_size_max = 1/world_size_max = 1\nnodes_max = 2/|nodes_max
heldcal|s/^calibrated = false/calibrated = true/|coefficients.held_out.*not calibrated
EOF2
# [coefficients.measured] (calibrate fit on micro-benchmarks alone): a bad ratio, key or reference.
A40="$SRC/data/hardware/a40.toml"
printf '\n[coefficients.measured]\nreference = "h200-sxm"\nsource = "x"\n\n[coefficients.measured.rel]\ncpu_lane_flops_per_s = 0.5\n' >"$TMP/measured_tail.toml"
cat "$A40" "$TMP/measured_tail.toml" >"$TMP/measured_ok.toml"
profile_edits "$TMP/measured_ok.toml" hw_measured <<'EOF2'
ratiozero|s/^cpu_lane_flops_per_s = 0.5/cpu_lane_flops_per_s = 0/|coefficients.measured.rel.cpu_lane_flops_per_s
ratiohuge|s/^cpu_lane_flops_per_s = 0.5/cpu_lane_flops_per_s = 1e6/|coefficients.measured.rel.cpu_lane_flops_per_s
ratiokey|s/^cpu_lane_flops_per_s = 0.5/cpu_speed = 0.5/|coefficients.measured.rel.cpu_speed.*not a cost-model coefficient
reference|s/^reference = "h200-sxm"/reference = "a100-80gb-sxm"/|coefficients.measured.reference.*"a100-80gb-sxm" is neither
measuredkey|s/^source = "x"/source = "x"\nwhen = 1/|coefficients.measured.when
norel|/^cpu_lane_flops_per_s = 0.5/d|coefficients.measured.rel' holds no coefficient
EOF2
# micro-benchmarks alone: GEMMs timed on the CPU measure no GPU; a GPU's alone on the reference's kind measure nothing kept
{ echo '{"kind":"micro_env","device":"cpu"}'; echo '{"bench":"gemm","kind":"micro","m":64,"n":64,"k":64,"seconds":1e-4}'; } >"$TMP/cpu_gemm.jsonl"
t 2 'cpu_gemm.jsonl:2: key "bench" = "gemm" was timed on device "cpu"' "$CALIBRATE" fit --runs "$TMP/cpu_gemm.jsonl" --hardware a40 --out "$TMP/out.file"
grep '"bench":"gemm"' "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3_micro.jsonl" >"$TMP/gpu_gemm.jsonl"
t 2 "time the host too" "$CALIBRATE" fit --runs "$TMP/gpu_gemm.jsonl" --hardware h200-sxm --out "$TMP/out.file"
# --- planner compare: prices, kinds, deadlines, budgets ---
t 2 "--train-tokens" "$PLANNER" compare --model 7b
t 2 "--train-tokens" "$PLANNER" compare --model 7b --train-tokens -5
t 2 'tpu-v9' "$PLANNER" compare --model 7b --train-tokens 1e9 --hardware tpu-v9
t 2 '--price "h100-sxm" is not KIND=USD' "$PLANNER" compare --model 7b --train-tokens 1e9 --price h100-sxm
t 2 '--price "h100-sxm=abc"' "$PLANNER" compare --model 7b --train-tokens 1e9 --price h100-sxm=abc
t 2 '--price "h100-sxm=-1"' "$PLANNER" compare --model 7b --train-tokens 1e9 --price h100-sxm=-1
t 2 'l40s is not among the compared kinds' "$PLANNER" compare --model 7b --train-tokens 1e9 --hardware h100-sxm --price l40s=1
t 2 'deadline-hours 0.01: no plan finishes in time; the fastest' "$PLANNER" compare --model 7b --train-tokens 1e9 --deadline-hours 0.01
t 2 'budget-usd 0.5: no plan costs that little; the cheapest' "$PLANNER" compare --model 7b --train-tokens 1e9 --budget-usd 0.5
t 2 'no \[\[prices\]\] offer of provider "acme"' "$PLANNER" compare --model 7b --train-tokens 1e9 --hardware h100-sxm --provider acme
t 2 '--max-gpus' "$PLANNER" compare --model 7b --train-tokens 1e9 --max-gpus 0
t 2 '--job-name "Bad_Name" is not a Kubernetes name' "$PLANNER" compare --model 7b --train-tokens 1e9 --k8s-manifest "$TMP/out.file" --job-name Bad_Name
t 2 '--job-name "-job" is not a Kubernetes name' "$PLANNER" compare --model 7b --train-tokens 1e9 --k8s-manifest "$TMP/out.file" --job-name=-job
t 2 'x.svg: cannot write' "$PLANNER" compare --model 7b --train-tokens 1e9 --svg /nonexistent/dir/x.svg
# --- engines: flags and their constraints ---
t 2 '--engine "megatron"' "$PLANNER" explain --model 7b --engine megatron
t 2 "must be 2 or 3" "$PLANNER" explain --model 7b --gpus 2 --engine fsdp2 --stage 1
t 2 "offload-pipeline must be off" "$PLANNER" explain --model 7b --gpus 2 --engine deepspeed --stage 2 --offload-optimizer cpu --offload-pipeline on
t 2 "fp32 CPU Adam" "$PLANNER" explain --model 7b --gpus 2 --engine deepspeed --stage 2 --offload-optimizer cpu --optimizer adamw8bit
t 2 "add --engine fsdp2" "$PLANNER" explain --model 7b --gpus 2 --stage 3 --fsdp-config "$TMP/out.file"
t 2 '--engine "megatron"' "$CALIBRATE" fit --engine megatron --runs "$SRC/data/runs/h200-sxm/2026-12-01_peers_fsdp2.jsonl" --hardware h200-sxm --out "$TMP/out.file"
t 2 "no runs of engine deepspeed" "$CALIBRATE" fit --engine deepspeed --runs "$SRC/data/runs/h200-sxm/2026-12-01_peers_fsdp2.jsonl" --hardware h200-sxm --out "$TMP/out.file"
t 2 "not valid for a peer measurement" "$CALIBRATE" measure --engine tpu --list "$SRC/bench/runlists/peers_fsdp2.txt" --out "$TMP/m"
t 2 "--sample" "$PLANNER" validate --model 7b --sample -1
printf 'name = "x"\n' >"$TMP/hw_min.toml"
t 2 "hw_min.toml" "$PLANNER" explain --model 7b --hardware "$TMP/hw_min.toml"
printf '' >"$TMP/hw_empty.toml"
t 2 "hw_empty.toml" "$PLANNER" explain --model 7b --hardware "$TMP/hw_empty.toml"

# --- plan files for train --plan ---
"$PLANNER" explain --model test-llama-tiny --gpus 1 --stage 2 --seq 32 --precision fp32 --json >"$TMP/plan.json"
while IFS='|' read -r name from to regex; do
  [[ -z "$name" ]] && continue
  python3 - "$TMP/plan.json" "$TMP/plan_$name.json" "$from" "$to" <<'PY'
import json, sys
src, dst, key, value = sys.argv[1:5]
j = json.load(open(src))
cfg = j["plans"][0]["config"]
if value == "DELETE":
    del cfg[key]
else:
    cfg[key] = json.loads(value)
open(dst, "w").write(json.dumps(j))
PY
  t 2 "$regex" "$TRAIN" --model test-llama-tiny --plan "$TMP/plan_$name.json" --device cpu --quiet --steps 1
done <<'EOF'
stagefloat|zero_stage|1.7|plans\[0\].config.zero_stage is 1.7
stagehuge|zero_stage|1099511627776|plans\[0\].config.zero_stage is 1099511627776
stage5|zero_stage|5|plans\[0\].config.zero_stage 5 is not a ZeRO stage
stagestr|zero_stage|"2"|zero_stage
mbzero|micro_batch|0|plans\[0\].config.micro_batch 0 must be at least 1
mbhuge|micro_batch|99999999999|plans\[0\].config.micro_batch
gasneg|gas|-1|plans\[0\].config.gas
seqfloat|seq_len|32.5|plans\[0\].config.seq_len
gpus|gpus|0|plans\[0\].config.gpus
nodes|nodes|4294967296|plans\[0\].config.nodes
offload|offload_optimizer|"disk"|offload_optimizer
opt|optimizer|"sgd"|optimizer
prec|precision|"fp8"|precision
nostage|zero_stage|DELETE|zero_stage
ckpt|activation_checkpointing|"yes"|activation_checkpointing
EOF
printf '{"plans": []}' >"$TMP/plan_empty.json"
t 2 "plan_empty.json" "$TRAIN" --model test-llama-tiny --plan "$TMP/plan_empty.json" --device cpu --quiet --steps 1
printf '{"plans": [' >"$TMP/plan_torn.json"
t 2 "plan_torn.json" "$TRAIN" --model test-llama-tiny --plan "$TMP/plan_torn.json" --device cpu --quiet --steps 1
python3 -c "print('{\"plans\":' + '['*100000 + ']'*100000 + '}')" >"$TMP/plan_deep.json"
t 2 "nested deeper" "$TRAIN" --model test-llama-tiny --plan "$TMP/plan_deep.json" --device cpu --quiet --steps 1

# --- run records for calibrate: one broken step record in a good file ---
RUNS="$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl"
MICRO="$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3_micro.jsonl"
good_line=$(grep -m1 '"warmup":false' "$RUNS")
while IFS='|' read -r name path value regex; do
  [[ -z "$name" ]] && continue
  python3 - "$good_line" "$path" "$value" >"$TMP/run_$name.jsonl" <<'PY'
import json, sys
line, path, value = sys.argv[1:4]
j = json.loads(line)
node = j
keys = path.split(".")
for k in keys[:-1]:
    node = node[k]
if value == "DELETE":
    del node[keys[-1]]
else:
    node[keys[-1]] = json.loads(value) if value not in ("NaN", "Infinity") else value
print(json.dumps(j).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity"))
PY
  cat "$RUNS" "$TMP/run_$name.jsonl" >"$TMP/runs_$name.jsonl"
  t 2 "$regex" "$CALIBRATE" report --runs "$TMP/runs_$name.jsonl" --hardware h200-sxm --svg "$TMP/out.file"
  t 2 "$regex" "$CALIBRATE" fit --runs "$MICRO" "$TMP/runs_$name.jsonl" --hardware h200-sxm --out "$TMP/out.file"
done <<'EOF'
stepzero|time_s.step|0|time_s.step is 0
stepneg|time_s.step|-1.5|time_s.step is -1.5
stephuge|time_s.step|1e30|time_s.step is 1e\+?30
stepstr|time_s.step|"fast"|time_s.step
fwdneg|time_s.forward|-0.1|time_s.forward
memneg|memory_bytes.gpu_peak_reserved|-1|memory_bytes.gpu_peak_reserved
memhuge|memory_bytes.gpu_peak_reserved|1e300|memory_bytes.gpu_peak_reserved
tpsneg|throughput.tokens_per_s|-5|throughput.tokens_per_s
nostep|time_s.step|DELETE|step
noconfig|config|DELETE|config
stage9|config.zero_stage|9|zero_stage 9 is not a ZeRO stage
mb|config.micro_batch|0|config.micro_batch 0
uploads|config.offload_uploads_in_backward|"soon"|config.offload_uploads_in_backward is "soon", expected true or false
model|model|"gpt-9"|unknown model
EOF
# a malformed line in the middle is an error; a torn last line is skipped with a warning (tested in test_tools)
{ head -3 "$RUNS"; echo '{"model": "x", '; tail -2 "$RUNS"; } >"$TMP/runs_mid.jsonl"
t 2 "runs_mid.jsonl:4: malformed JSON" "$CALIBRATE" report --runs "$TMP/runs_mid.jsonl" --hardware h200-sxm
# a superseded list beside the runs: an entry whose key matches no record, an unknown key
mkdir -p "$TMP/sup"
cp "$RUNS" "$TMP/sup/runs.jsonl"
printf '[[superseded]]\nfile = "runs.jsonl"\nkey = "gpt-9 g1n1"\nreason = "r"\n' >"$TMP/sup/superseded.toml"
t 2 "superseded.toml: superseded entry key \"gpt-9 g1n1\" matches no record of runs.jsonl" "$CALIBRATE" report --runs "$TMP/sup/runs.jsonl" --hardware h200-sxm
printf '[[superseded]]\nfile = "runs.jsonl"\nkey = "k"\nreason = "r"\nsince = 3\n' >"$TMP/sup/superseded.toml"
t 2 "superseded.toml.*since" "$CALIBRATE" fit --runs "$TMP/sup/runs.jsonl" --hardware h200-sxm --out "$TMP/out.file"
rm -rf "$TMP/sup"
# micro-benchmark records with absurd times
python3 - "$MICRO" >"$TMP/micro_bad.jsonl" <<'PY'
import json, sys
for i, line in enumerate(open(sys.argv[1])):
    j = json.loads(line)
    if j.get("kind") == "micro" and "seconds" in j and i > 3:
        j["seconds"] = 1e-30
        print(json.dumps(j))
        break
    print(line.rstrip("\n"))
PY
t 2 "seconds" "$CALIBRATE" fit --runs "$TMP/micro_bad.jsonl" "$RUNS" --hardware h200-sxm --out "$TMP/out.file"
# too little data for the coefficients the fit would move
head -3 "$RUNS" >"$TMP/runs_one.jsonl"
t 2 "cannot determine" "$CALIBRATE" fit --runs "$TMP/runs_one.jsonl" --hardware h200-sxm --out "$TMP/out.file"

# --- published throughputs (calibrate report --published) ---
printf '[source]\nid = "x"\ntitle = "t"\nurl = "u"\nretrieved = "2026-12-01"\nengine = "fsdp2"\n[[rows]]\nwhere = "w"\nmodel = "llama-2-13b"\nhardware = "a100-80gb-sxm"\ngpus = 12\nseq = 2048\nmicro_batch = 1\ngas = 1\ntokens_per_s_per_gpu = 1\n' >"$TMP/pub_gpus.toml"
t 2 "pub_gpus.toml: rows\[0\].gpus = 12" "$CALIBRATE" report --published "$TMP/pub_gpus.toml"
sed 's/engine = "fsdp2"/engine = "megatron"/' "$TMP/pub_gpus.toml" >"$TMP/pub_engine.toml"
t 2 "pub_engine.toml: source.engine.*megatron" "$CALIBRATE" report --published "$TMP/pub_engine.toml"
sed 's/model = "llama-2-13b"/model = "gpt-9"/' "$TMP/pub_gpus.toml" >"$TMP/pub_model.toml"
t 2 "pub_model.toml: rows\[0\].model.*gpt-9" "$CALIBRATE" report --published "$TMP/pub_model.toml"
sed 's/engine = "fsdp2"/engine = "fsdp2"\ngrad_sync = "often"/' "$TMP/pub_gpus.toml" >"$TMP/pub_sync.toml"
t 2 "pub_sync.toml: source.grad_sync = \"often\"" "$CALIBRATE" report --published "$TMP/pub_sync.toml"
sed 's/engine = "fsdp2"/engine = "deepspeed"\ngrad_sync = "each"/' "$TMP/pub_gpus.toml" >"$TMP/pub_sync_ds.toml"
t 2 "pub_sync_ds.toml: source.grad_sync = \"each\" is an FSDP2 setting" "$CALIBRATE" report --published "$TMP/pub_sync_ds.toml"
sed 's/gpus = 12/gpus = 8\nattention = "sliding"/' "$TMP/pub_gpus.toml" >"$TMP/pub_attn.toml"
t 2 "pub_attn.toml: rows\[0\].attention = \"sliding\"" "$CALIBRATE" report --published "$TMP/pub_attn.toml"
t 2 "--published and --runs" "$CALIBRATE" report --published --runs "$SRC/data/runs/h200-sxm/2026-11-30_calibration_v3.jsonl"
t 2 "nothing.toml" "$CALIBRATE" report --published "$TMP/nothing.toml"

# --- calibrate predict: a run list planner explain rejects, names its line; nothing is written ---
printf 'pythia-2.8b 1 --stage 2\npythia-2.8b 1 --stage 9\n' >"$TMP/predict_bad.txt"
t 2 "predict_bad.txt:2: planner explain rejects the line" "$CALIBRATE" predict --list "$TMP/predict_bad.txt" --engine deepspeed --out "$TMP/out.file"
[[ -e "$TMP/out.file" ]] && { echo "FAIL [calibrate predict]: wrote $TMP/out.file for a rejected list"; fail=$((fail + 1)); }
printf 'pythia-2.8b 2 --stage 2 --emulate-nodes 3\n' >"$TMP/predict_nodes.txt"
t 2 'predict_nodes.txt:1: --emulate-nodes "3" must be a whole number that divides NPROC 2' "$CALIBRATE" predict --list "$TMP/predict_nodes.txt"
printf '# nothing\n' >"$TMP/predict_empty.txt"
t 2 "predict_empty.txt: the run list has no configuration" "$CALIBRATE" predict --list "$TMP/predict_empty.txt"
t 2 "--engine \"tpu\" is not valid" "$CALIBRATE" predict --list "$SRC/bench/runlists/smoke.txt" --engine tpu
t 2 "nothing.txt: cannot open" "$CALIBRATE" predict --list "$TMP/nothing.txt"
t 2 "$TMP" "$CALIBRATE" predict --list "$SRC/bench/runlists/smoke.txt" --out "$TMP"

# --- calibrate --threads ---
for v in abc -1 1.5 5000; do
  t 2 "--threads" "$CALIBRATE" report --no-cv --threads "$v"
done

# --- calibrate link: collectives across nodes, or one clear line and no profile written ---
printf '{"kind":"micro","bench":"all_reduce","bytes":1048576,"world":2,"seconds":0.001}\n' >"$TMP/link_one_node.jsonl"
t 2 "no collective micro-benchmark across nodes" "$CALIBRATE" link --runs "$TMP/link_one_node.jsonl" --out "$TMP/link.toml"
[[ -e "$TMP/link.toml" ]] && { echo "FAIL [calibrate link]: wrote $TMP/link.toml without records across nodes"; fail=$((fail + 1)); }
printf '{"kind":"micro","bench":"all_gather","bytes":1048576,"world":4,"nodes":3,"seconds":0.001}\n' >"$TMP/link_nodes3.jsonl"
t 2 'link_nodes3.jsonl:1: key "nodes" is 3' "$CALIBRATE" link --runs "$TMP/link_nodes3.jsonl" --out "$TMP/link.toml"
printf '{"kind":"micro","bench":"all_reduce","bytes":1048576,"world":2,"nodes":2,"seconds":0.001}\n' >"$TMP/link_ok.jsonl"
t 2 "--out \"$TMP/out.file\": expected a .toml file" "$CALIBRATE" link --runs "$TMP/link_ok.jsonl" --out "$TMP/out.file"
t 2 "--out is required" "$CALIBRATE" link --runs "$TMP/link_ok.jsonl"
mkdir -p "$TMP/dir.toml"
t 2 "dir.toml" "$CALIBRATE" link --runs "$TMP/link_ok.jsonl" --out "$TMP/dir.toml"
t 2 "nothing.jsonl" "$CALIBRATE" link --runs "$TMP/nothing.jsonl" --out "$TMP/link.toml"
t 2 "hardware" "$CALIBRATE" link --runs "$TMP/link_ok.jsonl" --hardware no-such-gpu --out "$TMP/link.toml"

# --- run lists for calibrate measure ---
while IFS='|' read -r name text regex; do
  [[ -z "$name" ]] && continue
  printf '%b' "$text" >"$TMP/list_$name.txt"
  t 2 "$regex" "$CALIBRATE" measure --list "$TMP/list_$name.txt" --out "$TMP/m_$name" --device cpu --no-micro --steps 2
done <<'EOF'
nproc|test-llama-tiny abc --stage 2\n|list_nproc.txt:1
nproc0|test-llama-tiny 0\n|list_nproc0.txt:1
nonproc|test-llama-tiny\n|list_nonproc.txt:1
badflag|test-llama-tiny 1 --stage 7\n|--stage 7|stage
badmodel|gpt-9 1\n|gpt-9
EOF

echo "bad input: $pass passed, $fail failed"
[[ $fail -eq 0 ]]
