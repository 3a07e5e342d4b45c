#!/usr/bin/env bash
# Leave-host-out check of measured components (calibrate fit on micro-benchmarks alone,
# docs/calibration.md): for each lent H200 host whose call recorded both microbench's suite and
# our backend's step runs, its host's components are measured against the committed h200-sxm
# profile (the reference's GPU kind, so the host's components alone: CPU optimizer rates and PCIe
# share), and the same call's step runs are predicted with and without them. Prints the ratios
# and, per host, the mean |error| of the step and of the optimizer phase over all its runs and
# over those with the optimizer on the CPU. Runs on the CPU in seconds.
# Usage: bash bench/measured_hosts.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B=${1:-build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
R=data/runs/h200-sxm
# host (its call's micro file, then its step files)
HOSTS=(
  "calibration_v2|$R/2026-11-30_calibration_v2_micro.jsonl|$R/2026-11-30_calibration_v2.jsonl"
  "calibration_v4|$R/2026-11-30_calibration_v4_micro.jsonl|$R/2026-11-30_calibration_v4.jsonl"
  "calibration_v5|$R/2026-11-30_calibration_v5_micro.jsonl|$R/2026-11-30_calibration_v5.jsonl"
  "span_1gpu|$R/2026-12-01_span_1gpu_micro.jsonl|$R/2026-12-01_span_1gpu.jsonl $R/2026-12-01_span_1gpu_b.jsonl"
)
for h in "${HOSTS[@]}"; do
  IFS='|' read -r name micro steps <<<"$h"
  $B/calibrate/calibrate fit --hardware h200-sxm --runs "$micro" --out "$T/$name.toml" --json >"$T/$name.fit.json"
  # shellcheck disable=SC2086
  $B/calibrate/calibrate report --hardware h200-sxm --runs $steps --json >"$T/$name.plain.json" 2>/dev/null
  # shellcheck disable=SC2086
  $B/calibrate/calibrate report --hardware "$T/$name.toml" --runs $steps --json >"$T/$name.measured.json" 2>/dev/null
done
python3 - "$T" "${HOSTS[@]}" <<'PY'
import json, sys
tmp, hosts = sys.argv[1], [h.split("|")[0] for h in sys.argv[2:]]
def mean(v):
    v = [x for x in v if x == x]
    return sum(v) / len(v) if v else float("nan")
print("host             ratios (cpu bytes/lane, cpu flops/lane, dram share, pcie share)   runs  step % plain -> measured   optimizer % plain -> measured")
for h in hosts:
    fit = json.load(open(f"{tmp}/{h}.fit.json"))["coefficients"]
    rel = lambda k: fit[k]["rel"] if k in fit else float("nan")
    plain = {r["key"]: r for r in json.load(open(f"{tmp}/{h}.plain.json"))["runs"]}
    meas = {r["key"]: r for r in json.load(open(f"{tmp}/{h}.measured.json"))["runs"]}
    for label, pick in (("all", lambda k: True), ("cpu optimizer", lambda k: "off=cpu" in k)):
        keys = [k for k in plain if pick(k)]
        err = lambda rows, k, ph: 100 * abs(rows[k]["predicted"][ph] / rows[k]["measured"][ph] - 1) if rows[k]["measured"].get(ph, 0) > 0 else float("nan")
        print(f"{h:16s} {rel('cpu_core_bytes_per_s_per_lane'):6.3f} {rel('cpu_lane_flops_per_s'):6.3f} {rel('cpu_dram_eff_frac'):6.3f} {rel('pcie_eff_frac'):6.3f}"
              f"  {label:14s} {len(keys):4d}  {mean([err(plain,k,'step_s') for k in keys]):6.2f} -> {mean([err(meas,k,'step_s') for k in keys]):6.2f}"
              f"          {mean([err(plain,k,'optimizer_s') for k in keys]):6.2f} -> {mean([err(meas,k,'optimizer_s') for k in keys]):6.2f}")
PY
