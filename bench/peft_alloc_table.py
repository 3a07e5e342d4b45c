#!/usr/bin/env python3
"""The caching allocator's two settings side by side, from train's run records.

Usage: peft_alloc_table.py DEFAULT.jsonl EXPANDABLE.jsonl

Per plan (model, PEFT method, rank, targets, micro-batch): the median step time of the measured
steps and the peak reserved and allocated GPU memory, under the default allocator and under
expandable segments, and their ratios (expandable / default), both measured in the same call.
"""
import statistics
import sys

from run_records import measured_steps


def plans(path):
    out = {}
    for r in measured_steps(path):
        c = r["config"]
        key = (r["model"], c["peft"], c["lora_rank"], c["lora_targets"], c["micro_batch"])
        p = out.setdefault(key, {"step_s": [], "reserved": 0.0, "allocated": 0.0})
        p["step_s"].append(r["time_s"]["step"])
        p["reserved"] = max(p["reserved"], r["memory_bytes"]["gpu_peak_reserved"])
        p["allocated"] = max(p["allocated"], r["memory_bytes"]["gpu_peak_allocated"])
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: peft_alloc_table.py DEFAULT.jsonl EXPANDABLE.jsonl")
    default, expandable = plans(sys.argv[1]), plans(sys.argv[2])
    gib = 2.0**30
    print(f"{'plan':44s} {'step s':>7s} {'step s':>7s} {'ratio':>6s}   {'reserved GiB':>12s} {'reserved GiB':>12s} "
          f"{'ratio':>6s}   {'allocated GiB':>13s}")
    print(f"{'':44s} {'default':>7s} {'expand.':>7s} {'':>6s}   {'default':>12s} {'expandable':>12s} {'':>6s}   "
          f"{'default':>13s}")
    for key in sorted(default):
        if key not in expandable:
            continue
        d, e = default[key], expandable[key]
        sd, se = statistics.median(d["step_s"]), statistics.median(e["step_s"])
        model, peft, rank, targets, micro = key
        name = f"{model} {peft} r{rank} {targets} mb{micro}"
        print(f"{name:44s} {sd:7.3f} {se:7.3f} {se / sd:6.3f}   {d['reserved'] / gib:12.1f} {e['reserved'] / gib:12.1f} "
              f"{e['reserved'] / d['reserved']:6.3f}   {d['allocated'] / gib:13.1f}")


if __name__ == "__main__":
    main()
