#!/usr/bin/env python3
"""The H100's step time over the H200's, measured against predicted, for every configuration of
the H100 run lists that was also measured on an H200 (data/runs/h100-sxm/, data/runs/h200-sxm/).

A blind error on a transferred profile mixes two things: what the engine model already misses on
the H200, and what the transfer to another GPU gets wrong. The ratio of the two GPUs' times on the
same configuration isolates the second: the model predicts it as h100-sxm's step over
h200-sxm's (`planner explain` on each profile), the data as the H100's median step over the
H200's (the median over the calls of each call's median step; a call is a runs file).
A second predicted ratio ("+ew") takes h100-sxm with the H100's micro-benchmarks as measured
components, the layers' element-wise micro-benchmark among them (calibrate fit --runs ... --out).
Usage: python3 bench/h100_h200_ratio.py [BUILD_DIR]   (runs on the CPU in seconds)
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
build = sys.argv[1] if len(sys.argv) > 1 else "build"
planner = os.path.join(build, "planner", "planner")
if not os.access(planner, os.X_OK):
    print(f"h100_h200_ratio: no {planner} (build first)", file=sys.stderr)
    sys.exit(2)
LISTS = [("stepcast", "bench/runlists/h100_blind_1gpu.txt"), ("stepcast", "bench/runlists/h100_blind_2_1gpu.txt"),
         ("deepspeed", "bench/runlists/peers_deepspeed_h100_1gpu.txt"),
         ("fsdp2", "bench/runlists/peers_fsdp2_h100_1gpu.txt"), ("fsdp2", "bench/runlists/peers_fsdp2_h100_2_1gpu.txt")]
# Settings that change speed and that every record carries; the optional ones match where both have them.
CORE = ["zero_stage", "offload_optimizer", "offload_params", "optimizer", "precision", "micro_batch", "gas",
        "seq_len", "activation_checkpointing", "gpus"]
OPTIONAL = ["offload_overlap_forward", "offload_pipeline", "attention", "lora_rank", "lora_targets"]


def same(plan, rec_model, rec):
    c = rec["config"]
    if rec_model != plan["model"] or c.get("engine", "stepcast") != plan["engine"]:
        return False
    if c.get("peft", "none") != plan["config"].get("peft", "none"):
        return False
    if any(c.get(k) != plan["config"].get(k) for k in CORE):
        return False
    return all(c[k] == plan["config"][k] for k in OPTIONAL if k in c and k in plan["config"])


def records(folder):
    out = []
    for f in sorted(glob.glob(f"data/runs/{folder}/*.jsonl")):
        for line in open(f):
            r = json.loads(line)
            if "config" in r and not r.get("warmup") and r.get("time_s", {}).get("step"):
                out.append((f, r))
    return out


def measured(plan, recs):
    by_file = {}
    for f, r in recs:
        if same(plan, r["model"], r):
            by_file.setdefault(f, []).append(r["time_s"]["step"])
    if not by_file:
        return None
    return statistics.median(statistics.median(v) for v in by_file.values())


def predict(model, nproc, flags, engine, hardware):
    out = subprocess.run([planner, "explain", "--model", model, "--gpus", nproc, "--hardware", hardware,
                          "--engine", engine, *flags, "--json"], check=True, capture_output=True, text=True)
    p = json.loads(out.stdout)["plans"][0]
    return (p["time_s"]["gas"] or 0.0) + p["time_s"]["opt"], p["config"]  # GAS 1 has no GAS time


h100, h200 = records("h100-sxm"), records("h200-sxm")
tmp = tempfile.TemporaryDirectory()
measured_profile = os.path.join(tmp.name, "h100-measured.toml")
subprocess.run([os.path.join(build, "calibrate", "calibrate"), "fit", "--hardware", "h100-sxm", "--out", measured_profile,
                "--runs", *sorted(glob.glob("data/runs/h100-sxm/*_micro.jsonl"))], check=True, capture_output=True)
print("configurations measured on both GPUs: step time H100 / H200, measured and predicted")
print(f"{'engine':9s} {'configuration':70s} {'H100 s':>7s} {'H200 s':>7s} {'meas':>6s} {'pred':>6s} {'pred/meas':>9s}"
      f" {'+ew':>6s} {'pred/meas':>9s}")
errs, errs_ew = [], []
for engine, path in LISTS:
    for line in open(path):
        if not line.strip() or line.startswith("#"):
            continue
        model, nproc, *flags = line.split()
        t100, config = predict(model, nproc, flags, engine, "h100-sxm")
        t200, _ = predict(model, nproc, flags, engine, "h200-sxm")
        t100_ew, _ = predict(model, nproc, flags, engine, measured_profile)
        plan = {"model": model, "engine": engine, "config": config}
        m100, m200 = measured(plan, h100), measured(plan, h200)
        if m100 is None or m200 is None:
            continue
        meas, pred, pred_ew = m100 / m200, t100 / t200, t100_ew / t200
        errs.append(pred / meas - 1)
        errs_ew.append(pred_ew / meas - 1)
        print(f"{engine:9s} {(model + ' ' + ' '.join(flags))[:70]:70s} {m100:7.3f} {m200:7.3f} {meas:6.3f} {pred:6.3f}"
              f" {100 * (pred / meas - 1):+8.1f}% {pred_ew:6.3f} {100 * (pred_ew / meas - 1):+8.1f}%")
for name, e in (("datasheet h100-sxm", errs), ("with measured components", errs_ew)):
    if e:
        print(f"{len(e)} configurations, {name}: the predicted ratio over the measured one: mean "
              f"{100 * statistics.mean(e):+.1f} % (|mean| {100 * statistics.mean(abs(x) for x in e):.1f} %), "
              f"range {100 * min(e):+.1f} to {100 * max(e):+.1f} %")
