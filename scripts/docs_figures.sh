#!/usr/bin/env bash
# Writes the accuracy figures the docs quote, each generated from committed data by this build's
# `calibrate report`, so that no figure in the docs is typed by hand:
#   docs/figures/h200_report.txt       calibrate report --hardware h200-sxm (our engine)
#   docs/figures/h200_report.svg       its predicted-against-measured plot (--svg)
#   docs/figures/deepspeed_report.txt  calibrate report --engine deepspeed --hardware h200-sxm
#   docs/figures/fsdp2_report.txt      calibrate report --engine fsdp2 --hardware h200-sxm
#   docs/figures/published_report.txt calibrate report --published
# Each report without --runs reads the runs its profile section names in its provenance, and
# cross-validates (leave one configuration out, then one group).
# Usage: bash scripts/docs_figures.sh BUILD_DIR [--check]
#   --check writes into a temporary folder and exits 1 naming each file that differs from the
#   committed one (the docs then quote figures the data no longer gives: rerun without --check).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD="${1:?usage: bash scripts/docs_figures.sh BUILD_DIR [--check]}"
CHECK="${2:-}"
CAL="$BUILD/calibrate/calibrate"
[[ -x "$CAL" ]] || { echo "docs_figures: $CAL not found (build first)" >&2; exit 2; }
DEST=docs/figures
if [[ "$CHECK" == "--check" ]]; then DEST=$(mktemp -d); trap 'rm -rf "$DEST"' EXIT; fi
mkdir -p "$DEST"
status=0
gen() {  # NAME ARGS...: one report into DEST/NAME.txt; a failed report is named and fails the script
  local name="$1"; shift
  echo "docs_figures: calibrate report $* ..." >&2
  if ! "$CAL" report "$@" > "$DEST/$name.txt.part" 2> "$DEST/$name.err"; then
    echo "docs_figures: calibrate report $* failed:" >&2; tail -3 "$DEST/$name.err" >&2
    rm -f "$DEST/$name.txt.part" "$DEST/$name.err"; status=2; return
  fi
  mv "$DEST/$name.txt.part" "$DEST/$name.txt"; rm -f "$DEST/$name.err"
}
gen published_report --published
gen h200_report --hardware h200-sxm --svg "$DEST/h200_report.svg"
gen deepspeed_report --engine deepspeed --hardware h200-sxm
gen fsdp2_report --engine fsdp2 --hardware h200-sxm
(( status != 0 )) && exit $status
if [[ "$CHECK" == "--check" ]]; then
  for f in "$DEST"/*.txt "$DEST"/*.svg; do
    name=$(basename "$f")
    if ! cmp -s "$f" "docs/figures/$name"; then
      echo "docs_figures: docs/figures/$name differs from what the committed data gives (bash scripts/docs_figures.sh $BUILD)" >&2
      diff "docs/figures/$name" "$f" | head -10 >&2
      status=1
    fi
  done
  (( status == 0 )) && echo "docs_figures: the docs' figures match the committed data"
fi
exit $status
