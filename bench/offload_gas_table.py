"""DeepSpeed's CPU offload across GAS: measured against the predictions committed before the call.

Usage: python3 bench/offload_gas_table.py RUNS.jsonl PREDICTIONS.txt [--json]

RUNS.jsonl is what bench/unpinned_offload_heldout.sh wrote with
bench/runlists/offload_gas_sweep_deepspeed_1gpu.txt; PREDICTIONS.txt is the file
`calibrate predict --list` wrote for that list (bench/predictions/). For each run-list line it
prints the measured median step against the prediction, then, per ZeRO stage and pinning, the
cost of one more micro-batch inside the window, (step(GAS g) - step(GAS 1)) / (g - 1), measured
against predicted, and the window's last micro-batch with the boundary, step(GAS 1): the two
parts the model times separately (docs/engines.md)."""
import json
import re
import statistics
import sys

from run_records import measured_steps


def plan_of(flags):
    """(stage, micro_batch, gas, pinned) of a run-list line's planner flags."""
    def value(name, default=None):
        m = re.search(r"--%s (\S+)" % name, flags)
        return m.group(1) if m else default
    return (int(value("stage")), int(value("micro-batch")), int(value("gas")),
            value("offload-pin-memory", "on") != "off")


def read_predictions(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"(\S+) (\d+) (.*?)\s+step ([0-9.]+) s", line)
        if not m:
            sys.exit("%s: line %r is not a prediction (MODEL NPROC FLAGS step S s ...)" % (path, line.strip()))
        out[plan_of(m.group(3))] = float(m.group(4))
    return out


def read_measured(path):
    steps = {}
    for r in measured_steps(path):
        c = r["config"]
        key = (c["zero_stage"], c["micro_batch"], c["gas"], c.get("offload_pin_memory", True))
        steps.setdefault(key, []).append(r["time_s"]["step"])
    return {k: statistics.median(v) for k, v in steps.items()}


def main():
    args = [a for a in sys.argv[1:] if a != "--json"]
    if len(args) != 2:
        sys.exit(__doc__)
    predicted, measured = read_predictions(args[1]), read_measured(args[0])
    rows, slopes = [], []
    for key in sorted(predicted):
        if key in measured:
            rows.append({"stage": key[0], "micro_batch": key[1], "gas": key[2], "pinned": key[3],
                         "measured_step_s": measured[key], "predicted_step_s": predicted[key],
                         "error_pct": 100 * (predicted[key] / measured[key] - 1)})
    for (stage, mb, gas, pinned) in sorted(predicted):
        one = (stage, mb, 1, pinned)
        if gas == 1 or one not in measured or (stage, mb, gas, pinned) not in measured:
            continue
        per = lambda d: (d[(stage, mb, gas, pinned)] - d[one]) / (gas - 1)
        slopes.append({"stage": stage, "micro_batch": mb, "gas": gas, "pinned": pinned,
                       "measured_gas1_s": measured[one], "predicted_gas1_s": predicted[one],
                       "measured_per_micro_s": per(measured), "predicted_per_micro_s": per(predicted)})
    if "--json" in sys.argv:
        print(json.dumps({"runs": rows, "per_micro_batch": slopes}, indent=1))
        return
    print("%-5s %5s %4s %-8s %10s %10s %7s" % ("stage", "micro", "GAS", "pinned", "measured", "predicted", "error"))
    for r in rows:
        print("%-5d %5d %4d %-8s %9.3fs %9.3fs %+6.1f%%" % (r["stage"], r["micro_batch"], r["gas"],
              "yes" if r["pinned"] else "no", r["measured_step_s"], r["predicted_step_s"], r["error_pct"]))
    if rows:
        print("mean |error| %.1f %%, max %.1f %% over %d plans" % (
            statistics.mean(abs(r["error_pct"]) for r in rows), max(abs(r["error_pct"]) for r in rows), len(rows)))
    print("\nper stage and pinning: GAS 1 step, and one more micro-batch inside the window (s, measured / predicted)")
    for s in slopes:
        print("stage %d %-8s GAS 1 %7.3f / %7.3f   per micro-batch (GAS %d) %7.3f / %7.3f" % (
            s["stage"], "pinned" if s["pinned"] else "unpinned", s["measured_gas1_s"], s["predicted_gas1_s"],
            s["gas"], s["measured_per_micro_s"], s["predicted_per_micro_s"]))


if __name__ == "__main__":
    main()
