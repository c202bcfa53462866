#!/usr/bin/env python3
"""Make a Llama 3.1 8B directory at its real shape, with random bf16 weights, as the Hub ships it:
config.json with the published values (32 layers, width 4096, 32 heads over 8 key/value heads,
SwiGLU 14336, vocabulary 128,256, rope_theta 500000 with Llama 3.1's rope scaling), four
safetensors shards with model.safetensors.index.json, generation_config.json and the Llama 3
tokenizer. 8,030,261,248 parameters, 16.06 GB.

Weights cannot be downloaded here; the point is the size and the files, so that loading,
quantizing and training read what a real checkpoint would give them. The file is written tensor
by tensor (safetensors' format: an 8-byte header length, the JSON header, then the tensors' bytes),
so making it holds one tensor at a time (the embedding, 1 GB at most), never the model.
Weights as transformers initializes a Llama: normal(0, initializer_range = 0.02), norms 1.

  .venv/bin/python bench/make_llama8b.py --out runs/models/llama-3.1-8b-random
  .venv/bin/python bench/make_llama8b.py --out /tmp/l --layers 2   (the same files, 2 layers: a check)
  .venv/bin/python bench/make_llama8b.py --model qwen2.5-14b --out runs/models/qwen2.5-14b-random

About 2 minutes and 16 GB of disk here (2 cores). An existing directory is refused, never replaced.
"""
import argparse
import json
import os
import shutil
import struct
import sys

# Llama 3.1 8B's config.json as published (meta-llama/Llama-3.1-8B), the keys transformers reads.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}
# Qwen2.5 14B's config.json as published (Qwen/Qwen2.5-14B): 48 layers, width 5120, GQA 40/8,
# SwiGLU 13824, vocabulary 152,064, biases on q, k and v. 14,770,033,664 parameters, 29.5 GB: the
# largest model of the zoo fsdp-plan --fit finds room for at N = 2 on this 24 GiB machine (issue 55).
# bos/eos are the Llama 3 tokenizer's, which the directory carries (Qwen's is not among the
# project's shared files; its ids all lie inside this vocabulary).
QWEN25_14B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 13824,
    "max_position_embeddings": 131072,
    "max_window_layers": 48,
    "model_type": "qwen2",
    "num_attention_heads": 40,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 152064,
}
# --model: its config.json and how many safetensors files the Hub splits it into.
MODELS = {"llama-3.1-8b": (CONFIG, 4), "qwen2.5-14b": (QWEN25_14B, 8)}


def tensors(config):
    """(name, shape, init) in the order of the Hub's files: 'normal', 'ones' or 'zeros'."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = hidden // heads
    yield "model.embed_tokens.weight", (config["vocab_size"], hidden), "normal"
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (hidden,), "ones"
        yield p + "self_attn.q_proj.weight", (heads * head_dim, hidden), "normal"
        yield p + "self_attn.k_proj.weight", (kv_heads * head_dim, hidden), "normal"
        yield p + "self_attn.v_proj.weight", (kv_heads * head_dim, hidden), "normal"
        if config["model_type"] == "qwen2":  # Qwen2's q, k and v carry biases (zeros, as transformers initializes)
            yield p + "self_attn.q_proj.bias", (heads * head_dim,), "zeros"
            yield p + "self_attn.k_proj.bias", (kv_heads * head_dim,), "zeros"
            yield p + "self_attn.v_proj.bias", (kv_heads * head_dim,), "zeros"
        yield p + "self_attn.o_proj.weight", (hidden, heads * head_dim), "normal"
        yield p + "post_attention_layernorm.weight", (hidden,), "ones"
        yield p + "mlp.gate_proj.weight", (inter, hidden), "normal"
        yield p + "mlp.up_proj.weight", (inter, hidden), "normal"
        yield p + "mlp.down_proj.weight", (hidden, inter), "normal"
    yield "model.norm.weight", (hidden,), "ones"
    yield "lm_head.weight", (config["vocab_size"], hidden), "normal"


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def split_into_shards(entries, shards):
    """Consecutive runs of about equal bytes (bf16: 2 bytes an element), as save_pretrained cuts."""
    total = sum(2 * numel(shape) for _, shape, _ in entries)
    target = total / shards
    groups, current, size = [], [], 0
    for entry in entries:
        nbytes = 2 * numel(entry[1])
        if current and size + nbytes > target * 1.02 and len(groups) < shards - 1:
            groups.append(current)
            current, size = [], 0
        current.append(entry)
        size += nbytes
    groups.append(current)
    return groups, total


def write_shard(path, entries, generator, std):
    import torch

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape, _ in entries:
        nbytes = 2 * numel(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the tensors start 8-byte aligned, as safetensors writes them
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name, shape, init in entries:
            if init in ("ones", "zeros"):
                t = (torch.ones if init == "ones" else torch.zeros)(shape, dtype=torch.bfloat16)
            else:
                t = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=generator).to(torch.bfloat16)
            f.write(t.view(torch.int16).numpy().tobytes())
            del t


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the directory to make (must not exist)")
    parser.add_argument("--model", choices=sorted(MODELS), default="llama-3.1-8b", help="the published shape")
    parser.add_argument("--layers", type=int, default=None,
                        help="fewer layers for a quick check of the files (default: the real model's)")
    parser.add_argument("--tokenizer-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                                "data", "tokenizers", "llama3"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    if os.path.exists(args.out):
        sys.exit(f"make_llama8b: {args.out} exists; give a new directory (nothing there is replaced)")
    base, shards = MODELS[args.model]
    config = dict(base, num_hidden_layers=args.layers or base["num_hidden_layers"])
    if "max_window_layers" in config:
        config["max_window_layers"] = config["num_hidden_layers"]
    entries = list(tensors(config))
    groups, total = split_into_shards(entries, shards)
    parent = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(parent, exist_ok=True)  # a fresh checkout has no runs/models/ yet
    free = shutil.disk_usage(parent).free
    if free < total * 1.05:
        sys.exit(f"make_llama8b: {total / 1e9:.2f} GB of weights, {free / 1e9:.2f} GB free beside {args.out}")

    # Written into OUT.partial and renamed when complete: an interrupted run leaves no directory
    # that looks whole.
    partial = args.out.rstrip("/") + ".partial"
    if os.path.exists(partial):
        sys.exit(f"make_llama8b: {partial} exists (an interrupted run?); remove it first")
    os.makedirs(partial)
    generator = torch.Generator().manual_seed(args.seed)
    weight_map = {}
    for index, group in enumerate(groups):
        file = f"model-{index + 1:05d}-of-{len(groups):05d}.safetensors"
        write_shard(os.path.join(partial, file), group, generator, config["initializer_range"])
        weight_map.update({name: file for name, _, _ in group})
        print(f"make_llama8b: {file}: {len(group)} tensors, {sum(2 * numel(s) for _, s, _ in group) / 1e9:.2f} GB",
              flush=True)
    with open(os.path.join(partial, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(partial, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(partial, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"],
                   "do_sample": True, "temperature": 0.6, "top_p": 0.9}, f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(partial, name))
    os.rename(partial, args.out)
    parameters = sum(numel(s) for _, s, _ in entries)
    print(f"make_llama8b: {args.out}: {parameters:,} parameters, {total / 1e9:.2f} GB in {len(groups)} files")


if __name__ == "__main__":
    main()
