"""Medians of the non-warm-up steps of our backend against the torch-ops peer (bench/peft_h200.sh peer),
per plan, and the ratio of their throughputs, both measured in the same call.

Usage: python3 bench/peft_peer_table.py OURS.jsonl PEER.jsonl
"""
import statistics
import sys

from run_records import measured_steps


def medians(path):
    rows = {}
    for r in measured_steps(path):
        c = r["config"]
        key = (r["model"], c.get("peft", "none"), c.get("lora_rank"), c["micro_batch"], c["gas"], c["seq_len"],
               c["activation_checkpointing"])
        rows.setdefault(key, []).append((r["time_s"]["step"], r["throughput"]["tokens_per_s"],
                                         r["memory_bytes"]["gpu_peak_reserved"]))
    return {k: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v), max(x[2] for x in v), len(v))
            for k, v in rows.items()}


def main():
    ours, peer = medians(sys.argv[1]), medians(sys.argv[2])
    print(f"{'plan':52s} {'ours s':>8s} {'peer s':>8s} {'ours tok/s':>11s} {'peer tok/s':>11s} {'ratio':>6s} "
          f"{'ours GiB':>9s} {'peer GiB':>9s}")
    for k in sorted(ours):
        if k not in peer:
            continue
        o, p = ours[k], peer[k]
        name = f"{k[0]} {k[1]} r{k[2]} mb{k[3]} gas{k[4]} seq{k[5]}{' ckpt' if k[6] else ''}"
        print(f"{name:52s} {o[0]:8.3f} {p[0]:8.3f} {o[1]:11.0f} {p[1]:11.0f} {o[1] / p[1]:6.2f} "
              f"{o[2] / 2**30:9.1f} {p[2] / 2**30:9.1f}")


if __name__ == "__main__":
    main()
