#!/usr/bin/env bash
# Measures the backend on the GPU machine: each line of a run list is one
# `train` configuration; every step is appended as JSON to $OUT/runs.jsonl,
# the console to $OUT/train.log. Run after scripts/gpu_build.sh (same shell).
#   [TIMEOUT_S=300] bash scripts/gpu_measure.sh LIST_FILE [STEPS]
# A list line: MODEL NPROC then train flags, e.g.
#   llama-2-7b 2 --stage 3 --micro-batch 4 --gas 4
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LIST="$1"
STEPS="${2:-4}"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
source scripts/gpu_env.sh
NGPU=$(nvidia-smi -L | wc -l)
while read -r model nproc flags; do
  [[ -z "$model" || "$model" == \#* ]] && continue
  if (( nproc > NGPU )); then echo "skip (needs $nproc GPUs): $model $flags" | tee -a "$OUT/train.log"; continue; fi
  echo "=== $model nproc=$nproc $flags" | tee -a "$OUT/train.log"
  start=$(date +%s)
  timeout "${TIMEOUT_S:-300}" build-gpu/backend/train --model "$model" --nproc "$nproc" --seq 2048 --steps "$STEPS" --warmup 1 \
    --json-out "$OUT/runs.jsonl" $flags >>"$OUT/train.log" 2>&1
  echo "rc=$? wall=$(( $(date +%s) - start ))s" | tee -a "$OUT/train.log"
  tail -n "$((STEPS))" "$OUT/train.log" | head -n "$STEPS" | tail -n 2
done <"$LIST"
