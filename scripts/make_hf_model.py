#!/usr/bin/env python3
"""Make a small Hugging Face model directory with transformers' own save_pretrained (random
weights), standing in for a downloaded model where none can be downloaded: the loading code that
reads it is the real one, only the weights are small and random.

  python scripts/make_hf_model.py --family llama --out runs/hf/llama-tiny --tokenizer-dir ../shared/data/tokenizers/llama3
  python scripts/make_hf_model.py --family gpt2 --out /tmp/gpt2-tiny --dtype float16 --max-shard-size 200KB

Llama: 2 layers, hidden 64, 4 heads over 2 key/value heads (grouped-query attention), SwiGLU 128,
rms_norm_eps 1e-5, rope_theta 500000 with Llama 3.1's rope scaling (rope_type llama3) over an
original context of 16 (so it acts within short test sequences). With --tokenizer-dir, the
tokenizer's files are copied in and the vocabulary is the tokenizer's (Llama 3: 128,256).

Qwen2, Qwen3 and Mistral (the families built on Llama's decoder): the same layers and width, 4
heads over 2 key/value heads, SwiGLU 2 x hidden, rope_theta 1e6 (Mistral 1e4), no rope scaling.
Qwen2 has its q, k, v biases; Qwen3 its q_norm and k_norm and heads of head_dim (default 2 x
hidden / heads, so that they differ from hidden / heads); Mistral a sliding_window (default 8,
shorter than the test rows); Gemma 3 (Gemma3ForCausalLM) local and global layers (DECODER_FAMILIES
below). extra_config overrides any of them (num_attention_heads, ...).
"""
import argparse
import json
import os
import shutil
import sys


def make(family, out, vocab=512, dtype="float32", max_shard_size=None, tie=False, rope_scaling=True,
         tokenizer_dir=None, seed=0, layers=2, hidden=64, context=256, **extra_config):
    """extra_config: more config keys for the family's config class (GPT-2's n_inner, ...)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if tokenizer_dir:
        vocab = tokenizer_vocab(tokenizer_dir, vocab)
    if family == "llama":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 16} if rope_scaling else None
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, rms_norm_eps=1e-5,
            rope_theta=500000.0, rope_scaling=scaling, tie_word_embeddings=tie,
            bos_token_id=128000 if vocab > 128000 else 1, eos_token_id=128001 if vocab > 128001 else 2, **extra_config)
        model = transformers.LlamaForCausalLM(config)
    elif family in DECODER_FAMILIES:
        config_class, model_class, own = DECODER_FAMILIES[family]
        keys = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context, rms_norm_eps=1e-6,
                    tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2)
        keys.update(own(hidden))
        keys.update(extra_config)
        config = getattr(transformers, config_class)(**keys)
        model = getattr(transformers, model_class)(config)
    elif family == "gpt2":
        end = 50256 if vocab > 50256 else vocab - 1
        config = transformers.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=context,
                                         bos_token_id=end, eos_token_id=end, **extra_config)
        model = transformers.GPT2LMHeadModel(config)
    else:
        raise SystemExit(f"unknown family {family}")
    with torch.no_grad():  # larger than the default init, so logits differ visibly between positions
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.08)
            elif name.endswith("weight"):  # norm scales
                p.uniform_(0.5, 1.5)
            else:  # biases
                p.normal_(0.0, 0.1)
    model = model.to(getattr(torch, dtype))
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    if tokenizer_dir:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt"):
            if os.path.exists(os.path.join(tokenizer_dir, name)):
                shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(out, name))
    return out


# family -> (config class, model class, its own keys for a stand-in of width `hidden`)
DECODER_FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", lambda hidden: {"rope_theta": 1e6}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", lambda hidden: {"rope_theta": 1e6, "head_dim": 2 * hidden // 4}),
    "mistral": ("MistralConfig", "MistralForCausalLM", lambda hidden: {"rope_theta": 1e4, "sliding_window": 8}),
    # Gemma 3's text model: every 2nd layer global (linear rope factor 2), the others local with a
    # window of 8; heads 2 x hidden / 4 wide, scores scaled by 24^-1/2; always tied.
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", lambda hidden: {
        "head_dim": 2 * hidden // 4, "query_pre_attn_scalar": 24, "sliding_window": 8, "sliding_window_pattern": 2,
        "tie_word_embeddings": True, "pad_token_id": 0,
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}),
}


def tokenizer_vocab(tokenizer_dir, fallback):
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if os.path.exists(path):
        data = json.load(open(path))
        ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
        return max(ids) + 1
    path = os.path.join(tokenizer_dir, "vocab.json")
    if os.path.exists(path):
        return max(json.load(open(path)).values()) + 1
    return fallback


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=["llama", "gpt2"] + list(DECODER_FAMILIES), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--max-shard-size", default=None, help="e.g. 200KB: a sharded set with an index")
    parser.add_argument("--tie", action="store_true", help="tie the output head to the embedding (Llama)")
    parser.add_argument("--no-rope-scaling", action="store_true")
    parser.add_argument("--tokenizer-dir", default=None)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    if os.path.exists(args.out) and os.listdir(args.out):
        print(f"{args.out} exists; leaving it", file=sys.stderr)
        return
    make(args.family, args.out, args.vocab, args.dtype, args.max_shard_size, args.tie, not args.no_rope_scaling,
         args.tokenizer_dir, layers=args.layers, hidden=args.hidden, context=args.context)
    print(f"{args.out}: a {args.family} model directory (random weights, {args.dtype})")


if __name__ == "__main__":
    main()
