"""Peer harness: one training configuration run by real DeepSpeed or PyTorch FSDP2.

The configuration is a planner plan (`planner explain --json`, plans[0].config); the model is a
Hugging Face `transformers` model built from the same Stepcast model card, randomly initialised,
fed random tokens. Every step is appended as one JSON line in the schema of `train --json-out`
(config with "engine", model, params, time_s, memory_bytes, throughput, env, step, warmup), so
`calibrate fit` and `calibrate report --engine ...` read peer runs like the backend's own.

Phases, timed with a device synchronisation between them on every rank (the founding report's split):
  forward, backward   summed over the step's micro-batches
  gas                 the first GAS-1 micro-batches ("GAS Time")
  opt                 the last micro-batch and the optimizer step ("OPT Time")
  optimizer           the optimizer call alone (DeepSpeed: engine.step() at the boundary, which runs
                      the CPU Adam, the parameter upload and the all-gather; FSDP2: optimizer.step())
Collectives and copies run inside the engines' hooks and are not timed apart: grad_comm,
param_gather and offload_transfer are written as null ("not measured").
Memory: the largest peak reserved bytes of the caching allocator over the ranks, counted from after
the model and engine are set up (their construction is not a training step).

Run with torchrun on the GPU host (`calibrate measure --engine deepspeed|fsdp2` does):
  python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peers/peer.py \
      --engine deepspeed --plan plan.json --model-card data/models/llama-2-7b.toml \
      --deepspeed-config ds.json --steps 4 --warmup 1 --json-out runs.jsonl
DeepSpeed comes from .peers/ (scripts/peer_deps.sh), put on sys.path here.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "..", ".peers")
sys.path[:0] = [os.path.join(PEERS, "deepspeed-0.14.5"), os.path.join(PEERS, "site")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def fail(msg):
    print(f"peer: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def cpu_ticks():
    """The aggregate line of /proc/stat (proc(5)): user nice system idle iowait irq softirq steal,
    clock ticks since boot; None where there is none. Between a step's two samples the share stolen
    by the hypervisor and the share busy tell a busy host from a slow one (common/host_cpu.h holds
    the same for train)."""
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu "):
                    v = [float(x) for x in line.split()[1:9]]
                    return v if len(v) == 8 else None
    except OSError:
        return None
    return None


def cpu_share(before, after):
    if before is None or after is None:
        return None
    total = sum(after) - sum(before)
    if total <= 0:
        return {"steal_frac": 0.0, "busy_frac": 0.0, "ticks": 0.0}
    steal = after[7] - before[7]
    idle = (after[3] + after[4]) - (before[3] + before[4])
    return {"steal_frac": steal / total, "busy_frac": (total - idle - steal) / total, "ticks": total}


def host_op_us():
    """The host's time to issue one small in-place op on this rank's GPU from Python, microseconds:
    the median of five rounds of 256 adds (after one round of warm-up), each timed without waiting
    for the GPU, below its launch queue's depth. A peer layer's host floor is made of such issues;
    lent machines of one kind differ in it (docs/engines.md), so each record keeps it."""
    x = torch.zeros(1, device="cuda")
    rounds = []
    for r in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(256):
            x.add_(1.0)
        if r > 0:
            rounds.append((time.perf_counter() - t0) / 256 * 1e6)
    torch.cuda.synchronize()
    return sorted(rounds)[len(rounds) // 2]


def short_path(filename):
    """A frame's file without the machine's prefix: from site-packages/, .peers/ or bench/ on."""
    for mark in ("site-packages/", "dist-packages/", ".peers/", "bench/"):
        i = filename.rfind(mark)
        if i >= 0:
            return filename[i + len(mark):]
    return filename


def frame_keys(frames):
    """Two names for an allocation's Python stack (innermost frame first): the innermost frame
    (the operation that allocated) and the innermost frame in the model or engine code
    (transformers, deepspeed, torch.distributed.fsdp, this harness), which says what it is for."""
    if not frames:
        return "(no Python frame)", "(no Python frame)"
    fr = [f"{short_path(f.get('filename', '?'))}:{f.get('line', 0)} {f.get('name', '?')}" for f in frames]
    owner = next((n for n in fr if n.startswith(("transformers/", "deepspeed", "torch/distributed/fsdp", "peers/"))), fr[0])
    return fr[0], owner


def peak_report(trace, base_allocated, base_reserved):
    """What was live at the step's largest allocated and largest reserved bytes, replayed from the
    caching allocator's event trace (torch.cuda.memory._snapshot()["device_traces"]): allocations
    ("alloc" adds, "free_completed" removes) and segments ("segment_alloc" / "segment_free").
    Bytes allocated before the trace began are "before the step" (parameters, gradients, states
    that live across steps), less whatever of them the step freed."""
    creators = {}  # segment address -> the owner line of the allocation that made the allocator create it

    def replay(stop):
        live, segs = {}, {}
        alloc, reserved = base_allocated, base_reserved
        for i, e in enumerate(trace):
            if i == stop:
                break
            a, addr, size = e["action"], e["addr"], e["size"]
            if a == "alloc":
                live[addr] = (size, e.get("frames", []))
                alloc += size
            elif a == "free_completed":
                live.pop(addr, None)
                alloc -= size
            elif a == "segment_alloc":
                segs[addr] = size
                creators[addr] = frame_keys(e.get("frames", []))[1]
                reserved += size
            elif a == "segment_free":
                segs.pop(addr, None)
                reserved -= size
        return live, segs, alloc, reserved

    # One pass for where the peaks are, one replay up to each.
    alloc, reserved = base_allocated, base_reserved
    peak_a = (alloc, 0)
    peak_r = (reserved, 0, alloc)
    for i, e in enumerate(trace):
        a, size = e["action"], e["size"]
        alloc += size if a == "alloc" else -size if a == "free_completed" else 0
        reserved += size if a == "segment_alloc" else -size if a == "segment_free" else 0
        if alloc > peak_a[0]:
            peak_a = (alloc, i + 1)
        # The reserved peak's moment: the most bytes allocated while the most were reserved (a
        # segment is created just before the allocation that needed it).
        if reserved > peak_r[0] or (reserved == peak_r[0] and alloc > peak_r[2]):
            peak_r = (reserved, i + 1, alloc)

    def describe(stop):
        live, segs, alloc, reserved = replay(stop)
        by_site, by_owner = {}, {}
        traced = 0
        for size, frames in live.values():
            site, owner = frame_keys(frames)
            by_site[site] = by_site.get(site, 0) + size
            by_owner[owner] = by_owner.get(owner, 0) + size
            traced += size
        # Free bytes inside the segments the step created: the cache above what is live there.
        seg_free = []
        for saddr, ssize in segs.items():
            used = sum(sz for addr, (sz, _) in live.items() if saddr <= addr < saddr + ssize)
            seg_free.append((ssize, ssize - used, creators.get(saddr, "?")))
        top = lambda d: [{"where": k, "bytes": v} for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:30]]
        return {"event": stop, "allocated_bytes": alloc, "reserved_bytes": reserved,
                "allocated_before_step_bytes": alloc - traced, "allocated_in_step_bytes": traced,
                "live_in_step_blocks": len(live), "by_operation": top(by_site), "by_owner": top(by_owner),
                # Sizes name the tensors where no stack was recorded (N parameters x 4 B, ...).
                "largest_live_blocks": [{"bytes": sz, "where": frame_keys(fr)[0]}
                                        for sz, fr in sorted(live.values(), key=lambda v: -v[0])[:30]],
                "segments_new": len(segs), "segments_new_bytes": sum(segs.values()),
                "segments_new_free_bytes": sum(f for _, f, _ in seg_free),
                "largest_new_segments": [{"bytes": s, "free_bytes": f, "created_by": c}
                                         for s, f, c in sorted(seg_free, reverse=True)[:20]]}

    return {"base_allocated_bytes": base_allocated, "base_reserved_bytes": base_reserved, "events": len(trace),
            "at_peak_allocated": describe(peak_a[1]), "at_peak_reserved": describe(peak_r[1])}


def read_card(path):
    import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def hf_config(card, precision):
    """The transformers config of a Stepcast model card (model/model_spec.h names -> config.json keys)."""
    from transformers import AutoConfig
    t = card["model_type"]
    h, layers, heads = card["hidden_size"], card["num_layers"], card["num_heads"]
    kv = card.get("num_kv_heads", heads)
    common = dict(vocab_size=card["vocab_size"], use_cache=False, tie_word_embeddings=card.get("tied_embeddings", False))
    if t in ("llama", "mistral", "qwen2"):
        kw = dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  intermediate_size=card["intermediate_size"], max_position_embeddings=card["max_position_embeddings"],
                  rms_norm_eps=card.get("norm_eps", 1e-5), rope_theta=card.get("rope_theta", 10000.0))
        if t == "llama":
            kw["attention_bias"] = card.get("qkv_bias", False)
    elif t == "gpt_neox":
        kw = dict(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
                  intermediate_size=card["intermediate_size"], max_position_embeddings=card["max_position_embeddings"],
                  rotary_pct=card["rotary_dim"] / (h // heads),
                  partial_rotary_factor=card["rotary_dim"] / (h // heads), use_parallel_residual=card.get("parallel_residual", True),
                  layer_norm_eps=card.get("norm_eps", 1e-5))
    elif t == "gptj":
        kw = dict(n_embd=h, n_layer=layers, n_head=heads, n_inner=card["intermediate_size"],
                  n_positions=card["max_position_embeddings"], rotary_dim=card["rotary_dim"],
                  layer_norm_epsilon=card.get("norm_eps", 1e-5))
    else:
        fail(f"{card.get('name')}: model_type {t!r} has no peer mapping (llama, mistral, qwen2, gpt_neox, gptj)")
    cfg = AutoConfig.for_model(t, **kw, **common)
    # The plan's working precision: fp16 and bf16 plans hold 16-bit weights of that type.
    cfg.peer_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return cfg


def causal_lm(cfg, dtype):
    """The transformers model of `cfg` in `dtype` (transformers 5 names it dtype, 4 torch_dtype), with the
    plan's attention: SDPA for "flash", eager for "math" (the planner plans math attention for an
    architecture transformers has no SDPA path for, e.g. GPT-J)."""
    from transformers import AutoModelForCausalLM
    try:
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation=cfg.peer_attn)
    except TypeError:
        return AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=cfg.peer_attn)


def layer_list(model):
    for path in ("model.layers", "gpt_neox.layers", "transformer.h"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return list(obj)
        except AttributeError:
            continue
    fail(f"{type(model).__name__}: no decoder layer list found")


def init_weights(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name:
                p.fill_(1.0) if name.endswith("weight") else p.zero_()
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02)


def engine_version(engine):
    if engine == "deepspeed":
        path = os.path.join(PEERS, "deepspeed-0.14.5", "version.txt")
        return open(path).read().strip() + " (source tree, .peers)"
    return torch.__version__


def build_deepspeed(cfg, c, ds_config, local_rank):
    import deepspeed
    deepspeed.init_distributed(dist_backend="nccl")
    dtype = cfg.peer_dtype
    if c["zero_stage"] == 3:
        with deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=dtype):
            model = causal_lm(cfg, dtype)
    else:
        with torch.device(f"cuda:{local_rank}"):
            model = causal_lm(cfg, dtype)
    if c["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if c["zero_stage"] != 3:
        init_weights(model)  # ZeRO-3's partitioned parameters keep transformers' own initialisation
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())

    def micro(tokens, last):
        t0 = time.perf_counter()
        loss = engine(input_ids=tokens, labels=tokens).loss
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        engine.backward(loss)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        engine.step()  # applies the optimizer only at the accumulation boundary
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        return loss.item(), t1 - t0, t2 - t1, (t3 - t2) if last else 0.0, (t3 - t2) if not last else 0.0

    return micro, n_params


def build_fsdp2(cfg, c, local_rank):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    dist.init_process_group("nccl")
    if c["zero_stage"] not in (2, 3):
        fail(f"config.zero_stage is {c['zero_stage']}: FSDP2 shards parameters, gradients and states (stage 3) "
             "or keeps parameters gathered between forward and backward (stage 2)")
    off_opt, off_par = c["offload_optimizer"] == "cpu", c["offload_params"] == "cpu"
    if off_opt != off_par:
        fail("config.offload_optimizer and offload_params differ: FSDP2's CPUOffloadPolicy offloads "
             "parameters, gradients and the optimizer together")
    if c["optimizer"] != "adamw":
        fail(f"config.optimizer is {c['optimizer']!r}: the FSDP2 peer runs torch's fused AdamW")
    with torch.device("meta"):
        model = causal_lm(cfg, torch.float32)
    if c["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=cfg.peer_dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=True) if off_opt else OffloadPolicy()
    reshard = c["zero_stage"] == 3
    for layer in layer_list(model):
        fully_shard(layer, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard)
    fully_shard(model, mp_policy=mp, offload_policy=offload, reshard_after_forward=reshard)
    model.to_empty(device="cpu" if off_opt else f"cuda:{local_rank}")
    init_weights(model)
    # Buffers built on the meta device hold garbage after to_empty: recompute the rotary frequencies.
    with torch.no_grad():
        for mod in model.modules():
            if hasattr(mod, "inv_freq") and hasattr(mod, "rope_init_fn"):
                inv_freq, _ = mod.rope_init_fn(mod.config, mod.inv_freq.device)
                mod.inv_freq.copy_(inv_freq)
                if hasattr(mod, "original_inv_freq"):
                    mod.original_inv_freq = inv_freq
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.999), weight_decay=0.0, fused=True)
    n_params = sum(p.numel() for p in model.parameters())  # DTensor: the global count
    gas = c["gas"]
    state = {"mb": 0}

    def micro(tokens, last):
        model.set_requires_gradient_sync(last or c.get("grad_sync_each_micro", False))
        t0 = time.perf_counter()
        loss = model(input_ids=tokens, labels=tokens).loss / gas
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        loss.backward()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        t_opt = 0.0
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t_opt = time.perf_counter() - t2
        state["mb"] += 1
        return loss.item() * gas, t1 - t0, t2 - t1, t_opt, 0.0

    return micro, n_params


NF4_LEVELS = {}


def nf4_levels(device="cuda"):
    """QLoRA's NF4 code book (Dettmers et al. 2023, appendix E), as published; one copy per device,
    built once (a host-to-device copy per dequantisation would be timed with the peer's step)."""
    if device not in NF4_LEVELS:
        NF4_LEVELS[device] = torch.tensor(
            [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
             -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
             0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
             0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], device=device)
    return NF4_LEVELS[device]


def nf4_quantize(w):
    """Block-wise (64) absmax NF4 codes, two per byte (first value in the low nibble), and scales."""
    levels = nf4_levels()
    blocks = w.float().reshape(-1, 64)
    absmax = blocks.abs().amax(1)
    y = blocks / absmax.clamp_min(1e-30)[:, None]
    codes = torch.bucketize(y, (levels[1:] + levels[:-1]) / 2, right=True).to(torch.uint8).reshape(-1, 2)
    return codes[:, 0] | (codes[:, 1] << 4), absmax


def nf4_dequantize(codes, absmax, dtype):
    levels = nf4_levels()
    idx = torch.stack([codes & 15, codes >> 4], 1).reshape(-1).long()
    return (levels[idx].reshape(-1, 64) * absmax[:, None]).reshape(-1).to(dtype)


class Nf4Matmul(torch.autograd.Function):
    """x W^T with W dequantised from NF4 in the forward and again in the backward (nothing 16-bit saved)."""

    @staticmethod
    def forward(ctx, x, codes, absmax, shape):
        ctx.save_for_backward(codes, absmax)
        ctx.shape = shape
        return x @ nf4_dequantize(codes, absmax, x.dtype).view(shape).t()

    @staticmethod
    def backward(ctx, g):
        codes, absmax = ctx.saved_tensors
        return g @ nf4_dequantize(codes, absmax, g.dtype).view(ctx.shape), None, None, None


class LoraLinear(torch.nn.Module):
    """A frozen projection (bf16, or NF4 codes) plus (alpha / r) B A on its input, B starting at zero."""

    def __init__(self, base, rank, alpha, qlora):
        super().__init__()
        out_f, in_f = base.weight.shape
        self.shape = (out_f, in_f)
        self.qlora = qlora
        if qlora:
            codes, absmax = nf4_quantize(base.weight.data)
            self.register_buffer("codes", codes)
            self.register_buffer("absmax", absmax)
        else:
            self.weight = torch.nn.Parameter(base.weight.data, requires_grad=False)
        self.bias = None if base.bias is None else torch.nn.Parameter(base.bias.data, requires_grad=False)
        dtype = base.weight.dtype
        self.lora_a = torch.nn.Parameter(torch.empty(rank, in_f, device="cuda", dtype=dtype).uniform_(
            -1.0 / math.sqrt(in_f), 1.0 / math.sqrt(in_f)))
        self.lora_b = torch.nn.Parameter(torch.zeros(out_f, rank, device="cuda", dtype=dtype))
        self.scale = alpha / rank

    def forward(self, x):
        if self.qlora:
            y = Nf4Matmul.apply(x, self.codes, self.absmax, self.shape)
        else:
            y = torch.nn.functional.linear(x, self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y + torch.nn.functional.linear(torch.nn.functional.linear(x, self.lora_a), self.lora_b) * self.scale


def build_torch_peft(cfg, c, local_rank):
    """LoRA / QLoRA written from torch's own operations with the backend's math (no PEFT or
    bitsandbytes on the GPU host): every linear layer of the decoder layers ("all" targets) or of
    the attention or MLP only becomes a LoraLinear; torch's fused AdamW steps the adapters."""
    with torch.device("meta"):
        model = causal_lm(cfg, cfg.peer_dtype)
    model.to_empty(device=f"cuda:{local_rank}")
    init_weights(model)
    with torch.no_grad():  # buffers built on the meta device: recompute the rotary frequencies
        for mod in model.modules():
            if hasattr(mod, "inv_freq") and hasattr(mod, "rope_init_fn"):
                inv_freq, _ = mod.rope_init_fn(mod.config, mod.inv_freq.device)
                mod.inv_freq.copy_(inv_freq)
                if hasattr(mod, "original_inv_freq"):
                    mod.original_inv_freq = inv_freq
    for p in model.parameters():
        p.requires_grad_(False)
    attention_names = ("q_proj", "k_proj", "v_proj", "o_proj", "query_key_value", "dense", "out_proj")
    for layer in layer_list(model):
        for name, mod in list(layer.named_modules()):
            if not isinstance(mod, torch.nn.Linear):
                continue
            leaf = name.split(".")[-1]
            is_attention = leaf in attention_names and ("attn" in name or "attention" in name)
            if c["lora_targets"] == "attention" and not is_attention:
                continue
            if c["lora_targets"] == "mlp" and is_attention:
                continue
            parent = layer.get_submodule(".".join(name.split(".")[:-1])) if "." in name else layer
            setattr(parent, leaf, LoraLinear(mod, c["lora_rank"], c["lora_alpha"], c["peft"] == "qlora"))
    torch.cuda.empty_cache()
    if c["activation_checkpointing"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    n_params = sum(p.numel() for p in trainable)

    def micro(tokens, last):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model(input_ids=tokens, labels=tokens)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        (out.loss / c["gas"]).backward()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        o = 0.0
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            o = time.perf_counter() - t2
        return out.loss.item(), t1 - t0, t2 - t1, o, None

    return micro, n_params


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--engine", required=True, choices=["deepspeed", "fsdp2", "torch-peft"])
    p.add_argument("--plan", required=True, help="planner explain --json output; plans[0].config runs")
    p.add_argument("--model-card", required=True)
    p.add_argument("--model-name", default="", help="the name recorded (default: the card's name)")
    p.add_argument("--deepspeed-config", default="")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json-out", required=True)
    p.add_argument("--git-commit", default="unknown")
    p.add_argument("--hardware", default="")
    p.add_argument("--memory-trace", default="",
                   help="diagnostic run: record the caching allocator's events over every step and write what was "
                        "live at the largest allocated and reserved bytes to this JSON file (rank 0's GPU); "
                        "no step records are written, the recording slows the steps")
    p.add_argument("--memory-trace-stacks", choices=("python", "none"), default="python",
                   help="record each allocation's Python stack (python) or only its size (none: for a run "
                        "whose autograd Functions fail under Python-stack recording)")
    a = p.parse_args()
    if a.steps <= a.warmup:
        fail(f"--steps {a.steps} must exceed --warmup {a.warmup}")
    plan = json.load(open(a.plan))
    c = dict(plan["plans"][0]["config"])
    card = read_card(a.model_card)
    rank, world, local_rank = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if world != c["gpus"] * c["nodes"]:
        fail(f"{a.plan}: plans[0].config.world_size is {c['gpus'] * c['nodes']}, but torchrun started {world} ranks")
    # The plan's allocator (config.gpu_allocator, absent: torch's default), set before the first
    # CUDA allocation as PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True would set it at launch.
    expandable = c.get("gpu_allocator", "default") == "expandable"
    if expandable:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    torch.cuda.set_device(local_rank)
    cfg = hf_config(card, c["precision"])
    cfg.peer_attn = {"flash": "sdpa", "math": "eager"}[c["attention"]]
    if a.engine == "deepspeed":
        if not a.deepspeed_config:
            fail("--deepspeed-config is required with --engine deepspeed")
        ds_config = json.load(open(a.deepspeed_config))
        # The record's config.offload_pin_memory (absent: pinned) must be what DeepSpeed runs:
        # offload_optimizer.pin_memory, whose own default is false (runtime/zero/offload_config.py).
        offload = ds_config.get("zero_optimization", {}).get("offload_optimizer", {})
        if offload.get("device", "none") == "cpu":
            pinned = bool(offload.get("pin_memory", False))
            if pinned != c.get("offload_pin_memory", True):
                fail(f"{a.deepspeed_config}: zero_optimization.offload_optimizer.pin_memory is "
                     f"{str(pinned).lower()}, but {a.plan}: plans[0].config.offload_pin_memory is "
                     f"{str(c.get('offload_pin_memory', True)).lower()}")
        micro, n_params = build_deepspeed(cfg, c, ds_config, local_rank)
    elif a.engine == "torch-peft":
        if c.get("peft", "none") == "none" or world != 1:
            fail(f"{a.plan}: --engine torch-peft runs a LoRA or QLoRA plan on one GPU")
        dist.init_process_group("nccl")
        micro, n_params = build_torch_peft(cfg, c, local_rank)
    else:
        micro, n_params = build_fsdp2(cfg, c, local_rank)
    torch.cuda.synchronize()
    # The record says which allocator ran: the model's segments are expandable exactly when the
    # plan asked for it (an environment that turns it on for a default plan stops here).
    ran_expandable = any(seg.get("is_expandable", False) for seg in torch.cuda.memory_snapshot())
    if ran_expandable != expandable:
        fail(f"{a.plan}: plans[0].config.gpu_allocator is {c.get('gpu_allocator', 'default')}, but the caching "
             f"allocator's segments are {'expandable' if ran_expandable else 'not expandable'} "
             f"(PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')!r})")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    gas, mb, seq = c["gas"], c["micro_batch"], c["seq_len"]
    tokens_per_step = mb * seq * gas * world
    flops_per_token = 6 * n_params + 6 * card["num_layers"] * card["hidden_size"] * seq
    peak_flops = {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 494.7e12}[c["precision"]]  # H100/H200 SXM dense
    c["engine"] = a.engine
    env = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "engine": a.engine,
           "engine_version": engine_version(a.engine), "git_commit": a.git_commit, "world_size": world,
           "data": "random tokens", "attention": cfg.peer_attn, "model_implementation": "transformers",
           # The peers' CPU optimizers run on OpenMP / intra-op threads: torchrun sets OMP_NUM_THREADS=1
           # for each rank when it starts more than one per node and the variable is unset.
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"), "torch_threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "host_op_us": host_op_us()}
    if "PYTORCH_CUDA_ALLOC_CONF" in os.environ:
        env["pytorch_cuda_alloc_conf"] = os.environ["PYTORCH_CUDA_ALLOC_CONF"]
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    trace_max_entries = 8_000_000
    if a.memory_trace:
        base_allocated, base_reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        if a.memory_trace_stacks == "python":
            torch.cuda.memory._record_memory_history(max_entries=trace_max_entries, stacks="python")
        else:
            torch.cuda.memory._record_memory_history(max_entries=trace_max_entries, context=None)
    for step in range(a.steps):
        fwd = bwd = opt_s = gas_s = 0.0
        torch.cuda.synchronize()
        dist.barrier()
        ticks_before = cpu_ticks()
        t_start = time.perf_counter()
        for m in range(gas):
            last = m == gas - 1
            tokens = torch.randint(0, card["vocab_size"], (mb, seq), device="cuda", generator=gen)
            t0 = time.perf_counter()
            loss, f, b, o, _ = micro(tokens, last)
            fwd += f
            bwd += b
            opt_s += o
            if not last:
                gas_s += time.perf_counter() - t0
        torch.cuda.synchronize()
        step_s = time.perf_counter() - t_start
        host_cpu = cpu_share(ticks_before, cpu_ticks())
        # Every rank's numbers: the slowest rank's step and the largest peak are the job's.
        t = torch.tensor([step_s, gas_s, fwd, bwd, opt_s, torch.cuda.max_memory_reserved(),
                          torch.cuda.max_memory_allocated(),
                          resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0,
                          # Times the caching allocator freed its cache and retried an allocation,
                          # since the process began: a step near the card's capacity pays for these.
                          torch.cuda.memory_stats().get("num_alloc_retries", 0)], device="cuda",
                         dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step_s, gas_s, fwd, bwd, opt_s, reserved, allocated, rss, retries = t.tolist()
        tps = tokens_per_step / step_s
        rec = {"config": c, "model": a.model_name or card["name"], "params": n_params, "step": step + 1,
               "warmup": step < a.warmup, "loss": loss if math.isfinite(loss) else None,
               "time_s": {"step": step_s, "gas": gas_s if gas > 1 else None, "opt": step_s - gas_s, "forward": fwd,
                          "backward": bwd, "optimizer": opt_s, "grad_comm": None, "param_gather": None,
                          "offload_transfer": None},
               "memory_bytes": {"gpu_peak_reserved": reserved, "gpu_peak_allocated": allocated, "host_peak_rss": rss},
               "allocator": {"alloc_retries_total": int(retries)},
               "throughput": {"tokens_per_s": tps, "mfu": tps * flops_per_token / (world * peak_flops),
                              "world_samples_per_s": tokens_per_step / seq / step_s},
               "env": env}
        if host_cpu is not None:
            rec["host_cpu"] = host_cpu
        if a.hardware:
            rec["hardware"] = a.hardware
        if a.memory_trace:
            if rank == 0:
                print(f"peer {a.engine} step {step + 1} (memory trace, not recorded): {step_s:.3f} s, "
                      f"peak reserved {reserved / 2**30:.1f} GiB", flush=True)
            continue
        if rank == 0:
            print(f"peer {a.engine} step {step + 1}{' (warm-up)' if step < a.warmup else ''}: {step_s:.3f} s "
                  f"(gas {gas_s:.3f}, opt {step_s - gas_s:.3f}, optimizer {opt_s:.3f}), {tps:.0f} tokens/s, "
                  f"loss {loss:.3f}, peak reserved {reserved / 2**30:.1f} GiB", flush=True)
            with open(a.json_out, "a") as f:
                f.write(json.dumps(rec) + "\n")
    if a.memory_trace:
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        trace = snap["device_traces"][torch.cuda.current_device()]
        if rank == 0:
            rep = peak_report(trace, base_allocated, base_reserved)
            rep.update({"config": c, "model": a.model_name or card["name"], "steps": a.steps,
                        "stacks": a.memory_trace_stacks,
                        "trace_truncated": len(trace) >= trace_max_entries,
                        "max_memory_reserved_bytes": torch.cuda.max_memory_reserved(),
                        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(), "env": env})
            tmp = a.memory_trace + ".tmp"
            with open(tmp, "w") as f:
                json.dump(rep, f, indent=1)
            os.replace(tmp, a.memory_trace)
            print(f"peer: memory trace of {len(trace)} events -> {a.memory_trace}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
