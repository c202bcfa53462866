#!/usr/bin/env python3
"""fsdp-plan's prediction against what fsdp-train measures, per rank, on real runs.

    /usr/bin/python3 bench/plan_vs_measured.py --json out/bench/plan_vs_measured.json

Each run: fsdp-train for 3 steps with a GPT of the given shape, strategy and rank count (the
main job's config with --set overrides), then fsdp-plan on the very same config and overrides.
Compared per rank:
  gathered   the runtime's peak gathered bytes (metrics.jsonl) against the plan's gathered buffers
  live       the largest rank's peak of live memory: glibc's bytes in use plus FSDP's host
             buffers (mapped outside the heap, shard/storage.h), sampled every millisecond by
             fsdp-train's FSDP_MEMORY_TRACE, plus the process's other resident memory (code,
             libraries, stacks), against the plan's device total. What
             torch.cuda.max_memory_allocated is on a GPU: the bytes the program holds.
  resident   the largest rank's peak resident memory (VmHWM) against the same total: live memory
             plus what the allocator keeps mapped after it was freed (glibc's heap does not
             return freed blocks in its middle; fsdp-train keeps freed memory mapped on purpose,
             docs/benchmarks.md) and cached FSDP buffers. What max_memory_reserved is on a GPU.
The process overhead is calibrated once per rank count, for live and resident each, on a small
run (a 2-block, width-256 GPT, 3 steps): its measured peak less what the plan predicts for it
without overhead. That run is not one of the runs compared.
The aim: within 10% on every run.
"""
import re
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs/gpt-fortunes-tiny.toml"

# (label, ranks, overrides): sizes, strategies and N that differ.
RUNS = [
    ("gpt 227M full_shard N=4", 4, {"model.layers": 8, "model.dim": 1536, "model.heads": 12}),
    ("gpt 227M full_shard N=2", 2, {"model.layers": 8, "model.dim": 1536, "model.heads": 12}),
    ("gpt 114M full_shard N=1", 1, {"model.layers": 4, "model.dim": 1536, "model.heads": 12}),
    ("gpt 152M shard_grad_op N=4", 4, {"model.layers": 12, "model.dim": 1024, "model.heads": 8,
                                       "fsdp.strategy": "shard_grad_op"}),
    ("gpt 152M no_shard N=2", 2, {"model.layers": 12, "model.dim": 1024, "model.heads": 8,
                                  "fsdp.strategy": "no_shard"}),
    ("gpt 227M hybrid 2x2 N=4", 4, {"model.layers": 8, "model.dim": 1536, "model.heads": 12,
                                    "fsdp.strategy": "hybrid_shard", "fsdp.shard_group_size": 2}),
    ("gpt 152M bf16 N=2", 2, {"model.layers": 12, "model.dim": 1024, "model.heads": 8,
                              "fsdp.param_dtype": "bfloat16"}),
    ("gpt 152M no-sync x2 N=2", 2, {"model.layers": 12, "model.dim": 1024, "model.heads": 8,
                                    "train.micro_batches": 2, "train.sync_each_micro_batch": False}),
]
COMMON = {"model.name": "gpt-mini", "model.context": 128, "train.seq_len": 128, "train.steps": 3,
          "train.log_every": 1, "optimizer.warmup_steps": 0, "eval.every": 1000, "eval.batches": 1,
          "eval.sample_tokens": 1, "checkpoint.every": 0}


def set_args(overrides):
    args = []
    for key, value in overrides.items():
        args += ["--set", f"{key}={json.dumps(value) if isinstance(value, (str, bool)) else value}"]
    return args


def mpirun(ranks):
    flags = ["-x", "OMPI_ALLOW_RUN_AS_ROOT=1", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"] if os.geteuid() == 0 else []
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), "-x", "FSDP_MEMORY_TRACE", *flags]


TRACE = re.compile(r"memory-trace rank (\d+) step \d+ until \S+ +peak: resident +([\d.]+) MiB, live +([\d.]+) MiB; "
                   r"now: resident +([\d.]+) MiB, live +[\d.]+ MiB = heap in use +[\d.]+ \+ fsdp buffers +([\d.]+) MiB; "
                   r"(?:\S+ )?heap mapped +([\d.]+) MiB")


def live_peak_bytes(log):
    """Largest rank's peak of live memory from fsdp-train's memory trace (see the docstring)."""
    best = 0.0
    for rank, _, live_peak, resident_now, buffers_now, heap_mapped in TRACE.findall(Path(log).read_text()):
        # Resident memory that is neither the heap nor FSDP's mapped buffers: code, libraries, stacks.
        outside = float(resident_now) - float(heap_mapped) - float(buffers_now)
        best = max(best, float(live_peak) + outside)
    if best == 0.0:
        sys.exit(f"plan_vs_measured: no memory-trace lines in {log} (FSDP_MEMORY_TRACE)")
    return best * 2**20


def run(command, log):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", FSDP_MEMORY_TRACE="1")
    with open(log, "w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if code != 0:
        sys.exit(f"plan_vs_measured: {' '.join(map(str, command))} failed (exit {code}); see {log}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--global-batch", type=int, default=8, help="windows per step over all ranks")
    parser.add_argument("--json", default="out/bench/plan_vs_measured.json")
    parser.add_argument("--work-dir", default="")
    a = parser.parse_args()
    if a.global_batch < 4 or a.global_batch % 4:
        sys.exit("plan_vs_measured: --global-batch must be a positive multiple of 4 (ranks 1, 2 and 4)")
    for exe in ("build/apps/fsdp-train", "build/apps/fsdp-plan"):
        if not (ROOT / exe).exists():
            sys.exit(f"plan_vs_measured: {exe} is missing: build first")
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="fsdp-plan-check-"))
    work.mkdir(parents=True, exist_ok=True)

    def train_and_plan(name, ranks, sets, overheads):
        """fsdp-train's peaks (gathered; largest rank's live and resident) and fsdp-plan's JSON for
        the same config, once per overhead given ({"live": bytes, "resident": bytes})."""
        out_dir = work / name
        run([*mpirun(ranks), str(ROOT / "build/apps/fsdp-train"), str(CONFIG), "--progress", "lines",
             *set_args({**sets, "output_dir": str(out_dir)})], work / f"{name}.log")
        steps = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in steps if "step" in r]
        plans = {}
        for kind, overhead in overheads.items():
            plan_json = work / f"{name}_plan_{kind}.json"
            run([str(ROOT / "build/apps/fsdp-plan"), str(CONFIG), *set_args(sets), "--ranks", str(ranks),
                 "--overhead", f"{overhead}B", "--json", str(plan_json)], work / f"{name}_plan_{kind}.log")
            plans[kind] = json.loads(plan_json.read_text())
        measured = {"gathered": max(r["peak_gathered_bytes"] for r in steps), "live": live_peak_bytes(work / f"{name}.log"),
                    "resident": max(max(r["peak_resident_bytes_per_rank"]) for r in steps)}
        return measured, plans

    overheads = {}
    rows = []
    for label, ranks, overrides in RUNS:
        if ranks not in overheads:
            small = {**COMMON, "model.layers": 2, "model.dim": 256, "model.heads": 4, "train.global_batch": a.global_batch}
            measured, plans = train_and_plan(f"calibrate_np{ranks}", ranks, small, {"none": 0})
            without = plans["none"]["memory_bytes"]["device_total"]
            overheads[ranks] = {kind: int(measured[kind] - without) for kind in ("live", "resident")}
            print(f"calibration at {ranks} rank(s): peak live {measured['live'] / 2**20:.1f} MiB, resident "
                  f"{measured['resident'] / 2**20:.1f} MiB, of which the process (overhead) "
                  f"{overheads[ranks]['live'] / 2**20:.1f} and {overheads[ranks]['resident'] / 2**20:.1f} MiB", flush=True)
        sets = {**COMMON, **overrides, "train.global_batch": a.global_batch}
        name = label.replace(" ", "_").replace("=", "")
        measured, plans = train_and_plan(name, ranks, sets, overheads[ranks])
        row = {"label": label, "ranks": ranks, "parameters": plans["live"]["parameters"], "overhead_bytes": overheads[ranks],
               "plan": plans["live"]}
        predicted = {"gathered": plans["live"]["memory_bytes"]["gathered"],
                     "live": plans["live"]["memory_bytes"]["device_total"],
                     "resident": plans["resident"]["memory_bytes"]["device_total"]}
        for kind in ("gathered", "live", "resident"):
            row[f"measured_{kind}_bytes"] = measured[kind]
            row[f"predicted_{kind}_bytes"] = predicted[kind]
            row[f"{kind}_error"] = predicted[kind] / measured[kind] - 1
        rows.append(row)
        print(f"{label:<27}" + "; ".join(
            f"{kind} {measured[kind] / 2**20:7.1f} MiB measured, {predicted[kind] / 2**20:7.1f} predicted ({row[kind + '_error']:+.1%})"
            for kind in ("gathered", "live", "resident")), flush=True)
    worst = {kind: max(abs(r[f"{kind}_error"]) for r in rows) for kind in ("gathered", "live", "resident")}
    within = {kind: sum(abs(r[f"{kind}_error"]) <= 0.10 for r in rows) for kind in worst}
    print("\n" + "; ".join(f"{kind}: worst {worst[kind]:.1%}, {within[kind]} of {len(rows)} within 10%" for kind in worst))
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(a.json).with_name(Path(a.json).name + ".partial")
    partial.write_text(json.dumps({"rows": rows, "worst_error": worst, "within_10_percent": within}, indent=2) + "\n")
    partial.replace(a.json)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
