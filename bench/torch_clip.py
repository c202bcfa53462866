#!/usr/bin/env python3
"""transformers' CLIPModel trained under DistributedDataParallel or FSDP2 (fully_shard) on gloo:
bench/max_model.py's PyTorch peers for the clip family.

    mpirun -np 4 .venv/bin/python bench/torch_clip.py --layers 6 --dim 1024 --wrap ddp

The model is fsdp-train's clip-fmnist shape grown to --layers blocks of width --dim in each tower
(heads = dim / 64, MLP 4 x dim, projection dim, 28x28 greyscale images in 7x7 patches, byte
captions of 48 tokens over 257 ids, eos 256): transformers' CLIPModel, a model nobody here wrote.
--wrap ddp: DistributedDataParallel; --wrap fsdp2: fully_shard on every encoder layer of both
towers (reshard after forward), then on the root (embeddings, norms, projections, logit_scale
reshaped to [1], as OpenCLIP does, since FSDP2 refuses a 0-D parameter; kept unsharded after forward).
The loss is CLIP's over the global batch: each rank's features all-gathered with their gradient
(torch.distributed.nn.functional.all_gather), each rank its own rows, as fsdp-train computes it.
AdamW, fp32, random images and captions. Reported as torch_gpt.py reports: median step seconds,
every rank's peak resident memory (VmHWM), the parameter count (--json).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import every_rank_peak, run_launched  # noqa: E402

CONTEXT, VOCAB, EOS = 48, 257, 256


def build(layers, dim):
    from transformers import CLIPConfig, CLIPModel
    tower = dict(hidden_size=dim, intermediate_size=4 * dim, num_hidden_layers=layers, num_attention_heads=dim // 64,
                 projection_dim=dim, hidden_act="quick_gelu")
    config = CLIPConfig(text_config=dict(tower, vocab_size=VOCAB, max_position_embeddings=CONTEXT, eos_token_id=EOS,
                                         bos_token_id=EOS, pad_token_id=EOS),
                        vision_config=dict(tower, image_size=28, patch_size=7, num_channels=1), projection_dim=dim)
    config._attn_implementation = "sdpa"
    return CLIPModel(config)


def global_loss(image, text, scale, rank, world):
    """CLIP's loss over the global batch from this rank's features: gathered with their gradient."""
    if world > 1:
        from torch.distributed.nn.functional import all_gather
        all_image, all_text = torch.cat(all_gather(image)), torch.cat(all_gather(text))
    else:
        all_image, all_text = image, text
    b = image.shape[0]
    rows = torch.arange(rank * b, (rank + 1) * b)
    per_image = scale * image @ all_text.t()
    per_text = scale * text @ all_image.t()
    return (F.cross_entropy(per_image, rows) + F.cross_entropy(per_text, rows)) / 2


def train(args, rank, world, local_world):
    threads = args.threads or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    torch.manual_seed(1234)
    model = build(args.layers, args.dim)
    parameters = sum(p.numel() for p in model.parameters())
    if world > 1 and args.wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.wrap == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        # FSDP2 refuses a 0-D parameter ("fully_shard doesn't support scalar parameters"): OpenCLIP
        # reshapes logit_scale to [1]; so does this peer. (fsdp.cpp shards the 0-D one as it is.)
        model.logit_scale = torch.nn.Parameter(model.logit_scale.detach().reshape(1))
        for layer in [*model.text_model.encoder.layers, *model.vision_model.encoder.layers]:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        # The root stays unsharded after forward (FSDP2's advice for the root): the loss reads
        # logit_scale after the forward, as a plain tensor.
        fully_shard(model, mesh=mesh, reshard_after_forward=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05)
    generator = torch.Generator().manual_seed(42 + rank)
    step_seconds, losses = [], []
    for step in range(args.steps):
        images = torch.randn(args.batch_per_rank, 1, 28, 28, generator=generator)
        ids = torch.randint(32, 127, (args.batch_per_rank, CONTEXT), generator=generator)
        ids[:, 30:] = EOS
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        out = model(input_ids=ids, pixel_values=images)
        inner = model.module if hasattr(model, "module") else model
        loss = global_loss(out.image_embeds, out.text_embeds, inner.logit_scale.exp(), rank, world)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step + 1:3d}  loss {losses[-1]:.4f}  {step_seconds[-1]:.3f} s", flush=True)
    peaks = every_rank_peak(world)
    result = {"parameters": parameters, "ranks": world, "wrap": args.wrap if world > 1 else "none",
              "torch_version": torch.__version__, "layers": args.layers, "dim": args.dim, "losses": losses,
              "median_step_seconds": statistics.median(step_seconds), "peak_resident_bytes_per_rank": peaks.tolist()}
    if rank == 0:
        print(f"torch_clip: {parameters} parameters, {world} rank(s), peak resident "
              f"{max(result['peak_resident_bytes_per_rank']) / 2**20:.1f} MiB (largest rank)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="blocks in each tower")
    parser.add_argument("--dim", type=int, default=128, help="width of both towers (a multiple of 64)")
    parser.add_argument("--batch-per-rank", type=int, default=1, help="image-caption pairs per rank per step")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="per rank (0: cores / ranks on this node)")
    parser.add_argument("--port", type=int, default=29518, help="gloo's rendezvous port on 127.0.0.1")
    parser.add_argument("--json", help="write the results here (rank 0)")
    parser.add_argument("--wrap", choices=("ddp", "fsdp2"), default="ddp", help="with more than one rank")
    args = parser.parse_args()
    if args.layers <= 0 or args.dim <= 0 or args.dim % 64 or args.batch_per_rank <= 0 or args.steps <= 0:
        sys.exit("torch_clip: need --layers, --batch-per-rank and --steps positive and --dim a positive multiple of 64")
    run_launched("torch_clip", train, args)


if __name__ == "__main__":
    main()
