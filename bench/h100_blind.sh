#!/usr/bin/env bash
# The first GPU kind other than the H200 that our backend and FSDP2 ran on: one lent H100 SXM
# (data/runs/h100-sxm/). Prints, per configuration, the measured step time against
#   transferred  the h100-sxm profile as committed (datasheet hardware, engine coefficients from
#                h200-sxm): the blind prediction, committed before the call
#                (bench/predictions/h100_blind_1gpu_c29c9b9.*, peers_fsdp2_h100_1gpu_e4cf7c8.txt);
#   measured     the same profile with the call's own micro-benchmarks as measured components
#                (calibrate fit --hardware h100-sxm --runs micro.jsonl --out ...);
#   diagnostic   measured, with the H200's HBM rate (4.8 TB/s) in place of the H100's 3.35: not a
#                model, a test of which term carries the miss (docs/cost_model.md).
# and the mean / max |error| of each. Runs on the CPU in seconds.
# Usage: bash bench/h100_blind.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
R=data/runs/h100-sxm
$B/calibrate/calibrate fit --hardware h100-sxm --runs $R/2026-12-05_h100_blind_1gpu_micro.jsonl --out "$T/measured.toml" >/dev/null
sed 's/^memory_bytes_per_s = { value = 3350000000000.0/memory_bytes_per_s = { value = 4800000000000.0/' \
  "$T/measured.toml" >"$T/diagnostic.toml"
grep -q '^memory_bytes_per_s = { value = 4800000000000.0' "$T/diagnostic.toml" ||
  { echo "h100_blind: the h100-sxm profile's HBM line changed; update the sed above" >&2; exit 1; }
for p in h100-sxm "$T/measured.toml" "$T/diagnostic.toml"; do
  n=$(basename "$p" .toml)
  $B/calibrate/calibrate report --hardware "$p" --runs $R/2026-12-05_h100_blind_1gpu.jsonl --json >"$T/ours.$n.json" 2>/dev/null
  $B/calibrate/calibrate report --engine fsdp2 --hardware "$p" --runs $R/2026-12-05_peers_fsdp2_h100_1gpu.jsonl \
    --json >"$T/fsdp2.$n.json" 2>/dev/null
done
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
names = [("h100-sxm", "transferred"), ("measured", "measured"), ("diagnostic", "diagnostic")]
for engine in ("ours", "fsdp2"):
    runs = {n: {r["key"]: r for r in json.load(open(f"{t}/{engine}.{n}.json"))["runs"]} for n, _ in names}
    keys = list(runs["h100-sxm"])
    print(f"{'our backend' if engine == 'ours' else 'FSDP2'} on one H100 SXM: step s measured, error % of each profile; memory GiB measured, error %")
    print(f"{'configuration':72s} {'meas':>7s} " + " ".join(f"{label:>11s}" for _, label in names) + f" {'mem':>6s} {'err':>6s}")
    errs = {n: [] for n, _ in names}
    for k in keys:
        r0 = runs["h100-sxm"][k]
        row = f"{k[:72]:72s} {r0['measured']['step_s']:7.3f} "
        for n, _ in names:
            e = runs[n][k]["step_error_pct"]
            errs[n].append(abs(e))
            row += f" {e:+10.1f}"
        row += f" {r0['measured']['gpu_peak_reserved_bytes'] / 2**30:6.1f} {r0['memory_error_pct']:+6.1f}"
        print(row)
    print(f"{'mean / max |error|':72s} {'':7s} " + " ".join(
        f"{sum(errs[n]) / len(errs[n]):5.1f}/{max(errs[n]):5.1f}" for n, _ in names))
    print()
PY
