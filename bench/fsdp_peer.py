"""PyTorch FSDP2 peer for the backend's performance goal (issue "Backend v1").

The same model shape and batch as `train`: a Llama-architecture decoder
(RMSNorm, SwiGLU, RoPE, grouped-query attention via scaled_dot_product_attention)
with random weights, FSDP2 `fully_shard` per layer, bf16 parameters with fp32
gradient reduction, fused AdamW, random tokens. Prints one JSON line per
measured step and a summary; run it with torchrun on the GPU machine:

  python3 -m torch.distributed.run --nproc_per_node 2 bench/fsdp_peer.py \
      --hidden 4096 --layers 32 --heads 32 --kv-heads 32 --intermediate 11008 --vocab 32000 \
      --micro-batch 4 --gas 4 --seq 2048 --steps 5

With --cpu-offload 1 the peer is FSDP2's CPU offload (CPUOffloadPolicy, pinned
memory: sharded parameters, gradients and the AdamW step on the CPU, torch's
fused CPU AdamW), the reference of issue "Backend v2"'s offload goal.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard


class Layer(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        d = a.hidden // a.heads
        self.norm1 = nn.RMSNorm(a.hidden, eps=1e-5)
        self.norm2 = nn.RMSNorm(a.hidden, eps=1e-5)
        self.qkv = nn.Linear(a.hidden, (a.heads + 2 * a.kv_heads) * d, bias=False)
        self.o = nn.Linear(a.heads * d, a.hidden, bias=False)
        self.up = nn.Linear(a.hidden, 2 * a.intermediate, bias=False)
        self.down = nn.Linear(a.intermediate, a.hidden, bias=False)

    def forward(self, x, cos, sin):
        a = self.a
        b, s, _ = x.shape
        d = a.hidden // a.heads
        q, k, v = self.qkv(self.norm1(x)).split([a.heads * d, a.kv_heads * d, a.kv_heads * d], -1)
        q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))

        def rope(t):
            t1, t2 = t[..., : d // 2], t[..., d // 2 :]
            return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1)

        q, k = rope(q), rope(k)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=a.kv_heads != a.heads)
        x = x + self.o(o.transpose(1, 2).reshape(b, s, -1))
        g, u = self.up(self.norm2(x)).chunk(2, -1)
        return x + self.down(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.layers = nn.ModuleList(Layer(a) for _ in range(a.layers))
        self.norm = nn.RMSNorm(a.hidden, eps=1e-5)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, tokens, targets):
        a = self.a
        d = a.hidden // a.heads
        s = tokens.shape[1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=tokens.device, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(s, device=tokens.device, dtype=torch.float32), inv)
        cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, a.vocab), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    for name, default in [("hidden", 4096), ("layers", 32), ("heads", 32), ("kv-heads", 32), ("intermediate", 11008),
                          ("vocab", 32000), ("micro-batch", 4), ("gas", 4), ("seq", 2048), ("steps", 5), ("warmup", 2),
                          ("cpu-offload", 0)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--json-out", default="")
    p.add_argument("--label", default="fsdp2")
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    with torch.device("meta"):
        model = Model(a)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True) if a.cpu_offload else OffloadPolicy()
    for layer in model.layers:
        fully_shard(layer, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mp_policy=mp, offload_policy=offload)
    model.to_empty(device="cpu" if a.cpu_offload else "cuda")
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if "norm" in name:
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, 0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), fused=True)
    tokens_per_step = a.micro_batch * a.seq * a.gas * world
    n_params = sum(p.numel() for p in model.parameters())  # DTensor numel is the global count
    flops_per_token = 6 * n_params + 6 * a.layers * a.hidden * a.seq
    times = []
    for step in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for mb in range(a.gas):
            model.set_requires_gradient_sync(mb == a.gas - 1)
            batch = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), device="cuda")
            loss = model(batch[:, :-1], batch[:, 1:]) / a.gas
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        tps = tokens_per_step / dt
        mfu = tps * flops_per_token / (world * 989.4e12)
        rec = {"peer": a.label, "cpu_offload": bool(a.cpu_offload), "step": step + 1, "warmup": step < a.warmup, "step_s": dt, "tokens_per_s": tps,
               "mfu": mfu, "loss": loss.item() * a.gas, "world_size": world, "micro_batch": a.micro_batch,
               "gas": a.gas, "seq_len": a.seq, "params": n_params,
               "gpu_peak_allocated_bytes": torch.cuda.max_memory_allocated(),
               "gpu_peak_reserved_bytes": torch.cuda.max_memory_reserved(), "torch": torch.__version__}
        if step >= a.warmup:
            times.append(dt)
        if rank == 0:
            print(json.dumps(rec), flush=True)
            if a.json_out:
                with open(a.json_out, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    if rank == 0 and times:
        med = sorted(times)[len(times) // 2]
        print(f"fsdp2 median step {med:.3f} s, {tokens_per_step / med:.0f} tokens/s, "
              f"MFU {100 * tokens_per_step / med * flops_per_token / (world * 989.4e12):.1f} %", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
