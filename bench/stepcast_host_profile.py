"""Per-layer host time of our backend by model family, from bench/stepcast_host_profile.sh's records.

For each card, the medians (warm-up steps left out) of the forward and backward phase times at 4
and at 16 decoder layers; one layer's time per micro-batch is their difference / (12 x GAS).
Prints one line per card: the values of the profile's [host.stepcast_layer_s].
  python3 bench/stepcast_host_profile.py stepcast_layers.jsonl
"""
import collections
import json
import statistics
import sys


def main(path):
    phases = collections.defaultdict(lambda: collections.defaultdict(list))
    gas = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("warmup") or "time_s" not in r:
            continue
        key = (r["model"], r["params"])  # the 4-layer cut has fewer parameters
        phases[key]["forward"].append(r["time_s"]["forward"])
        phases[key]["backward"].append(r["time_s"]["backward"])
        gas[key] = r["config"]["gas"]
    by_model = collections.defaultdict(dict)
    for (model, params), p in phases.items():
        by_model[model][params] = (statistics.median(p["forward"]), statistics.median(p["backward"]),
                                   gas[(model, params)], len(p["forward"]))
    print(f"{'card':14s} {'fwd ms/layer':>12s} {'bwd ms/layer':>12s}  steps")
    for model, cuts in by_model.items():
        if len(cuts) != 2:
            print(f"{model:14s} missing a cut ({len(cuts)} of 2)")
            continue
        (p4, small), (p16, big) = sorted(cuts.items())
        g = small[2]
        fwd_ms = 1e3 * (big[0] - small[0]) / (12 * g)
        bwd_ms = 1e3 * (big[1] - small[1]) / (12 * g)
        print(f"{model:14s} {fwd_ms:12.3f} {bwd_ms:12.3f}  {small[3]}+{big[3]}")


if __name__ == "__main__":
    main(sys.argv[1])
