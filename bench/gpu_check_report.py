#!/usr/bin/env python3
"""scripts/gpu-check.sh's table and JSON: fsdp.cpp against PyTorch FSDP2 on the GPU.

    python3 bench/gpu_check_report.py --dir out/gpu-check [--cap-fraction 0.113]

Reads DIR/stages.tsv (stage, exit code, seconds), DIR/fsdp_<model>/metrics.jsonl (fsdp-train's
per-step records) and DIR/torch_<model>.json (bench/torch_fsdp2.py). fsdp.cpp's figures are
medians over the steps after the first three; MFU is against the bf16 matmul peak fsdp-train
measured on that GPU before training (peak_flops). Writes DIR/gpu-check.json.
"""
import argparse
import json
import os
import statistics
from pathlib import Path

MODELS = ("gpt2", "llama1b")
AIMS = {"tokens_per_second_ratio": 1.0, "llama1b_mfu": 0.45}


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
    steps = [r for r in records if "step" in r]
    if not steps:
        return None
    settled = steps[3:] or steps
    reserved = [max(r.get("peak_device_reserved_bytes_per_rank", [-1])) for r in steps]
    return {"tokens_per_second": statistics.median(r["tokens_per_second"] for r in settled),
            "mfu": statistics.median(r["mfu"] for r in settled), "peak_flops": steps[0]["peak_flops"],
            "peak_reserved_bytes": max(reserved), "final_loss": steps[-1]["loss"], "steps": len(steps)}


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
    report = {"stages": stages, "models": {}, "aims": AIMS}
    gib = 2.0 ** 30
    print(f"{'model':<10} {'fsdp.cpp tok/s':>15} {'FSDP2 tok/s':>12} {'ratio':>6} {'MFU':>6} "
          f"{'fsdp.cpp peak':>14} {'FSDP2 peak':>11}")
    for model in MODELS:
        ours = fsdp_run(d / f"fsdp_{model}")
        theirs_path = d / f"torch_{model}.json"
        theirs = json.loads(theirs_path.read_text()) if theirs_path.exists() else None
        row = {"fsdp_cpp": ours, "pytorch_fsdp2": theirs}
        if ours and theirs:
            row["tokens_per_second_ratio"] = ours["tokens_per_second"] / theirs["tokens_per_second"]
            row["peak_memory_ratio"] = ours["peak_reserved_bytes"] / theirs["peak_reserved_bytes"]
        report["models"][model] = row
        cell = lambda v, f: f.format(v) if v is not None else "-"  # noqa: E731
        print(f"{model:<10} {cell(ours and ours['tokens_per_second'], '{:15.0f}'):>15} "
              f"{cell(theirs and theirs['tokens_per_second'], '{:12.0f}'):>12} "
              f"{cell(row.get('tokens_per_second_ratio'), '{:6.2f}'):>6} {cell(ours and ours['mfu'] * 100, '{:5.1f}%'):>6} "
              f"{cell(ours and ours['peak_reserved_bytes'] / gib, '{:10.1f} GiB'):>14} "
              f"{cell(theirs and theirs['peak_reserved_bytes'] / gib, '{:7.1f} GiB'):>11}")
    offload = fsdp_run(d / "fsdp_llama1b_offload")
    report["offload"] = {"run": offload, "cap_fraction": a.cap_fraction,
                         "trained": bool(offload and stages.get("fsdp_llama1b_offload", {}).get("exit") == 0)}
    if offload:
        print(f"llama1b with CPU offload under a cap of {a.cap_fraction:.3f} of the GPU: {offload['steps']} steps, "
              f"loss {offload['final_loss']:.3f}, {offload['tokens_per_second']:.0f} tok/s, "
              f"peak {offload['peak_reserved_bytes'] / gib:.1f} GiB reserved")
    else:
        print("llama1b with CPU offload: no result (see fsdp_llama1b_offload.log)")
    failed = [name for name, s in stages.items() if s["exit"] != 0]
    outcome = lambda s: "ok" if s["exit"] == 0 else "SKIPPED" if s["exit"] == "skipped" else "FAILED"  # noqa: E731
    print("stages: " + ", ".join(f"{n} {outcome(s)} ({s['seconds']} s)" for n, s in stages.items()))
    report["failed_stages"] = failed
    out = d / "gpu-check.json"
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(report, indent=2) + "\n")
    os.replace(partial, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
