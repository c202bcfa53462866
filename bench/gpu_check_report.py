#!/usr/bin/env python3
"""scripts/gpu-check.sh's table and JSON: fsdp.cpp against PyTorch FSDP2 on the GPU.

    python3 bench/gpu_check_report.py --dir out/gpu-check [--cap-fraction 0.113]

Reads DIR/stages.tsv (stage, exit code, seconds), DIR/fsdp_<run>/metrics.jsonl (fsdp-train's
per-step records) and DIR/torch_<peer>.json (bench/torch_fsdp2.py). fsdp.cpp's figures are
medians over the steps after the first three; MFU is against the bf16 matmul peak fsdp-train
measured on that GPU before training (peak_flops). One row per (fsdp.cpp run, peer): tokens/s
of both, their ratio (> 1: fsdp.cpp is faster; the last rows compare fsdp.cpp runs: fused ops
against composed, fp16 against bf16, an NF4 base against a bf16 one), peak memory reserved of
both, and the issue's aim for that row where it sets one; the 1B Llama's attention kernel and its
start-up timings (train.attention_kernel); the NF4 decode's GB/s (DIR/nf4_decode.json); the fused
kernels' GB/s (DIR/fused_ops.json); each run's last loss and skipped steps; the GPU (DIR/gpu.txt).
Writes DIR/gpu-check.json.
"""
import argparse
import json
import os
import statistics
from pathlib import Path

# (fsdp.cpp run, peer, the peer in words, aim for tokens/s ours / theirs or None)
ROWS = (
    ("llama1b", "hf_llama1b_compiled", "HF + FSDP2 + compile", 1.05),
    ("llama1b", "hf_llama1b", "HF + FSDP2 eager", None),
    ("llama1b", "llama1b", "own FSDP2 model", None),
    ("llama1b_ac", "hf_llama1b_ac", "HF + FSDP2 + AC", 1.05),
    ("gpt2", "hf_gpt2_compiled", "HF + FSDP2 + compile", 1.5),
    ("gpt2", "hf_gpt2", "HF + FSDP2 eager", None),
    ("gpt2", "gpt2", "own FSDP2 model", None),
    ("llama1b", "fsdp:llama1b_composed", "fsdp.cpp, composed ops", None),
    ("llama1b_fp16", "fsdp:llama1b", "fsdp.cpp, bf16", None),
    ("llama1b", "fsdp:llama1b_fp32", "fsdp.cpp, fp32", None),
    ("llama1b_qlora", "fsdp:llama1b_lora", "fsdp.cpp, bf16 LoRA", None),
)
AIMS = {"llama1b_mfu": 0.60}


def fsdp_run(directory):
    path = directory / "metrics.jsonl"
    if not path.exists():
        return None
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the last line of a stage killed mid-write
            continue
    steps = [r for r in records if "step" in r and "tokens_per_second" in r]
    if not steps:
        return None
    start = next((r for r in records if "run_start" in r), {})
    # After the first three; steps the profiler recorded (--profile-steps) are slower and left out.
    settled = [r for r in steps[3:] if not r.get("profiled")] or steps
    reserved = [max(r.get("peak_device_reserved_bytes_per_rank", [-1])) for r in steps]
    # The compute stream's stand-still at the waits (the largest rank's), where the run reports it.
    exposed = [max(r["exposed_communication_seconds_per_rank"]) for r in settled
               if r.get("exposed_communication_seconds_per_rank")]
    return {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in settled),
            "mfu": statistics.median(r["mfu"] for r in settled), "peak_flops": steps[0]["peak_flops"],
            "peak_reserved_bytes": max(reserved), "final_loss": steps[-1]["loss"], "steps": len(steps),
            # Steps the guard skipped (not finite: the device's flag, never run on a GPU before
            # 2026-12-07) still count in tokens/s: a wrongly skipped step would flatter the figure.
            "skipped_steps": steps[-1].get("skipped_steps", 0),
            # fp16's loss-scale overflows among them: expected while the scale backs off from 65,536.
            "overflow_steps": steps[-1].get("overflow_steps", 0),
            "exposed_seconds_per_step": statistics.median(exposed) if exposed else None,
            # train.attention_kernel's choice at start, and rank 0's timings (seconds; null: wrong)
            "attention_kernel": start.get("attention_kernel"),
            "attention_kernel_seconds": start.get("attention_kernel_seconds")}


def bench_json(path):
    """A benchmark's JSON, or None where it wrote none (or was killed mid-write)."""
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except json.JSONDecodeError:
        return None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True)
    p.add_argument("--cap-fraction", type=float, default=0.0)
    a = p.parse_args()
    d = Path(a.dir)
    stages = {}
    if (d / "stages.tsv").exists():
        for line in (d / "stages.tsv").read_text().splitlines():
            name, rc, seconds = line.split("\t")
            # "skipped": the script's time budget ran out before the stage could start.
            stages[name] = {"exit": int(rc) if rc.lstrip("-").isdigit() else rc, "seconds": int(seconds)}
    report = {"stages": stages, "runs": {}, "peers": {}, "rows": [], "aims": AIMS}
    # The machine (gpu-check.sh's gpu.txt: nvidia-smi's name, memory and driver; torch and CUDA):
    # figures of two cards are not to be mixed.
    if (d / "gpu.txt").exists():
        report["gpu"] = (d / "gpu.txt").read_text().strip()
        print("gpu: " + report["gpu"].replace("\n", "; "))
    gib = 2.0 ** 30
    cell = lambda v, f: f.format(v) if v is not None else "-"  # noqa: E731
    print(f"{'fsdp.cpp run':<12} {'tok/s':>8} {'MFU':>6} {'peak':>9}   {'peer':<22} {'tok/s':>8} {'peak':>9} {'ratio':>6} {'aim':>6}")
    # Every fsdp-train run's figures, read once (DIR/fsdp_<run>/metrics.jsonl).
    runs = {p.name[len("fsdp_"):]: fsdp_run(p) for p in sorted(d.glob("fsdp_*")) if p.is_dir()}
    for run, peer, words, aim in ROWS:
        ours = report["runs"].setdefault(run, runs.get(run))
        if peer not in report["peers"]:
            if peer.startswith("fsdp:"):  # another fsdp-train run (train.fused_ops = false)
                report["peers"][peer] = runs.get(peer[len("fsdp:"):])
            else:
                path = d / f"torch_{peer}.json"
                report["peers"][peer] = bench_json(path)
        theirs = report["peers"][peer]
        row = {"run": run, "peer": peer, "peer_description": words, "aim_ratio": aim}
        if ours and theirs:
            row["tokens_per_second_ratio"] = ours["tokens_per_second"] / theirs["tokens_per_second"]
            row["peak_memory_ratio"] = ours["peak_reserved_bytes"] / theirs["peak_reserved_bytes"]
            row["meets_aim"] = None if aim is None else row["tokens_per_second_ratio"] >= aim
        report["rows"].append(row)
        print(f"{run:<12} {cell(ours and ours['tokens_per_second'], '{:8.0f}'):>8} "
              f"{cell(ours and ours['mfu'] * 100, '{:5.1f}%'):>6} "
              f"{cell(ours and ours['peak_reserved_bytes'] / gib, '{:5.1f} GiB'):>9}   {words:<22} "
              f"{cell(theirs and theirs['tokens_per_second'], '{:8.0f}'):>8} "
              f"{cell(theirs and theirs['peak_reserved_bytes'] / gib, '{:5.1f} GiB'):>9} "
              f"{cell(row.get('tokens_per_second_ratio'), '{:6.2f}'):>6} {cell(aim, '{:6.2f}'):>6}")
    # Every fsdp-train run's last loss and skipped steps: a fast run that trained nothing, or skipped
    # its steps, shows here (the peers' last loss beside it: the same random tokens, so about
    # ln(vocab) early). A NaN loss is null in metrics.jsonl: "-" here.
    for name, r in runs.items():
        if not r:
            continue
        unexpected = r["skipped_steps"] - r["overflow_steps"]
        warn = f"  <- {unexpected} SKIPPED: its tok/s counts steps not taken" if unexpected > 0 else ""
        overflows = f" ({r['overflow_steps']} fp16 overflows)" if r["overflow_steps"] else ""
        print(f"{name}: last loss {cell(r['final_loss'], '{:.4f}')} after {r['steps']} steps, "
              f"{r['skipped_steps']} skipped{overflows}{warn}")
    for name, r in sorted(report["peers"].items()):
        if r and not name.startswith("fsdp:") and r.get("final_loss") is not None:
            print(f"peer {name}: last loss {cell(r['final_loss'], '{:.4f}')}")
    llama = report["runs"].get("llama1b")
    if llama:
        report["llama1b_mfu"] = llama["mfu"]
        print(f"llama1b MFU {llama['mfu'] * 100:.1f}% (aim {AIMS['llama1b_mfu'] * 100:.0f}%)")
        if llama["attention_kernel_seconds"]:
            times = ", ".join(f"{k} {v * 1e3:.2f} ms" if v is not None else f"{k} wrong"
                              for k, v in llama["attention_kernel_seconds"].items())
            print(f"llama1b attention kernel: {llama['attention_kernel'] or 'libtorch order'} first ({times}, "
                  f"forward and backward at start)")
        if llama["exposed_seconds_per_step"] is not None:
            print(f"llama1b exposed communication {llama['exposed_seconds_per_step'] * 1e3:.2f} ms per step (median)")
    # The NF4 decode (bench/nf4_decode_bench.cpp): GB/s of each path on one 1B Llama block.
    decode = bench_json(d / "nf4_decode.json")
    if decode:
        report["nf4_decode"] = decode
        copy_rate = decode["rows"][-1]["gb_per_s"]
        for r in decode["rows"]:
            print(f"nf4 decode: {r['path']:<48} {r['seconds'] * 1e3:8.3f} ms {r['gb_per_s']:8.1f} GB/s "
                  f"({r['gb_per_s'] / copy_rate:.2f}x the copy's)")
    # The decoder's fused kernels (bench/fused_ops_bench.cpp): GB/s against a copy's, fused and composed.
    fused = bench_json(d / "fused_ops.json")
    if fused:
        report["fused_ops"] = fused
        for r in fused["rows_table"]:
            print(f"fused ops: {r['operation']:<44} {r['path']:<8} {r['seconds'] * 1e3:8.3f} ms "
                  f"{r['gb_per_s']:8.1f} GB/s ({r['of_copy']:.2f}x the copy's)")
    offload = runs.get("llama1b_offload")
    report["offload"] = {"run": offload, "cap_fraction": a.cap_fraction,
                         "trained": bool(offload and stages.get("fsdp_llama1b_offload", {}).get("exit") == 0)}
    if offload:
        print(f"llama1b with CPU offload under a cap of {a.cap_fraction:.3f} of the GPU: {offload['steps']} steps, "
              f"loss {cell(offload['final_loss'], '{:.3f}')}, {offload['tokens_per_second']:.0f} tok/s, "
              f"peak {offload['peak_reserved_bytes'] / gib:.1f} GiB reserved")
    else:
        print("llama1b with CPU offload: no result (see fsdp_llama1b_offload.log)")
    failed = [name for name, s in stages.items() if s["exit"] not in (0, "skipped")]
    report["skipped_stages"] = [name for name, s in stages.items() if s["exit"] == "skipped"]
    outcome = lambda s: ("ok" if s["exit"] == 0 else "SKIPPED" if s["exit"] == "skipped"  # noqa: E731
                         else "TIMED OUT" if s["exit"] == 124 else "KILLED (timed out, or out of memory)"
                         if s["exit"] == 137 else "FAILED")
    print("stages: " + ", ".join(f"{n} {outcome(s)} ({s['seconds']} s)" for n, s in stages.items()))
    report["failed_stages"] = failed
    out = d / "gpu-check.json"
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
