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
[[ -d /tmp/deps/usr ]] || for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# DeepSpeed's ops (CPU Adam, fused Adam) compile just in time, once per machine.
export DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext TOKENIZERS_PARALLELISM=false
if [[ ! -x build-peers/calibrate/calibrate ]]; then
  cmake -S . -B build-peers -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
    -DSTEPCAST_WITH_TORCH=OFF -DSTEPCAST_WITH_CUDA=OFF -DSTEPCAST_WITH_NCCL=OFF -DSTEPCAST_WITH_CERES=OFF \
    >/tmp/cmake-peers.log 2>&1 || { tail -30 /tmp/cmake-peers.log; exit 1; }
  cmake --build build-peers -j "$(nproc)" --target planner calibrate >/tmp/build-peers.log 2>&1 ||
    { grep -E "error" -A3 /tmp/build-peers.log | head -40; exit 1; }
fi
mkdir -p "$OUT_DIR"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  nproc; free -g | head -2; } > "$OUT_DIR/env.txt" 2>&1
build-peers/calibrate/calibrate measure --engine "$ENGINE" --list "$LIST" --out "$OUT_DIR" --steps "$STEPS" \
  --budget-min "${BUDGET_MIN:-8}" --timeout-s "${TIMEOUT_S:-300}" --planner build-peers/planner/planner \
  --hardware "$HARDWARE"
