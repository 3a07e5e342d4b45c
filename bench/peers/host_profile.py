"""Host cost of transformers' decoder layers: what the peers' forward and backward take on the CPU.

The peers (DeepSpeed, FSDP2) run Hugging Face `transformers` models in eager PyTorch, so every
operator is a Python call and one or more kernel launches. At small micro-batches the GPU waits on
the host, and the step time is the host's, not the GEMMs'. This measures, per model card and
attention implementation, on a model cut to --layers decoder layers (the host cost is per layer):
  kernels_fwd_per_layer, kernels_bwd_per_layer   CUDA kernels launched (torch.profiler), per layer
  ops_fwd_per_layer                              aten operators called on the host, per layer
  fwd_ms_per_layer, bwd_ms_per_layer             wall time per layer at --micro-batch x --seq, with a
                                                 device synchronisation around each pass (median of
                                                 --repeats), where the GPU's share is small
One JSON line per model card to --json-out, with the environment.

  python3 bench/peers/host_profile.py --cards data/models/gpt-j-6b.toml data/models/llama-2-7b.toml \
      --json-out host.jsonl
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

from peer import causal_lm, hf_config, init_weights, read_card  # noqa: E402


def count_kernels(prof):
    """CUDA kernels and aten operators recorded by torch.profiler."""
    kernels = ops = 0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif e.name.startswith("aten::") and e.cpu_parent is None:
            ops += 1
    return kernels, ops


def profile_card(path, a, layers):
    card = dict(read_card(path), num_layers=layers)
    cfg = hf_config(card, "bf16")
    attn = a.attention or ("eager" if card["model_type"] == "gptj" else "sdpa")
    cfg.peer_attn = attn
    torch.manual_seed(0)
    with torch.device("cuda"):  # built and initialised on the GPU: the CPU's init is the slow part
        model = causal_lm(cfg, torch.bfloat16)
    init_weights(model)
    model.train()
    tokens = torch.randint(0, card["vocab_size"], (a.micro_batch, a.seq), device="cuda")

    def passes():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1

    for _ in range(3):
        passes()
    fwd, bwd = zip(*[passes() for _ in range(a.repeats)])
    # Kernel and operator counts of one forward and one backward, the embedding and head included:
    # the same passes with the model cut to one layer fewer give the per-layer difference.
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pf:
        loss = model(input_ids=tokens, labels=tokens).loss
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pb:
        loss.backward()
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    kf, of = count_kernels(pf)
    kb, ob = count_kernels(pb)
    return {"model": card["name"], "model_type": card["model_type"], "attention": attn, "layers": layers,
            "micro_batch": a.micro_batch, "seq_len": a.seq,
            "fwd_ms": 1e3 * statistics.median(fwd), "bwd_ms": 1e3 * statistics.median(bwd),
            "kernels_fwd": kf, "kernels_bwd": kb, "ops_fwd": of, "ops_bwd": ob}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cards", nargs="+", required=True)
    p.add_argument("--layers", type=int, nargs="+", default=[2, 6], help="two depths: per-layer = difference")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--attention", default="", help="sdpa | eager (default: eager for GPT-J, else sdpa)")
    p.add_argument("--json-out", required=True)
    a = p.parse_args()
    if len(a.layers) != 2 or a.layers[0] >= a.layers[1]:
        sys.exit("host_profile: --layers takes two depths, the smaller first")
    import transformers
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    with open(a.json_out, "a") as out:
        for path in a.cards:
            rows = []
            for n in a.layers:
                rows.append(profile_card(path, a, n))
                torch.cuda.empty_cache()
            lo, hi = rows
            d = hi["layers"] - lo["layers"]
            rec = {"model": hi["model"], "model_type": hi["model_type"], "attention": hi["attention"],
                   "micro_batch": a.micro_batch, "seq_len": a.seq, "depths": [lo, hi],
                   "fwd_ms_per_layer": (hi["fwd_ms"] - lo["fwd_ms"]) / d, "bwd_ms_per_layer": (hi["bwd_ms"] - lo["bwd_ms"]) / d,
                   "kernels_fwd_per_layer": (hi["kernels_fwd"] - lo["kernels_fwd"]) / d,
                   "kernels_bwd_per_layer": (hi["kernels_bwd"] - lo["kernels_bwd"]) / d,
                   "ops_fwd_per_layer": (hi["ops_fwd"] - lo["ops_fwd"]) / d,
                   "ops_bwd_per_layer": (hi["ops_bwd"] - lo["ops_bwd"]) / d, "env": env}
            out.write(json.dumps(rec) + "\n")
            out.flush()
            print(f"host_profile: {rec['model']} ({rec['attention']}): fwd {rec['fwd_ms_per_layer']:.3f} ms, "
                  f"bwd {rec['bwd_ms_per_layer']:.3f} ms a layer; kernels {rec['kernels_fwd_per_layer']:.0f} fwd, "
                  f"{rec['kernels_bwd_per_layer']:.0f} bwd a layer", flush=True)


if __name__ == "__main__":
    main()
