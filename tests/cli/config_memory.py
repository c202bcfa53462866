#!/usr/bin/env python3
"""Every config in configs/, run briefly: its memory prediction against its measured peak.

    python3 tests/cli/config_memory.py BUILD_DIR MPIEXEC [--json FILE] [--markdown FILE] [--only NAME ...]
                                       [--work NEW_DIR]   (keeps the runs and their logs there)

Each config runs at 2 ranks for 4 steps with an evaluation at steps 0, 2 and 4 (the whole test set
for the image models, eval.batches for text), as written otherwise. What a config needs that a
fresh clone lacks is made first with the project's own commands, as scripts/finetune.sh does: the
fortunes tokenizer (fsdp-data train-tokenizer), the pretrained Llama (4 steps of
llama-fortunes-pretrain, exported by fsdp-ckpt) and the instruction data (fsdp-data instructions).

Per config:
  planned   the run's own prediction (metrics.jsonl predicted_peak_bytes_per_rank): fsdp-plan's
            process peak for a CPU run (device total + data held + ...; plan/memory_plan.h)
  measured  the largest rank's resident peak (VmHWM) over the run, what the report shows
  fsdp-plan fsdp-plan CONFIG --ranks 2 with the same --set: must equal `planned` (one prediction)
Checked: measured / planned - 1 within the config's tolerance (10%, the aim; a wider one, with its
reason, where the plan is known to fall short); and fsdp-plan's figure equal to the run's.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AIM = 0.10
# Configs whose prediction is known to fall short of the aim, each with the tolerance that still
# catches the errors this test was written for (ViT's 5x of 2026-12-05) and its reason
# (docs/planning.md, "How close it comes"; gpt-fortunes-tiny measured -6.2% to -8.2% against the
# plan over ten runs).
KNOWN_SHORT = {
    # Since the blocks' terms were measured (tests/unit/block_activation_tests.cpp, 2026-12-06), the
    # language model's fp32 attention is no longer counted at 16 bytes a channel of the stream, and
    # what that hid shows: 17 MiB live after the start-up matmul measurements (bf16 GEMMs' state
    # that libtorch keeps) and 14 MiB after the first evaluation's generated answers, neither in the
    # plan (memory traces, 2026-12-06). Measured +9.2% to +10.4%.
    "llava-fashion-mnist": (0.13, "bf16 GEMM state after the start-up measurements and the first "
                                  "evaluation's answers, 31 MiB live, not in the plan"),
}
NOT_MODELLED = {}  # configs fsdp-plan does not model: none since LLaVA (2026-12-06)
STEPS = ["--set", "train.steps=4", "--set", "eval.every=2", "--set", "train.log_every=1"]


def run(cmd, log, env=None):
    with open(log, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    if done.returncode != 0:
        sys.stderr.write(Path(log).read_text()[-3000:])
        raise SystemExit(f"config_memory: {' '.join(map(str, cmd))} exited {done.returncode} (log {log})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("mpiexec")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--work", help="write the runs and their logs into this new directory and keep them "
                                       "(default: a temporary one, removed when every check passes)")
    args = parser.parse_args()
    apps = Path(args.build).resolve() / "apps"
    # A build configured with FSDP_TCMALLOC=OFF runs on glibc's heap, as its user chose.
    cache = Path(args.build) / "CMakeCache.txt"
    tcmalloc = not (cache.exists() and "FSDP_TCMALLOC:BOOL=OFF" in cache.read_text())
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    mpi = [args.mpiexec, "--oversubscribe", "-np", "2"]
    if args.work:
        work = Path(args.work).resolve()
        if work.exists():  # a new directory: nothing of the user's is overwritten
            sys.exit(f"config_memory: --work {work} exists; name a new directory")
        work.mkdir(parents=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="config-memory-"))

    # What the configs read that a fresh clone does not have.
    tokenizer = work / "fortunes-bpe"
    run([apps / "fsdp-data", "train-tokenizer", "--output-dir", tokenizer, "--vocab-size", "4096"], work / "tokenizer.log")
    tokenizer_json = ["--set", f'data.tokenizer_json="{tokenizer}/tokenizer.json"']
    chat = work / "fortune-chat.jsonl"
    run([apps / "fsdp-data", "instructions", "--output", chat], work / "instructions.log")
    pretrained = work / "pretrain-hf"
    extra = {
        "llama-fortunes-pretrain": tokenizer_json + ["--set", "checkpoint.every=4"],
        "llama-finetune-fortunes": ["--set", f'model.init_from="{pretrained}"', "--set", f'data.train_jsonl="{chat}"'],
        # Its evaluation generates an answer per image (about 30 ms each here): 128 images, not the
        # config's 2000, three times (3 minutes of the test's 4 otherwise). It is not planned.
        "llava-fashion-mnist": ["--set", "eval.max_items=128"],
    }
    configs = sorted(p.stem for p in (ROOT / "configs").glob("*.toml"))
    # The pretrained Llama first: the fine-tune starts from it.
    configs.sort(key=lambda name: name != "llama-fortunes-pretrain")
    failures, rows = [], []
    for name in configs:
        if args.only and name not in args.only and not (name == "llama-fortunes-pretrain" and "llama-finetune-fortunes" in args.only):
            continue
        overrides = extra.get(name, []) + ["--set", "checkpoint.every=0"] * (name != "llama-fortunes-pretrain")
        out = work / name
        run(mpi + [apps / "fsdp-train", ROOT / "configs" / f"{name}.toml", *STEPS, *overrides, "--output-dir", out],
            work / f"{name}.log", env)
        if name == "llama-fortunes-pretrain":
            run([apps / "fsdp-ckpt", "export", out / "checkpoints" / "step-00000004", "--hf-dir", pretrained], work / "export.log")
        planned, measured, heaps = None, 0.0, set()
        for line in (out / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            heaps |= {record["host_heap"]} if "host_heap" in record else set()
            planned = record.get("predicted_peak_bytes_per_rank", planned)
            measured = max([measured] + record.get("peak_resident_bytes_per_rank", []))
        if tcmalloc and heaps != {"tcmalloc"}:  # plan::kCpuHeapCacheBytes is tcmalloc's, as measured
            failures.append(f"{name}: fsdp-train's heap was {sorted(heaps) or 'not recorded'}, not tcmalloc "
                            "(apps/CMakeLists.txt links it)")
        plan_json = work / f"{name}.plan.json"
        plan = subprocess.run([apps / "fsdp-plan", ROOT / "configs" / f"{name}.toml", "--ranks", "2", *STEPS, *overrides,
                               "--json", plan_json], cwd=ROOT, capture_output=True, text=True)
        row = {"config": name, "measured_bytes": measured}
        if name in NOT_MODELLED:
            row["note"] = NOT_MODELLED[name]
            if planned is not None or plan.returncode == 0:
                failures.append(f"{name}: predicted now; take it out of NOT_MODELLED")
            rows.append(row)
            continue
        if planned is None or plan.returncode != 0:
            failures.append(f"{name}: no prediction (fsdp-plan: {plan.stderr.strip()})")
            continue
        from_plan = json.loads(plan_json.read_text())["peak_bytes"]
        memory = json.loads(plan_json.read_text())["memory_bytes"]
        tolerance, reason = KNOWN_SHORT.get(name, (AIM, ""))
        error = measured / planned - 1
        row.update(planned_bytes=planned, fsdp_plan_bytes=from_plan, error=error, tolerance=tolerance, note=reason,
                   data_bytes=memory["data"], activations_bytes=memory["activations"], overhead_bytes=memory["overhead"])
        rows.append(row)
        if from_plan != planned:
            failures.append(f"{name}: fsdp-plan says {from_plan} bytes, the run predicted {planned}")
        if abs(error) > tolerance:
            failures.append(f"{name}: measured {measured / 2**20:.1f} MiB against {planned / 2**20:.1f} MiB planned "
                            f"({100 * error:+.1f}%, tolerance {100 * tolerance:.0f}%)")

    mib = lambda b: f"{b / 2**20:.1f}"
    lines = ["| config | planned (MiB) | measured peak (MiB) | measured / planned - 1 | data held (MiB) | activations (MiB) | note |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        if "planned_bytes" in r:
            lines.append(f"| {r['config']} | {mib(r['planned_bytes'])} | {mib(r['measured_bytes'])} | {100 * r['error']:+.1f}% | "
                         f"{mib(r['data_bytes'])} | {mib(r['activations_bytes'])} | {r['note']} |")
        else:
            lines.append(f"| {r['config']} | - | {mib(r['measured_bytes'])} | - | - | - | {r['note']} |")
    table = "\n".join(lines)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"ranks": 2, "steps": 4, "rows": rows}, indent=2) + "\n")
    if failures:
        print("\n".join(["config_memory: FAILED"] + failures))
        return 1
    print(f"config_memory: {len(rows)} configs checked")
    if not args.work:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
