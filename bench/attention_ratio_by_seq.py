#!/usr/bin/env python3
"""The flash attention kernels' time on one GPU kind over another's, shape by shape, from the
committed micro-benchmarks (`microbench --suite compute`: bench "attention" and "attention_bwd").

The cost model carries attention to a GPU it has not fitted as one ratio of its best efficiency
(`[coefficients.measured.rel]` attn_eff_max_frac, attn_bwd_eff_max_frac), the same at every length;
this table shows how the measured ratio moves with the sequence (docs/cost_model.md, "Long
sequences on the H100"). Each cell: median over the records of that shape of the first folder's
seconds over the second's, with the number of records on each side.
Usage: python3 bench/attention_ratio_by_seq.py [--json] [FOLDER_A FOLDER_B]
       (default data/runs/h100-sxm data/runs/h200-sxm; runs on the CPU in a second)
"""
import glob
import json
import os
import statistics
import sys

from run_records import records

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
args = [a for a in sys.argv[1:] if a != "--json"]
as_json = "--json" in sys.argv[1:]
if len(args) not in (0, 2):
    print(__doc__.split("Usage: ")[1].strip(), file=sys.stderr)
    sys.exit(2)
folder_a, folder_b = args if args else ("data/runs/h100-sxm", "data/runs/h200-sxm")
SHAPE = ("batch", "heads", "head_dim", "seq_len", "kernel", "dtype", "causal")


def timings(folder):
    """(bench, shape) -> seconds of every attention record in the folder's run files."""
    out = {}
    files = sorted(glob.glob(os.path.join(folder, "*.jsonl")))
    if not files:
        print(f"attention_ratio_by_seq: no .jsonl files in {folder}", file=sys.stderr)
        sys.exit(2)
    for path in files:
        for r in records(path):
            if r.get("kind") != "micro" or r.get("bench") not in ("attention", "attention_bwd"):
                continue
            key = (r["bench"],) + tuple(r.get(k) for k in SHAPE)
            out.setdefault(key, []).append(r["seconds"])
    return out


a, b = timings(folder_a), timings(folder_b)
rows = []
for key in sorted(set(a) & set(b), key=lambda k: (k[0], k[4], k[3])):
    shape = dict(zip(SHAPE, key[1:]))
    rows.append({"bench": key[0], **shape, "ratio": statistics.median(a[key]) / statistics.median(b[key]),
                 "records_a": len(a[key]), "records_b": len(b[key])})
if as_json:
    print(json.dumps({"a": folder_a, "b": folder_b, "rows": rows}, indent=1))
    sys.exit(0)
print(f"attention time, {folder_a} over {folder_b} (median of each shape's records)")
print(f"{'bench':<14} {'seq':>6} {'batch':>5} {'head_dim':>8} {'ratio':>7} {'records':>9}")
for r in rows:
    print(f"{r['bench']:<14} {r['seq_len']:>6} {r['batch']:>5} {r['head_dim']:>8} {r['ratio']:>7.3f} "
          f"{r['records_a']:>4}/{r['records_b']:<4}")
