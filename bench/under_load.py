#!/usr/bin/env python3
"""bench/under_load: how much a busy core slows fsdp.cpp down, beside PyTorch DDP, in one run.

    bash bench/under_load.sh                   # builds first; or, with build/ and .venv/ ready:
    .venv/bin/python bench/under_load.py --json out/bench/under_load.json

The main job's model (GPT 4 x 128, 4 heads, byte vocabulary, 128-token windows, global batch 32)
at N = 2 on this machine, trained by fsdp-train (FULL_SHARD, prefetch) and by PyTorch DDP on gloo
(bench/torch_gpt.py, the same GPT), each alone and beside a background process that keeps one
core busy (a shell loop: `while :; do :; done`). The four configurations run --rounds times,
interleaved. Reported per configuration: the median step and its tokens/s, the 10th and 90th
percentile step (the swing), fsdp.cpp's exposed communication per step (median and largest), and
the slowdown: loaded median step / unloaded median step, fsdp.cpp beside DDP. fsdp.cpp runs once
per way of waiting for MPI in --comm-waits (FSDP_COMM_WAIT: spin, backoff; include/fsdp/comm/
process_group.h), so that the choice of default is measured here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402  (fsdp_run, json_run, mpirun: the same launch as bench/compare)

ROOT = compare.ROOT


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def fsdp_run(a, work, name):
    out_dir = work / name
    r = compare.fsdp_run(a, 2, work)
    metrics = [json.loads(line) for line in (work / "fsdp_np2" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "step" in m][a.warmup:]
    exposed = [max(m.get("exposed_communication_seconds_per_rank", [0.0])) for m in steps]
    out_dir.mkdir(parents=True, exist_ok=True)
    (work / "fsdp_np2" / "metrics.jsonl").replace(out_dir / "metrics.jsonl")
    r["exposed_seconds"] = exposed
    return r


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default="out/bench/under_load.json")
    parser.add_argument("--work-dir", default="")
    parser.add_argument("--comm-waits", default="spin,backoff", help="FSDP_COMM_WAIT values to run fsdp.cpp with")
    a = parser.parse_args()
    # compare.fsdp_run / json_run read these: the main job's model and batch.
    a.layers, a.dim, a.heads, a.seq, a.batch = 4, 128, 4, 128, 32
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="fsdp-under-load-"))
    work.mkdir(parents=True, exist_ok=True)
    systems = [f"fsdp-{wait}" for wait in a.comm_waits.split(",")] + ["ddp"]
    configs = [(system, loaded) for loaded in (False, True) for system in systems]
    results = {c: [] for c in configs}
    for round_index in range(a.rounds):
        for system, loaded in configs:
            name = f"{system}_{'loaded' if loaded else 'idle'}_round{round_index}"
            print(f"round {round_index + 1}/{a.rounds}: {name}", flush=True)
            load = subprocess.Popen(["/bin/sh", "-c", "while :; do :; done"]) if loaded else None
            try:
                if system.startswith("fsdp"):
                    os.environ["FSDP_COMM_WAIT"] = system.split("-", 1)[1]
                    r = fsdp_run(a, work, name)
                else:
                    r = compare.json_run(a, [*compare.mpirun(2), compare.PYTHON, str(ROOT / "bench/torch_gpt.py"),
                                             "--wrap", "ddp"], name, work)
                    if "error" in r:
                        sys.exit(f"under_load: DDP failed: {r['error']}")
            finally:
                if load:
                    load.kill()
                    load.wait()
            results[(system, loaded)].append(r)

    rows = []
    for (system, loaded), runs in results.items():
        steps = [s for r in runs for s in r["step_seconds"]]
        exposed = [e for r in runs for e in r.get("exposed_seconds", [])]
        median = statistics.median(steps)
        rows.append({"system": system, "loaded": loaded, "median_step_seconds": median,
                     "tokens_per_second": runs[0]["tokens_per_step"] / median,
                     "p10_tokens_per_second": runs[0]["tokens_per_step"] / percentile(steps, 0.9),
                     "p90_tokens_per_second": runs[0]["tokens_per_step"] / percentile(steps, 0.1),
                     "round_tokens_per_second": [r["tokens_per_step"] / statistics.median(r["step_seconds"])
                                                 for r in runs],
                     "median_exposed_seconds": statistics.median(exposed) if exposed else None,
                     "max_exposed_seconds": max(exposed) if exposed else None})
    by = {(r["system"], r["loaded"]): r for r in rows}
    for system in systems:
        by[(system, True)]["slowdown"] = (by[(system, True)]["median_step_seconds"] /
                                          by[(system, False)]["median_step_seconds"])
    cores = os.cpu_count() or 1
    print(f"\nGPT 4x128 (main job's model), global batch 32 x 128 tokens, N = 2, {cores} cores, "
          f"{a.steps} steps (median over steps {a.warmup + 1}-{a.steps}) x {a.rounds} rounds")
    print(f"{'run':<34} {'tokens/s':>9} {'p10':>8} {'p90':>8} {'exposed med/max s':>18} {'slowdown':>9}")
    labels = {s: f"fsdp.cpp N=2 {s[5:]}" for s in systems if s.startswith("fsdp")}
    labels["ddp"] = "pytorch DDP N=2"
    for r in rows:
        exposed = (f"{r['median_exposed_seconds']:.3f}/{r['max_exposed_seconds']:.3f}"
                   if r["median_exposed_seconds"] is not None else "-")
        slowdown = f"{r['slowdown']:.2f}x" if "slowdown" in r else "-"
        print(f"{labels[r['system']] + (' + 1 busy core' if r['loaded'] else ''):<34} {r['tokens_per_second']:>9.0f} "
              f"{r['p10_tokens_per_second']:>8.0f} {r['p90_tokens_per_second']:>8.0f} {exposed:>18} {slowdown:>9}")
    ratio = {s: by[(s, True)]["slowdown"] / by[("ddp", True)]["slowdown"] for s in systems if s != "ddp"}
    for s, value in ratio.items():
        print(f"{labels[s]}: slowdown / DDP's slowdown = {value:.2f} (aim: <= 1)")
    out = {"steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "cores": cores, "rows": rows,
           "slowdown_over_ddp_slowdown": ratio, "work_dir": str(work),
           "fsdp_env": {k: v for k, v in os.environ.items() if k.startswith(("FSDP_", "OMPI_MCA_"))}}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(a.json).with_name(Path(a.json).name + ".partial")
    partial.write_text(json.dumps(out, indent=2) + "\n")
    partial.replace(a.json)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
