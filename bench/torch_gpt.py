#!/usr/bin/env python3
"""The GPT of src/models/gpt.cpp in PyTorch 2.x (the torch wheel in .venv/), or Hugging Face
transformers' GPT2LMHeadModel with the same configuration, trained under DistributedDataParallel
or FSDP2 (fully_shard) on gloo: bench/compare's PyTorch peers.

    mpirun -np 2 .venv/bin/python bench/torch_gpt.py --layers 6 --dim 256 --heads 8 --json out.json
    mpirun -np 2 .venv/bin/python bench/torch_gpt.py --wrap fsdp2 --model hf ...
    .venv/bin/python bench/torch_gpt.py ...          # one process, no wrapper

Launched by mpirun like fsdp-train: the rank and world size come from Open MPI's environment
(OMPI_COMM_WORLD_RANK/SIZE) and gloo meets on 127.0.0.1:--port. --model ours is the C++ model,
layer for layer: learned positions, pre-norm blocks, GPT-2's tanh GELU, biases everywhere, the
head tied to the token embedding, scaled_dot_product_attention as include/fsdp/compat.h calls
it, the same initialisation. --model hf is transformers' GPT2LMHeadModel (GPT2Config with the
same layers, width, heads, vocabulary and context, dropout off, sdpa attention): a model nobody
here wrote. --wrap ddp: DistributedDataParallel; --wrap fsdp2: fully_shard on each block, then
on the root (embeddings, final norm, tied head), reshard after forward: fsdp.cpp's FULL_SHARD
with the embedding in the root. Optimizer: AdamW (fsdp-train's settings), gradient clipping 1.0.
Data: uniformly random byte tokens, one seeded generator per rank. Reported: median tokens/s
over the steps after --warmup, every rank's peak resident memory (VmHWM), the parameter count.
If the wrapper fails (it needs collectives gloo may lack), the exception is written to --json
as {"error": ...} and the exit status is 3, so that the table can show it.
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
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
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


def every_rank_peak(world):
    """Every rank's peak resident bytes (VmHWM), gathered: a tensor [world]."""
    peaks = torch.tensor([float(peak_resident_bytes())])
    if world > 1:
        gathered = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(gathered, peaks)
        peaks = torch.cat(gathered)
    return peaks


def launch(port):
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    local_world = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", str(world)))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return rank, world, local_world


def build_model(args):
    """(model, blocks): the blocks are the units FSDP2 wraps before the root."""
    if args.model == "ours":
        model = Gpt(args.layers, args.dim, args.heads, args.vocab, args.seq)
        return model, list(model.h)
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.dim, n_layer=args.layers,
                        n_head=args.heads, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    config._attn_implementation = "sdpa"
    model = GPT2LMHeadModel(config)
    return model, list(model.transformer.h)


def logits_of(model, args, ids):
    return model(ids) if args.model == "ours" else model(input_ids=ids).logits


def wrap(model, blocks, args, world):
    if args.wrap == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    if args.wrap == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
    return model


def train(args, rank, world, local_world):
    if args.batch % world:
        sys.exit(f"torch_gpt: --batch {args.batch} is not divisible by the {world} ranks")
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    model, blocks = build_model(args)
    parameters = sum(p.numel() for p in model.parameters())
    if world > 1 or args.wrap == "fsdp2":
        model = wrap(model, blocks, args, world)
    # fsdp-train's defaults for the optimizer (configs/gpt-fortunes-tiny.toml), constant rate.
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    generator = torch.Generator().manual_seed(42 + rank)
    local_batch = args.batch // world
    step_seconds, losses = [], []
    for step in range(args.steps):
        window = torch.randint(0, args.vocab, (local_batch, args.seq + 1), generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = logits_of(model, args, window[:, :-1])
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
    peaks = every_rank_peak(world)
    median_step = statistics.median(step_seconds[args.warmup:])
    result = {
        "parameters": parameters, "ranks": world, "model": args.model, "wrap": args.wrap if world > 1 else "none",
        "torch_version": torch.__version__, "threads": threads, "batch": args.batch, "seq": args.seq,
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
    parser.add_argument("--model", choices=("ours", "hf"), default="ours",
                        help="ours: src/models/gpt.cpp in PyTorch; hf: transformers' GPT2LMHeadModel")
    parser.add_argument("--wrap", choices=("ddp", "fsdp2"), default="ddp", help="with more than one rank")
    args = parser.parse_args()
    for name in ("layers", "dim", "heads", "vocab", "seq", "batch", "steps"):
        if getattr(args, name) <= 0:
            sys.exit(f"torch_gpt: --{name} must be positive")
    if args.dim % args.heads:
        sys.exit(f"torch_gpt: --dim {args.dim} is not divisible by --heads {args.heads}")
    if not 0 <= args.warmup < args.steps:
        sys.exit(f"torch_gpt: --warmup {args.warmup} must be in [0, --steps)")
    run_launched("torch_gpt", train, args)


def run_launched(tool, train, args):
    """Launches (launch), runs train(args, rank, world, local_world), and tears the group down. If
    the wrapper fails (it needs collectives gloo may lack), the exception is written to args.json as
    {"error": ...} and the exit status is 3, so that a table can show it."""
    rank, world, local_world = launch(args.port)
    try:
        train(args, rank, world, local_world)
    except Exception as e:  # recorded for the table: what stops this wrapper here
        message = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        print(f"{tool}: rank {rank}: {args.wrap} failed: {message}", file=sys.stderr, flush=True)
        if rank == 0 and args.json:
            with open(args.json, "w") as f:
                json.dump({"error": message, "torch_version": torch.__version__}, f, indent=2)
        sys.exit(3)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
