#!/usr/bin/env python3
"""Llama 3.1 8B QLoRA at its real size on this machine, measured against fsdp-plan (issue 55).

For each N: fsdp-plan --calibrate --fit picks the settings for this machine's memory shared by N
ranks (MemTotal less 2 GiB for the system, over N; activation checkpointing fixed on, as QLoRA's
recipe has it: without it the 8 B run at N = 2 was killed for memory, 2026-12-05), fsdp-train runs them on the 8B directory
(bench/make_llama8b.py, made once if missing) with lora.base_dtype = "nf4", rank 16 on every
linear layer, 512 tokens per rank, a few steps on the instruction set; every rank's peak resident
memory from its start to its last step (VmHWM, metrics.jsonl) is put beside the plan's predicted
peak. transformers + bitsandbytes loading the same directory 4-bit in one process
(bench/hf_4bit_load.py) is the loading peer. Prints a table and writes JSON.

  .venv/bin/python bench/qlora_8b.py                       # N = 2 and 4, 2 steps each
  .venv/bin/python bench/qlora_8b.py --ranks 2 --steps 1   # the shortest look
About 15 minutes a step at N = 2 on the 2-core VM (fp32 GEMMs on bf16 operands: no bf16 units).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv/bin/python")
CONFIG = """name = "qlora-8b"
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
global_batch = {ranks}
seq_len = {seq}
log_every = 1
report_every = 0
[eval]
every = 0
batches = 1
sample_tokens = 0
[optimizer]
lr = 1e-4
warmup_steps = 0
[fsdp]
param_dtype = "bfloat16"
activation_checkpointing = true   # the issue's recipe; --fit searches the rest
[lora]
rank = 16
alpha = 32
targets = "all-linear"
base_dtype = "nf4"
[checkpoint]
every = 0
"""


def mpirun(ranks):
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]


def env():
    # FSDP_MEMORY_TRACE: each rank's resident and live peaks per phase in the log (built, loaded, start,
    # forward, backward, ...), for where a peak comes from.
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", FSDP_MEMORY_TRACE="1")


def mem_total_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    sys.exit("qlora_8b: no MemTotal in /proc/meminfo")


def run_timed(command, log_path):
    """Runs `command`, its output to log_path; returns (exit status, seconds, {line prefix: seconds})."""
    start = time.time()
    marks = {}
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env(), cwd=ROOT,
                                   text=True)
        for line in process.stdout:
            log.write(line)
            log.flush()
            for prefix in ("fsdp-train:", "eval  step 0", "step 1/"):
                if line.startswith(prefix) and prefix not in marks:
                    marks[prefix] = time.time() - start
        status = process.wait()
    return status, time.time() - start, marks


def one_run(a, ranks, work):
    budget = (mem_total_bytes() - (2 << 30)) // ranks
    config = work / f"qlora-{ranks}.toml"
    out = work / f"out-{ranks}"
    config.write_text(CONFIG.format(out=out, model=a.model_dir, data=a.data, steps=a.steps, ranks=ranks, seq=a.seq))
    fit_json = work / f"fit-{ranks}.json"
    fit = subprocess.run([*mpirun(ranks), str(ROOT / "build/apps/fsdp-plan"), str(config), "--calibrate", "--fit",
                          f"{budget}B", "--json", str(fit_json)], env=env(), cwd=ROOT, capture_output=True, text=True)
    (work / f"fit-{ranks}.log").write_text(fit.stdout + fit.stderr)
    if fit.returncode != 0:
        sys.exit(f"qlora_8b: fsdp-plan --fit failed at N = {ranks} (exit {fit.returncode}):\n{fit.stdout}{fit.stderr}")
    plan = json.loads(fit_json.read_text())
    sets = [arg for key, value in plan["fit"]["config_keys"].items() for arg in ("--set", f"{key}={value}")]
    log = work / f"train-{ranks}.log"
    status, seconds, marks = run_timed([*mpirun(ranks), str(ROOT / "build/apps/fsdp-train"), str(config), *sets,
                                        "--progress", "lines"], log)
    if status != 0:
        tail = log.read_text().splitlines()[-20:]
        sys.exit(f"qlora_8b: fsdp-train failed at N = {ranks} (exit {status}); end of {log}:\n" + "\n".join(tail))
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step" in s and "loss" in s]
    measured = steps[-1]["peak_resident_bytes_per_rank"]  # each rank's VmHWM from its start
    predicted = plan["peak_bytes"]
    return {
        "ranks": ranks, "memory_budget_bytes": budget, "fit_config_keys": plan["fit"]["config_keys"],
        "plans_searched": plan["fit"]["searched"], "predicted_peak_bytes": predicted,
        "measured_peak_bytes_per_rank": measured, "ratio_per_rank": [m / predicted for m in measured],
        "loaded_seconds": marks.get("fsdp-train:"), "seconds_to_first_step": marks.get("eval  step 0"),
        "step_seconds": [s["step_seconds"] for s in steps], "losses": [s["loss"] for s in steps],
        "tokens_per_second": [s["tokens_per_second"] for s in steps], "run_seconds": seconds,
        "log": str(log),
    }


def add_input_arguments(p, json_name):
    """--model-dir, --data, --json and --work-dir, as the 8B benchmarks (this one, qlora_8b_peft.py) take them."""
    p.add_argument("--model-dir", default=str(ROOT / "runs/models/llama-3.1-8b-random"))
    p.add_argument("--data", default=str(ROOT / "runs/data/fortune-chat.jsonl"))
    p.add_argument("--json", default=str(ROOT / "runs/bench" / json_name))
    p.add_argument("--work-dir", default=None, help="default: a new temporary directory (kept: it holds the logs)")


def prepare_inputs(a, prefix, reuse=False):
    """The 8B directory and the instruction data, each made once if missing; the work directory (a
    --work-dir that holds files is refused unless `reuse`: nothing there is replaced)."""
    if a.work_dir and Path(a.work_dir).is_dir() and any(Path(a.work_dir).iterdir()) and not reuse:
        sys.exit(f"{Path(sys.argv[0]).name}: --work-dir {a.work_dir} holds files; give a new or empty directory "
                 "(nothing there is replaced)")
    if not Path(a.model_dir).exists():
        subprocess.run([PYTHON, str(ROOT / "bench/make_llama8b.py"), "--out", a.model_dir], check=True)
    if not Path(a.data).exists():
        Path(a.data).parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([str(ROOT / "build/apps/fsdp-data"), "instructions", "--output", a.data], check=True, cwd=ROOT)
    work = Path(a.work_dir or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    return work


def write_json(path, result):
    """`result` into `path` through path.partial: an interrupted write leaves no file that looks whole."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(str(path) + ".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(path)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--no-peer", action="store_true", help="leave out transformers + bitsandbytes")
    add_input_arguments(p, "qlora_8b.json")
    a = p.parse_args()
    work = prepare_inputs(a, "fsdp-qlora8b-")

    rows = [one_run(a, n, work) for n in a.ranks]
    peer = None
    if not a.no_peer:
        done = subprocess.run([PYTHON, str(ROOT / "bench/hf_4bit_load.py"), a.model_dir], capture_output=True,
                              text=True, cwd=ROOT)
        (work / "peer.log").write_text(done.stdout + done.stderr)
        peer = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-2000:]}

    gib = 2**30
    with open(Path(a.model_dir) / "config.json") as f:
        shape = json.load(f)
    print(f"\n{Path(a.model_dir).name} ({shape['model_type']}: {shape['num_hidden_layers']} layers, width "
          f"{shape['hidden_size']}, random bf16 weights), QLoRA: NF4 base, rank 16 on every linear "
          f"layer, {a.seq} tokens per rank, {a.steps} steps; this machine: {mem_total_bytes() / gib:.1f} GiB, "
          f"{os.cpu_count()} cores")
    print(f"{'N':>2} {'settings (fsdp-plan --fit)':<44} {'planned':>8} {'measured VmHWM per rank':>26} "
          f"{'ratio':>12} {'loaded':>7} {'step s':>7} {'tok/s':>6}")
    for r in rows:
        keys = ", ".join(f"{k.split('.')[-1]}={v.strip(chr(34))}" for k, v in r["fit_config_keys"].items()
                         if k in ("fsdp.strategy", "fsdp.activation_checkpointing", "fsdp.max_inflight",
                                  "train.loss_chunk_tokens", "fsdp.activation_checkpointing_every"))
        measured = ", ".join(f"{m / gib:.2f}" for m in r["measured_peak_bytes_per_rank"])
        ratios = ", ".join(f"{x:.2f}" for x in r["ratio_per_rank"])
        print(f"{r['ranks']:>2} {keys:<44} {r['predicted_peak_bytes'] / gib:>7.2f}G {measured:>25}G {ratios:>12} "
              f"{r['loaded_seconds'] or 0:>6.0f}s {sorted(r['step_seconds'])[len(r['step_seconds']) // 2]:>7.0f} "
              f"{sorted(r['tokens_per_second'])[len(r['tokens_per_second']) // 2]:>6.1f}")
        total = sum(r["measured_peak_bytes_per_rank"])
        r["measured_peak_bytes_all_ranks"] = total
    if peer:
        if "error" in peer:
            print(f"transformers + bitsandbytes load_in_4bit: failed: {peer['error'][-300:]}")
        else:
            print(f"transformers + bitsandbytes load_in_4bit, one process: loaded in {peer['seconds']:.0f} s, "
                  f"peak resident {peer['peak_resident_mib'] / 1024:.2f} GiB "
                  f"({peer['resident_after_mib'] / 1024:.2f} GiB after loading)")
            for r in rows:
                print(f"  fsdp.cpp N = {r['ranks']}: all ranks' peaks together {r['measured_peak_bytes_all_ranks'] / gib:.2f}"
                      f" GiB ({r['measured_peak_bytes_all_ranks'] / gib / (peer['peak_resident_mib'] / 1024):.2f}x), "
                      f"loaded in {r['loaded_seconds'] or 0:.0f} s (each rank reads and quantizes 1/N)")
    out = {"date": datetime.date.today().isoformat(), "model_dir": a.model_dir, "seq": a.seq, "steps": a.steps,
           "mem_total_bytes": mem_total_bytes(), "cores": os.cpu_count(), "rows": rows, "transformers_bnb": peer,
           "work_dir": str(work)}
    write_json(a.json, out)


if __name__ == "__main__":
    main()
