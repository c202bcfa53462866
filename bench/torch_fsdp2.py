#!/usr/bin/env python3
"""PyTorch's own FSDP2 (fully_shard) on the GPU, for scripts/gpu-check.sh's side-by-side.

    python3 bench/torch_fsdp2.py --model gpt --layers 12 --dim 768 --heads 12 --vocab 50304 \\
        --batch 8 --seq 1024 --steps 20 --json out.json
    python3 bench/torch_fsdp2.py --model hf-llama --layers 16 --dim 2048 --heads 32 --kv-heads 8 \\
        --ffn 8192 --vocab 128256 --tie --batch 4 --seq 2048 --compile --profile-steps 6:7 --trace t.json

Needs PyTorch >= 2.4 (torch.distributed fully_shard); --model hf-* needs transformers. World size
from torchrun or mpirun (RANK/WORLD_SIZE or OMPI_COMM_WORLD_*), meeting on 127.0.0.1:--port; one
GPU per rank, NCCL (--device cpu: gloo, for trying the script on a machine without a GPU).
Models:
- gpt, llama: this script's own, the C++ ones layer for layer (src/models/gpt.cpp, llama.cpp):
  GPT with learned positions, tanh GELU, biases, tied head; Llama with RMSNorm in fp32, rotary
  embeddings, SwiGLU, grouped-query attention, untied head unless --tie. Initialised as GPT-2 and
  the C++ models are: normal(0, 0.02) weights and embeddings, zero biases, the residual
  projections at 0.02 / sqrt(2 layers) (a loss of ~ln(vocab) at the start, as fsdp-train's).
- hf-gpt2, hf-llama: Hugging Face transformers' GPT2LMHeadModel and LlamaForCausalLM of the same
  shapes (AutoModelForCausalLM.from_config, attn_implementation="sdpa", their own init).
Attention is scaled_dot_product_attention throughout. Each block is a fully_shard unit and the
root one more, as fsdp.cpp wraps them; bf16 parameters with fp32 gradient reduction
(MixedPrecisionPolicy) and fused AdamW, as fsdp-train with param_dtype bfloat16. --compile calls
torch.compile on each block before sharding it (FSDP2's recommended use); --checkpointing wraps each
block in activation checkpointing. Loss: cross-entropy of the fp32 logits.
Data: uniformly random tokens (the cost of a step does not depend on their values).
Reported: median tokens/s over the steps after --warmup, peak GPU memory (allocated and
reserved by the caching allocator), the parameter count. --profile-steps A:B writes a Chrome trace
of steps A to B (counted from 1, warm-up included) with torch.profiler, as fsdp-train's
--profile-steps does, for comparing op by op.
"""
import argparse
import contextlib
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


class GptBlock(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.attn_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.c_fc, self.mlp_proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(a.vocab, a.dim), nn.Embedding(a.seq, a.dim)
        self.blocks = nn.ModuleList(GptBlock(a.dim, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.dim)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.size(1), device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


class RmsNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


def rotate(x, cos, sin):
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.heads, self.kv_heads, self.hd = a.heads, a.kv_heads, a.dim // a.heads
        self.input_layernorm, self.post_attention_layernorm = RmsNorm(a.dim), RmsNorm(a.dim)
        self.q_proj = nn.Linear(a.dim, a.dim, bias=False)
        self.k_proj = nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(a.dim, a.kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(a.dim, a.dim, bias=False)
        self.gate_proj = nn.Linear(a.dim, a.ffn, bias=False)
        self.up_proj = nn.Linear(a.dim, a.ffn, bias=False)
        self.down_proj = nn.Linear(a.ffn, a.dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.embed_tokens = nn.Embedding(a.vocab, a.dim)
        self.blocks = nn.ModuleList(LlamaBlock(a) for _ in range(a.layers))
        self.norm = RmsNorm(a.dim)
        self.lm_head = None if a.tie else nn.Linear(a.dim, a.vocab, bias=False)
        hd = a.dim // a.heads
        inverse = 1.0 / (a.rope_theta ** (torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd))
        angles = torch.outer(torch.arange(a.seq, dtype=torch.float64), inverse)
        self.register_buffer("cos", torch.cat((angles.cos(), angles.cos()), -1).float(), persistent=False)
        self.register_buffer("sin", torch.cat((angles.sin(), angles.sin()), -1).float(), persistent=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin)
        x = self.norm(x)
        return x @ self.embed_tokens.weight.t() if self.lm_head is None else self.lm_head(x)


def init_as_gpt2(model, layers):
    """GPT-2's initialisation, as the C++ models draw theirs: weights and embeddings from
    normal(0, 0.02), biases zero, norms one, residual projections normal(0, 0.02 / sqrt(2 layers))."""
    residual_std = 0.02 / math.sqrt(2 * layers)
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("attn_proj", "mlp_proj", "o_proj", "down_proj")) else 0.02
                module.weight.normal_(0.0, std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()


def build_hf(a, device):
    """transformers' own model of the same shapes, with its own initialisation."""
    try:
        import transformers
    except ImportError as e:
        sys.exit(f"torch_fsdp2: --model {a.model} needs transformers: {e}")
    if a.model == "hf-gpt2":
        config = transformers.GPT2Config(vocab_size=a.vocab, n_positions=a.seq, n_embd=a.dim, n_layer=a.layers,
                                         n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         use_cache=False)
    else:
        config = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                                          num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                          num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                                          rope_theta=a.rope_theta, rms_norm_eps=1e-5, tie_word_embeddings=a.tie,
                                          use_cache=False)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    blocks = model.transformer.h if a.model == "hf-gpt2" else model.model.layers
    return model, blocks


def parse_steps(text):
    first, _, last = text.partition(":")
    first, last = int(first), int(last or first)
    if not 1 <= first <= last:
        raise argparse.ArgumentTypeError(f"--profile-steps {text}: expected A:B with 1 <= A <= B")
    return first, last


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt", "llama", "hf-gpt2", "hf-llama"], required=True)
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--heads", type=int, required=True)
    p.add_argument("--kv-heads", type=int, default=0)
    p.add_argument("--ffn", type=int, default=0)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--rope-theta", type=float, default=500000.0)
    p.add_argument("--tie", action="store_true")
    p.add_argument("--batch", type=int, required=True, help="sequences per step over all ranks")
    p.add_argument("--seq", type=int, required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--json", default="")
    p.add_argument("--compile", action="store_true", help="torch.compile each block before sharding it")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing on each block")
    p.add_argument("--profile-steps", type=parse_steps, default=None, help="A:B: a Chrome trace of steps A to B")
    p.add_argument("--trace", default="", help="the trace's path (default: --json's with .trace.json)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = p.parse_args()
    a.kv_heads = a.kv_heads or a.heads
    a.ffn = a.ffn or 4 * a.dim

    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError as e:
            sys.exit(f"torch_fsdp2: this PyTorch ({torch.__version__}) has no fully_shard (FSDP2): {e}")
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")))
    if a.batch % world:
        sys.exit(f"torch_fsdp2: --batch {a.batch} is not divisible by the {world} ranks")
    cuda = a.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        torch.backends.cuda.matmul.allow_tf32 = False  # libtorch's default, which fsdp-train keeps (bf16 matmuls either way)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=world)

    torch.manual_seed(1234)
    if a.model.startswith("hf-"):
        model, blocks = build_hf(a, a.device)
    else:
        with torch.device(a.device):
            model = Gpt(a) if a.model == "gpt" else Llama(a)
        init_as_gpt2(model, a.layers)
        blocks = model.blocks
    parameters = sum(p.numel() for p in model.parameters())
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for index, block in enumerate(blocks):
        if a.checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
            block = checkpoint_wrapper(block)
            blocks[index] = block
        if a.compile:
            block.compile()
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, fused=cuda)
    synchronize = torch.cuda.synchronize if cuda else (lambda: None)
    profiler = None
    trace = a.trace or (a.json[:-5] if a.json.endswith(".json") else a.json or "torch_fsdp2") + ".trace.json"
    if world > 1:  # one trace per rank, as fsdp-train writes them
        trace = (trace[:-11] if trace.endswith(".trace.json") else trace) + f"-rank{rank}.trace.json"

    local_batch = a.batch // world
    generator = torch.Generator(device=a.device).manual_seed(rank)
    times = []
    for step in range(a.warmup + a.steps):
        if a.profile_steps and step + 1 == a.profile_steps[0]:
            activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            profiler.__enter__()
        ids = torch.randint(0, a.vocab, (local_batch, a.seq + 1), device=a.device, generator=generator)
        synchronize()
        start = time.perf_counter()
        with torch.profiler.record_function(f"ProfilerStep#{step + 1}") if profiler else contextlib.nullcontext():
            logits = model(ids[:, :-1])
            if not torch.is_tensor(logits):
                logits = logits.logits  # transformers' CausalLMOutput
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), ids[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = loss.item()  # a host sync per step, as fsdp-train's loss print
            synchronize()
        if step >= a.warmup and not profiler:  # profiled steps are slower: left out, as the report leaves out fsdp-train's
            times.append(time.perf_counter() - start)
        if profiler and step + 1 == a.profile_steps[1]:
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(trace + ".partial")
            os.replace(trace + ".partial", trace)
            profiler = None
            if rank == 0:
                print(f"torch_fsdp2: profile of steps {a.profile_steps[0]}-{a.profile_steps[1]} written: {trace}")
    step_seconds = statistics.median(times)
    result = {
        "implementation": "pytorch-fsdp2", "torch_version": torch.__version__, "model": a.model,
        "parameters": parameters, "world_size": world, "batch": a.batch, "seq": a.seq,
        "tokens_per_second": a.batch * a.seq / step_seconds, "median_step_seconds": step_seconds,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else -1,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else -1,
        "final_loss": loss_value, "steps": a.steps, "compiled": a.compile, "checkpointing": a.checkpointing,
    }
    if rank == 0:
        print(json.dumps(result, indent=2))
        if a.json:
            with open(a.json + ".partial", "w") as f:
                json.dump(result, f, indent=2)
            os.replace(a.json + ".partial", a.json)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
