"""What one summing micro-batch of FSDP2's CPU offload costs on this host, piece by piece.

With CPUOffloadPolicy and a reduction every micro-batch, torch's foreach_reduce copies each
parameter's reduced fp32 shard to the host blocking, into a new pageable tensor, once the
parameter already has a host gradient, then adds it into that gradient on the CPU
(torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py). This times, for fp32 tensors of the
sizes a 3B model's parameters have, each way a GPU tensor can reach the host, and the sum:
  fresh    t.to("cpu")                      a new pageable tensor (what FSDP2 does)
  reused   host.copy_(t)                    into a pageable tensor touched before
  pinned   pinned.copy_(t)                  into pinned memory
  sum      acc += host                      the host sum (read 4 + 4 B, write 4 B a value)
Medians of REPEATS; rates in GB/s of fp32 bytes, the sum's in GB/s of the tensor's bytes; each
also as a ratio to the pinned copy of the same size, measured in the same run (the reference).
  python3 bench/fsdp2_offload_copy.py [--json]
"""
import json
import statistics
import sys
import time

import torch

SIZES_MIB = (16, 25, 48, 100, 256, 1024)
REPEATS = 5


def timed(fn):
    out = []
    for _ in range(REPEATS + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def main(as_json):
    rows = []
    for mib in SIZES_MIB:
        n = (mib << 20) // 4
        t = torch.randn(n, device="cuda")
        reused = torch.empty(n)
        reused.fill_(1.0)
        pinned = torch.empty(n, pin_memory=True)
        acc = torch.zeros(n)
        host = t.to("cpu")
        b = float(n * 4)
        row = {
            "mib": mib,
            "fresh_gb_per_s": b / timed(lambda: t.to("cpu")) / 1e9,
            "reused_gb_per_s": b / timed(lambda: reused.copy_(t)) / 1e9,
            "pinned_gb_per_s": b / timed(lambda: pinned.copy_(t)) / 1e9,
            "sum_gb_per_s": b / timed(lambda: acc.add_(host)) / 1e9,
        }
        for way in ("fresh", "reused", "sum"):
            row[f"{way}_over_pinned"] = row[f"{way}_gb_per_s"] / row["pinned_gb_per_s"]
        rows.append(row)
        if not as_json:
            print(f"{mib:5d} MiB  pinned {row['pinned_gb_per_s']:6.2f} GB/s (reference)  "
                  f"fresh {row['fresh_gb_per_s']:6.2f} ({row['fresh_over_pinned']:.3f}x)  "
                  f"reused {row['reused_gb_per_s']:6.2f} ({row['reused_over_pinned']:.3f}x)  "
                  f"sum {row['sum_gb_per_s']:6.2f} ({row['sum_over_pinned']:.3f}x)", flush=True)
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if as_json:
        print(json.dumps({"env": env, "rows": rows}))
    else:
        print(env)


if __name__ == "__main__":
    main("--json" in sys.argv[1:])
