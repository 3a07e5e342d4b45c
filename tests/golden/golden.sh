#!/usr/bin/env bash
# Fixed commands of `planner`, `calibrate` and `train` whose outputs must stay
# byte-identical across refactors (issue 14). Each command's stdout, stderr and
# exit status go to OUT/<name>.{out,err,rc}; files the commands write go beside
# them. Lines that carry the date, the git commit or a measured time are
# filtered (the filters are below, each with its reason).
#
#   golden.sh BUILD_DIR OUT_DIR            record into OUT_DIR
#   golden.sh BUILD_DIR OUT_DIR EXPECTED   record, then diff against EXPECTED (exit 1 on a difference)
set -u
BUILD=$(cd "$1" && pwd)
OUT="$2"
EXPECTED="${3:-}"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PLANNER="$BUILD/planner/planner"
CALIBRATE="$BUILD/calibrate/calibrate"
TRAIN="$BUILD/backend/train"
rm -rf "$OUT"
mkdir -p "$OUT"
cd "$ROOT"
RUNS=data/runs/h200-sxm

# run NAME PROGRAM ARGS... : stdout, stderr and exit status of one command.
run() {
  local name="$1"
  shift
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  echo $? >"$OUT/$name.rc"
}

run models "$PLANNER" models
run models_json "$PLANNER" models --json
run hardware "$PLANNER" hardware
run hardware_json "$PLANNER" hardware --json
run rec_6b "$PLANNER" recommend --model 6b --gpus 2
run rec_6b_json "$PLANNER" recommend --model 6b --gpus 2 --json
run rec_llama7_ds "$PLANNER" recommend --model llama-2-7b --gpus 2 --engine deepspeed --json
run rec_llama7_on "$PLANNER" recommend --model llama-2-7b --gpus 2 --offload-pipeline on --top 8
run rec_70b_nodes "$PLANNER" recommend --model llama-2-70b --gpus 8 --nodes 2 --train-tokens 1e9
run rec_70b_peft "$PLANNER" recommend --model 70b --gpus 1 --peft auto --global-batch 16
run rec_70b_peft_json "$PLANNER" recommend --model 70b --gpus 1 --peft auto --global-batch 16 --json
run exp_7b_qlora_ds "$PLANNER" explain --model llama-2-7b --gpus 2 --stage 2 --peft qlora --lora-targets attention --micro-batch 4 --gas 4 --deepspeed-config "$OUT/exp_7b_qlora_ds.json"
run cmp_6b "$PLANNER" compare --model 6b --train-tokens 1e9 --svg "$OUT/cmp_6b.svg" --k8s-manifest "$OUT/cmp_6b.yaml"
run cmp_6b_json "$PLANNER" compare --model 6b --train-tokens 1e9 --json --deadline-hours 5 --budget-usd 150 --price a40=0.5
run cmp_70b_ds "$PLANNER" compare --model 70b --train-tokens 1e9 --engine deepspeed --provider coreweave --max-gpus 32 --k8s-manifest "$OUT/cmp_70b_ds.yaml"
run rec_pythia_a40 "$PLANNER" recommend --model pythia-2.8b --gpus 1 --hardware a40 --precision fp32 --json
run rec_13b_gb0 "$PLANNER" recommend --model llama-2-13b --gpus 4 --global-batch 0 --optimizers adamw,adamw8bit
run rec_nofit "$PLANNER" recommend --model llama-2-70b --gpus 1 --seq 8192
run rec_files "$PLANNER" recommend --model mistral-7b --gpus 2 --deepspeed-config "$OUT/rec_files.ds.json" \
  --accelerate-config "$OUT/rec_files.accelerate.yaml"
run exp_offload "$PLANNER" explain --model llama-2-7b --gpus 2 --stage 2 --offload-optimizer cpu --micro-batch 4 \
  --gas 4 --deepspeed-config "$OUT/exp_offload.ds.json"
run exp_serial_json "$PLANNER" explain --model llama-2-7b --gpus 2 --stage 3 --offload-optimizer cpu \
  --offload-params cpu --optimizer adamw8bit --micro-batch 8 --gas 1 --offload-pipeline off --json
run exp_math "$PLANNER" explain --model qwen2.5-14b --gpus 4 --stage 3 --micro-batch 2 --gas 8 --attention math \
  --checkpointing on --seq 4096
run exp_bad "$PLANNER" explain --model 6b --stage 5
# The profile note's other cases: a profile with a held-out interval for the engine (h100-sxm,
# DeepSpeed) and a datasheet profile whose interval is transferred (a40).
run exp_h100_ds "$PLANNER" explain --model pythia-2.8b --gpus 1 --hardware h100-sxm --engine deepspeed --stage 2 \
  --offload-optimizer cpu --micro-batch 4 --gas 2
run exp_a40 "$PLANNER" explain --model pythia-2.8b --gpus 1 --hardware a40 --precision fp32 --stage 2 \
  --offload-optimizer cpu --micro-batch 4 --gas 5

run cal_report_json "$CALIBRATE" report --runs $RUNS/2026-11-30_calibration_v3_micro.jsonl \
  $RUNS/2026-11-30_calibration_v3.jsonl --hardware h200-sxm --json
run cal_report "$CALIBRATE" report --runs $RUNS/2026-11-30_calibration_v3_micro.jsonl \
  $RUNS/2026-11-30_calibration_v3.jsonl --hardware h200-sxm --svg "$OUT/cal_report.svg"
if [[ -x "$CALIBRATE" ]] && "$CALIBRATE" fit --help >/dev/null 2>&1; then
  run cal_fit "$CALIBRATE" fit --runs $RUNS/2026-11-30_calibration_v3_micro.jsonl \
    $RUNS/2026-11-30_calibration_v3.jsonl --hardware h200-sxm --out "$OUT/cal_fit.toml" --json
fi

if [[ -x "$TRAIN" ]]; then
  # oneDNN picks its kernels by the CPU's newest instruction set (bf16 and AMX paths round
  # differently), so the trained weights' bytes depend on the host: the recordings hold the
  # AVX-512 core kernels, which every AVX-512 host runs when capped there.
  export DNNL_MAX_CPU_ISA=AVX512_CORE
  for spec in "s0:--stage 0" "s3off:--stage 3 --offload-optimizer cpu --offload-params cpu --optimizer adamw8bit" \
              "s2pipe:--stage 2 --offload-optimizer cpu --offload-pipeline full --gas 2"; do
    name=train_${spec%%:*}
    run "$name" "$TRAIN" --model test-llama-tiny --precision bf16 --seq 32 --micro-batch 2 --steps 3 --quiet \
      --device cpu --json-out "$OUT/$name.jsonl" --dump-params "$OUT/$name.params.pt" ${spec#*:}
  done
  run train_bad "$TRAIN" --model test-llama-tiny --stage 2 --offload-params cpu
fi

# Filters. The profile's provenance names the date and commit; the solver's summary
# and every measured time differ from run to run.
for f in "$OUT"/*; do
  case "$f" in
    *.toml) sed -i -E 's/calibrate fit [0-9-]+, git [0-9a-f]+([+-]dirty)?/calibrate fit DATE, git COMMIT/' "$f" ;;
    *.jsonl) python3 - "$f" <<'PY'
import json, sys
path = sys.argv[1]
rows = [json.loads(l) for l in open(path)]
keep = ("model", "params", "config", "step", "warmup", "loss")
with open(path, "w") as out:
    for r in rows:
        out.write(json.dumps({k: r[k] for k in keep if k in r}, sort_keys=True) + "\n")
PY
    ;;
  esac
done
sed -i -E 's/"fit_wall_s": [0-9.e+-]+/"fit_wall_s": T/' "$OUT"/cal_fit.out 2>/dev/null
# Paths of written files name the output folder.
for f in "$OUT"/*; do [[ -f "$f" ]] && sed -i "s#$OUT/#OUT/#g" "$f"; done
# Parameters: compared as their values (torch's zip container carries no clock, but keep it plain).
for f in "$OUT"/*.params.pt; do
  [[ -f "$f" ]] && sha256sum <"$f" | cut -c1-64 >"$f.sha256" && rm "$f"
done

if [[ -n "$EXPECTED" ]]; then
  if diff -r "$EXPECTED" "$OUT" >"$OUT.diff"; then
    echo "golden: identical ($(ls "$OUT" | wc -l) files)"
  else
    echo "golden: outputs differ from $EXPECTED:"
    head -60 "$OUT.diff"
    exit 1
  fi
fi
