#!/usr/bin/env bash
# Issue 18's multi-node path in one call of a host with two GPUs, blind: two "nodes" of one GPU
# each on that host (--emulate-nodes 2: each its own NCCL host identity, so NCCL moves the bytes
# over its network transport, not NVLink; backend/comm/launcher.h).
#   1. microbench times the collectives across the two emulated nodes (and within one node, for
#      comparison);
#   2. calibrate link turns the first into a profile of that link: h200-sxm's coefficients, its
#      [links] inter_node_bytes_per_s and inter_node_latency_s measured (no Ceres needed);
#   3. calibrate predict writes every configuration of the run list with that profile, before
#      any of them runs (predictions.txt, its time stamped in the log);
#   4. calibrate measure runs the list with our backend (train);
#   5. calibrate report prints predicted against measured (report.txt, report.json).
# Run on the GPU machine from the repository root, after `bash scripts/gpu_build.sh --tools`:
#   [BUDGET_MIN=6] bash bench/two_node_emulation.sh OUT_DIR [RUN_LIST]
# Everything lands in OUT_DIR; back here the runs go to data/runs/h200-sxm/ with the profile and
# the predictions beside them, and `calibrate report --runs ... --hardware PROFILE` redoes step 5.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${1:?usage: bash bench/two_node_emulation.sh OUT_DIR [RUN_LIST]}"
LIST="${2:-bench/runlists/two_node_emulation_2gpu.txt}"
B=build-gpu
[[ -x $B/calibrate/calibrate && -x $B/backend/microbench && -x $B/backend/train ]] ||
  { echo "two_node_emulation: build first (bash scripts/gpu_build.sh --tools)" >&2; exit 2; }
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
(( NGPU >= 2 )) || { echo "two_node_emulation: needs two GPUs, this host has $NGPU" >&2; exit 2; }
source scripts/gpu_env.sh
mkdir -p "$OUT"
log() { echo "two_node_emulation $(date -u +%FT%TZ): $*" | tee -a "$OUT/log.txt" >&2; }
PROFILE="$OUT/h200-sxm-emulated-nodes.toml"

log "1/5 collectives across two emulated nodes, then within one node"
$B/backend/microbench --suite collectives --device cuda --nproc 2 --emulate-nodes 2 --out "$OUT/micro_emulated.jsonl" \
  2>>"$OUT/log.txt" || { log "microbench across nodes failed"; exit 1; }
$B/backend/microbench --suite collectives --device cuda --nproc 2 --out "$OUT/micro_one_node.jsonl" 2>>"$OUT/log.txt" ||
  log "microbench within one node failed (the comparison only)"

log "2/5 calibrate link"
$B/calibrate/calibrate link --runs "$OUT/micro_emulated.jsonl" --hardware h200-sxm --out "$PROFILE" | tee "$OUT/link.txt" ||
  { log "calibrate link failed"; exit 1; }

log "3/5 predictions, before the runs"
$B/calibrate/calibrate predict --list "$LIST" --hardware "$PROFILE" --planner $B/planner/planner \
  --out "$OUT/predictions.txt" || { log "calibrate predict failed"; exit 1; }
sha256sum "$OUT/predictions.txt" | tee -a "$OUT/log.txt"

log "4/5 the runs"
TIMEOUT_S=${TIMEOUT_S:-180} $B/calibrate/calibrate measure --list "$LIST" --out "$OUT/runs" --train $B/backend/train \
  --device cuda --budget-min "${BUDGET_MIN:-6}" --no-micro 2>&1 | tail -n 40 >>"$OUT/log.txt"

log "5/5 predicted against measured"
$B/calibrate/calibrate report --runs "$OUT/runs/runs.jsonl" --hardware "$PROFILE" --no-cv | tee "$OUT/report.txt"
$B/calibrate/calibrate report --runs "$OUT/runs/runs.jsonl" --hardware "$PROFILE" --no-cv --json >"$OUT/report.json"
log "done"
