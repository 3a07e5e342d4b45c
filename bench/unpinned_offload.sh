#!/usr/bin/env bash
# DeepSpeed's CPU optimizer offload with its host buffers pinned (what the planner's configs
# write) and not pinned (DeepSpeed's default, `offload_optimizer.pin_memory` false, which the
# founding report's ds_config.json left as it was): the same plan twice, then the founding
# report's job shape unpinned, each config written by the planner (`--offload-pin-memory on|off`;
# the records key on it). `planner diagnose` reads the unpinned runs against the profile
# (docs/diagnose.md).
# Usage (GPU host, repository root): bench/unpinned_offload.sh OUT_DIR HARDWARE [STEPS]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="$1"; HW="$2"; STEPS="${3:-4}"
source scripts/peer_env.sh || exit 1
mkdir -p "$OUT"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
run() {  # NAME PIN FLAGS...: one plan, its DeepSpeed config pinned (on) or not (off)
  local name="$1" pin="$2"; shift 2
  build-peers/planner/planner explain --model pythia-2.8b --engine deepspeed --hardware "$HW" "$@" \
    --offload-pin-memory "$pin" --deepspeed-config "$OUT/$name.ds.json" --json >"$OUT/$name.plan.json" || return 1
  echo "=== $name pin_memory=$pin $*" | tee -a "$OUT/peer.log"
  timeout --kill-after=30 "${TIMEOUT_S:-200}" python3 -m torch.distributed.run --standalone --nproc_per_node 1 \
    bench/peers/peer.py --engine deepspeed --plan "$OUT/$name.plan.json" --model-card data/models/pythia-2.8b.toml \
    --model-name pythia-2.8b --deepspeed-config "$OUT/$name.ds.json" --steps "$STEPS" --warmup 1 \
    --json-out "$OUT/$name.jsonl" --git-commit "$COMMIT" --hardware "$HW" >>"$OUT/peer.log" 2>&1
  echo "rc=$?" | tee -a "$OUT/peer.log"
  grep "^peer deepspeed step" "$OUT/peer.log" | tail -2
}
run s2_pinned on --stage 2 --offload-optimizer cpu --micro-batch 4 --gas 2
run s2_unpinned off --stage 2 --offload-optimizer cpu --micro-batch 4 --gas 2
run founding_unpinned off --stage 2 --offload-optimizer cpu --micro-batch 8 --gas 5 --checkpointing on --attention math
# The unpinned step against the pinned one measured in this call (medians of the measured steps).
python3 - "$OUT" <<'PY'
import json, statistics, sys
def step(name):
    try:
        rows = [json.loads(l) for l in open(f"{sys.argv[1]}/{name}.jsonl")]
    except OSError:
        return None
    return statistics.median(r["time_s"]["step"] for r in rows if not r.get("warmup"))
pinned, unpinned = step("s2_pinned"), step("s2_unpinned")
if pinned and unpinned:
    print("ZeRO-2 4 x 2048 GAS 2: pinned %.3f s, unpinned %.3f s a step: %.2fx" % (pinned, unpinned, unpinned / pinned))
PY
