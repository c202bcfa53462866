#!/usr/bin/env python3
"""LLaVA directories in and out, checked against transformers' LlavaForConditionalGeneration itself.

1. Logits. transformers makes small LLaVA directories (save_pretrained, random weights drawn larger
   than its init, norms moved off their ones): a CLIP image tower of three blocks on 28x28
   greyscale images in 7x7 patches (16 patches), read at vision_feature_layer -2 (the second
   block's output), a two-layer gelu projector, and a two-block Llama over 300 tokens with the
   image token 257; in fp32 as one file (2 ranks), in bf16 as a sharded set with an index (3
   ranks), with the class token kept (strategy "full", 17 image tokens; 2 ranks), and as the
   hub's older files name the tower (vision_tower.vision_model.*; 2 ranks). fsdp_hf_logits loads
   each the way fsdp-train loads model.init_from, and its logits [b, t, vocab] for random images
   and token rows (the image tokens at a different place in each row) must equal transformers'
   forward of the same directory within 1e-4. The check can see what it guards against: reading
   the tower's last block (vision_feature_layer -1) moves transformers' own logits by far more.
2. Export. fsdp-ckpt import (2 ranks) then fsdp-ckpt export --hf-dir (3 ranks) gives a directory
   that from_pretrained loads as a LlavaForConditionalGeneration with every tensor equal to the
   original's and the same logits.
3. The zoo's llava-1.5-7b has transformers' parameter count (the model built on the meta device).
4. Refusals, one line each: a tensor LLaVA has not named; projector_hidden_act other than gelu;
   features of several layers (vision_feature_layer a list).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

IMAGE_TOKEN = 257
VOCAB = 300
PATCHES = 16

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_models import (EXPORT_TOLERANCE, LOGIT_TOLERANCE, check, failures, import_then_export, logits_tool,  # noqa: E402
                             refused)


def llava_config(strategy="default", **extra):
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
                                           image_size=28, patch_size=7, num_channels=1, hidden_act="quick_gelu")
    text = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=IMAGE_TOKEN,
                                    vision_feature_select_strategy=strategy, **extra)


def make_llava(out, dtype=torch.float32, max_shard_size=None, seed=0, strategy="default", **extra):
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(llava_config(strategy, **extra))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:  # biases, the class embedding
                p.normal_(0.0, 0.1)
    model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    return out


def inputs(seed=1, rows=3, length=40, image_tokens=PATCHES):
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(rows, 1, 28, 28, generator=generator)
    ids = torch.randint(0, 256, (rows, length), generator=generator)
    for row in range(rows):  # the image's tokens at a different place in each row
        start = 2 + 5 * row
        ids[row, start:start + image_tokens] = IMAGE_TOKEN
    return pixels, ids


def hf_logits(model_dir, pixels, ids, feature_layer=None):
    model = transformers.LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    if feature_layer is not None:  # the rule the check guards against
        model.config.vision_feature_layer = feature_layer
        model.model.config.vision_feature_layer = feature_layer
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pixels, vision_feature_layer=model.config.vision_feature_layer).logits


def our_logits(args, model_dir, pixels, ids, ranks, work):
    return logits_tool(args, model_dir, {"ids": ids, "images": pixels}, ranks, work)


def rename_tower_as_the_hub_does(model_dir):
    """The hub's llava-hf files name the tower vision_tower.vision_model.*; transformers 5 saves vision_tower.*."""
    path = os.path.join(model_dir, "model.safetensors")
    weights = load_file(path)
    renamed = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
               for k, v in weights.items()}
    save_file(renamed, path, metadata={"format": "pt"})
    return sorted(k for k in renamed if k.startswith("vision_tower."))[0]


def check_logits(args, work):
    pixels, ids = inputs()
    full_pixels, full_ids = inputs(seed=2, image_tokens=PATCHES + 1)
    hub = make_llava(os.path.join(work, "llava-hub-names"), seed=4)
    cases = [("llava fp32, one file", make_llava(os.path.join(work, "llava-fp32")), 2, pixels, ids),
             ("llava bf16, sharded set", make_llava(os.path.join(work, "llava-bf16"), torch.bfloat16, "60KB", seed=3), 3, pixels, ids),
             ("llava, class token kept (\"full\")", make_llava(os.path.join(work, "llava-full"), seed=6, strategy="full"), 2, full_pixels,
              full_ids)]
    for label, model_dir, ranks, x, t in cases:
        files = sorted(os.listdir(model_dir))
        reference = hf_logits(model_dir, x, t)
        ours = our_logits(args, model_dir, x, t, ranks, work)
        error = (ours - reference).abs().max().item()
        check(ours.shape == reference.shape and error < LOGIT_TOLERANCE,
              f"{label} ({', '.join(files[:3])}{' ...' if len(files) > 3 else ''}) at {ranks} ranks: logits "
              f"{list(ours.shape)} within {LOGIT_TOLERANCE:g} of transformers' ({error:.2e})")
    reference = hf_logits(hub, pixels, ids)
    first = rename_tower_as_the_hub_does(hub)
    ours = our_logits(args, hub, pixels, ids, 2, work)
    error = (ours - reference).abs().max().item()
    check(error < LOGIT_TOLERANCE, f"llava with the hub's tensor names ({first}, ...) at 2 ranks: logits within "
                                   f"{LOGIT_TOLERANCE:g} of transformers' ({error:.2e})")
    moved = (hf_logits(cases[0][1], pixels, ids, feature_layer=-1) - hf_logits(cases[0][1], pixels, ids)).abs().max().item()
    check(moved > 100 * LOGIT_TOLERANCE, f"the check sees the layer read: the tower's last block (vision_feature_layer -1) "
                                         f"moves transformers' logits by {moved:.2e}")


def check_export(args, work):
    source = make_llava(os.path.join(work, "llava-export"), seed=5)
    exported = import_then_export(args, source, work, "llava")
    original = transformers.LlavaForConditionalGeneration.from_pretrained(source, dtype=torch.float32).state_dict()
    loaded = transformers.LlavaForConditionalGeneration.from_pretrained(exported, dtype=torch.float32)
    state = loaded.state_dict()
    mismatched = [k for k, v in state.items() if k not in original or not torch.equal(v, original[k])]
    check(not mismatched and len(state) == len(original),
          f"export: from_pretrained(exported) is a LlavaForConditionalGeneration with every tensor equal to the original's "
          f"({len(original)} tensors; mismatched: {mismatched[:3]})")
    pixels, ids = inputs(seed=7)
    error = (hf_logits(exported, pixels, ids) - hf_logits(source, pixels, ids)).abs().max().item()
    check(error < EXPORT_TOLERANCE, f"export: the exported directory's logits within {EXPORT_TOLERANCE:g} of the original's ({error:.2e})")


def check_parameter_count(args):
    vision = transformers.CLIPVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                                           image_size=336, patch_size=14, projection_dim=768, hidden_act="quick_gelu")
    text = transformers.LlamaConfig(vocab_size=32064, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                                    num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5)
    with torch.device("meta"):
        model = transformers.LlavaForConditionalGeneration(
            transformers.LlavaConfig(vision_config=vision, text_config=text, image_token_index=32000))
    theirs = sum(p.numel() for p in model.parameters())
    train = os.path.join(args.build_dir, "apps", "fsdp-train")
    listing = subprocess.run([train, "--list-models"], capture_output=True, text=True, check=True).stdout
    line = [l for l in listing.splitlines() if l.split() and l.split()[0] == "llava-1.5-7b"]
    ours = int(line[0].split()[2].replace(",", "")) if line else -1
    check(ours == theirs, f"llava-1.5-7b: {ours:,} parameters in the zoo, transformers' LlavaForConditionalGeneration {theirs:,}")


def refusal(args, work, model_dir, expected, what):
    pixels, ids = inputs()
    refused(args, work, model_dir, {"ids": ids, "images": pixels}, expected, what)


def edit_config(model_dir, **changes):
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(changes)
    with open(path, "w") as f:
        json.dump(config, f)


def check_refusals(args, work):
    extra = make_llava(os.path.join(work, "llava-extra-key"), seed=9)
    weights = load_file(os.path.join(extra, "model.safetensors"))
    weights["multi_modal_projector.linear_3.weight"] = torch.zeros(32, 32)
    save_file(weights, os.path.join(extra, "model.safetensors"), metadata={"format": "pt"})
    refusal(args, work, extra, "'multi_modal_projector.linear_3.weight' is not part of the LLaVA model", "a tensor LLaVA has not")

    relu = make_llava(os.path.join(work, "llava-relu"), seed=9)
    edit_config(relu, projector_hidden_act="relu")
    refusal(args, work, relu, "projector_hidden_act = \"relu\" is not supported", "another projector activation")

    layers = make_llava(os.path.join(work, "llava-layers"), seed=9)
    edit_config(layers, vision_feature_layer=[-2, -1])
    refusal(args, work, layers, "vision_feature_layer = [-2,-1] is not supported", "features of several layers")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fsdp_llava_") as work:
        check_logits(args, work)
        check_export(args, work)
        check_parameter_count(args)
        check_refusals(args, work)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
