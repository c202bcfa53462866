#!/usr/bin/env python3
"""bench/max_model: the largest GPT (or CLIP) that trains 3 steps under a per-rank memory cap.

    .venv/bin/python bench/max_model.py --json out/bench/max_model.json      # as root (cgroups)
    .venv/bin/python bench/max_model.py --family clip --dim 1024 --cap 3 --only fsdp4_capped,ddp4_capped

--family llama (issue 35, QLoRA): a Llama of width --dim (heads dim / 128 over a quarter as many
key/value heads, SwiGLU 2.75 x dim, byte vocabulary, --seq-token windows, one per rank) fine-tuned
with LoRA rank 16 on every linear layer of the blocks, bf16 compute, activation checkpointing, its
frozen base stored in bf16 (lora_bf16_2_capped) or in NF4 (qlora_2_capped), 2 ranks each capped.
--family clip: fsdp-train's clip-fmnist grown to --dim wide towers (heads = dim / 64, MLP 4 x dim,
projection dim) of equal depth, the depth searched, one image-caption pair per rank, fp32 AdamW, the
contrastive loss over the global batch; the peers are transformers' CLIPModel of the same shape under
DDP and FSDP2 (bench/torch_clip.py); no single-process configuration.

GPUs each have their own memory; ranks here share one machine's. Each rank runs in a memory
cgroup of its own capped at --cap GiB (bench/memory_cap.sh): an emulated device. The model is a
GPT of width --dim (heads = dim / 128, byte vocabulary, --seq-token windows, one window per rank
per step, fp32 AdamW) whose depth is searched: a run passes when every rank exits 0 after 3
optimizer steps; over the cap the kernel's OOM killer ends a rank (recorded). Configurations:
  fsdp4_capped    fsdp-train FULL_SHARD on 4 ranks, each capped
  ddp4_capped     PyTorch DDP (gloo, bench/torch_gpt.py) on 4 ranks, each capped
  fsdp2_4_capped  PyTorch FSDP2 (fully_shard per block and root, gloo, bench/torch_gpt.py) on 4
                  ranks, each capped
  single_capped   one process, plain libtorch (bench/plain_gpt), capped
  fsdp4_uncapped  fsdp-train on 4 ranks with no per-rank cap: the 4 ranks share one cgroup capped at
                  the machine's available memory less --reserve GiB, so that a failure kills a rank,
                  not this script or the shell; reported against the machine's bound, total memory
                  over 16 bytes per parameter (fp32 parameter, gradient, AdamW's two moments)
The search for each: start at the depth the --start-bytes-per-param guess gives, go up (or down)
by --step layers until the result changes, then bisect to one layer.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = {"fsdp-train": ROOT / "build/apps/fsdp-train", "plain_gpt": ROOT / "build/bench/plain_gpt"}
PYTHON = os.environ.get("FSDP_TORCH_PYTHON", str(ROOT / ".venv/bin/python"))  # scripts/setup.sh's torch wheel
GIB = 1 << 30


def gpt_parameters(layers, dim, vocab, seq):
    block = 4 * dim + dim * 3 * dim + 3 * dim + dim * dim + dim + dim * 4 * dim + 4 * dim + 4 * dim * dim + dim
    return vocab * dim + seq * dim + layers * block + 2 * dim


def clip_parameters(layers, dim):
    """fsdp.cpp's ClipConfig::parameter_count for max_model's CLIP shape (models/clip.cpp)."""
    block = 4 * (dim * dim + dim) + 4 * dim + dim * 4 * dim + 4 * dim + 4 * dim * dim + dim
    vision = dim + dim * 49 + 17 * dim + 4 * dim + layers * block
    text = 257 * dim + 48 * dim + 2 * dim + layers * block
    return vision + text + dim * 2 * dim + 1


def llama_ffn(dim):
    return (int(2.75 * dim) + 255) // 256 * 256


def llama_parameters(layers, dim, seq):
    """fsdp.cpp's LlamaConfig::parameter_count (untied, byte vocabulary) for max_model's Llama shape."""
    kv = dim // 4
    block = 2 * dim + 2 * dim * dim + 2 * dim * kv + 3 * dim * llama_ffn(dim)
    return 2 * 256 * dim + dim + layers * block


def parameters_of(a, layers):
    if a.family == "clip":
        return clip_parameters(layers, a.dim)
    if a.family == "llama":
        return llama_parameters(layers, a.dim, a.seq)
    return gpt_parameters(layers, a.dim, 256, a.seq)


def meminfo_bytes(key):
    """A /proc/meminfo figure ("MemTotal", "MemAvailable") in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/meminfo")


def write_json_atomically(path, value):
    """Readers never see half a file: write beside it, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=2) + "\n")
    partial.replace(path)


def name_values(text, option, names, convert):
    """"a=1,b=2" -> {"a": convert("1"), ...}, every name one of `names`; else a clear exit."""
    out = {}
    for item in filter(None, text.split(",")):
        name, sep, value = item.partition("=")
        try:
            if not sep or name not in names:
                raise ValueError
            out[name] = convert(value)
        except ValueError:
            sys.exit(f"max_model: {option}: '{item}' is not NAME=VALUE with NAME one of {sorted(names)}")
    return out


def clip_command_for(config, layers, a, out_dir):
    ranks = config["ranks"]
    if config["runner"] == "fsdp":
        sets = {"model.name": "clip-fmnist", "model.vision_layers": layers, "model.text_layers": layers,
                "model.vision_dim": a.dim, "model.text_dim": a.dim, "model.vision_heads": a.dim // 64,
                "model.text_heads": a.dim // 64, "model.vision_mlp_hidden": 4 * a.dim, "model.text_mlp_hidden": 4 * a.dim,
                "model.projection_dim": a.dim, "train.global_batch": ranks, "train.steps": 3, "train.log_every": 1,
                "optimizer.warmup_steps": 0, "eval.every": 1000, "eval.max_items": 8, "checkpoint.every": 0,
                "fsdp.strategy": "full_shard", "fsdp.param_dtype": "float32", "output_dir": str(out_dir)}
        command = [str(BIN["fsdp-train"]), str(ROOT / "configs/clip-fashion-mnist.toml"), "--progress", "lines"]
        for key, value in sets.items():
            command += ["--set", f"{key}={json.dumps(value) if isinstance(value, str) else value}"]
        return command
    return [PYTHON, str(ROOT / "bench/torch_clip.py"), "--wrap", config["runner"], "--layers", str(layers),
            "--dim", str(a.dim), "--steps", "3"]


def llama_command_for(config, layers, a, out_dir):
    heads = a.dim // 128
    sets = {"model.name": "llama-small", "model.layers": layers, "model.dim": a.dim, "model.heads": heads,
            "model.kv_heads": max(1, heads // 4), "model.ffn_hidden": llama_ffn(a.dim), "model.context": a.seq,
            "train.seq_len": a.seq, "train.global_batch": config["ranks"], "train.micro_batches": 1, "train.steps": 3,
            "train.log_every": 1,
            "optimizer.warmup_steps": 0, "eval.every": 1000, "eval.batches": 1, "eval.sample_tokens": 0,
            "checkpoint.every": 0, "fsdp.strategy": "full_shard", "fsdp.param_dtype": "bfloat16",
            "fsdp.activation_checkpointing": True, "lora.rank": 16, "lora.alpha": 32,
            "lora.targets": "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj",
            "lora.base_dtype": config["base_dtype"], "output_dir": str(out_dir)}
    command = [str(BIN["fsdp-train"]), str(ROOT / "configs/llama-fortunes-small.toml"), "--progress", "lines"]
    for key, value in sets.items():
        text = json.dumps(value) if isinstance(value, str) else ("true" if value is True else value)
        command += ["--set", f"{key}={text}"]
    return command


def command_for(config, layers, a, out_dir):
    """The training command of one configuration (before mpirun and the memory wrapper)."""
    if a.family == "clip":
        return clip_command_for(config, layers, a, out_dir)
    if a.family == "llama":
        return llama_command_for(config, layers, a, out_dir)
    heads = a.dim // 128
    ranks = config["ranks"]
    if config["runner"] == "fsdp":
        sets = {"model.name": "gpt-mini", "model.layers": layers, "model.dim": a.dim, "model.heads": heads,
                "model.context": a.seq, "train.seq_len": a.seq, "train.global_batch": ranks, "train.steps": 3,
                "train.log_every": 1, "optimizer.warmup_steps": 0, "eval.every": 1000, "eval.batches": 1,
                "eval.sample_tokens": 1, "checkpoint.every": 0, "fsdp.strategy": "full_shard",
                "output_dir": str(out_dir)}
        command = [str(BIN["fsdp-train"]), str(ROOT / "configs/gpt-fortunes-tiny.toml"), "--progress", "lines"]
        for key, value in sets.items():
            command += ["--set", f"{key}={json.dumps(value) if isinstance(value, str) else value}"]
        return command
    model = ["--layers", str(layers), "--dim", str(a.dim), "--heads", str(heads), "--seq", str(a.seq),
             "--batch", str(ranks), "--steps", "3", "--warmup", "0"]
    if config["runner"] in ("ddp", "fsdp2"):
        return [PYTHON, str(ROOT / "bench/torch_gpt.py"), "--wrap", config["runner"], *model]
    return [str(BIN["plain_gpt"]), *model]


def mpirun(ranks):
    flags = ["-x", "OMPI_ALLOW_RUN_AS_ROOT=1", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"] if os.geteuid() == 0 else []
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(ranks), *flags]


def trial(config, layers, a, work):
    name = f"{config['name']}_L{layers}"
    out_dir, report_dir = work / name, work / f"{name}_caps"
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.rmtree(report_dir, ignore_errors=True)
    train = command_for(config, layers, a, out_dir)
    per_rank_cap = str(int(a.cap * GIB)) if config["capped"] else "max"
    wrapped = [str(ROOT / "bench/memory_cap.sh"), per_rank_cap, str(report_dir), *train]
    shared_limit = None
    if config["capped"]:
        command = [*mpirun(config["ranks"]), *wrapped] if config["ranks"] > 1 else wrapped
    else:
        # No per-rank cap: every rank (and mpirun) in one cgroup holding what the machine has free,
        # once the previous trial's memory has gone back (MemAvailable lags its exit).
        for _ in range(60):
            if meminfo_bytes("MemAvailable") >= meminfo_bytes("MemTotal") - 3 * GIB:
                break
            time.sleep(1)
        shared_limit = int(meminfo_bytes("MemAvailable") - a.reserve * GIB)
        command = [str(ROOT / "bench/memory_cap.sh"), str(shared_limit), str(work / f"{name}_shared"),
                   *mpirun(config["ranks"]), *wrapped]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    start = time.time()
    with open(work / f"{name}.log", "w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    seconds = time.time() - start
    reports = [json.loads(p.read_text()) for p in sorted(report_dir.glob("rank*.json"))]
    if code == 3 and not reports:
        sys.exit(f"max_model: bench/memory_cap.sh could not create a memory cgroup (see {work / (name + '.log')})")
    oom = sum(r["oom_kills"] for r in reports)
    if config["capped"] is False:
        shared = work / f"{name}_shared" / "rank0.json"
        if shared.exists():
            oom += json.loads(shared.read_text())["oom_kills"]
    passed = code == 0 and len(reports) == config["ranks"] and all(r["exit_code"] == 0 for r in reports)
    result = {"layers": layers, "parameters": parameters_of(a, layers), "passed": passed,
              "exit_code": code, "oom_kills": oom, "seconds": round(seconds, 1),
              "peak_bytes_per_rank": [r["peak_bytes"] for r in reports], "shared_limit_bytes": shared_limit}
    if not passed and oom == 0:
        tail = (work / f"{name}.log").read_text().splitlines()[-5:]
        result["log_tail"] = tail
    print(f"  {name}: {result['parameters'] / 1e6:8.1f} M parameters  {'pass' if passed else 'FAIL'}  "
          f"exit {code}  OOM kills {oom}  peak/rank "
          f"{max(result['peak_bytes_per_rank'], default=0) / GIB:.2f} GiB  {seconds:.0f} s", flush=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    remove_stale_cgroups()
    return result


def remove_stale_cgroups():
    """A rank that mpirun killed leaves memory_cap.sh's cgroup behind (empty): remove those."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy_id, controllers, path = line.split(":", 2)
        if Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base = Path("/sys/fs/cgroup" + path) if hierarchy_id == "0" else None
        else:
            base = Path("/sys/fs/cgroup/memory" + path) if "memory" in controllers.split(",") else None
        if base is None or not base.is_dir():
            continue
        # Deepest first: the uncapped run nests the ranks' cgroups inside the shared one.
        for stale in sorted(base.glob("fsdp-cap-*/fsdp-cap-*")) + sorted(base.glob("fsdp-cap-*")):
            try:
                stale.rmdir()  # fails while a process is still inside: then it is not stale
            except OSError:
                pass


def search(config, a, work, start_layers):
    trials = {}

    def run(layers):
        if layers not in trials:
            trials[layers] = trial(config, layers, a, work)
        return trials[layers]["passed"]

    layers = max(1, start_layers)
    if run(layers):
        low, high = layers, None
        while high is None:
            nxt = low + a.step
            if run(nxt):
                low = nxt
            else:
                high = nxt
    else:
        low, high = None, layers
        while low is None:
            nxt = high - a.step
            if nxt < 1:
                return None, trials
            if run(nxt):
                low = nxt
            else:
                high = nxt
    while high - low > 1:
        mid = (low + high) // 2
        if run(mid):
            low = mid
        else:
            high = mid
    return low, trials


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=("gpt", "clip", "llama"), default="gpt", help="the model searched")
    parser.add_argument("--cap", type=float, default=5.0, help="per-rank memory cap, GiB")
    parser.add_argument("--dim", type=int, default=1536, help="model width (heads = dim / 128; clip: dim / 64)")
    parser.add_argument("--seq", type=int, default=64, help="tokens per window")
    parser.add_argument("--step", type=int, default=4, help="layers per step of the search before bisecting")
    parser.add_argument("--reserve", type=float, default=0.75, help="GiB left free in the uncapped run")
    parser.add_argument("--only", default="", help="comma-separated configuration names to run")
    parser.add_argument("--start-bytes-per-param", default="", help="first guess per configuration: a rank's bytes per "
                        "model parameter (default: fsdp4_capped=4.6,ddp4_capped=21,fsdp2_4_capped=8,single_capped=17,"
                        "fsdp4_uncapped=4.4; llama: lora_bf16_2_capped=2,qlora_2_capped=0.5)")
    parser.add_argument("--try-layers", default="", help="e.g. fsdp4_capped=24: run only that depth for that "
                        "configuration (no search); a pass shows a lower bound on its largest model")
    parser.add_argument("--previous", default="", help="a JSON this script wrote: its results for the "
                        "configurations not run now join the table (runs split over sessions)")
    parser.add_argument("--json", default="out/bench/max_model.json")
    parser.add_argument("--work-dir", default="out/bench/max_model")
    parser.add_argument("--bin-dir", default="", help="fsdp-train and plain_gpt from here (default: build/), "
                        "e.g. copies, so that a rebuild during the search does not swap them")
    a = parser.parse_args()
    if a.cap <= 0 or a.dim <= 0 or a.dim % (64 if a.family == "clip" else 128) or a.seq <= 0 or a.step < 1:
        sys.exit("max_model: need --cap > 0, --dim a positive multiple of 128 (clip: 64), --seq > 0, --step >= 1")
    if a.bin_dir:
        for name in BIN:
            BIN[name] = Path(a.bin_dir).resolve() / name
    for exe in BIN.values():
        if not exe.exists():
            sys.exit(f"max_model: {exe} is missing: build first")
    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    configs = [
        {"name": "ddp4_capped", "runner": "ddp", "ranks": 4, "capped": True},
        {"name": "fsdp2_4_capped", "runner": "fsdp2", "ranks": 4, "capped": True},
        {"name": "single_capped", "runner": "plain", "ranks": 1, "capped": True},
        {"name": "fsdp4_capped", "runner": "fsdp", "ranks": 4, "capped": True},
        {"name": "fsdp4_uncapped", "runner": "fsdp", "ranks": 4, "capped": False},
    ]
    if a.family == "clip":  # no single-process CLIP runner
        configs = [c for c in configs if c["runner"] != "plain"]
    if a.family == "llama":  # LoRA over a frozen base, fsdp-train only
        configs = [{"name": "lora_bf16_2_capped", "runner": "fsdp", "ranks": 2, "capped": True, "base_dtype": "bfloat16"},
                   {"name": "qlora_2_capped", "runner": "fsdp", "ranks": 2, "capped": True, "base_dtype": "nf4"}]
    all_names = {c["name"] for c in configs}
    if a.only:
        wanted = set(a.only.split(","))
        unknown = wanted - {c["name"] for c in configs}
        if unknown:
            sys.exit(f"max_model: unknown configuration(s) {sorted(unknown)}")
        configs = [c for c in configs if c["name"] in wanted]
    default_guesses = ("lora_bf16_2_capped=2,qlora_2_capped=0.5" if a.family == "llama" else
                       "fsdp4_capped=4.6,ddp4_capped=21,fsdp2_4_capped=8,fsdp4_uncapped=4.4" +
                       (",single_capped=17" if a.family == "gpt" else ""))
    guesses = name_values(a.start_bytes_per_param or default_guesses, "--start-bytes-per-param", all_names, float)
    fixed = name_values(a.try_layers, "--try-layers", all_names, int)
    if any(v <= 0 for v in [*guesses.values(), *fixed.values()]):
        sys.exit("max_model: --start-bytes-per-param and --try-layers values must be positive")
    per_layer = parameters_of(a, 1) - parameters_of(a, 0)
    total = meminfo_bytes("MemTotal")
    machine_bound = total / 16
    results = []
    if a.previous:
        running = {c["name"] for c in configs}
        try:
            kept = [r for r in json.loads(Path(a.previous).read_text())["results"] if r["name"] not in running]
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"max_model: --previous {a.previous}: not a max_model JSON ({e})")
        results += kept
    for config in configs:
        budget = a.cap * GIB if config["capped"] else meminfo_bytes("MemAvailable") / config["ranks"]
        if config["name"] not in guesses and config["name"] not in fixed:
            sys.exit(f"max_model: no --start-bytes-per-param guess for {config['name']}")
        start = int(budget / guesses.get(config["name"], 1.0) / per_layer)
        if config["name"] in fixed:
            layers = fixed[config["name"]]
            print(f"{config['name']}: one trial at {layers} layers (no search)", flush=True)
            t = trial(config, layers, a, work)
            largest, trials, searched = (layers if t["passed"] else None), {layers: t}, False
        else:
            print(f"{config['name']}: searching from {start} layers ({per_layer / 1e6:.1f} M parameters each)", flush=True)
            largest, trials = search(config, a, work, start)
            searched = True
        results.append({**config, "largest_layers": largest, "searched": searched,
                        "largest_parameters": parameters_of(a, largest) if largest else 0,
                        "trials": [trials[k] for k in sorted(trials)]})
        write_json_atomically(a.json, {"results": results})  # what is done survives a stop

    by_name = {r["name"]: r for r in results}
    if a.family == "llama":
        print(f"\nLlama width {a.dim}, {a.dim // 128} heads, SwiGLU {llama_ffn(a.dim)}, byte vocabulary, {a.seq}-token windows, "
              f"one per rank, LoRA r16 on every block linear, bf16 compute, activation checkpointing, 3 steps; "
              f"per-rank cap {a.cap:g} GiB; machine {total / GIB:.1f} GiB")
    elif a.family == "clip":
        print(f"\nCLIP, both towers width {a.dim}, {a.dim // 64} heads, 28x28 images, 48-token byte captions, one pair per "
              f"rank, fp32 AdamW, 3 steps; per-rank cap {a.cap:g} GiB; machine {total / GIB:.1f} GiB")
    else:
        print(f"\nGPT width {a.dim}, {a.dim // 128} heads, byte vocabulary, {a.seq}-token windows, one per rank, "
              f"fp32 AdamW, 3 steps; per-rank cap {a.cap:g} GiB; machine {total / GIB:.1f} GiB")
    print(f"{'configuration':<16} {'layers':>6} {'parameters':>12} {'peak/rank GiB':>13} {'vs DDP':>7} {'vs FSDP2':>8} "
          f"{'vs 1 proc':>9}")
    for r in results:
        passing = [t for t in r["trials"] if t["passed"] and t["layers"] == r["largest_layers"]]
        peak = max(passing[0]["peak_bytes_per_rank"]) / GIB if passing else float("nan")
        r["peak_bytes_per_rank_at_largest"] = passing[0]["peak_bytes_per_rank"] if passing else []
        for other, key in (("ddp4_capped", "vs_ddp"), ("fsdp2_4_capped", "vs_fsdp2"), ("single_capped", "vs_single"),
                           ("lora_bf16_2_capped", "vs_bf16_base")):
            o = by_name.get(other)
            r[key] = r["largest_parameters"] / o["largest_parameters"] if o and o["largest_parameters"] else None
        fmt = lambda v: f"{v:.2f}x" if v else "-"
        print(f"{r['name']:<16} {r['largest_layers'] or 0:>6} {r['largest_parameters'] / 1e6:>10.1f} M {peak:>13.2f} "
              f"{fmt(r['vs_ddp']):>7} {fmt(r['vs_fsdp2']):>8} {fmt(r['vs_single']):>9}" + ("" if r.get("searched", True) else "  (one trial: at least)")
              + (f"  vs bf16 base {fmt(r['vs_bf16_base'])}" if r.get("vs_bf16_base") else ""))
    if "fsdp4_uncapped" in by_name:
        r = by_name["fsdp4_uncapped"]
        r["machine_bound_parameters"] = machine_bound
        r["vs_machine_bound"] = r["largest_parameters"] / machine_bound
        print(f"machine bound: {total / GIB:.1f} GiB / 16 B = {machine_bound / 1e6:.0f} M parameters; "
              f"fsdp4_uncapped reaches {r['vs_machine_bound']:.2f}x")
    write_json_atomically(a.json, {"family": a.family, "dim": a.dim, "seq": a.seq, "cap_gib": a.cap, "mem_total_bytes": total,
                                   "results": results})
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
