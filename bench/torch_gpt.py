#!/usr/bin/env python3
"""The GPT of src/models/gpt.cpp in PyTorch (Debian's python3-torch 1.13), trained with
DistributedDataParallel on gloo: bench/compare's DDP baseline.

    mpirun -np 2 /usr/bin/python3 bench/torch_gpt.py --layers 6 --dim 256 --heads 8 --json out.json
    /usr/bin/python3 bench/torch_gpt.py ...          # one process, no DDP
    mpirun -np 2 /usr/bin/python3 bench/torch_gpt.py --probe-fsdp --json probe.json

Launched by mpirun like fsdp-train: the rank and world size come from Open MPI's environment
(OMPI_COMM_WORLD_RANK/SIZE) and gloo meets on 127.0.0.1:--port. The architecture is the C++
one, layer for layer: learned positions, pre-norm blocks, GPT-2's tanh GELU, biases everywhere,
the head tied to the token embedding, attention composed as libtorch 1.13 does it in
include/fsdp/compat.h (1.13 has no fused scaled_dot_product_attention), the same initialisation.
Data: uniformly random byte tokens, one seeded generator per rank. Reported: median tokens/s
over the steps after --warmup, every rank's peak resident memory (VmHWM), the parameter count.
--probe-fsdp instead checks whether PyTorch's own FSDP can run here (its import, and gloo's
reduce-scatter, which FSDP needs) and writes what failed.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        # [b, t, 3 * dim] -> three [b, heads, t, head_dim]
        q, k, v = self.c_attn(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.matmul(torch.softmax(scores, -1), v)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class Mlp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads, layers):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = Mlp(dim)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.02)
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2.0 * layers)
        nn.init.normal_(self.attn.c_proj.weight, 0.0, residual_std)
        nn.init.normal_(self.mlp.c_proj.weight, 0.0, residual_std)

    def forward(self, x):
        h1 = x + self.attn(self.ln_1(x))
        return h1 + self.mlp(self.ln_2(h1))


class Gpt(nn.Module):
    def __init__(self, layers, dim, heads, vocab, context):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.h = nn.ModuleList(Block(dim, heads, layers) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)

    def forward(self, ids):
        positions = torch.arange(ids.size(1))
        x = self.wte(ids) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return torch.matmul(self.ln_f(x), self.wte.weight.t())  # tied head


def peak_resident_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return -1


def launch(port):
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    local_world = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", str(world)))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return rank, world, local_world


def probe_fsdp(args, rank, world):
    """What stops PyTorch's FSDP here: its import, and gloo's reduce-scatter."""
    result = {"torch_version": torch.__version__, "python_version": sys.version.split()[0]}
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: F401
        result["fsdp_import"] = "ok"
    except Exception as e:  # the point is to record whatever it raises
        result["fsdp_import"] = f"{type(e).__name__}: {e}"
    if world > 1:
        try:
            out = torch.zeros(4)
            dist.reduce_scatter(out, [torch.ones(4) for _ in range(world)])
            result["gloo_reduce_scatter"] = "ok"
        except Exception as e:
            result["gloo_reduce_scatter"] = f"{type(e).__name__}: {e}".splitlines()[0]
    if rank == 0:
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)


def train(args, rank, world, local_world):
    if args.batch % world:
        sys.exit(f"torch_gpt: --batch {args.batch} is not divisible by the {world} ranks")
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    model = Gpt(args.layers, args.dim, args.heads, args.vocab, args.seq)
    parameters = sum(p.numel() for p in model.parameters())
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    # fsdp-train's defaults for the optimizer (configs/gpt-fortunes-tiny.toml), constant rate.
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    generator = torch.Generator().manual_seed(42 + rank)
    local_batch = args.batch // world
    step_seconds, losses = [], []
    for step in range(args.steps):
        window = torch.randint(0, args.vocab, (local_batch, args.seq + 1), generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), window[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        seconds = time.perf_counter() - start
        if world > 1:  # the slowest rank sets the pace
            t = torch.tensor([seconds])
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            seconds = t.item()
        step_seconds.append(seconds)
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step + 1:3d}  loss {losses[-1]:.4f}  {seconds:.3f} s", flush=True)
    peaks = torch.tensor([float(peak_resident_bytes())])
    if world > 1:
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, peaks)
        peaks = torch.cat(gathered)
    median_step = statistics.median(step_seconds[args.warmup:])
    result = {
        "parameters": parameters, "ranks": world, "threads": threads, "batch": args.batch, "seq": args.seq,
        "steps": args.steps, "warmup": args.warmup, "step_seconds": step_seconds, "losses": losses,
        "median_step_seconds": median_step, "tokens_per_second": args.batch * args.seq / median_step,
        "peak_resident_bytes_per_rank": peaks.tolist(),
    }
    if rank == 0:
        print(f"torch_gpt: {parameters} parameters, {world} rank(s), {threads} threads per rank, median step "
              f"{median_step:.3f} s, {result['tokens_per_second']:.0f} tokens/s, peak resident "
              f"{max(result['peak_resident_bytes_per_rank']) / 2**20:.1f} MiB (largest rank)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256, help="tokens per window (also the context)")
    parser.add_argument("--batch", type=int, default=16, help="windows per step, over all ranks")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    parser.add_argument("--threads", type=int, default=0, help="per rank (0: cores / ranks on this node)")
    parser.add_argument("--port", type=int, default=29517, help="gloo's rendezvous port on 127.0.0.1")
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--probe-fsdp", action="store_true", help="check whether PyTorch FSDP can run here")
    args = parser.parse_args()
    for name in ("layers", "dim", "heads", "vocab", "seq", "batch", "steps"):
        if getattr(args, name) <= 0:
            sys.exit(f"torch_gpt: --{name} must be positive")
    if args.dim % args.heads:
        sys.exit(f"torch_gpt: --dim {args.dim} is not divisible by --heads {args.heads}")
    if not 0 <= args.warmup < args.steps:
        sys.exit(f"torch_gpt: --warmup {args.warmup} must be in [0, --steps)")
    rank, world, local_world = launch(args.port)
    if args.probe_fsdp:
        probe_fsdp(args, rank, world)
    else:
        train(args, rank, world, local_world)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
