#!/usr/bin/env python3
"""The adapter of a QLoRA run at 8B, loaded with peft over transformers' own 4-bit base (issue 55).

tests/hf/check_hf_models.py part 5 checks this on a 2-layer Llama in CI; this is the same check at
Llama 3.1 8B's real shape (bench/make_llama8b.py's directory, made once if missing):

1. fsdp-train fine-tunes rank-16 adapters on every linear layer over the NF4 base of the directory
   (lora.base_dtype = "nf4", activation checkpointing, fp32 compute: one step at bf16 would move the
   logits by less than bf16's rounding), 2 ranks, a few steps, and checkpoints its last step.
2. fsdp-ckpt export --peft-dir writes the adapter as peft does (2 ranks).
3. fsdp.cpp's logits on random token rows: tests/fsdp_hf_logits on the checkpoint (2 ranks).
4. transformers loads the directory 4-bit (BitsAndBytesConfig nf4, double quantization, fp32
   compute), peft.PeftModel.from_pretrained puts the adapter on it, and its logits on the same rows
   are compared with fsdp.cpp's. Each 4-bit layer computes as bitsandbytes' dequantize_4bit of its own
   quantized weight (into bf16, the weight's stored dtype, as fsdp.cpp decodes its NF4 base) then an
   fp32 product (bitsandbytes' CPU gemm_4bit rounds about as bf16 does; tests/hf/check_hf_models.py
   says why). The logits of the same base without the adapter show the adapter's effect, which must
   be 10x the difference; decoding into fp32 instead is measured beside (what the check can see).

Each stage runs alone (the 4-bit load peaks near 20 GiB). About 25 minutes on the 2-core VM.

  .venv/bin/python bench/qlora_8b_peft.py
  .venv/bin/python bench/qlora_8b_peft.py --model-dir runs/models/qwen2.5-14b-random
"""
import argparse
import copy
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from qlora_8b import add_input_arguments, prepare_inputs, write_json  # bench/: the 8B run's inputs and output

ROOT = Path(__file__).resolve().parent.parent
# fsdp.cpp and peft compute the same fp32 products over the same dequantized weights in another
# order. The first runs (2026-12-06) differed by 1.0e-3 of the largest logit, traced to 20 of
# 65,536 blocks of a weight whose double-quantized absmax bitsandbytes had quantized at two threads
# and fsdp.cpp at one (now both at one); decoding the base into fp32 rather than bf16 moves the
# logits by 3.4e-2 of it, and the adapter by 8.9e-2. The adapter's effect must be 10x the difference.
RELATIVE_TOLERANCE = 1e-4
CONFIG = """name = "qlora-8b-peft"
output_dir = "{out}"
[model]
init_from = "{model}"
[data]
source = "instructions"
train_jsonl = "{data}"
validation_percent = 2
packing = true
[train]
steps = {steps}
global_batch = 2
seq_len = {seq}
log_every = 1
report_every = 0
[eval]
every = 0
batches = 1
sample_tokens = 0
[optimizer]
lr = {lr}
warmup_steps = 0
[fsdp]
param_dtype = "float32"
activation_checkpointing = true
[lora]
rank = 16
alpha = 32
targets = "all-linear"
base_dtype = "nf4"
[checkpoint]
every = {steps}
"""


def env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def mpirun(ranks, command, log):
    """Runs command at `ranks` ranks, its output to `log`; exits naming the log on a failure."""
    start = time.time()
    with open(log, "w") as f:
        status = subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *command],
                                stdout=f, stderr=subprocess.STDOUT, env=env(), cwd=ROOT).returncode
    if status != 0:
        tail = "\n".join(Path(log).read_text().splitlines()[-20:])
        sys.exit(f"qlora_8b_peft: {Path(command[0]).name} failed (exit {status}); end of {log}:\n{tail}")
    return time.time() - start


def peak_resident_gib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 2**20


def peft_logits(model_dir, adapter, ids):
    """transformers' 4-bit model of model_dir with the adapter and without it: (logits with the adapter;
    the same with each 4-bit weight dequantized straight into fp32 instead of bf16; logits without
    the adapter; Linear4bit layers)."""
    import bitsandbytes
    import peft
    import torch
    import transformers

    # bitsandbytes quantizes as it loads; its double quantization's absmax mean (an fp32 sum that
    # libtorch splits over threads) moves its last bit, and a few blocks' codes, with the thread
    # count. fsdp.cpp sums it at one thread on any machine (shard/nf4.h): so does the reference.
    torch.set_num_threads(1)
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                   bnb_4bit_use_double_quant=True,
                                                   bnb_4bit_compute_dtype=torch.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=quantization,
                                                              device_map="cpu")
    four_bit = 0
    for parameter in model.parameters():  # the rest of the base widened, as fsdp.cpp computes in fp32
        if parameter.dtype == torch.bfloat16:
            parameter.data = parameter.data.float()
    # bitsandbytes dequantizes to the dtype the weight was stored in (quant_state.dtype, bf16 here)
    # and the product casts that to the compute dtype; fsdp.cpp gathers an NF4 base decoded into bf16
    # (the frozen base's dtype) and widens it for fp32 compute: the same values. Decoding straight
    # into fp32 instead (quant_state.dtype fp32) is measured beside, to show what the check can see.
    into_fp32 = [False]
    for module in model.modules():
        if type(module).__name__ == "Linear4bit":
            four_bit += 1

            def forward(x, module=module):
                state = copy.copy(module.weight.quant_state)
                if into_fp32[0]:
                    state.dtype = torch.float32
                weight = bitsandbytes.functional.dequantize_4bit(module.weight.data, state)
                return torch.nn.functional.linear(x.to(torch.float32), weight.to(torch.float32), module.bias)

            module.forward = forward
    model.eval()
    torch.set_num_threads(os.cpu_count())
    with torch.no_grad():
        without = model(ids).logits
    model = peft.PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.no_grad():
        with_adapter = model(ids).logits
        into_fp32[0] = True
        decoded_into_fp32 = model(ids).logits
    return with_adapter, decoded_into_fp32, without, four_bit


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=64, help="tokens per rank per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--tokens", type=int, default=24)
    add_input_arguments(p, "qlora_8b_peft.json")
    p.add_argument("--reuse", action="store_true",
                   help="take the run, adapter and fsdp.cpp logits an earlier call left in --work-dir; compare again")
    a = p.parse_args()
    import torch
    from safetensors.torch import load_file, save_file

    work = prepare_inputs(a, "fsdp-qlora8b-peft-", reuse=a.reuse)
    out = work / "run"
    config = work / "qlora.toml"
    config.write_text(CONFIG.format(out=out, model=a.model_dir, data=a.data, steps=a.steps, seq=a.seq, lr=a.lr))
    adapter = work / "adapter"
    reused = a.reuse and (work / "logits.safetensors").exists() and adapter.exists()
    seconds = json.loads((work / "seconds.json").read_text()) if reused else {}
    if not reused:
        seconds["train"] = mpirun(2, [str(ROOT / "build/apps/fsdp-train"), str(config), "--progress", "lines"],
                                  work / "train.log")
        checkpoint = out / "checkpoints" / sorted(os.listdir(out / "checkpoints"))[-1]
        seconds["export"] = mpirun(2, [str(ROOT / "build/apps/fsdp-ckpt"), "export", str(checkpoint), "--peft-dir",
                                       str(adapter)], work / "export.log")
        vocab = json.loads((Path(a.model_dir) / "config.json").read_text())["vocab_size"]
        ids = torch.randint(0, vocab, (a.rows, a.tokens), generator=torch.Generator().manual_seed(55))
        save_file({"ids": ids}, str(work / "ids.safetensors"))
        seconds["fsdp_logits"] = mpirun(2, [str(ROOT / "build/tests/fsdp_hf_logits"), str(checkpoint),
                                            str(work / "ids.safetensors"), str(work / "logits.safetensors")],
                                        work / "logits.log")
        (work / "seconds.json").write_text(json.dumps(seconds))
    ids = load_file(str(work / "ids.safetensors"))["ids"]
    ours = load_file(str(work / "logits.safetensors"))["logits"]
    start = time.time()
    theirs, decoded_into_fp32, base_only, four_bit = peft_logits(a.model_dir, str(adapter), ids)
    seconds["peft"] = time.time() - start
    scale = theirs.abs().max().item()
    error = (ours - theirs).abs().max().item()
    effect = (theirs - base_only).abs().max().item()
    rounding = (ours - decoded_into_fp32).abs().max().item()
    adapter_config = json.loads((adapter / "adapter_config.json").read_text())
    passed = error <= RELATIVE_TOLERANCE * scale and effect >= 10 * error
    print(f"\n{Path(a.model_dir).name}: QLoRA r{adapter_config['r']} on {', '.join(sorted(adapter_config['target_modules']))}"
          f", {a.steps} steps at lr {a.lr:g}, 2 ranks; peft over transformers' 4-bit base ({four_bit} Linear4bit layers)")
    print(f"  logits on {a.rows} x {a.tokens} random tokens: largest |logit| {scale:.3g}")
    print(f"  fsdp.cpp against peft:           {error:.3e} ({error / scale:.1e} of the scale; tolerance {RELATIVE_TOLERANCE:g})")
    times = f"{effect / error:.0f}x" if error > 0 else "the difference is 0"
    print(f"  the adapter's effect in peft:    {effect:.3e} (must be 10x the difference: {times})")
    print(f"  (the 4-bit weights decoded into fp32 rather than bf16 in peft's model: {rounding:.3e} from fsdp.cpp's)")
    print(f"  seconds: train {seconds['train']:.0f}, export {seconds['export']:.0f}, fsdp.cpp logits "
          f"{seconds['fsdp_logits']:.0f}, peft {seconds['peft']:.0f}; peak resident of the peft process "
          f"{peak_resident_gib():.2f} GiB")
    print(f"  {'PASSED' if passed else 'FAILED'}")
    result = {"date": datetime.date.today().isoformat(), "model_dir": a.model_dir, "steps": a.steps, "lr": a.lr,
              "seq": a.seq, "rows": a.rows, "tokens": a.tokens, "four_bit_layers": four_bit,
              "adapter_targets": sorted(adapter_config["target_modules"]), "logit_scale": scale,
              "max_abs_difference": error, "adapter_effect": effect, "difference_decoded_into_fp32": rounding, "relative_tolerance": RELATIVE_TOLERANCE,
              "passed": passed, "seconds": seconds, "work_dir": str(work)}
    write_json(a.json, result)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
