#!/usr/bin/env python3
"""CLIP directories in and out, checked against transformers' CLIPModel itself.

1. Logits. transformers makes small CLIPModel directories (save_pretrained, random weights drawn
   larger than its init, norms and logit_scale moved off their defaults): 28x28 greyscale images
   in 7x7 patches, a byte vocabulary of 257 with eos_token_id 256, two blocks a tower; in fp32 as
   one file, and in bf16 as a sharded set with an index; and one whose towers' configs keep
   transformers' default projection_dim (512) beside the model's 16, which CLIPModel loads and
   ignores (it projects with the top-level value). fsdp_hf_logits loads each the way
   fsdp-train loads model.init_from (config.json; each rank reads its slice) at 2 and 3 ranks, and
   its logits_per_image for random images against byte captions (each ending at its first eos,
   padding after it) must equal transformers' forward of the same directory within 1e-4. The check
   can see what it guards against: pooling each caption at its last token instead of its first eos
   (the legacy rule) moves transformers' own logits by far more.
2. Export. fsdp-ckpt import (2 ranks) then fsdp-ckpt export --hf-dir (3 ranks) gives a directory
   that from_pretrained loads as a CLIPModel with every tensor equal to the original's (logit_scale,
   a 0-D parameter, included) and the same logits.
3. LoRA on the towers. peft's own adapter over a transformers-made CLIPModel (q_proj and v_proj of
   both towers, lora_B drawn, not zero) loads through lora.init_adapter: fsdp.cpp's logits_per_image
   equal the PeftModel's within 1e-4 at 2 ranks; the adapter moves them (so the check sees it). And
   out: a 2-step fsdp-train LoRA run from that base, exported with --peft-dir, loads with peft over
   CLIPModel with the checkpoint's logits.
4. Refusals, one line each: a tensor CLIPModel has not (a bias on visual_projection) named; a
   hidden_act other than quick_gelu; the legacy eos_token_id 2.
"""
import argparse
import json
import os
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file, save_file

EOS = 256
CONTEXT = 48

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_hf_models import (EXPORT_TOLERANCE, LOGIT_TOLERANCE, check, failures, import_then_export, logits_tool, mpirun,  # noqa: E402
                             refused)


def make_clip(out, dtype=torch.float32, max_shard_size=None, seed=0, **text_extra):
    torch.manual_seed(seed)
    text = dict(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                max_position_embeddings=CONTEXT, eos_token_id=EOS, bos_token_id=EOS, pad_token_id=EOS, projection_dim=16)
    text.update(text_extra)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                  patch_size=7, num_channels=1, projection_dim=16)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    model = transformers.CLIPModel(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "logit_scale":
                p.fill_(2.0)
            elif p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif "norm" in name and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
            else:  # biases, the class embedding
                p.normal_(0.0, 0.1)
    model = model.to(dtype)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    return out


def inputs(seed=1, images=5, captions=4):
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(images, 1, 28, 28, generator=generator)
    ids = torch.full((captions, CONTEXT), EOS, dtype=torch.long)
    for row in range(captions):  # bytes, then eos at different places, then eos padding
        length = 6 + 7 * row
        ids[row, :length] = torch.randint(32, 127, (length,), generator=generator)
    return pixels, ids


def hf_logits(model_dir, pixels, ids, legacy_pooling=False):
    model = transformers.CLIPModel.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    if legacy_pooling:  # the rule the check guards against: each caption read at its last token
        model.text_model.eos_token_id = 2
        ids = ids.clone()
        ids[ids == EOS] = 0
        ids[:, -1] = EOS
    with torch.no_grad():
        return model(input_ids=ids, pixel_values=pixels).logits_per_image


def our_logits(args, model_dir, pixels, ids, ranks, work):
    return logits_tool(args, model_dir, {"ids": ids, "images": pixels}, ranks, work)


def check_logits(args, work):
    pixels, ids = inputs()
    cases = [("clip fp32, one file", make_clip(os.path.join(work, "clip-fp32")), 2),
             ("clip bf16, sharded set", make_clip(os.path.join(work, "clip-bf16"), torch.bfloat16, "60KB", seed=3), 3),
             ("clip, text_config.projection_dim 512 beside the model's 16",
              make_clip(os.path.join(work, "clip-tower-projection"), seed=4, projection_dim=512), 2)]
    for label, model_dir, ranks in cases:
        files = sorted(os.listdir(model_dir))
        reference = hf_logits(model_dir, pixels, ids)
        ours = our_logits(args, model_dir, pixels, ids, ranks, work)
        error = (ours - reference).abs().max().item()
        check(ours.shape == reference.shape and error < LOGIT_TOLERANCE,
              f"{label} ({', '.join(files[:3])}{' ...' if len(files) > 3 else ''}) at {ranks} ranks: logits_per_image "
              f"{list(ours.shape)} within {LOGIT_TOLERANCE:g} of transformers' ({error:.2e})")
    legacy = (hf_logits(cases[0][1], pixels, ids, legacy_pooling=True) - hf_logits(cases[0][1], pixels, ids)).abs().max().item()
    check(legacy > 100 * LOGIT_TOLERANCE, f"the check sees the pooling rule: reading each caption at its last token moves "
                                          f"transformers' logits by {legacy:.2e}")


def check_export(args, work):
    source = make_clip(os.path.join(work, "clip-export"), seed=5)
    exported = import_then_export(args, source, work, "clip")
    original = transformers.CLIPModel.from_pretrained(source, dtype=torch.float32).state_dict()
    loaded = transformers.CLIPModel.from_pretrained(exported, dtype=torch.float32)
    mismatched = [k for k, v in loaded.state_dict().items() if k in original and not torch.equal(v, original[k])]
    check(not mismatched and torch.equal(loaded.logit_scale, original["logit_scale"]),
          f"export: from_pretrained(exported) is a CLIPModel with every tensor equal to the original's "
          f"({len(original)} tensors, logit_scale {loaded.logit_scale.item():.4f}; mismatched: {mismatched[:3]})")
    pixels, ids = inputs(seed=7)
    error = (hf_logits(exported, pixels, ids) - hf_logits(source, pixels, ids)).abs().max().item()
    check(error < EXPORT_TOLERANCE, f"export: the exported directory's logits within {EXPORT_TOLERANCE:g} of the original's ({error:.2e})")


def check_peft(args, work):
    import peft
    base = make_clip(os.path.join(work, "clip-lora-base"), seed=11)
    adapter = os.path.join(work, "clip-lora-adapter")
    torch.manual_seed(12)
    model = peft.get_peft_model(transformers.CLIPModel.from_pretrained(base, dtype=torch.float32),
                                peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
    model.save_pretrained(adapter)
    model.eval()
    pixels, ids = inputs(seed=13)
    with torch.no_grad():
        theirs = model(input_ids=ids, pixel_values=pixels).logits_per_image
    ours = logits_tool(args, base, {"ids": ids, "images": pixels}, 2, work, adapter=adapter)
    error = (ours - theirs).abs().max().item()
    moved = (theirs - hf_logits(base, pixels, ids)).abs().max().item()
    check(error < LOGIT_TOLERANCE and moved > 100 * LOGIT_TOLERANCE,
          f"LoRA: peft's adapter on both towers' q_proj and v_proj (lora.init_adapter) at 2 ranks: logits_per_image within "
          f"{LOGIT_TOLERANCE:g} of the PeftModel's ({error:.2e}); the adapter moves them by {moved:.2e}")

    # Out: fsdp-train trains adapters from that base (2 steps), fsdp-ckpt --peft-dir writes them,
    # and peft loads them over transformers' CLIPModel with fsdp.cpp's logits.
    run = os.path.join(work, "clip-lora-run")
    config = os.path.join(work, "clip-lora.toml")
    with open(config, "w") as f:
        f.write(f"""name = "clip-lora"
output_dir = "{run}"
[model]
init_from = "{base}"
[data]
source = "fashion_mnist"
[train]
steps = 2
global_batch = 8
[optimizer]
lr = 0.01
warmup_steps = 0
[checkpoint]
every = 2
[eval]
max_items = 8
[lora]
rank = 4
alpha = 8
targets = "q_proj v_proj fc1"
""")
    mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-train"), config, "--progress", "lines"])
    step_dir = os.path.join(run, "checkpoints", sorted(os.listdir(os.path.join(run, "checkpoints")))[-1])
    exported = os.path.join(work, "clip-lora-exported")
    mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-ckpt"), "export", step_dir, "--peft-dir", exported])
    loaded = peft.PeftModel.from_pretrained(transformers.CLIPModel.from_pretrained(base, dtype=torch.float32), exported)
    loaded.eval()
    with torch.no_grad():
        theirs = loaded(input_ids=ids, pixel_values=pixels).logits_per_image
    ours = logits_tool(args, step_dir, {"ids": ids, "images": pixels}, 2, work)
    error = (ours - theirs).abs().max().item()
    trained = (theirs - hf_logits(base, pixels, ids)).abs().max().item()
    check(error < LOGIT_TOLERANCE and trained > 100 * LOGIT_TOLERANCE,
          f"LoRA: a CLIP LoRA run's --peft-dir export loads with peft over CLIPModel: logits_per_image within "
          f"{LOGIT_TOLERANCE:g} of fsdp.cpp's checkpoint ({error:.2e}); training moved them by {trained:.2e}")


def refusal(args, work, model_dir, expected, what):
    pixels, ids = inputs()
    refused(args, work, model_dir, {"ids": ids, "images": pixels}, expected, what)


def check_refusals(args, work):
    extra = make_clip(os.path.join(work, "clip-extra-key"), seed=9)
    weights = load_file(os.path.join(extra, "model.safetensors"))
    weights["visual_projection.bias"] = torch.zeros(16)
    save_file(weights, os.path.join(extra, "model.safetensors"), metadata={"format": "pt"})
    refusal(args, work, extra, "'visual_projection.bias' is not part of the CLIP model", "a tensor CLIPModel has not")

    gelu = make_clip(os.path.join(work, "clip-gelu"), seed=9, hidden_act="gelu")
    refusal(args, work, gelu, "hidden_act = \"gelu\" is not supported", "another activation")

    legacy = make_clip(os.path.join(work, "clip-legacy"), seed=9)
    config_path = os.path.join(legacy, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["text_config"]["eos_token_id"] = 2
    with open(config_path, "w") as f:
        json.dump(config, f)
    refusal(args, work, legacy, "eos_token_id = 2", "the legacy pooling rule")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fsdp_clip_") as work:
        check_logits(args, work)
        check_export(args, work)
        check_peft(args, work)
        check_refusals(args, work)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
