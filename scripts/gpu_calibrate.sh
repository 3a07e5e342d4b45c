#!/usr/bin/env bash
# Calibration on a GPU host: micro-benchmarks, then the designed step runs,
# appended to DIR as JSONL (resumable: run it again with the same DIR to go on
# where a previous call stopped). Fit the result on a machine with Ceres:
#   calibrate fit --runs DIR/micro.jsonl DIR/runs.jsonl --hardware h200-sxm
# Usage (after scripts/gpu_build.sh): bash scripts/gpu_calibrate.sh DIR [BUDGET_MIN] [LIST]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="$1"
BUDGET="${2:-0}"
LIST="${3:-bench/runlists/calibration.txt}"
source scripts/gpu_env.sh
mkdir -p "$DIR"
start=$(date +%s)
build-gpu/calibrate/calibrate measure --list "$LIST" --out "$DIR" --budget-min "$BUDGET" \
  --train build-gpu/backend/train --device cuda
rc=$?
echo "calibrate measure: rc=$rc, wall $(( $(date +%s) - start )) s" | tee -a "$DIR/wall.log"
exit $rc
