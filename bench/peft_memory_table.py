#!/usr/bin/env python3
"""PEFT runs' GPU memory against the planner, split into what the allocator holds and its cache.

Usage: peft_memory_table.py PLANNER RUNS.jsonl...

Per plan (model, method, rank, targets, micro-batch, GAS, sequence, checkpointing): the measured
peak allocated and the cache above it (peak reserved - peak allocated), beside what
`PLANNER explain --json` predicts for the same plan on one GPU (`peak_allocated`,
`allocator_reserve`), and the peak reserved error. The last lines give mean and max |error| of the
peak allocated and of the peak reserved. Records are grouped across files: the largest peak of a
plan's measured steps counts.
"""
import json
import statistics
import subprocess
import sys

from run_records import measured_steps

GIB = 2.0**30


def plans(paths):
    out = {}
    for path in paths:
        for r in measured_steps(path):
            c = r["config"]
            key = (r["model"], c["peft"], c["lora_rank"], c["lora_targets"], c["micro_batch"], c["gas"],
                   c["seq_len"], c["activation_checkpointing"])
            p = out.setdefault(key, {"allocated": 0.0, "reserved": 0.0})
            p["allocated"] = max(p["allocated"], r["memory_bytes"]["gpu_peak_allocated"])
            p["reserved"] = max(p["reserved"], r["memory_bytes"]["gpu_peak_reserved"])
    return out


def predicted(planner, key):
    model, peft, rank, targets, mb, gas, seq, ckpt = key
    cmd = [planner, "explain", "--model", model, "--gpus", "1", "--peft", peft, "--lora-rank", str(rank),
           "--lora-targets", targets, "--micro-batch", str(mb), "--gas", str(gas), "--seq", str(seq),
           "--checkpointing", "on" if ckpt else "off", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["plans"][0]["gpu_memory_bytes"]


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: peft_memory_table.py PLANNER RUNS.jsonl...")
    planner, paths = sys.argv[1], sys.argv[2:]
    alloc_err, reserved_err = [], []
    print(f"{'plan':<64} {'allocated GiB':>14} {'predicted':>9} {'error':>7} "
          f"{'cache GiB':>9} {'predicted':>9} {'reserved error':>14}")
    for key, m in plans(paths).items():
        if key[1] == "none":
            continue
        p = predicted(planner, key)
        pa, pr = p["peak_allocated"], p["allocator_reserve"]
        ea = pa / m["allocated"] - 1.0
        er = (pa + pr) / m["reserved"] - 1.0
        alloc_err.append(abs(ea))
        reserved_err.append(abs(er))
        print(f"{str(key):<64} {m['allocated'] / GIB:>14.2f} {pa / GIB:>9.2f} {100 * ea:>+6.1f}% "
              f"{(m['reserved'] - m['allocated']) / GIB:>9.2f} {pr / GIB:>9.2f} {100 * er:>+13.1f}%")
    n = len(alloc_err)
    print(f"{n} plans: peak allocated {100 * statistics.mean(alloc_err):.2f} % mean, {100 * max(alloc_err):.2f} % max; "
          f"peak reserved {100 * statistics.mean(reserved_err):.2f} % mean, {100 * max(reserved_err):.2f} % max")


if __name__ == "__main__":
    main()
