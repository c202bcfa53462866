#!/usr/bin/env python3
"""bench/compare: fsdp.cpp against what a user would pick instead, in one run on one machine.

    bash bench/compare.sh                      # builds first; or, with build/ and .venv/ ready:
    .venv/bin/python bench/compare.py --json out/bench/compare.json --plot docs/compare.png

The same GPT (default 6 blocks, width 256, 8 heads, byte vocabulary, 128-token windows,
4.8 M parameters), the same global batch, trained by:
  fsdp N=1,2,4   fsdp-train FULL_SHARD (prefetch on), threads per rank = cores / N (at least 1)
  libtorch 1p    bench/plain_gpt: one process, plain libtorch, no sharding, all cores; once with
                 fsdp-train's malloc (the tcmalloc it links, preloaded, and its settings) and once with
                 glibc's defaults
  pytorch 1p     bench/torch_gpt.py in one process (Python, same kernels: the torch wheel fsdp.cpp
                 links, from .venv/)
  ddp N=2,4      bench/torch_gpt.py under DistributedDataParallel on gloo, threads = cores / N
  fsdp2 N=2,4    bench/torch_gpt.py under PyTorch FSDP2 (fully_shard per block and root) on gloo
  hf ddp/fsdp2   transformers' GPT2LMHeadModel, same configuration, under DDP and FSDP2
A peer that fails (e.g. a collective gloo lacks) gets a row with its error instead of figures.
Every configuration runs --rounds times, interleaved (this machine is noisy); per configuration
the median step over all rounds' steps after the warm-up gives tokens/s, and the largest rank's
peak resident memory (VmHWM) its memory. Ratios: against the one-process libtorch run (same malloc
settings as fsdp-train), against DDP and against FSDP2 at equal N (tokens/s and peak memory). Writes a table, JSON and (with gnuplot) a PNG.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("FSDP_TORCH_PYTHON", str(ROOT / ".venv/bin/python"))  # scripts/setup.sh's torch wheel
RUN_TIMEOUT = 900  # seconds for one configuration: a peer that hangs must not stall the table


def mpirun(ranks):
    env_flags = []
    if os.geteuid() == 0:
        env_flags = ["-x", "OMPI_ALLOW_RUN_AS_ROOT=1", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"]
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *env_flags]


class RunFailed(Exception):
    """A command that exited with a status it should not have, or ran past RUN_TIMEOUT."""


def run(command, log_path, allowed=(0,)):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("OMP_NUM_THREADS", None)  # every program sets its own thread count
    with open(log_path, "w") as log:
        try:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                  timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise RunFailed(f"{' '.join(map(str, command))} ran past {RUN_TIMEOUT} s; log: {log_path}")
    if done.returncode not in allowed:
        tail = Path(log_path).read_text().splitlines()[-15:]
        raise RunFailed(f"{' '.join(map(str, command))} failed (exit {done.returncode}); "
                        f"end of {log_path}:\n" + "\n".join(tail), done.returncode)
    return done.returncode


def model_args(a):
    return ["--layers", str(a.layers), "--dim", str(a.dim), "--heads", str(a.heads), "--seq", str(a.seq),
            "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup)]


def fsdp_run(a, ranks, work):
    out_dir = work / f"fsdp_np{ranks}"
    shutil.rmtree(out_dir, ignore_errors=True)
    sets = {"model.name": "gpt-mini", "model.layers": a.layers, "model.dim": a.dim, "model.heads": a.heads,
            "model.context": a.seq, "train.seq_len": a.seq, "train.global_batch": a.batch,
            "train.steps": a.steps, "train.log_every": a.steps, "optimizer.warmup_steps": 0,
            "optimizer.lr": 3e-4, "optimizer.min_lr": 3e-4, "eval.every": 10 * a.steps, "eval.batches": 1,
            "eval.sample_tokens": 1, "checkpoint.every": 0, "fsdp.strategy": "full_shard",
            "output_dir": str(out_dir)}
    command = [*mpirun(ranks), str(ROOT / "build/apps/fsdp-train"), str(ROOT / "configs/gpt-fortunes-tiny.toml"),
               "--progress", "lines"]
    for key, value in sets.items():
        command += ["--set", f"{key}={json.dumps(value) if isinstance(value, str) else value}"]
    try:
        run(command, work / f"fsdp_np{ranks}.log")
    except RunFailed as e:  # fsdp.cpp's own run failing ends the comparison
        sys.exit(f"compare: {e.args[0]}")
    steps = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "step" in r]
    if len(steps) != a.steps:
        sys.exit(f"compare: {out_dir}/metrics.jsonl holds {len(steps)} steps, expected {a.steps}")
    return {"step_seconds": [r["step_seconds"] for r in steps[a.warmup:]], "tokens_per_step": a.batch * a.seq,
            "peak_resident_bytes": max(max(r["peak_resident_bytes_per_rank"]) for r in steps),
            "losses": [r["loss"] for r in steps]}


def fsdp_train_malloc():
    """The tcmalloc fsdp-train links (apps/CMakeLists.txt), as ldd finds it; None if it links none."""
    listing = subprocess.run(["ldd", str(ROOT / "build/apps/fsdp-train")], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        if "libtcmalloc" in line and "=>" in line:
            return line.split("=>")[1].split("(")[0].strip()
    return None


def json_run(a, command, name, work):
    out = work / f"{name}.json"
    out.unlink(missing_ok=True)
    # A peer is one cell of the table: its failure is shown there and the comparison goes on. One
    # that wrote its result and then failed on the way out (PyTorch's gloo teardown has aborted with
    # "terminate called without an active exception", exit 134) keeps its result, with a note.
    log = work / f"{name}.log"
    exit_after_result = None
    try:
        run([*command, *model_args(a), "--json", str(out)], log, allowed=(0, 3))
    except RunFailed as e:
        status = e.args[1] if len(e.args) > 1 else None
        if status is None or not out.exists():
            return {"error": f"exit {status} before its result; log {log}" if status is not None else e.args[0]}
        exit_after_result = status
    try:
        r = json.loads(out.read_text())
    except ValueError:
        return {"error": f"its result {out} is not JSON; log {log}"}
    if "error" in r:  # torch_gpt.py's wrapper failed: its exception goes into the table
        return {"error": r["error"]}
    peak = r.get("peak_resident_bytes", max(r.get("peak_resident_bytes_per_rank", [0])))
    result = {"step_seconds": r["step_seconds"][a.warmup:], "tokens_per_step": r["batch"] * r["seq"],
              "peak_resident_bytes": peak, "losses": r["losses"], "parameters": r["parameters"]}
    if exit_after_result is not None:
        result["exit_after_result"] = exit_after_result
    return result


def plot(rows, png, work):
    if not shutil.which("gnuplot"):
        print("compare: gnuplot not found (apt-get install gnuplot-nox): no plot")
        return
    # PyTorch's line starts at its one-process run; libtorch's point uses fsdp-train's malloc settings.
    series = {"fsdp.cpp FULL\\_SHARD": ("fsdp",), "PyTorch (N=1: one process; N>1: DDP on gloo)": ("pytorch", "ddp"),
              "PyTorch FSDP2 on gloo": ("fsdp2",), "plain libtorch, one process": ("libtorch",)}
    files = {}
    for title, families in series.items():
        points = sorted((r["ranks"], r["tokens_per_second"], r["peak_resident_mib"]) for r in rows
                        if r["family"] in families and "error" not in r and r["model"] == "ours"
                        and not (r["family"] == "libtorch" and r["malloc"] != "fsdp"))
        family = families[-1]
        path = work / f"plot_{family}.dat"
        path.write_text("".join(f"{n} {t:.1f} {m:.1f}\n" for n, t, m in points))
        files[title] = path
    def plots(column):
        return ", ".join(f"'{p}' using 1:{column} with linespoints lw 2 pt 7 title '{t}'" for t, p in files.items())
    script = f"""set terminal pngcairo size 1200,480 font ',11'
set output '{png}'
set multiplot layout 1,2 title 'GPT 4.8 M parameters, global batch fixed, 2-core VM (bench/compare.py)'
set xlabel 'ranks N'
set xtics (1, 2, 4)
set xrange [0.5:4.5]
set grid
set key bottom left
set ylabel 'tokens / s (median step)'
set yrange [0:*]
plot {plots(2)}
set ylabel 'peak resident memory per rank (MiB)'
set key bottom left
plot {plots(3)}
unset multiplot
"""
    (work / "plot.gp").write_text(script)
    if subprocess.run(["gnuplot", str(work / "plot.gp")]).returncode == 0:
        print(f"wrote {png}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16, help="global batch (windows per step)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=3, help="steps per run left out of the median")
    parser.add_argument("--rounds", type=int, default=2, help="times each configuration runs, interleaved")
    parser.add_argument("--ranks", default="1,2,4", help="fsdp.cpp rank counts (DDP: those above 1)")
    parser.add_argument("--json", default="out/bench/compare.json")
    parser.add_argument("--plot", default="", help="PNG to write (gnuplot)")
    parser.add_argument("--work-dir", default="", help="logs and per-run files (default: a temporary folder)")
    a = parser.parse_args()
    ranks = [int(n) for n in a.ranks.split(",")]
    if a.batch % 4 or any(a.batch % n for n in ranks):
        sys.exit(f"compare: --batch {a.batch} must be divisible by every rank count in {ranks}")
    if not 0 <= a.warmup < a.steps or a.rounds < 1:
        sys.exit("compare: need 0 <= --warmup < --steps and --rounds >= 1")
    for exe in ("build/apps/fsdp-train", "build/bench/plain_gpt"):
        if not (ROOT / exe).exists():
            sys.exit(f"compare: {exe} is missing: build first (bash bench/compare.sh does)")
    work = Path(a.work_dir) if a.work_dir else Path(tempfile.mkdtemp(prefix="fsdp-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1

    # (family, ranks, variant): variant is the malloc setting for libtorch, the model for the peers.
    configs = [("fsdp", n, None) for n in ranks]
    configs += [("libtorch", 1, "fsdp"), ("libtorch", 1, "glibc"), ("pytorch", 1, "ours")]
    configs += [(family, n, model) for n in ranks if n > 1 for model in ("ours", "hf") for family in ("ddp", "fsdp2")]
    results = {c: [] for c in configs}
    for round_index in range(a.rounds):
        for family, n, variant in configs:
            name = f"{family}_np{n}" + (f"_{variant}" if variant else "") + f"_round{round_index}"
            print(f"round {round_index + 1}/{a.rounds}: {name}", flush=True)
            if family == "fsdp":
                r = fsdp_run(a, n, work)
            elif family == "libtorch":
                extra = ["--keep-freed-memory-mapped"] if variant == "fsdp" else []
                malloc = fsdp_train_malloc() if variant == "fsdp" else None
                preload = ["env", f"LD_PRELOAD={malloc}"] if malloc else []
                r = json_run(a, [*preload, str(ROOT / "build/bench/plain_gpt"), "--threads", str(cores), *extra], name,
                             work)
                if "error" in r:  # the baseline every ratio divides by: the comparison cannot go on
                    sys.exit(f"compare: plain libtorch failed: {r['error']}")
            else:
                launcher = mpirun(n) if n > 1 else []
                wrapper = ["--wrap", family] if n > 1 else []
                r = json_run(a, [*launcher, PYTHON, str(ROOT / "bench/torch_gpt.py"), "--model", variant, *wrapper],
                             name, work)
            results[(family, n, variant)].append(r)

    labels = {"fsdp": "fsdp.cpp", "libtorch": "libtorch 1 proc", "pytorch": "pytorch 1 proc", "ddp": "pytorch DDP",
              "fsdp2": "pytorch FSDP2"}
    rows = []
    for (family, n, variant), runs in results.items():
        label = f"{labels[family]} N={n}"
        if family == "libtorch":
            label += f" ({variant} malloc)"
        elif family in ("ddp", "fsdp2"):
            label = ("HF GPT2LMHeadModel " if variant == "hf" else "") + label
        row = {"label": label, "family": family, "ranks": n, "model": variant if family in ("pytorch", "ddp", "fsdp2")
               else "ours", "malloc": {"fsdp": "fsdp", "libtorch": variant}.get(family, "glibc"),
               "threads_per_rank": max(1, cores // n)}
        errors = [r["error"] for r in runs if "error" in r]
        if errors:
            row["error"] = errors[0]
            rows.append(row)
            continue
        exits = [r["exit_after_result"] for r in runs if "exit_after_result" in r]
        if exits:
            row["exit_after_result"] = exits
        steps = [s for r in runs for s in r["step_seconds"]]
        median_step = statistics.median(steps)
        row.update({
            "median_step_seconds": median_step, "tokens_per_second": runs[0]["tokens_per_step"] / median_step,
            "round_tokens_per_second": [r["tokens_per_step"] / statistics.median(r["step_seconds"]) for r in runs],
            "peak_resident_mib": max(r["peak_resident_bytes"] for r in runs) / 2**20,
            "first_loss": runs[0]["losses"][0], "parameters": runs[0].get("parameters"),
        })
        rows.append(row)
    base = next(r for r in rows if r["family"] == "libtorch" and r["malloc"] == "fsdp")
    peers = {(r["family"], r["ranks"]): r for r in rows if r["family"] in ("ddp", "fsdp2") and r["model"] == "ours"}
    print(f"\nGPT {a.layers}x{a.dim}, {a.heads} heads, seq {a.seq}, global batch {a.batch}, {a.steps} steps "
          f"(median over steps {a.warmup + 1}-{a.steps}) x {a.rounds} rounds, {cores} cores")
    print("ratios: tokens/s and peak resident memory per rank against the peer at the same N (our GPT in PyTorch)")
    print(f"{'run':<38} {'thr':>3} {'tokens/s':>9} {'vs 1p':>6} {'vs DDP':>7} {'vs FSDP2':>8} {'RSS/rank MiB':>12} "
          f"{'vs DDP':>7} {'vs FSDP2':>8} {'loss@1':>7}")

    def ratio(r, peer_family, key):
        peer = peers.get((peer_family, r["ranks"]))
        if not peer or "error" in peer or "error" in r:
            return None
        return r[key] / peer[key]

    def fmt(x, width):
        return f"{x:>{width - 1}.2f}x" if x is not None else f"{'-':>{width}}"

    for r in rows:
        if "error" in r:
            print(f"{r['label']:<38} {r['threads_per_rank']:>3} failed: {r['error']}")
            continue
        r["tokens_vs_libtorch"] = r["tokens_per_second"] / base["tokens_per_second"]
        r["tokens_vs_ddp"] = ratio(r, "ddp", "tokens_per_second")
        r["memory_vs_ddp"] = ratio(r, "ddp", "peak_resident_mib")
        r["tokens_vs_fsdp2"] = ratio(r, "fsdp2", "tokens_per_second")
        r["memory_vs_fsdp2"] = ratio(r, "fsdp2", "peak_resident_mib")
        print(f"{r['label']:<38} {r['threads_per_rank']:>3} {r['tokens_per_second']:>9.0f} "
              f"{r['tokens_vs_libtorch']:>5.2f}x {fmt(r['tokens_vs_ddp'], 7)} {fmt(r['tokens_vs_fsdp2'], 8)} "
              f"{r['peak_resident_mib']:>12.1f} {fmt(r['memory_vs_ddp'], 7)} {fmt(r['memory_vs_fsdp2'], 8)} "
              f"{r['first_loss']:>7.4f}" + (f"  (wrote its result, then exited {r['exit_after_result']})"
                                              if "exit_after_result" in r else ""))
    out = {"model": {"layers": a.layers, "dim": a.dim, "heads": a.heads, "vocab": 256, "seq": a.seq,
                     "parameters": next((r["parameters"] for r in rows if r["parameters"]), None)},
           "global_batch": a.batch, "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "cores": cores,
           "torch_python": PYTHON, "rows": rows, "work_dir": str(work)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    partial = Path(a.json).with_name(Path(a.json).name + ".partial")
    partial.write_text(json.dumps(out, indent=2) + "\n")
    partial.replace(a.json)  # never half a file
    print(f"wrote {a.json}")
    if a.plot:
        plot(rows, str(Path(a.plot).resolve()), work)


if __name__ == "__main__":
    main()
