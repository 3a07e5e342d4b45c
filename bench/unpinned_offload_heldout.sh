#!/usr/bin/env bash
# DeepSpeed's unpinned offload held out, in one call on the GPU host (docs/engines.md):
# the host's pageable copy rate by `microbench --suite offload` first, then the designed run list
# bench/runlists/unpinned_offload_deepspeed_1gpu.txt (or LIST) through real DeepSpeed, whose
# predictions are committed before the call (bench/predictions/). Prints each unpinned step
# against its pinned twin measured in the same call.
# Usage (GPU host, repository root):
#   STEPCAST_GIT_COMMIT=sha bench/unpinned_offload_heldout.sh OUT_DIR HARDWARE [SECONDS=570] [LIST]
# Everything it writes is also in OUT_DIR.tgz.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="$1"; HW="$2"; LIMIT_S="${3:-570}"; LIST="${4:-bench/runlists/unpinned_offload_deepspeed_1gpu.txt}"
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
BUDGET_MIN=$(left_min) TIMEOUT_S=150 bash scripts/gpu_peers.sh deepspeed "$LIST" \
  "$OUT/deepspeed" 4 "$HW" > "$OUT/deepspeed.log" 2>&1
echo "deepspeed rc $? at ${SECONDS} s"
# Unpinned against pinned, same plan, same call (medians of the measured steps).
python3 - "$OUT/deepspeed/runs.jsonl" <<'PY'
import json, statistics, sys
steps = {}
try:
    rows = [json.loads(l) for l in open(sys.argv[1])]
except OSError:
    rows = []
for r in rows:
    if r.get("warmup"):
        continue
    c = dict(r["config"]); pinned = c.pop("offload_pin_memory", True)
    steps.setdefault(json.dumps(c, sort_keys=True), {}).setdefault(pinned, []).append(r["time_s"]["step"])
for key, by_pin in steps.items():
    c = json.loads(key)
    plan = "stage %d, %d x %d, GAS %d, %s" % (c["zero_stage"], c["micro_batch"], c["seq_len"], c["gas"], c["precision"])
    if True in by_pin and False in by_pin:
        pin, unpin = statistics.median(by_pin[True]), statistics.median(by_pin[False])
        print("%s: pinned %.3f s, unpinned %.3f s: %.2fx" % (plan, pin, unpin, unpin / pin))
    else:
        print("%s: %s only, %.3f s" % (plan, "pinned" if True in by_pin else "unpinned",
                                        statistics.median(next(iter(by_pin.values())))))
PY
# The whole output in one file beside the folder: the device tool returns a few files per call, and
# the folder holds nine (the run records among them).
tar czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "all of $OUT in $OUT.tgz"
