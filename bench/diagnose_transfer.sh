#!/usr/bin/env bash
# Does a diagnosis carry to other plans on the same machine? `planner diagnose` reads ONE
# configuration of a runs file (the one whose key contains PATTERN) and names the resources and
# speeds that explain it; every other configuration of the file is then predicted three ways and
# set against its measured step:
#   profile    the profile as it stands (what the planner said before anything was measured)
#   told       the profile told the truth about the machine (TRUTH flags, e.g. the thread count
#              the run was given: --cpu-threads-per-rank 2 for a peer, --cpu-cores 2 for ours)
#   diagnosed  the profile with the diagnosed speeds (--speed), told nothing
# Usage: bench/diagnose_transfer.sh BUILD HARDWARE ENGINE RUNS.jsonl PATTERN [TRUTH FLAGS...]
#   e.g. bench/diagnose_transfer.sh build h100-sxm deepspeed runs.jsonl " s2 " --cpu-threads-per-rank 2
# Prints one table (errors = predicted / measured - 1) and the mean absolute error of each way.
set -euo pipefail
BUILD="$1"; HW="$2"; ENGINE="$3"; RUNS="$4"; PATTERN="$5"; shift 5
TRUTH=("$@")
PLANNER="$BUILD/planner/planner"; CAL="$BUILD/calibrate/calibrate"
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

"$CAL" report --runs "$RUNS" --hardware "$HW" --engine "$ENGINE" --no-cv --json 2>/dev/null |
  python3 -c 'import json,sys; [print(r["key"]) for r in json.load(sys.stdin)["runs"]]' >"$TMP/keys"
A=$(grep -F -- "$PATTERN" "$TMP/keys" || true)
[[ $(printf '%s\n' "$A" | grep -c .) -eq 1 ]] || { echo "diagnose_transfer: PATTERN '$PATTERN' must name one configuration of $RUNS" >&2; exit 2; }

"$PLANNER" diagnose --run "$RUNS" --key "$A" --hardware "$HW" --json >"$TMP/a.json"
SPEEDS=$(python3 -c '
import json,sys
e=json.load(open(sys.argv[1]))["explanation"]
print(" ".join("--speed %s=%.6g" % (r["resource"], r["speed_frac"]) for r in e["resources"]))' "$TMP/a.json")
echo "diagnosed from: $A"
echo "speeds: ${SPEEDS:-none, the run lies within the error of the model}"
python3 -c '
import json,sys
d=json.load(open(sys.argv[1]))
for r in d["explanation"]["resources"]: print("  %s x%.4g: %s" % (r["resource"], r["speed_frac"], r["meaning"]))' "$TMP/a.json"

printf '%-78s %9s %9s %8s %9s %8s %9s %8s\n' configuration measured profile err told err diagnosed err
printf '%-78s %9s %9s %8s %9s %8s %9s %8s\n' "" s s % s % s %
while IFS= read -r key; do
  [[ "$key" == "$A" ]] && continue
  # shellcheck disable=SC2086
  for way in profile told diagnosed; do
    case $way in
      profile) extra=() ;;
      told) extra=("${TRUTH[@]}") ;;
      diagnosed) read -r -a extra <<<"$SPEEDS" ;;
    esac
    "$PLANNER" diagnose --run "$RUNS" --key "$key" --hardware "$HW" "${extra[@]}" --json >"$TMP/$way.json"
  done
  python3 - "$key" "$TMP" <<'PY'
import json, sys
key, tmp = sys.argv[1], sys.argv[2]
row, meas = [], None
for way in ("profile", "told", "diagnosed"):
    d = json.load(open(f"{tmp}/{way}.json"))
    step = next(p for p in d["phases"] if p["phase"] == "step")
    meas = step["measured_s"]
    row += [step["predicted_s"], 100.0 * (step["predicted_s"] / meas - 1.0)]
print("%-78s %9.3f %9.3f %+8.1f %9.3f %+8.1f %9.3f %+8.1f" % (key[:78], meas, *row))
PY
done <"$TMP/keys" | tee "$TMP/rows"
python3 - "$TMP/rows" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
if rows:
    errs = [[abs(float(r[i])) for r in rows] for i in (-5, -3, -1)]
    print("mean |error| over %d: profile %.1f %%, told %.1f %%, diagnosed %.1f %%" %
          (len(rows), *(sum(e) / len(e) for e in errs)))
PY
