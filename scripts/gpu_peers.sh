#!/usr/bin/env bash
# Measures a peer engine (real DeepSpeed or PyTorch FSDP2) on the GPU machine with
# `calibrate measure --engine`: builds the planner and calibrate (no LibTorch, no CUDA: the peers
# bring their own), then runs a run list through bench/peers/peer.py under torchrun.
# DeepSpeed comes from .peers/ (made here by scripts/peer_deps.sh; carry ".peers" and ".deps").
#   [STEPCAST_GIT_COMMIT=sha] [BUDGET_MIN=8] bash scripts/gpu_peers.sh ENGINE LIST OUT_DIR [STEPS=4] [HARDWARE=h200-sxm]
# HARDWARE: the profile the plans are made for and the records name (h100-sxm on an H100).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENGINE="$1"; LIST="$2"; OUT_DIR="$3"; STEPS="${4:-4}"; HARDWARE="${5:-h200-sxm}"
source scripts/peer_env.sh || exit 1
mkdir -p "$OUT_DIR"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  nproc; free -g | head -2; } > "$OUT_DIR/env.txt" 2>&1
build-peers/calibrate/calibrate measure --engine "$ENGINE" --list "$LIST" --out "$OUT_DIR" --steps "$STEPS" \
  --budget-min "${BUDGET_MIN:-8}" --timeout-s "${TIMEOUT_S:-300}" --planner build-peers/planner/planner \
  --hardware "$HARDWARE"
