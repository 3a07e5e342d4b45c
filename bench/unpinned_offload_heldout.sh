#!/usr/bin/env bash
# DeepSpeed's unpinned offload held out (docs/engines.md, session 46), one call on the GPU host:
# the host's pageable copy rate by `microbench --suite offload` first, then the designed run list
# bench/runlists/unpinned_offload_deepspeed_1gpu.txt through real DeepSpeed, whose predictions
# were committed before the call for a grid of rates (bench/predictions/unpinned_offload_*).
# Then, while time is left, the FSDP2 slow-CPU list (OMP_NUM_THREADS=2).
# Usage (GPU host, repository root): STEPCAST_GIT_COMMIT=sha bench/unpinned_offload_heldout.sh OUT_DIR HARDWARE [SECONDS=570]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="$1"; HW="$2"; LIMIT_S="${3:-570}"
mkdir -p "$OUT"
{ echo "# $(date -u) HW=$HW commit ${STEPCAST_GIT_COMMIT:-unknown}"; nvidia-smi -L
  nvidia-smi --query-gpu=driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  lscpu | head -20; free -g; } > "$OUT/env.txt" 2>&1
bash scripts/gpu_build.sh --tools > "$OUT/build.log" 2>&1; echo "build rc $? at ${SECONDS} s"
build-gpu/backend/microbench --out "$OUT/micro_offload.jsonl" --suite offload --repeats 5 2> "$OUT/micro.log"
echo "microbench rc $? at ${SECONDS} s"; grep "pageable vs pinned" "$OUT/micro.log"
# The rule of calibrate/micro_record.h (pageable_copy_bytes_per_s): median over records >= 16 MiB.
python3 - "$OUT/micro_offload.jsonl" <<'PY'
import json, statistics, sys
rates = [r["bytes"] / r["seconds"] for r in map(json.loads, open(sys.argv[1]))
         if r.get("kind") == "micro" and r.get("bench") in ("h2d_pageable", "d2h_pageable") and r["bytes"] >= 16 * 2**20]
print("pageable_bytes_per_s %.4g (median of %d records)" % (statistics.median(rates), len(rates)) if rates else "no pageable records")
PY
left_min() { python3 -c "print(round(max(0.5, ($LIMIT_S - $SECONDS) / 60 - 2.6), 2))"; }
BUDGET_MIN=$(left_min) TIMEOUT_S=150 bash scripts/gpu_peers.sh deepspeed bench/runlists/unpinned_offload_deepspeed_1gpu.txt \
  "$OUT/deepspeed" 4 "$HW" > "$OUT/deepspeed.log" 2>&1
echo "deepspeed rc $? at ${SECONDS} s"; grep -c '"warmup": false' "$OUT/deepspeed/runs.jsonl" 2>/dev/null
if (( LIMIT_S - SECONDS > 150 )); then
  OMP_NUM_THREADS=2 BUDGET_MIN=$(left_min) TIMEOUT_S=120 bash scripts/gpu_peers.sh fsdp2 \
    bench/runlists/diagnose_slow_cpu_fsdp2_1gpu.txt "$OUT/fsdp2" 4 "$HW" > "$OUT/fsdp2.log" 2>&1
  echo "fsdp2 rc $? at ${SECONDS} s"
fi
