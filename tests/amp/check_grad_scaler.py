#!/usr/bin/env python3
"""fsdp-train's float16 loss scaling against torch.amp.GradScaler itself.

fsdp-train runs a tiny GPT in float16 on 2 ranks, starting at a scale of 2^20 (above what its fp16
gradients hold, about 2^17: the first steps overflow and back off), growth every 4 clean steps
(which overflows again), twice: as it is, and with a bad batch at step 10 (FSDP_TEST_LOSS_FAULTS
multiplies its loss by 1e6: its gradients overflow where the plain run's did not). Its
metrics.jsonl gives, per step, the scale the step's backward used and whether it overflowed.

torch's GradScaler, with the same settings, is then fed the same overflows (an inf gradient on
exactly those steps) and must hold the same scale before every step: the history of scales is
GradScaler's arithmetic, value for value. The run is also resumed from its step-8 checkpoint and
must continue with the same scales and losses.

Usage: check_grad_scaler.py FSDP_TRAIN MPIRUN
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

STEPS = 20
INIT_SCALE = 2.0 ** 20
GROWTH_INTERVAL = 4
FAULT_STEP = 10  # 1-based, as printed


def run(train, mpirun, config, extra=(), fault=True):
    env = dict(os.environ)
    env.pop("FSDP_TEST_LOSS_FAULTS", None)
    if fault:
        env["FSDP_TEST_LOSS_FAULTS"] = f"{FAULT_STEP}:1e6"
    cmd = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", "2", train, config, "--progress", "lines", *extra]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout


def steps_of(metrics_path):
    steps = {}
    with open(metrics_path) as f:
        for line in f:
            record = json.loads(line)
            if "step" in record and "loss" in record:
                steps[record["step"]] = record  # a resumed run's records replace the first run's
    return [steps[s] for s in sorted(steps)]


def torch_scales(overflowed):
    """The scale GradScaler holds before each step, fed an inf gradient on the overflowed steps."""
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=GROWTH_INTERVAL)
    scales = []
    for overflow in overflowed:
        scales.append(scaler.get_scale())
        optimizer.zero_grad()
        scaler.scale(param.sum()).backward()
        if overflow:
            with torch.no_grad():
                param.grad[1] = float("inf")
        scaler.step(optimizer)
        scaler.update()
    return scales


def main():
    train, mpirun = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "run")
        config = os.path.join(work, "run.toml")
        with open(config, "w") as f:
            f.write(f"""name = "fp16-scaler"
output_dir = "{out}"
[model]
name = "gpt-test"
[train]
steps = {STEPS}
global_batch = 4
seq_len = 16
log_every = 1
threads = 1
[optimizer]
lr = 3e-3
warmup_steps = 2
[fsdp]
param_dtype = "float16"
[loss_scale]
init = {INIT_SCALE}
growth_interval = {GROWTH_INTERVAL}
[eval]
every = 0
sample_tokens = 0
[checkpoint]
every = 8
""")
        # The plain run first: its history is GradScaler's too, and step FAULT_STEP is clean there.
        run(train, mpirun, config, fault=False)
        plain = steps_of(os.path.join(out, "metrics.jsonl"))
        plain_overflowed = [r.get("skip_reason") == "overflow" for r in plain]
        if [r["loss_scale"] for r in plain] != torch_scales(plain_overflowed):
            sys.exit("FAIL: the plain run's scale history differs from torch.amp.GradScaler's")
        if plain_overflowed[FAULT_STEP - 1]:
            sys.exit(f"FAIL: step {FAULT_STEP} overflows without the bad batch: the check cannot see the injected one")
        os.rename(out, out + "-plain")

        log = run(train, mpirun, config)
        if "loss scaling: dynamic, scale 1.04858e+06" not in log:
            sys.exit("FAIL: the header does not say the loss scaling:\n" + log[:2000])
        records = steps_of(os.path.join(out, "metrics.jsonl"))
        if len(records) != STEPS:
            sys.exit(f"FAIL: {len(records)} step records, expected {STEPS}")
        ours = [r["loss_scale"] for r in records]
        overflowed = [r.get("skip_reason") == "overflow" for r in records]
        expected = torch_scales(overflowed)
        print("step  fsdp-train scale  GradScaler scale  overflow")
        for i, (a, b, o) in enumerate(zip(ours, expected, overflowed)):
            print(f"{i + 1:4d}  {a:16.0f}  {b:16.0f}  {'yes' if o else ''}{' (bad batch)' if i + 1 == FAULT_STEP else ''}")
        if ours != expected:
            sys.exit("FAIL: the scale history differs from torch.amp.GradScaler's")
        # The test sees what it guards: overflows that back off, growth, and the bad batch.
        if not overflowed[0]:
            sys.exit("FAIL: a scale of 2^20 should overflow this model's fp16 gradients at step 1")
        if not overflowed[FAULT_STEP - 1]:
            sys.exit(f"FAIL: step {FAULT_STEP}'s bad batch (loss x 1e6) did not overflow")
        if not any(b > a for a, b in zip(ours, ours[1:])):
            sys.exit("FAIL: the scale never grew")
        if sum(overflowed) != records[-1]["overflow_steps"]:
            sys.exit("FAIL: overflow_steps does not count the overflows")
        losses = [r["loss"] for r in records]

        # Resumed from step 8: the same scales and losses from there on.
        # (A branch from an older checkpoint goes into a directory of its own: fsdp-train refuses to
        # continue a run from a checkpoint older than its newest.)
        branch = out + "-from-8"
        run(train, mpirun, config, ["--resume", os.path.join(out, "checkpoints", "step-00000008"), "--output-dir", branch])
        resumed = steps_of(os.path.join(branch, "metrics.jsonl"))
        if [r["step"] for r in resumed] != list(range(9, STEPS + 1)):
            sys.exit("FAIL: the resumed run's steps are " + str([r["step"] for r in resumed]))
        if [r["loss_scale"] for r in resumed] != ours[8:]:
            sys.exit("FAIL: the resumed run's scales differ: " + str([r["loss_scale"] for r in resumed]))
        if [r["loss"] for r in resumed] != losses[8:]:
            sys.exit("FAIL: the resumed run's losses differ")
        print(f"OK: {STEPS} steps, {sum(overflowed)} overflows ({sum(plain_overflowed)} without the bad batch), the scale "
              f"history equals torch.amp.GradScaler's "
              f"(torch {torch.__version__}); resumed at step 8 with the same scales and losses")


if __name__ == "__main__":
    main()
