#!/usr/bin/env bash
# What a peer engine (real DeepSpeed or PyTorch FSDP2) holds at its peak GPU memory, for the
# configurations whose peak the model misses most: each run-list line runs once more through
# bench/peers/peer.py --memory-trace, which records the caching allocator's events over its steps
# and writes what was live at the largest allocated and the largest reserved bytes, grouped by the
# Python line that allocated it and by the model or engine code that asked, and the free bytes
# inside the segments the steps created (the cache above the live bytes). Diagnostic runs: no step
# record is written (the recording slows the steps).
#   bash bench/peer_memory_trace.sh ENGINE LIST OUT_DIR [STEPS=2] [STACKS=auto]
# STACKS auto: a line whose run fails while Python stacks are recorded (DeepSpeed's ZeRO-3
# parameter offload raises SystemError from an autograd Function there) runs once more recording
# sizes only; python or none: that recording alone.
# On the GPU host, after scripts/gpu_peers.sh's dependencies (carry ".deps" and ".peers"); it
# builds the planner as gpu_peers.sh does. OUT_DIR/NN_<model>.json per line, OUT_DIR/trace.log, and
# all of them in OUT_DIR.tgz (a device call brings back a few files only).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ENGINE="$1"; LIST="$2"; OUT_DIR="$3"; STEPS="${4:-2}"; STACKS="${5:-auto}"
case "$ENGINE" in deepspeed|fsdp2) ;; *) echo "peer_memory_trace: ENGINE $ENGINE is not deepspeed or fsdp2" >&2; exit 2 ;; esac
case "$STACKS" in auto) tries=(python none) ;; python|none) tries=("$STACKS") ;;
  *) echo "peer_memory_trace: STACKS $STACKS is not auto, python or none" >&2; exit 2 ;; esac
[[ -f "$LIST" ]] || { echo "peer_memory_trace: $LIST: no such run list" >&2; exit 2; }
source scripts/peer_env.sh || exit 1
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/trace.log"
n=0; failed=0
while read -r model nproc flags; do
  [[ -z "$model" || "$model" == \#* ]] && continue
  n=$((n + 1))
  name=$(printf "%02d_%s" "$n" "$model")
  plan="$OUT_DIR/$name.plan.json"; ds="$OUT_DIR/$name.deepspeed.json"
  extra=(); [[ "$ENGINE" == deepspeed ]] && extra=(--deepspeed-config "$ds")
  # shellcheck disable=SC2086  # the line's flags are words
  if ! build-peers/planner/planner explain --model "$model" --gpus "$nproc" --engine "$ENGINE" --hardware h200-sxm \
      --json "${extra[@]}" $flags > "$plan" 2>> "$LOG"; then
    echo "peer_memory_trace: $LIST line $n: planner explain rejects it" >&2; failed=$((failed + 1)); continue
  fi
  echo "=== $name: $model $nproc $flags" | tee -a "$LOG" >&2
  peer_ds=(); [[ "$ENGINE" == deepspeed ]] && peer_ds=(--deepspeed-config "$ds")
  ok=0
  for stacks in "${tries[@]}"; do
    timeout --signal=TERM --kill-after=30 "${TIMEOUT_S:-300}" python3 -m torch.distributed.run --standalone \
      --nproc_per_node "$nproc" bench/peers/peer.py --engine "$ENGINE" --plan "$plan" \
      --model-card "data/models/$model.toml" --steps "$STEPS" --warmup 1 --json-out /dev/null \
      --git-commit "${STEPCAST_GIT_COMMIT:-unknown}" --hardware h200-sxm --memory-trace "$OUT_DIR/$name.json" \
      --memory-trace-stacks "$stacks" "${peer_ds[@]}" >> "$LOG" 2>&1 && { ok=1; break; }
    echo "peer_memory_trace: $name failed with stacks=$stacks (see $LOG)" >&2
  done
  [[ $ok -eq 1 ]] || failed=$((failed + 1))
done < "$LIST"
tar czf "$OUT_DIR.tgz" -C "$(dirname "$OUT_DIR")" "$(basename "$OUT_DIR")"
echo "peer_memory_trace: $n configurations, $failed failed; reports in $OUT_DIR and $OUT_DIR.tgz" >&2
[[ $failed -eq 0 ]]
