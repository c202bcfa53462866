#!/usr/bin/env python3
"""The families fine-tuned beside Llama: Qwen2 (Qwen2.5), Qwen3 and Mistral (built on Llama's
decoder) and Gemma 3's text model (its own), checked against transformers' own Qwen2ForCausalLM,
Qwen3ForCausalLM, MistralForCausalLM and Gemma3ForCausalLM.

transformers makes each directory (scripts/make_hf_model.py: save_pretrained, random weights
drawn larger than its init, so that logits differ visibly), and fsdp_hf_logits loads it the way
fsdp-train loads model.init_from. Every logit comparison is against transformers' forward of the
same directory in fp32, max |difference| within 1e-4.

1. Logits, per family, in shapes a user might not expect:
   - fp32, one file, a 509-token vocabulary and a width of 88 (neither divides by 3), 2 and 3 ranks;
   - bf16 as a sharded set with an index, multi-query attention (one key/value head), the head
     tied to the embedding, 3 ranks;
   - Qwen3's heads are 32 wide beside a 64-wide stream of 4 heads (head_dim 2 x hidden / heads);
     Mistral's window (8 positions) is shorter than the rows (48); Gemma 3 has a local layer
     (window 8) and a global one (linear rope factor 2), heads 44 wide, scores scaled by 24^-1/2.
   A packed row of three examples (data.packing) gives each example transformers' logits for it
   alone. The check sees what it guards against: each family's own part removed (Qwen2's q, k, v
   biases zeroed, Qwen3's q_norm and k_norm set to ones, Mistral's and Gemma's windows lifted) moves
   transformers' logits by far more than the tolerance.
2. Export: fsdp-ckpt import (2 ranks) then export --hf-dir (3 ranks) gives a directory whose
   model_type is the family's, which transformers loads with every tensor equal to the original's,
   and the same logits (1e-5).
3. LoRA in: peft's own adapter (lora_B drawn, "all-linear": Qwen2's biased q, k, v projections
   included) loads through lora.init_adapter at 3 ranks with peft's logits within 1e-4.
   LoRA out: fsdp-train fine-tunes adapters over each bf16 directory (2 ranks, 8 steps of the
   fortune instructions, activation checkpointing); the validation loss falls, and
   peft puts the adapter fsdp-ckpt exports (--peft-dir) on transformers' model of the same
   directory with fsdp.cpp's logits for the checkpoint within 1e-4.
   QLoRA: the same run with lora.base_dtype = "nf4"; peft puts its adapter on transformers' 4-bit
   model of the directory (bitsandbytes NF4, double quantization; each layer computing with
   bitsandbytes' dequantize_4bit) with fsdp.cpp's logits within 1e-3, and the check sees the
   quantization (over the unquantized base the logits differ by more than 1e-2).
4. The zoo's published sizes have transformers' parameter counts (the model built on the meta
   device from the hub's config.json values, written out below).
5. Refusals, by name: Qwen2's per-layer sliding window (use_sliding_window), Qwen3 with
   attention_bias, Gemma 3 with Gemma 2's final_logit_softcapping.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import check_hf_models as base  # noqa: E402  (its mpirun, logits tool and check)
import make_hf_model  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

LOGIT_TOLERANCE = 1e-4
EXPORT_TOLERANCE = 1e-5
FAMILIES = ("qwen2", "qwen3", "mistral", "gemma3")
check = base.check


def compare(args, work, name, model_dir, ids, ranks):
    reference = base.hf_logits(model_dir, ids)
    ours = base.our_logits(args, model_dir, ids, ranks, work)
    error = (ours - reference).abs().max().item()
    check(ours.shape == reference.shape and error < LOGIT_TOLERANCE,
          f"{name}: logits {list(ours.shape)} at {ranks} ranks within {LOGIT_TOLERANCE:g} of transformers' "
          f"(max |diff| {error:.2e}, logits' scale {reference.abs().max().item():.1f})")


def without_own_part(family, model_dir, out):
    """A copy of model_dir with the family's own part removed, as a loader that ignored it would compute."""
    shutil.copytree(model_dir, out)
    config_path = os.path.join(out, "config.json")
    config = json.load(open(config_path))
    if family in ("mistral", "gemma3"):
        config["sliding_window"] = None if family == "mistral" else 4096
        json.dump(config, open(config_path, "w"))
        return "the sliding window lifted"
    weights_path = os.path.join(out, "model.safetensors")
    weights = load_file(weights_path)
    for key in weights:
        if family == "qwen2" and key.endswith("_proj.bias"):
            weights[key] = torch.zeros_like(weights[key])
        if family == "qwen3" and (key.endswith("q_norm.weight") or key.endswith("k_norm.weight")):
            weights[key] = torch.ones_like(weights[key])
    save_file(weights, weights_path, metadata={"format": "pt"})
    return {"qwen2": "the q, k, v biases zeroed", "qwen3": "q_norm and k_norm set to ones"}[family]


def check_logits(args, work):
    torch.manual_seed(2)
    dirs = {}
    for family in FAMILIES:
        plain = os.path.join(work, f"{family}-fp32")
        make_hf_model.make(family, plain, vocab=509, hidden=88 if family != "qwen3" else 64, seed=5)
        dirs[family] = plain
        ids = torch.randint(0, 509, (2, 48))
        for ranks in (2, 3):
            compare(args, work, f"{family}-fp32 (vocab 509)", plain, ids, ranks)
        sharded = os.path.join(work, f"{family}-bf16-mqa-tied-sharded")
        make_hf_model.make(family, sharded, vocab=509, dtype="bfloat16", max_shard_size="30KB", tie=True, seed=6,
                           num_key_value_heads=1)
        check(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), f"{family}: a sharded set")
        compare(args, work, f"{family}-bf16-mqa-tied-sharded", sharded, ids, 3)
        # Packed rows: three examples and padding, positions restarting at 0 for each.
        lengths = [13, 20, 11]
        positions = torch.cat([torch.arange(n) for n in lengths + [48 - sum(lengths)]]).view(1, 48)
        row = ids[:1]
        ours = base.our_logits(args, plain, row, 2, work, positions=positions)
        error, start = 0.0, 0
        for n in lengths:
            error = max(error, (ours[:, start:start + n] - base.hf_logits(plain, row[:, start:start + n])).abs().max().item())
            start += n
        check(error < LOGIT_TOLERANCE, f"{family}: a packed row of {len(lengths)} examples gives each transformers' logits "
                                       f"for it alone within {LOGIT_TOLERANCE:g} (max |diff| {error:.2e})")
        removed = os.path.join(work, f"{family}-without")
        what = without_own_part(family, plain, removed)
        moved = (base.hf_logits(removed, ids) - base.hf_logits(plain, ids)).abs().max().item()
        check(moved > 100 * LOGIT_TOLERANCE, f"{family}: its own part matters here: with {what} the logits move by {moved:.2e}")
    return dirs


def check_export(args, work, dirs):
    for family, source in dirs.items():
        exported = base.import_then_export(args, source, work, family, "--max-file-size", "60KB")
        config = json.load(open(os.path.join(exported, "config.json")))
        model_type = {"gemma3": "gemma3_text"}.get(family, family)
        check(config.get("model_type") == model_type, f"{family}: the export's model_type is {config.get('model_type')}")
        original = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
        loaded = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).state_dict()
        mismatched = [k for k in original if k not in loaded or not torch.equal(loaded[k], original[k])]
        check(not mismatched and set(loaded) == set(original),
              f"{family}: from_pretrained(exported) has every tensor equal to the original's ({len(original)} tensors; "
              f"mismatched: {mismatched[:3]})")
        ids = torch.randint(0, 509, (2, 40))
        error = (base.hf_logits(exported, ids) - base.hf_logits(source, ids)).abs().max().item()
        check(error < EXPORT_TOLERANCE, f"{family}: exported logits within {EXPORT_TOLERANCE:g} of the original's ({error:.2e})")


def check_lora_import(args, work):
    try:
        import peft
    except ImportError:
        check(False, "LoRA: peft, the reference, is not installed (scripts/requirements-peers.txt; scripts/test.sh installs it)")
        return
    ids = torch.randint(0, 509, (2, 40))
    for family in FAMILIES:
        model_dir, adapter = os.path.join(work, f"{family}-lora-base"), os.path.join(work, f"{family}-adapter")
        make_hf_model.make(family, model_dir, vocab=509, dtype="bfloat16", seed=7)
        model = base.peft_adapter(peft, model_dir, adapter, "all-linear", seed=8)
        with torch.no_grad():
            theirs = model(ids).logits
            with model.disable_adapter():
                moved = (model(ids).logits - theirs).abs().max().item()
        ours = base.our_logits(args, model_dir, ids, 3, work, adapter=adapter)
        error = (ours - theirs).abs().max().item()
        targets = json.load(open(os.path.join(adapter, "adapter_config.json")))["target_modules"]
        check(moved > 1e-3 and error < LOGIT_TOLERANCE,
              f"{family}: peft's own all-linear adapter ({len(targets)} targets) loaded by fsdp.cpp at 3 ranks gives "
              f"peft's logits within {LOGIT_TOLERANCE:g} ({error:.2e}; the adapter moves them by {moved:.2e})")


QLORA_LOGIT_TOLERANCE = 1e-3


def bitsandbytes_4bit(model_dir):
    """transformers' 4-bit model of `model_dir` (NF4, double quantization, fp32 compute), everything
    else widened to fp32, each Linear4bit computing with bitsandbytes' own dequantize_4bit of its
    weight (its CPU gemm_4bit is about bf16-accurate; check_hf_models.py's QLoRA part says more)."""
    import bitsandbytes
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                   bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization, device_map="cpu")
    for parameter in model.parameters():
        if parameter.dtype == torch.bfloat16:
            parameter.data = parameter.data.float()
    layers = 0
    for module in model.modules():
        if type(module).__name__ == "Linear4bit":
            def forward(x, module=module):
                weight = bitsandbytes.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
                bias = module.bias.float() if module.bias is not None else None
                return torch.nn.functional.linear(x.to(torch.float32), weight.to(torch.float32), bias)
            module.forward = forward
            layers += 1
    return model.eval(), layers


def check_lora_training(args, work):
    try:
        import peft
    except ImportError:
        return  # said by check_lora_import
    data = os.path.join(work, "chat.jsonl")
    subprocess.run([os.path.join(args.build_dir, "apps", "fsdp-data"), "instructions", "--format", "prompt-completion",
                    "--output", data], check=True, capture_output=True)
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        check(False, "QLoRA: bitsandbytes, the reference, is not installed (scripts/requirements-peers.txt)")
    ids = torch.randint(0, 256, (2, 40))
    for family, base_dtype in [(f, d) for f in FAMILIES for d in ("bfloat16", "nf4")]:
        label = family + ("-qlora" if base_dtype == "nf4" else "-lora")
        model_dir, out = os.path.join(work, f"{family}-lora-base"), os.path.join(work, f"{label}-run")
        config = os.path.join(work, f"{label}.toml")
        with open(config, "w") as f:
            f.write(f"""name = "{label}"
output_dir = "{out}"
[model]
init_from = "{model_dir}"
[data]
source = "instructions"
tokenizer = "byte"
chat_format = "plain"
train_jsonl = "{data}"
validation_percent = 2
[train]
steps = 8
global_batch = 8
seq_len = 128
threads = 1
[fsdp]
activation_checkpointing = true
[optimizer]
lr = 1e-2
warmup_steps = 1
weight_decay = 0.0
[eval]
every = 8
batches = 2
sample_tokens = 0
[checkpoint]
every = 8
[lora]
rank = 4
alpha = 8
targets = "all-linear"
base_dtype = "{base_dtype}"
""")
        base.mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-train"), config, "--progress", "lines"])
        metrics = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        evals = [m["validation_loss"] for m in metrics if "validation_loss" in m]
        checkpoint = os.path.join(out, "checkpoints", sorted(os.listdir(os.path.join(out, "checkpoints")))[-1])
        adapter = os.path.join(work, f"{label}-trained-adapter")
        base.mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-ckpt"), "export", checkpoint, "--peft-dir", adapter])
        ours = base.our_logits(args, checkpoint, ids, 2, work)
        plain = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        plain = peft.PeftModel.from_pretrained(plain, adapter).eval()
        with torch.no_grad():
            over_plain = plain(ids).logits
        trained = f"validation loss {' -> '.join(f'{v:.3f}' for v in evals)}"
        if base_dtype == "bfloat16":
            error = (ours - over_plain).abs().max().item()
            check(len(evals) == 2 and evals[1] < evals[0] - 0.1 and error < LOGIT_TOLERANCE,
                  f"{family}: fsdp-train's LoRA run ({trained}), its adapter exported with --peft-dir, gives peft "
                  f"fsdp.cpp's logits within {LOGIT_TOLERANCE:g} ({error:.2e})")
            continue
        try:
            four_bit, layers = bitsandbytes_4bit(model_dir)
        except ImportError:
            continue
        with torch.no_grad():
            theirs = peft.PeftModel.from_pretrained(four_bit, adapter).eval()(ids).logits
        error = (ours - theirs).abs().max().item()
        unquantized = (ours - over_plain).abs().max().item()
        check(len(evals) == 2 and evals[1] < evals[0] and error < QLORA_LOGIT_TOLERANCE and
              unquantized > 10 * QLORA_LOGIT_TOLERANCE,
              f"{family}: fsdp-train's QLoRA run (lora.base_dtype nf4; {trained}): peft with its adapter over "
              f"transformers' 4-bit base ({layers} Linear4bit layers) gives fsdp.cpp's logits within "
              f"{QLORA_LOGIT_TOLERANCE:g} ({error:.2e}; over the unquantized base they differ by {unquantized:.2e})")


# The hub's config.json values of the zoo's published sizes (Qwen/Qwen2.5-*, Qwen/Qwen3-*,
# mistralai/*): hidden, layers, heads, kv heads, intermediate, vocab, tied, and head_dim where set.
PUBLISHED = {
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", 896, 24, 14, 2, 4864, 151936, True, None),
    "qwen2.5-1.5b": ("Qwen2Config", "Qwen2ForCausalLM", 1536, 28, 12, 2, 8960, 151936, True, None),
    "qwen2.5-3b": ("Qwen2Config", "Qwen2ForCausalLM", 2048, 36, 16, 2, 11008, 151936, True, None),
    "qwen2.5-7b": ("Qwen2Config", "Qwen2ForCausalLM", 3584, 28, 28, 4, 18944, 152064, False, None),
    "qwen2.5-14b": ("Qwen2Config", "Qwen2ForCausalLM", 5120, 48, 40, 8, 13824, 152064, False, None),
    "qwen2.5-32b": ("Qwen2Config", "Qwen2ForCausalLM", 5120, 64, 40, 8, 27648, 152064, False, None),
    "qwen2.5-72b": ("Qwen2Config", "Qwen2ForCausalLM", 8192, 80, 64, 8, 29568, 152064, False, None),
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM", 1024, 28, 16, 8, 3072, 151936, True, 128),
    "qwen3-1.7b": ("Qwen3Config", "Qwen3ForCausalLM", 2048, 28, 16, 8, 6144, 151936, True, 128),
    "qwen3-4b": ("Qwen3Config", "Qwen3ForCausalLM", 2560, 36, 32, 8, 9728, 151936, True, 128),
    "qwen3-8b": ("Qwen3Config", "Qwen3ForCausalLM", 4096, 36, 32, 8, 12288, 151936, False, 128),
    "qwen3-14b": ("Qwen3Config", "Qwen3ForCausalLM", 5120, 40, 40, 8, 17408, 151936, False, 128),
    "qwen3-32b": ("Qwen3Config", "Qwen3ForCausalLM", 5120, 64, 64, 8, 25600, 151936, False, 128),
    "mistral-7b": ("MistralConfig", "MistralForCausalLM", 4096, 32, 32, 8, 14336, 32000, False, None),
    "mistral-7b-v0.3": ("MistralConfig", "MistralForCausalLM", 4096, 32, 32, 8, 14336, 32768, False, None),
    "mistral-nemo-12b": ("MistralConfig", "MistralForCausalLM", 5120, 40, 32, 8, 14336, 131072, False, 128),
    # google/gemma-3-1b-pt's config.json; the 4B-27B models' text_config (their language model alone).
    "gemma3-1b": ("Gemma3TextConfig", "Gemma3ForCausalLM", 1152, 26, 4, 1, 6912, 262144, True, 256),
    "gemma3-4b": ("Gemma3TextConfig", "Gemma3ForCausalLM", 2560, 34, 8, 4, 10240, 262208, True, 256),
    "gemma3-12b": ("Gemma3TextConfig", "Gemma3ForCausalLM", 3840, 48, 16, 8, 15360, 262208, True, 256),
    "gemma3-27b": ("Gemma3TextConfig", "Gemma3ForCausalLM", 5376, 62, 32, 16, 21504, 262208, True, 128),
}


def check_parameter_counts(args):
    listing = subprocess.run([os.path.join(args.build_dir, "apps", "fsdp-train"), "--list-models"], capture_output=True,
                             text=True, check=True).stdout
    counts = {line.split()[0]: int(line.split()[2].replace(",", "")) for line in listing.splitlines()
              if len(line.split()) > 2 and line.split()[2].replace(",", "").isdigit()}
    for name, (config_class, model_class, hidden, layers, heads, kv, ffn, vocab, tied, head_dim) in PUBLISHED.items():
        keys = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                    intermediate_size=ffn, vocab_size=vocab, tie_word_embeddings=tied)
        if head_dim:
            keys["head_dim"] = head_dim
        with torch.device("meta"):
            model = getattr(transformers, model_class)(getattr(transformers, config_class)(**keys))
        theirs = sum(p.numel() for p in model.parameters())
        ours = counts.get(name, -1)
        check(ours == theirs, f"{name}: {ours:,} parameters in the zoo, transformers' {model_class} {theirs:,}")


def check_refusals(args, work, dirs):
    ids = {"ids": torch.randint(0, 509, (1, 16))}
    for family, key, value, expected in (("qwen2", "use_sliding_window", True, "use_sliding_window true"),
                                         ("qwen3", "attention_bias", True, "attention_bias = true is not supported"),
                                         ("gemma3", "final_logit_softcapping", 30.0,
                                          "final_logit_softcapping = 30.0 is not supported")):
        edited = os.path.join(work, f"{family}-{key}")
        shutil.copytree(dirs[family], edited)
        config = json.load(open(os.path.join(edited, "config.json")))
        config[key] = value
        json.dump(config, open(os.path.join(edited, "config.json"), "w"))
        base.refused(args, work, edited, ids, expected, f"{family} with {key} = {json.dumps(value)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("--work", default=None, help="keep the directories here (default: a temporary one)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    work = args.work or tempfile.mkdtemp(prefix="fsdp-decoder-families-")
    os.makedirs(work, exist_ok=True)
    dirs = check_logits(args, work)
    check_export(args, work, dirs)
    check_lora_import(args, work)
    check_lora_training(args, work)
    check_parameter_counts(args)
    check_refusals(args, work, dirs)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if base.failures:
        print(f"\n{len(base.failures)} check(s) failed:")
        for failure in base.failures:
            print("  " + failure)
        return 1
    print("\nall checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
