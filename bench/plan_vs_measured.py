#!/usr/bin/env python3
"""fsdp-plan's prediction against what fsdp-train measures, per rank, on real runs.

    /usr/bin/python3 bench/plan_vs_measured.py --json out/bench/plan_vs_measured.json

Each run: fsdp-train for 3 steps with a GPT of the given shape, strategy and rank count (the
main job's config with --set overrides), then fsdp-plan on the very same config and overrides.
Compared per rank:
  gathered   the runtime's peak gathered bytes (metrics.jsonl) against the plan's gathered buffers
  resident   the largest rank's peak resident memory (VmHWM) against the plan's device total.
             The process overhead is calibrated once per rank count on a small run (a 2-block,
             width-256 GPT, 3 steps): its measured peak less what the plan predicts for it without
             overhead. That run is not one of the runs compared.
The aim: within 10% on every run.
"""
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
]
COMMON = {"model.name": "gpt-mini", "model.context": 128, "train.seq_len": 128, "train.steps": 3,
          "train.log_every": 1, "optimizer.warmup_steps": 0, "eval.every": 1000, "eval.batches": 1,
          "eval.sample_tokens": 1, "checkpoint.every": 0}


def set_args(overrides):
    args = []
    for key, value in overrides.items():
        args += ["--set", f"{key}={json.dumps(value) if isinstance(value, str) else value}"]
    return args


def mpirun(ranks):
    flags = ["-x", "OMPI_ALLOW_RUN_AS_ROOT=1", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"] if os.geteuid() == 0 else []
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *flags]


def run(command, log):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
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

    def train_and_plan(name, ranks, sets, overhead):
        """fsdp-train's peaks (gathered, largest rank's resident) and fsdp-plan's JSON, same config."""
        out_dir = work / name
        run([*mpirun(ranks), str(ROOT / "build/apps/fsdp-train"), str(CONFIG), "--progress", "lines",
             *set_args({**sets, "output_dir": str(out_dir)})], work / f"{name}.log")
        steps = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in steps if "step" in r]
        plan_json = work / f"{name}_plan.json"
        run([str(ROOT / "build/apps/fsdp-plan"), str(CONFIG), *set_args(sets), "--ranks", str(ranks),
             "--overhead", f"{overhead}B", "--json", str(plan_json)], work / f"{name}_plan.log")
        return (max(r["peak_gathered_bytes"] for r in steps),
                max(max(r["peak_resident_bytes_per_rank"]) for r in steps), json.loads(plan_json.read_text()))

    overheads = {}
    rows = []
    for label, ranks, overrides in RUNS:
        if ranks not in overheads:
            small = {**COMMON, "model.layers": 2, "model.dim": 256, "model.heads": 4, "train.global_batch": a.global_batch}
            _, resident, plan = train_and_plan(f"calibrate_np{ranks}", ranks, small, 0)
            overheads[ranks] = resident - plan["memory_bytes"]["device_total"]
            print(f"calibration at {ranks} rank(s): peak {resident / 2**20:.1f} MiB, of which "
                  f"{overheads[ranks] / 2**20:.1f} MiB the process (overhead)", flush=True)
        sets = {**COMMON, **overrides, "train.global_batch": a.global_batch}
        name = label.replace(" ", "_").replace("=", "")
        measured_gathered, measured_resident, plan = train_and_plan(name, ranks, sets, overheads[ranks])
        predicted_gathered = plan["memory_bytes"]["gathered"]
        predicted_resident = plan["memory_bytes"]["device_total"]
        rows.append({"label": label, "ranks": ranks, "parameters": plan["parameters"],
                     "measured_gathered_bytes": measured_gathered, "predicted_gathered_bytes": predicted_gathered,
                     "measured_resident_bytes": measured_resident, "predicted_resident_bytes": predicted_resident,
                     "overhead_bytes": overheads[ranks], "plan": plan,
                     "gathered_error": predicted_gathered / measured_gathered - 1,
                     "resident_error": predicted_resident / measured_resident - 1})
        r = rows[-1]
        print(f"{label:<28} gathered {measured_gathered / 2**20:8.1f} MiB measured, {predicted_gathered / 2**20:8.1f} "
              f"predicted ({r['gathered_error']:+.1%}); resident {measured_resident / 2**20:8.1f} MiB measured, "
              f"{predicted_resident / 2**20:8.1f} predicted ({r['resident_error']:+.1%})", flush=True)
    worst = max(max(abs(r["gathered_error"]), abs(r["resident_error"])) for r in rows)
    print(f"\nworst error {worst:.1%} over {len(rows)} runs (aim: within 10%)")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(a.json).with_name(Path(a.json).name + ".partial")
    partial.write_text(json.dumps({"rows": rows, "worst_error": worst}, indent=2) + "\n")
    partial.replace(a.json)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
