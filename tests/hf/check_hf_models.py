#!/usr/bin/env python3
"""Hugging Face model directories in and out, checked against transformers itself.

1. Logits. transformers makes small model directories (save_pretrained, random weights; see
   scripts/make_hf_model.py): Llama with Llama 3.1's rope scaling, untied in fp32 as one file and
   tied in bf16 as a sharded set with an index; GPT-2 in fp32, in fp16 as a sharded set, and with an
   MLP width (n_inner) other than 4 x n_embd and another layer_norm_epsilon.
   fsdp_hf_logits loads each the way fsdp-train loads model.init_from (config.json; each rank reads
   its slice) at 2 ranks (3 for one case), and its logits must equal transformers' forward of the
   same directory, loaded in fp32, within 1e-4 (max |difference|). The check can see what it guards
   against: the same Llama without its rope scaling differs from transformers' by far more. A packed
   row (data.packing: three examples, positions restarting at 0 for each) gives each example
   transformers' logits for it alone, Llama and GPT-2, within 1e-4.
2. Export. fsdp-ckpt import (2 ranks) then fsdp-ckpt export --hf-dir (3 ranks) gives a directory
   that transformers' from_pretrained loads, with every tensor equal to the original's and the same
   logits (1e-5), the tokenizer files copied, and the rope scaling in its config.
3. Fine-tuning (needs the real Llama 3 tokenizer): configs/llama-finetune-fortunes.toml on a
   transformers-made Llama directory and fsdp-data's fortune instructions, 2 ranks, 12 steps: the
   masked validation loss falls, the sample is a chat turn, and the exported directory gives
   transformers the logits fsdp.cpp computes from it (1e-4).
4. LoRA (peft, a reference library scripts/test.sh installs: its absence fails the check): fsdp-train
   fine-tunes adapters over a transformers-made bf16 Llama (2 ranks, lora.dropout 0.1);
   peft loads the adapter fsdp-ckpt exports (--peft-dir) onto the same base and its logits equal
   fsdp.cpp's for the trained checkpoint within 1e-4; fsdp-ckpt's merged export (--merge) equals
   peft's merge_and_unload within 1e-5, tensor by tensor. Import: peft's own adapters (lora_B drawn,
   not zero; Llama, GPT-2 with "all-linear", and Llama with use_rslora) load through
   lora.init_adapter's path at 3 ranks with peft's logits within 1e-4; a run continued from the
   exported adapter (lr 1e-12, 1 step) gives it back within 1e-6; an adapter made for another base
   (hidden 64 onto 96) is refused naming both shapes; a DoRA adapter and one with modules_to_save
   are refused by name. An fp32 GPT-2 base with adapters at B = 0, merged and exported (lora.base_dtype
   "auto"), is the base again bit for bit.
5. QLoRA (bitsandbytes and peft, from the peers' requirements): fsdp-train fine-tunes adapters over
   the same bf16 Llama with lora.base_dtype = "nf4" (2 ranks); transformers loads that base 4-bit
   (BitsAndBytesConfig nf4, double quantization, fp32 compute; it runs on the CPU), peft puts the
   exported adapter on it, and its logits equal fsdp.cpp's for the checkpoint within 1e-3, each
   4-bit layer computing with bitsandbytes' dequantize_4bit (its CPU gemm_4bit product is about
   bf16-accurate: printed beside). The
   check sees a base that was not quantized: peft over the bf16 base differs by far more. The
   --merge export equals bitsandbytes' dequantize_4bit of each weight plus peft's B A scaled
   (1e-5). transformers' saved nf4 directory loads without requantizing: dequantized for a plain
   model (3 ranks), kept as its NF4 bytes under an adapter (lora.base_dtype "auto" resolves to nf4),
   each with the 4-bit model's logits within 1e-3; an fp4 directory is refused naming the tensor.
6. Chat format (needs the real Llama 3 tokenizer, --tokenizers): fsdp-data render's tokens equal
   transformers' apply_chat_template with Llama 3's tokenizer_config.json template, token for token,
   on hand-written conversations and on the instruction set fsdp-data makes from the fortunes; the
   trained tokens are the assistant's contents and their <|eot_id|>.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import make_hf_model  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

LOGIT_TOLERANCE = 1e-4
EXPORT_TOLERANCE = 1e-5
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def mpirun(args, ranks, command, expect_failure=False):
    full = [args.mpiexec, "--oversubscribe", "--bind-to", "none", "-np", str(ranks)] + command
    result = subprocess.run(full, capture_output=True, text=True, timeout=300)
    if expect_failure:
        return result
    if result.returncode != 0:
        print(result.stdout[-3000:], result.stderr[-3000:])
        raise SystemExit(f"failed: {' '.join(full)}")
    return result.stdout


def hf_logits(model_dir, ids):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(ids).logits


def logits_tool(args, model_dir, inputs, ranks, work, adapter=None, expect_failure=False):
    """fsdp_hf_logits on `inputs` ({"ids": ..., and "positions" or "images"}) at `ranks` ranks: the
    logits it wrote, or (expect_failure) the finished process, whose stderr names the refusal."""
    ids_path, out_path = os.path.join(work, "inputs.safetensors"), os.path.join(work, "logits.safetensors")
    save_file({k: v.contiguous() for k, v in inputs.items()}, ids_path)
    result = mpirun(args, ranks, [os.path.join(args.build_dir, "tests", "fsdp_hf_logits"), model_dir, ids_path, out_path] +
                    ([adapter] if adapter else []), expect_failure=expect_failure)
    return result if expect_failure else load_file(out_path)["logits"]


def our_logits(args, model_dir, ids, ranks, work, adapter=None, positions=None):
    return logits_tool(args, model_dir, {"ids": ids} | ({"positions": positions} if positions is not None else {}), ranks, work,
                       adapter)


def refused(args, work, model_dir, inputs, expected, what):
    """fsdp_hf_logits at 2 ranks must fail, its message holding `expected`."""
    result = logits_tool(args, model_dir, inputs, 2, work, expect_failure=True)
    message = [line for line in result.stderr.splitlines() if "error" in line][:1]
    check(result.returncode != 0 and expected in result.stderr, f"refused: {what}: {message[0] if message else result.stderr[-300:]}")


def import_then_export(args, source, work, name, *export_options):
    """fsdp-ckpt import of the Hugging Face directory `source` (2 ranks), then export --hf-dir of
    that checkpoint (3 ranks): the exported directory."""
    fsdp_ckpt = os.path.join(args.build_dir, "apps", "fsdp-ckpt")
    out = mpirun(args, 2, [fsdp_ckpt, "import", source, "--output", os.path.join(work, name + "-checkpoint")])
    step_dir = out.strip().split(" into ")[-1].split(" (")[0]
    exported = os.path.join(work, name + "-exported")
    mpirun(args, 3, [fsdp_ckpt, "export", step_dir, "--hf-dir", exported, *export_options])
    return exported


def check_models(args, work):
    torch.manual_seed(1)
    cases = [
        # name, family, dtype, max shard size, tied, ranks
        ("llama-rope-scaled-untied-fp32", "llama", "float32", None, False, 2),
        ("llama-rope-scaled-tied-bf16-sharded", "llama", "bfloat16", "40KB", True, 3),
        ("gpt2-fp32", "gpt2", "float32", None, True, 2),
        ("gpt2-fp16-sharded", "gpt2", "float16", "40KB", True, 2),
        ("gpt2-n_inner-eps", "gpt2", "float32", None, True, 2),
    ]
    # transformers reads n_inner and layer_norm_epsilon; fsdp.cpp refused both until 2026-12-02.
    extra = {"gpt2-n_inner-eps": {"n_inner": 96, "layer_norm_epsilon": 1e-2}}
    dirs = {}
    for name, family, dtype, shard, tied, ranks in cases:
        model_dir = os.path.join(work, name)
        make_hf_model.make(family, model_dir, vocab=512, dtype=dtype, max_shard_size=shard, tie=tied, **extra.get(name, {}))
        dirs[name] = model_dir
        sharded = os.path.exists(os.path.join(model_dir, "model.safetensors.index.json"))
        check(sharded == (shard is not None), f"{name}: {'a sharded set with an index' if sharded else 'one file'}")
        ids = torch.randint(0, 512, (2, 48))
        reference = hf_logits(model_dir, ids)
        ours = our_logits(args, model_dir, ids, ranks, work)
        error = (ours - reference).abs().max().item()
        check(ours.shape == reference.shape and error < LOGIT_TOLERANCE,
              f"{name}: logits {list(ours.shape)} at {ranks} ranks within {LOGIT_TOLERANCE:g} of transformers' "
              f"(max |diff| {error:.2e}, logits' scale {reference.abs().max().item():.1f})")
    # Packed rows (data.packing): three examples and padding in one row, positions restarting at 0
    # for each; each example's logits must equal transformers' for the example alone.
    lengths = [13, 20, 11]
    for name in ("llama-rope-scaled-untied-fp32", "gpt2-fp32"):
        ids = torch.randint(0, 512, (1, 48))
        positions = torch.cat([torch.arange(n) for n in lengths + [48 - sum(lengths)]]).view(1, 48)
        ours = our_logits(args, dirs[name], ids, 2, work, positions=positions)
        error, start = 0.0, 0
        for n in lengths:
            error = max(error, (ours[:, start:start + n] - hf_logits(dirs[name], ids[:, start:start + n])).abs().max().item())
            start += n
        unpacked = (our_logits(args, dirs[name], ids, 2, work)[:, lengths[0]:] - ours[:, lengths[0]:]).abs().max().item()
        check(error < LOGIT_TOLERANCE and unpacked > 100 * LOGIT_TOLERANCE,
              f"{name}: a packed row of {len(lengths)} examples gives each transformers' logits for it alone within "
              f"{LOGIT_TOLERANCE:g} (max |diff| {error:.2e}; the same row unpacked differs by {unpacked:.2e})")
    # The check sees the error it guards against: without its rope scaling the model is another.
    name = "llama-rope-scaled-untied-fp32"
    config = json.load(open(os.path.join(dirs[name], "config.json")))
    unscaled = os.path.join(work, "llama-unscaled")
    os.makedirs(unscaled)
    for file in os.listdir(dirs[name]):
        if file != "config.json":
            os.symlink(os.path.join(dirs[name], file), os.path.join(unscaled, file))
    config.pop("rope_scaling", None)
    if isinstance(config.get("rope_parameters"), dict):
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": config["rope_parameters"]["rope_theta"]}
    json.dump(config, open(os.path.join(unscaled, "config.json"), "w"))
    ids = torch.randint(0, 512, (2, 48))
    difference = (hf_logits(unscaled, ids) - hf_logits(dirs[name], ids)).abs().max().item()
    check(difference > 100 * LOGIT_TOLERANCE, f"rope scaling matters here: without it the logits move by {difference:.2e}")
    return dirs


def check_export(args, work, tokenizers):
    fsdp_ckpt = os.path.join(args.build_dir, "apps", "fsdp-ckpt")
    llama3 = os.path.join(tokenizers, "llama3") if tokenizers else None
    has_tokenizer = llama3 and os.path.exists(os.path.join(llama3, "tokenizer.json"))
    cases = [("llama-export", "llama", llama3 if has_tokenizer else None), ("gpt2-export", "gpt2", None)]
    for name, family, tokenizer_dir in cases:
        source = os.path.join(work, name)
        make_hf_model.make(family, source, vocab=512, tokenizer_dir=tokenizer_dir, tie=False)
        exported = import_then_export(args, source, work, name, "--max-file-size", "100KB")
        files = sorted(os.listdir(exported))
        check("model.safetensors.index.json" in files and "config.json" in files and "generation_config.json" in files,
              f"{name}: exported {', '.join(files[:6])}{' ...' if len(files) > 6 else ''}")
        check(not os.path.exists(exported + ".partial"), f"{name}: no .partial directory left")
        original = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).state_dict()
        loaded = transformers.AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32)
        mismatched = [k for k, v in loaded.state_dict().items() if k in original and not torch.equal(v, original[k])]
        check(not mismatched, f"{name}: from_pretrained(exported) has every tensor equal to the original's "
                              f"({len(original)} tensors; mismatched: {mismatched[:3]})")
        ids = torch.randint(0, 512, (2, 40))
        error = (hf_logits(exported, ids) - hf_logits(source, ids)).abs().max().item()
        check(error < EXPORT_TOLERANCE, f"{name}: exported logits within {EXPORT_TOLERANCE:g} of the original's ({error:.2e})")
        if family == "llama":
            rope = loaded.config.rope_parameters if hasattr(loaded.config, "rope_parameters") else loaded.config.rope_scaling
            check(rope.get("rope_type") == "llama3" and rope.get("factor") == 8.0,
                  f"{name}: the exported config keeps the llama3 rope scaling ({rope})")
        if tokenizer_dir:
            ours = transformers.AutoTokenizer.from_pretrained(exported)
            theirs = transformers.AutoTokenizer.from_pretrained(source)
            text = "Fortunes: 'Tis a gift to be simple. \u00e9\u00e8 \U0001F600"
            check(ours.encode(text) == theirs.encode(text) and ours.chat_template == theirs.chat_template,
                  f"{name}: the tokenizer files (with the chat template) came along")


def check_chat_format(args, work, tokenizers):
    llama3 = os.path.join(tokenizers, "llama3")
    if not os.path.exists(os.path.join(llama3, "tokenizer.json")):
        check(False, f"chat format: no {llama3}/tokenizer.json")
        return
    tokenizer = transformers.AutoTokenizer.from_pretrained(llama3)
    fsdp_data = os.path.join(args.build_dir, "apps", "fsdp-data")
    conversations = [
        [{"role": "user", "content": "Tell me a fortune."}, {"role": "assistant", "content": "You will write C++."}],
        [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": "Why?\n\n"},
         {"role": "assistant", "content": "\tBecause.  "}, {"role": "user", "content": "Really? caf\u00e9 \u4e16\u754c"},
         {"role": "assistant", "content": "1234567 tokens, 'tis so.\r\n"}],
        [{"role": "user", "content": "<|eot_id|> inside text"}, {"role": "assistant", "content": "\U0001F600\u200d!"}],
        # Unicode spaces at the edges: the template's trim (Python's str.strip()) removes them too.
        [{"role": "user", "content": "\u00a0\u3000wide spaces\u2028"}, {"role": "assistant", "content": "\u0085ok\u00a0\u202f"}],
    ]
    hand = os.path.join(work, "chat.jsonl")
    with open(hand, "w") as f:
        for messages in conversations:
            f.write(json.dumps({"messages": messages}) + "\n")
        f.write(json.dumps({"prompt": "Say hi.", "completion": "Hi!"}) + "\n")
    conversations.append([{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}])
    fortunes = os.path.join(work, "fortune-chat.jsonl")
    subprocess.run([fsdp_data, "instructions", "--output", fortunes], check=True, capture_output=True)
    for messages_file in (hand, fortunes):
        rendered_file = messages_file + ".rendered"
        subprocess.run([fsdp_data, "render", "--tokenizer", "hf", "--tokenizer-json", os.path.join(llama3, "tokenizer.json"),
                        "--input", messages_file, "--output", rendered_file], check=True, capture_output=True)
        examples = conversations if messages_file == hand else [json.loads(l)["messages"] for l in open(messages_file)]
        rendered = [json.loads(l) for l in open(rendered_file)]
        header = tokenizer.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False)
        mismatches = mask_errors = tokens = 0
        eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
        for messages, ours in zip(examples, rendered):
            # Llama 3's template always ends with the assistant's header (a generation prompt).
            theirs = list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False))
            tokens += len(theirs)
            if ours["ids"] + header != theirs:
                mismatches += 1
            theirs_prompt = list(tokenizer.apply_chat_template(messages[:-1], tokenize=True, return_dict=False))
            if ours["prompt_ids"] != theirs_prompt:
                mismatches += 1
            trained = [t for t, m in zip(ours["ids"], ours["trained"]) if m]
            expected = []
            for m in messages:
                if m["role"] == "assistant":
                    expected += tokenizer.encode(m["content"].strip(), add_special_tokens=False) + [eot]
            if trained != expected:
                mask_errors += 1
        check(len(rendered) == len(examples) and mismatches == 0,
              f"chat format ({os.path.basename(messages_file)}): {len(examples)} conversations, {tokens} tokens, "
              f"{mismatches} differ from apply_chat_template")
        check(mask_errors == 0, f"chat format ({os.path.basename(messages_file)}): trained tokens are the assistant's "
                                f"contents and <|eot_id|> ({mask_errors} examples otherwise)")


def check_finetune(args, work, tokenizers):
    llama3 = os.path.join(tokenizers, "llama3")
    if not os.path.exists(os.path.join(llama3, "tokenizer.json")):
        check(False, f"fine-tuning: no {llama3}/tokenizer.json")
        return
    root = os.path.join(HERE, "..", "..")
    model_dir = os.path.join(work, "llama3-finetune-base")
    make_hf_model.make("llama", model_dir, tokenizer_dir=llama3, tie=True, hidden=64, layers=2, context=512)
    data = os.path.join(work, "fortune-chat.jsonl")
    subprocess.run([os.path.join(args.build_dir, "apps", "fsdp-data"), "instructions", "--output", data], check=True,
                   capture_output=True)
    out = os.path.join(work, "finetune-run")
    sets = [f'model.init_from="{model_dir}"', f'data.train_jsonl="{data}"', f'output_dir="{out}"', "train.steps=12",
            "eval.every=12", "checkpoint.every=12", "eval.sample_tokens=8", "optimizer.warmup_steps=2", "optimizer.lr=3e-3"]
    command = [os.path.join(args.build_dir, "apps", "fsdp-train"), os.path.join(root, "configs", "llama-finetune-fortunes.toml"),
               "--progress", "lines"]
    for s in sets:
        command += ["--set", s]
    log = mpirun(args, 2, command)
    dropped = [l for l in log.splitlines() if "data: instructions" in l]
    print("     " + (dropped[0].strip() if dropped else "(no data line)"))
    records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    evals = [r["validation_loss"] for r in records if "eval_step" in r]
    check(len(evals) == 2 and evals[1] < evals[0] - 0.1,
          f"fine-tuning: the masked validation loss falls over 12 steps ({' -> '.join(f'{e:.3f}' for e in evals)})")
    sample = open(os.path.join(out, "sample.txt")).read()
    check(sample.startswith("user: Tell me a fortune about computers.\nassistant: "), f"fine-tuning: the sample is a chat turn ({sample[:60]!r}...)")
    exported = os.path.join(work, "finetuned-hf")
    checkpoint = sorted(os.listdir(os.path.join(out, "checkpoints")))[-1]
    mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-ckpt"), "export", os.path.join(out, "checkpoints", checkpoint),
                     "--hf-dir", exported])
    ids = torch.randint(0, 128256, (2, 32))
    reference = hf_logits(exported, ids)
    ours = our_logits(args, exported, ids, 2, work)
    error = (ours - reference).abs().max().item()
    check(error < LOGIT_TOLERANCE, f"fine-tuned export: transformers' logits within {LOGIT_TOLERANCE:g} of fsdp.cpp's ({error:.2e})")
    base = hf_logits(model_dir, ids)
    check((base - reference).abs().max().item() > 1e-2, "fine-tuned export: differs from the base model (training changed it)")


def check_lora(args, work):
    try:
        import peft
    except ImportError:
        check(False, "LoRA: peft, the reference, is not installed (scripts/requirements-peers.txt; scripts/test.sh installs it)")
        return
    base = os.path.join(work, "lora-base")
    make_hf_model.make("llama", base, vocab=512, dtype="bfloat16", tie=False)
    data = os.path.join(work, "lora-chat.jsonl")
    subprocess.run([os.path.join(args.build_dir, "apps", "fsdp-data"), "instructions", "--format", "prompt-completion",
                    "--output", data], check=True, capture_output=True)
    out = os.path.join(work, "lora-run")
    config = os.path.join(work, "lora.toml")
    with open(config, "w") as f:
        f.write(f"""name = "lora-check"
output_dir = "{out}"
[model]
init_from = "{base}"
[data]
source = "instructions"
tokenizer = "byte"
chat_format = "plain"
train_jsonl = "{data}"
validation_percent = 2
[train]
steps = 10
global_batch = 8
seq_len = 128
threads = 1
[optimizer]
lr = 1e-2
warmup_steps = 1
weight_decay = 0.0
[eval]
every = 10
batches = 1
sample_tokens = 0
[checkpoint]
every = 10
[lora]
rank = 4
alpha = 8
dropout = 0.1
targets = "q_proj v_proj o_proj down_proj"
""")
    mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-train"), config, "--progress", "lines"])
    config_text = open(config).read()
    checkpoint = os.path.join(out, "checkpoints", sorted(os.listdir(os.path.join(out, "checkpoints")))[-1])
    fsdp_ckpt = os.path.join(args.build_dir, "apps", "fsdp-ckpt")
    adapter, merged = os.path.join(work, "lora-adapter"), os.path.join(work, "lora-merged")
    mpirun(args, 2, [fsdp_ckpt, "export", checkpoint, "--peft-dir", adapter])
    mpirun(args, 3, [fsdp_ckpt, "export", checkpoint, "--hf-dir", merged, "--merge"])
    adapter_config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    check(adapter_config["r"] == 4 and sorted(adapter_config["target_modules"]) == ["down_proj", "o_proj", "q_proj", "v_proj"],
          f"adapter_config.json: r {adapter_config['r']}, targets {adapter_config['target_modules']}")
    base_model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    base_model.eval()
    ids = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        base_logits = base_model(ids).logits
    model = peft.PeftModel.from_pretrained(base_model, adapter)
    model.eval()
    with torch.no_grad():
        peft_logits = model(ids).logits
    ours = our_logits(args, checkpoint, ids, 2, work)
    error = (ours - peft_logits).abs().max().item()
    moved = (peft_logits - base_logits).abs().max().item()
    check(moved > 1e-3, f"LoRA: the trained adapter changes the logits (by up to {moved:.2e})")
    check(error < LOGIT_TOLERANCE, f"LoRA: peft with fsdp.cpp's adapter gives fsdp.cpp's logits within {LOGIT_TOLERANCE:g} "
                                   f"({error:.2e}, 2 ranks)")
    theirs = model.merge_and_unload().state_dict()
    mine = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).state_dict()
    worst = max((mine[k] - theirs[k]).abs().max().item() for k in theirs)
    check(set(mine) == set(theirs) and worst < EXPORT_TOLERANCE,
          f"LoRA: the --merge export equals peft's merge_and_unload ({len(theirs)} tensors, largest difference {worst:.2e})")
    check_lora_continue(args, work, config_text, adapter)
    check_lora_import(args, work, peft)
    check_lora_fp32_base(args, work)
    check_qlora(args, work, peft, base, config_text.replace(out, out + "-nf4") + 'base_dtype = "nf4"\n')


QLORA_LOGIT_TOLERANCE = 1e-3


def check_qlora(args, work, peft, base, config_text):
    """Part 5: a QLoRA run's adapter over transformers' own 4-bit model of the same base."""
    try:
        import bitsandbytes
    except ImportError:
        check(False, "QLoRA: bitsandbytes, the reference, is not installed (scripts/requirements-peers.txt)")
        return
    config = os.path.join(work, "qlora.toml")
    with open(config, "w") as f:
        f.write(config_text)
    out = re.search(r'output_dir = "([^"]+)"', config_text).group(1)
    mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-train"), config, "--progress", "lines"])
    checkpoint = os.path.join(out, "checkpoints", sorted(os.listdir(os.path.join(out, "checkpoints")))[-1])
    fsdp_ckpt = os.path.join(args.build_dir, "apps", "fsdp-ckpt")
    adapter, merged = os.path.join(work, "qlora-adapter"), os.path.join(work, "qlora-merged")
    mpirun(args, 2, [fsdp_ckpt, "export", checkpoint, "--peft-dir", adapter])
    mpirun(args, 3, [fsdp_ckpt, "export", checkpoint, "--hf-dir", merged, "--merge"])

    def four_bit(quant_type, widen=True, source=None):
        quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                                       bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
        if source is None:
            model = transformers.AutoModelForCausalLM.from_pretrained(base, quantization_config=quantization, device_map="cpu")
        else:  # a directory transformers saved 4-bit: its bytes as they are
            model = transformers.AutoModelForCausalLM.from_pretrained(source, device_map="cpu")
        # The linear weights quantized from the bf16 base (QLoRA's recipe, and fsdp.cpp's NF4 base);
        # everything else widened to fp32, as fsdp.cpp computes this run (fsdp.param_dtype float32).
        for parameter in model.parameters():
            if widen and parameter.dtype == torch.bfloat16:
                parameter.data = parameter.data.float()
        model.eval()
        return model

    def dequantizing(model, requantized=()):
        # bitsandbytes 0.50's CPU gemm_4bit (Linear4bit's product, in training and inference alike)
        # differs from its own dequantize_4bit followed by the product by up to 4e-3 a layer here,
        # about bf16's rounding, and on a CPU with AVX512-BF16 inference repacks the weight and
        # multiplies in bf16 whatever the compute dtype. The reference layer is therefore
        # bitsandbytes' dequantize_4bit of its own quantized weight, then the product in fp32.
        # `requantized`: layers whose weight is dequantized, quantized again and dequantized (what
        # a reader that requantizes would compute).
        for name, module in model.named_modules():
            if type(module).__name__ == "Linear4bit":
                def forward(x, module=module, again=name in requantized):
                    weight = bitsandbytes.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
                    if again:
                        weight = bitsandbytes.functional.dequantize_4bit(*bitsandbytes.functional.quantize_4bit(
                            weight, blocksize=64, compress_statistics=True, quant_type="nf4"))
                    return torch.nn.functional.linear(x.to(torch.float32), weight.to(torch.float32), module.bias)
                module.forward = forward
        return model

    base_4bit = four_bit("nf4")
    check(type(base_4bit.model.layers[0].self_attn.q_proj).__name__ == "Linear4bit", "QLoRA: transformers loads the base 4-bit (Linear4bit)")
    # Dequantized before peft wraps the layers: each quantized weight as bitsandbytes reads it back.
    dequantized = {name + ".weight": bitsandbytes.functional.dequantize_4bit(m.weight.data, m.weight.quant_state).float()
                   for name, m in base_4bit.named_modules() if type(m).__name__ == "Linear4bit"}
    ids = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        kernel_model = peft.PeftModel.from_pretrained(four_bit("nf4"), adapter)
        kernel_model.eval()
        kernel_logits = kernel_model(ids).logits
    model = peft.PeftModel.from_pretrained(dequantizing(base_4bit), adapter)
    model.eval()
    with torch.no_grad():
        peft_logits = model(ids).logits
    plain = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    plain.eval()
    with torch.no_grad():
        unquantized_logits = plain(ids).logits
    ours = our_logits(args, checkpoint, ids, 2, work)
    error = (ours - peft_logits).abs().max().item()
    unquantized = (ours - unquantized_logits).abs().max().item()
    check(error < QLORA_LOGIT_TOLERANCE, f"QLoRA: peft with fsdp.cpp's adapter over transformers' 4-bit base gives fsdp.cpp's "
                                         f"logits within {QLORA_LOGIT_TOLERANCE:g} ({error:.2e}, 2 ranks)")
    print(f"     (with bitsandbytes' own CPU 4-bit product, gemm_4bit, peft's logits differ from fsdp.cpp's by "
          f"{(ours - kernel_logits).abs().max().item():.2e})")
    check(unquantized > 10 * QLORA_LOGIT_TOLERANCE,
          f"QLoRA: the check sees the quantization: over the bf16 base peft's logits differ by {unquantized:.2e}")
    # The merged export: bitsandbytes' dequantized weight plus the adapter's scaled B A, layer by layer.
    adapter_config = json.load(open(os.path.join(adapter, "adapter_config.json")))
    scale = adapter_config["lora_alpha"] / adapter_config["r"]
    weights = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    mine = transformers.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).state_dict()
    worst, compared = 0.0, 0
    for name, weight in dequantized.items():
        expected = weight.clone()
        a_name = "base_model.model." + name.replace(".weight", ".lora_A.weight")
        if a_name in weights:
            expected += scale * weights[a_name.replace("lora_A", "lora_B")].float() @ weights[a_name].float()
        worst = max(worst, (mine[name] - expected).abs().max().item())
        compared += 1
    check(compared > 0 and worst < EXPORT_TOLERANCE,
          f"QLoRA: the --merge export equals bitsandbytes' dequantize_4bit plus B A ({compared} weights, largest difference {worst:.2e})")
    # transformers' own 4-bit directories, read without requantizing: NF4 as the bytes bitsandbytes
    # saved (with the adapter: lora.base_dtype "auto" keeps them NF4) or dequantized (a plain
    # model); fp4 refused by name. One layer's codes are made such that no quantization produces
    # them (every +-1 code moved one step in, so no element reaches its block's absmax): a reader
    # that dequantized and quantized again would change that layer, and the check sees it.
    saved = os.path.join(work, "saved-nf4")
    model = four_bit("nf4", widen=False)
    odd = "model.layers.0.self_attn.o_proj"
    layer = model.get_submodule(odd)
    high, low = layer.weight.data >> 4, layer.weight.data & 15
    inward = lambda code: torch.where(code == 15, 14, torch.where(code == 0, 1, code))  # noqa: E731
    layer.weight.data = (inward(high) << 4 | inward(low)).to(torch.uint8)
    model.save_pretrained(saved)
    with torch.no_grad():
        plain_4bit_logits = dequantizing(four_bit("nf4", source=saved))(ids).logits
        requantized_logits = dequantizing(four_bit("nf4", source=saved), requantized=[odd])(ids).logits
    from_saved = our_logits(args, saved, ids, 3, work)
    error = (from_saved - plain_4bit_logits).abs().max().item()
    check(error < QLORA_LOGIT_TOLERANCE, f"QLoRA: transformers' saved nf4 directory, read by fsdp.cpp (3 ranks, dequantized), gives "
                                         f"the 4-bit model's logits within {QLORA_LOGIT_TOLERANCE:g} ({error:.2e})")
    with torch.no_grad():
        saved_peft = peft.PeftModel.from_pretrained(dequantizing(four_bit("nf4", source=saved)), adapter)
        saved_peft.eval()
        saved_peft_logits = saved_peft(ids).logits
    from_saved = our_logits(args, saved, ids, 2, work, adapter=adapter)
    error = (from_saved - saved_peft_logits).abs().max().item()
    requantizing = (requantized_logits - plain_4bit_logits).abs().max().item()
    check(error < QLORA_LOGIT_TOLERANCE, f"QLoRA: the saved nf4 directory kept as NF4 bytes with fsdp.cpp's adapter (2 ranks) gives "
                                         f"peft's logits over the 4-bit model within {QLORA_LOGIT_TOLERANCE:g} ({error:.2e})")
    check(requantizing > 10 * QLORA_LOGIT_TOLERANCE,
          f"QLoRA: the check sees a reader that requantizes: the altered layer requantized moves the logits by {requantizing:.2e}")
    saved = os.path.join(work, "saved-fp4")
    four_bit("fp4", widen=False).save_pretrained(saved)
    result = subprocess.run([os.path.join(args.build_dir, "tests", "fsdp_hf_logits"), saved,
                             os.path.join(work, "ids.safetensors"), os.path.join(work, "refused.safetensors")],
                            capture_output=True, text=True, timeout=120)
    said = [line for line in (result.stdout + result.stderr).splitlines() if "4-bit" in line]
    check(result.returncode != 0 and any("is stored 4-bit by bitsandbytes: as fp4" in line for line in said),
          f"QLoRA: a transformers fp4 4-bit directory is refused by name: {said[0] if said else result.stderr[-300:]}")


def peft_adapter(peft, base, out, targets, seed, **options):
    """peft's own adapter over `base`, saved with save_pretrained: lora_B drawn (not zero), so it
    changes the logits. Returns the PEFT model, in eval mode. options: more LoraConfig settings."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, init_lora_weights=False,
                             fan_in_fan_out="gpt2" in base, task_type="CAUSAL_LM", **options)
    model = peft.get_peft_model(model, config)
    model.save_pretrained(out)
    model.eval()
    return model


def check_lora_import(args, work, peft):
    """A PEFT adapter loads (lora.init_adapter) onto the base it was made for, and training goes on
    from it; one made for another base is refused with both shapes named."""
    ids = torch.randint(0, 256, (2, 40))
    cases = (("llama", ["q_proj", "k_proj", "gate_proj"], {}), ("gpt2", ["c_attn", "c_fc"], {}),
             ("gpt2", "all-linear", {}), ("llama", ["q_proj", "v_proj", "down_proj"], {"use_rslora": True}))
    for family, targets, options in cases:
        label = family + ("-all-linear" if targets == "all-linear" else "") + ("-rslora" if options else "")
        base, adapter = os.path.join(work, f"import-{label}"), os.path.join(work, f"import-{label}-adapter")
        # bf16 weights: with lora.base_dtype "auto" fsdp.cpp keeps a bf16 base in bf16, exact for these.
        make_hf_model.make(family, base, vocab=512, dtype="bfloat16")
        model = peft_adapter(peft, base, adapter, targets, seed=3, **options)
        saved = json.load(open(os.path.join(adapter, "adapter_config.json")))
        with torch.no_grad():
            theirs = model(ids).logits
            with model.disable_adapter():
                moved = (model(ids).logits - theirs).abs().max().item()
        ours = our_logits(args, base, ids, 3, work, adapter=adapter)
        error = (ours - theirs).abs().max().item()
        check(moved > 1e-3 and error < LOGIT_TOLERANCE,
              f"LoRA import ({label}, target_modules {saved['target_modules']}, use_rslora {saved.get('use_rslora')}): "
              f"peft's own adapter loaded by fsdp.cpp (3 ranks) gives peft's logits within {LOGIT_TOLERANCE:g} "
              f"({error:.2e}; the adapter moves them by {moved:.2e})")
    # Another base: the Llama adapter (hidden 64) onto a Llama of hidden 96.
    other = os.path.join(work, "import-other")
    make_hf_model.make("llama", other, vocab=512, dtype="bfloat16", hidden=96)
    ids_path = os.path.join(work, "ids.safetensors")
    save_file({"ids": ids.contiguous()}, ids_path)
    result = mpirun(args, 2, [os.path.join(args.build_dir, "tests", "fsdp_hf_logits"), other, ids_path,
                              os.path.join(work, "other.safetensors"), os.path.join(work, "import-llama-adapter")],
                    expect_failure=True)
    message = result.stderr + result.stdout
    named = "has shape [4, 64], this model's layer needs [4, 96]" in message and "another base model" in message
    check(result.returncode != 0 and named,
          "LoRA import: an adapter for another base is refused, shapes named: " +
          next((line.strip() for line in message.splitlines() if "has shape" in line), "(no such message)")[:200])
    # What fsdp.cpp does not implement is refused by name, never loaded as a plain adapter: DoRA
    # (peft's own), and a trained lm_head (modules_to_save), in the config and in the file.
    llama = os.path.join(work, "import-llama")
    for label, options, named in (("dora", {"use_dora": True}, "use_dora = true"),
                                  ("modules_to_save", {"modules_to_save": ["lm_head"]}, "modules_to_save = ")):
        adapter = os.path.join(work, f"import-{label}-adapter")
        peft_adapter(peft, llama, adapter, ["q_proj"], seed=4, **options)
        result = mpirun(args, 2, [os.path.join(args.build_dir, "tests", "fsdp_hf_logits"), llama, ids_path,
                                  os.path.join(work, "refused.safetensors"), adapter], expect_failure=True)
        message = result.stderr + result.stdout
        check(result.returncode != 0 and named in message,
              f"LoRA import: a {label} adapter is refused by name: " +
              next((line.strip() for line in message.splitlines() if named in line), "(no such message)")[:200])
        # The same adapter's extra tensors alone (its config edited to a plain one) are refused too.
        config = json.load(open(os.path.join(adapter, "adapter_config.json")))
        config.update({"use_dora": False, "modules_to_save": None})
        json.dump(config, open(os.path.join(adapter, "adapter_config.json"), "w"))
        result = mpirun(args, 2, [os.path.join(args.build_dir, "tests", "fsdp_hf_logits"), llama, ids_path,
                                  os.path.join(work, "refused.safetensors"), adapter], expect_failure=True)
        message = result.stderr + result.stdout
        check(result.returncode != 0 and "refused rather than dropped" in message,
              f"LoRA import: the {label} adapter's extra tensors are refused, named: " +
              next((line.strip() for line in message.splitlines() if "refused rather" in line), "(no such message)")[:200])
    return ids


def check_lora_fp32_base(args, work):
    """lora.base_dtype "auto" keeps an fp32 base in fp32. One step at lr 1e-30 leaves lora_B at
    ~1e-30 (AdamW moves each element by about lr), so W + (alpha / r) B A rounds back to W in fp32:
    the merged export must equal the transformers-made fp32 base bit for bit, every tensor. The
    check sees what it guards against: with lora.base_dtype "bfloat16" (the default before
    2026-12-02) the weights come out rounded."""
    base = os.path.join(work, "fp32-gpt2-base")
    make_hf_model.make("gpt2", base, vocab=512, dtype="float32")

    def load_dir(directory):
        tensors = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".safetensors"):
                tensors.update(load_file(os.path.join(directory, name)))
        # transformers' GPT2LMHeadModel writes its body under "transformer."; the hub's gpt2 files
        # and fsdp.cpp's export do not (both load): compare by the name without it.
        return {k.removeprefix("transformer."): v for k, v in tensors.items()}

    def merged_export(label, base_dtype_line):
        out = os.path.join(work, f"fp32-lora-run-{label}")
        config = os.path.join(work, f"fp32-lora-{label}.toml")
        with open(config, "w") as f:
            f.write(f"""name = "fp32-lora"
output_dir = "{out}"
[model]
init_from = "{base}"
[data]
tokenizer = "byte"
[train]
steps = 1
global_batch = 4
seq_len = 32
threads = 1
[optimizer]
lr = 1e-30
min_lr = 0.0
[eval]
every = 0
batches = 1
sample_tokens = 0
[checkpoint]
every = 1
[lora]
rank = 4
alpha = 8
targets = "c_attn c_fc"
{base_dtype_line}
""")
        mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-train"), config, "--progress", "lines"])
        checkpoint = os.path.join(out, "checkpoints", sorted(os.listdir(os.path.join(out, "checkpoints")))[-1])
        merged = os.path.join(work, f"fp32-gpt2-merged-{label}")
        mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-ckpt"), "export", checkpoint, "--hf-dir", merged, "--merge"])
        return open(os.path.join(out, "config.toml")).read(), load_dir(merged)

    original = load_dir(base)
    resolved, exported = merged_export("auto", "")
    check(re.search(r"""base_dtype = ["']float32["']""", resolved) is not None,
          'LoRA fp32 base: lora.base_dtype "auto" resolves to float32 for fp32 weights')
    same = [k for k in original if k in exported and exported[k].dtype == torch.float32 and torch.equal(exported[k], original[k])]
    missing = [k for k in original if k not in exported]
    worst = max([(exported[k] - original[k]).abs().max().item() for k in original if k in exported] + [0.0])
    check(len(same) == len(original) and not missing,
          f"LoRA fp32 base: --merge of an fp32 base with B ~ 0 is the base bit for bit ({len(same)} of {len(original)} "
          f"tensors equal; largest difference {worst:.1e}; not exported: {missing[:3]})")
    _, rounded = merged_export("bf16", 'base_dtype = "bfloat16"')
    differing = [k for k in original if k in rounded and not torch.equal(rounded[k], original[k])]
    check(len(differing) > len(original) // 2,
          f"LoRA fp32 base: the check sees the rounding it guards against (base_dtype bfloat16: {len(differing)} of "
          f"{len(original)} tensors differ)")


def check_lora_continue(args, work, config_text, adapter):
    """Training continues from an exported adapter: a run with lora.init_adapter and a learning rate of
    1e-12 exports it again unchanged (1e-6), where adapters not loaded (B = 0) would differ by ~0.1."""
    out = os.path.join(work, "lora-continue")
    config = os.path.join(work, "lora-continue.toml")
    text = config_text.replace(os.path.join(work, "lora-run"), out).replace("steps = 10", "steps = 1")
    text = text.replace("lr = 1e-2", "lr = 1e-12\nmin_lr = 0.0").replace("every = 10", "every = 1")
    text = text.replace("[lora]\nrank = 4\nalpha = 8\n", f"[lora]\ninit_adapter = \"{adapter}\"\n")
    with open(config, "w") as f:
        f.write(text)
    mpirun(args, 4, [os.path.join(args.build_dir, "apps", "fsdp-train"), config, "--progress", "lines"])
    checkpoint = os.path.join(out, "checkpoints", sorted(os.listdir(os.path.join(out, "checkpoints")))[-1])
    again = os.path.join(work, "lora-continue-adapter")
    mpirun(args, 2, [os.path.join(args.build_dir, "apps", "fsdp-ckpt"), "export", checkpoint, "--peft-dir", again])
    before = load_file(os.path.join(adapter, "adapter_model.safetensors"))
    after = load_file(os.path.join(again, "adapter_model.safetensors"))
    worst = max((after[k] - before[k]).abs().max().item() for k in before)
    check(set(before) == set(after) and worst < 1e-6,
          f"LoRA continue: lora.init_adapter -> 1 step at lr 1e-12 (4 ranks) -> --peft-dir gives the adapter back "
          f"({len(before)} tensors, largest difference {worst:.1e})")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("--tokenizers", default=None, help="folder with llama3/tokenizer.json (../shared/data/tokenizers)")
    parser.add_argument("--only", nargs="+", choices=["models", "export", "finetune", "lora", "chat"], default=None,
                        help="these parts only (default: all; finetune and chat need --tokenizers)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="fsdp_hf_") as work:
        parts = args.only or ["models", "export", "finetune", "lora", "chat"]
        if ("finetune" in parts or "chat" in parts) and not args.tokenizers:
            if args.only:
                raise SystemExit("check_hf_models: finetune and chat need --tokenizers (the real Llama 3 tokenizer)")
            parts = [p for p in parts if p not in ("finetune", "chat")]
            print("not run: finetune and chat (they need --tokenizers)")
        if "models" in parts:
            check_models(args, work)
        if "export" in parts:
            check_export(args, work, args.tokenizers)
        if "finetune" in parts:
            check_finetune(args, work, args.tokenizers)
        if "lora" in parts:
            check_lora(args, work)
        if "chat" in parts:
            check_chat_format(args, work, args.tokenizers)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
