#!/usr/bin/env bash
# Our backend, real DeepSpeed and PyTorch FSDP2 on lent H100 SXM 80GB machines, the first GPU
# kind other than the H200 (data/runs/h100-sxm/). Three calls, each predicted before it ran
# (bench/predictions/h100_blind_1gpu_c29c9b9.*, peers_fsdp2_h100_1gpu_e4cf7c8.txt;
# h100_blind_2_1gpu_8e05810.*, peers_deepspeed_h100_1gpu_8e05810.txt, peers_fsdp2_h100_2_1gpu_8e05810.txt;
# h100_blind_3_1gpu_5e4b1f8.txt and h100_blind_3_1gpu_measured_5e4b1f8.txt). Prints, per configuration, the measured step time against
#   transferred  the h100-sxm profile as it is now (datasheet hardware, h200-sxm's fitted and
#                engine coefficients);
#   measured     the same profile with the call's own micro-benchmarks as measured components
#                (calibrate fit --hardware h100-sxm --runs micro.jsonl --out ...);
#   +elementwise measured, with the layers' element-wise micro-benchmarks as well (one H100
#                machine's, the same for every call, against the H200's of the same commit:
#                elementwise_bw_eff_frac, docs/cost_model.md);
#   diagnostic   measured, with the H200's HBM rate (4.8 TB/s) in place of the H100's 3.35: not a
#                model, a test of which term carries the miss (docs/cost_model.md).
# and the mean / max |error| of each. Runs on the CPU in seconds.
# Usage: bash bench/h100_blind.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B=${1:-build}
[[ -x $B/calibrate/calibrate ]] || { echo "h100_blind: no $B/calibrate/calibrate (build first)" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
R=data/runs/h100-sxm
# call: its micro-benchmarks (comma-separated), then ENGINE:RUNS pairs measured in it. The third
# call timed no micro-benchmarks but the element-wise ones, so its row takes the other calls', as
# its blind prediction did (h100_blind_3_1gpu_measured_5e4b1f8.txt).
CALLS=(
  "1 2026-12-05_h100_blind_1gpu_micro.jsonl ours:2026-12-05_h100_blind_1gpu.jsonl fsdp2:2026-12-05_peers_fsdp2_h100_1gpu.jsonl"
  "2 2026-12-05_h100_blind_2_1gpu_micro.jsonl ours:2026-12-05_h100_blind_2_1gpu.jsonl deepspeed:2026-12-05_peers_deepspeed_h100_1gpu.jsonl fsdp2:2026-12-05_peers_fsdp2_h100_2_1gpu.jsonl"
  "3 2026-12-05_h100_blind_1gpu_micro.jsonl,2026-12-05_h100_blind_2_1gpu_micro.jsonl,2026-12-05_h100_repeat_micro.jsonl ours:2026-12-05_h100_blind_3_1gpu.jsonl"
)
for call in "${CALLS[@]}"; do
  read -r n micro pairs <<<"$call"
  files=(); IFS=, read -r -a names <<<"$micro"; for f in "${names[@]}"; do files+=("$R/$f"); done
  $B/calibrate/calibrate fit --hardware h100-sxm --runs "${files[@]}" --out "$T/measured$n.toml" >/dev/null
  $B/calibrate/calibrate fit --hardware h100-sxm --runs "${files[@]}" "$R/2026-12-05_elementwise_micro.jsonl" \
    --out "$T/elementwise$n.toml" >/dev/null
  sed 's/^memory_bytes_per_s = { value = 3350000000000.0/memory_bytes_per_s = { value = 4800000000000.0/' \
    "$T/measured$n.toml" >"$T/diagnostic$n.toml"
  grep -q '^memory_bytes_per_s = { value = 4800000000000.0' "$T/diagnostic$n.toml" ||
    { echo "h100_blind: the h100-sxm profile's HBM line changed; update the sed above" >&2; exit 1; }
  for pair in $pairs; do
    engine=${pair%%:*}; runs=${pair#*:}
    flag=(); [[ $engine == ours ]] || flag=(--engine "$engine")
    for p in h100-sxm "$T/measured$n.toml" "$T/elementwise$n.toml" "$T/diagnostic$n.toml"; do
      label=$(basename "$p" .toml); label=${label%$n}
      $B/calibrate/calibrate report "${flag[@]}" --hardware "$p" --runs "$R/$runs" --json \
        >"$T/call$n.$engine.$label.json" 2>/dev/null
    done
  done
done
python3 - "$T" <<'PY'
import glob, json, os, sys
t = sys.argv[1]
names = [("h100-sxm", "transferred"), ("measured", "measured"), ("elementwise", "+elementwise"),
         ("diagnostic", "diagnostic")]
title = {"ours": "our backend", "deepspeed": "DeepSpeed", "fsdp2": "FSDP2"}
pooled = {}
for engine in ("ours", "deepspeed", "fsdp2"):
    for call in sorted({os.path.basename(f).split(".")[0] for f in glob.glob(f"{t}/call*.{engine}.h100-sxm.json")}):
        runs = {n: {r["key"]: r for r in json.load(open(f"{t}/{call}.{engine}.{n}.json"))["runs"]} for n, _ in names}
        print(f"{title[engine]}, {call}: step s measured, error % of each profile; memory GiB measured, error %")
        print(f"{'configuration':72s} {'meas':>7s} " + " ".join(f"{label:>11s}" for _, label in names) + f" {'mem':>6s} {'err':>6s}")
        errs = {n: [] for n, _ in names}
        mem = []
        for k, r0 in runs["h100-sxm"].items():
            row = f"{k[:72]:72s} {r0['measured']['step_s']:7.3f} "
            for n, _ in names:
                e = runs[n][k]["step_error_pct"]
                errs[n].append(abs(e))
                row += f" {e:+10.1f}"
            mem.append(abs(r0["memory_error_pct"]))
            row += f" {r0['measured']['gpu_peak_reserved_bytes'] / 2**30:6.1f} {r0['memory_error_pct']:+6.1f}"
            print(row)
        print(f"{'mean / max |error|':72s} {'':7s} " + " ".join(
            f"{sum(errs[n]) / len(errs[n]):5.1f}/{max(errs[n]):5.1f}" for n, _ in names) +
            f" {'':6s} {sum(mem) / len(mem):.1f}/{max(mem):.1f}")
        print()
        p = pooled.setdefault(engine, ({n: [] for n, _ in names}, []))
        for n, _ in names:
            p[0][n] += errs[n]
        p[1].extend(mem)
print("pooled over the calls: step mean / max |error| (transferred, measured, +elementwise, diagnostic); memory")
for engine, (errs, mem) in pooled.items():
    print(f"{title[engine]:12s} {len(mem):3d} runs  " + "  ".join(
        f"{sum(errs[n]) / len(errs[n]):5.1f}/{max(errs[n]):5.1f}" for n, _ in names) +
        f"   memory {sum(mem) / len(mem):.1f}/{max(mem):.1f}")
PY
