#!/usr/bin/env bash
# What running the cross-validation's and the bootstrap's refits in parallel earns (calibrate
# --threads; common/parallel.h), on this machine: `calibrate report --engine fsdp2 --hardware
# h200-sxm --json` (48 configurations: 48 + 26 cross-validation refits and 100 bootstrap refits)
# with --threads 1 and with every hardware thread, REPEATS times each, interleaved. Prints each
# side's median wall time and their ratio, and fails when the two reports differ: the threads
# must not change a number.
# Usage: bash bench/cv_threads.sh [BUILD_DIR] [REPEATS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
B=${1:-build}
N=${2:-3}
CAL=$B/calibrate/calibrate
[[ -x $CAL ]] || { echo "cv_threads: no $CAL (build first)" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
echo "cv_threads: $(nproc) hardware threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), git $(git rev-parse --short HEAD)"
for ((i = 1; i <= N; ++i)); do
  for threads in 1 0; do
    start=$(date +%s.%N)
    "$CAL" report --engine fsdp2 --hardware h200-sxm --json --threads "$threads" >"$T/report_$threads.json" 2>/dev/null
    end=$(date +%s.%N)
    echo "$threads $(echo "$end - $start" | bc)" >>"$T/times"
    echo "  repeat $i, --threads $threads: $(tail -1 "$T/times" | cut -d' ' -f2) s"
  done
  cmp -s "$T/report_1.json" "$T/report_0.json" ||
    { echo "cv_threads: the report with --threads 1 differs from the one with every thread" >&2; exit 1; }
done
python3 - "$T/times" <<'PY'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    t.setdefault(k, []).append(float(v))
one, all_ = statistics.median(t["1"]), statistics.median(t["0"])
print(f"median wall: --threads 1 {one:.2f} s, every thread {all_:.2f} s; speed-up {one / all_:.2f}x "
      f"({len(t['1'])} repeats each; identical reports)")
PY
