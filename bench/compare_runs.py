#!/usr/bin/env python3
"""Side-by-side table of fsdp-train runs from their metrics.jsonl files.

    python3 bench/compare_runs.py --json out/bench/x.json label=runs/a label=runs/b ...

Per run: final validation loss (or test accuracy), median step seconds and throughput over the
steps after the first 5, peak gathered bytes (the runtime's accounting), peak resident memory of
the largest rank, median exposed communication. Ratios are against the first run.
"""
import argparse
import json
import statistics
import sys
from pathlib import Path


def summarize(label, run_dir):
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        sys.exit(f"compare_runs: {path} does not exist (did the run finish?)")
    steps, evals = [], []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "step" in record:
            steps.append(record)
        elif "eval_step" in record:
            evals.append(record)
    if not steps or not evals:
        sys.exit(f"compare_runs: {path} holds no steps or no evaluation")
    measured = steps[5:] if len(steps) > 10 else steps
    rate_key = "tokens_per_second" if "tokens_per_second" in steps[0] else "images_per_second"
    return {
        "label": label,
        "run_dir": str(run_dir),
        "steps": steps[-1]["step"],
        "final_validation_loss": evals[-1]["validation_loss"],
        "final_test_accuracy": evals[-1].get("test_accuracy"),
        "median_step_seconds": statistics.median(r["step_seconds"] for r in measured),
        "median_rate": statistics.median(r[rate_key] for r in measured),
        "rate_unit": rate_key,
        "peak_gathered_bytes": max(r["peak_gathered_bytes"] for r in steps),
        "peak_resident_bytes": max(max(r["peak_resident_bytes_per_rank"]) for r in steps),
        "median_exposed_seconds": statistics.median(
            max(r.get("exposed_communication_seconds_per_rank", [0.0])) for r in measured),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="write the table here as JSON")
    parser.add_argument("runs", nargs="+", help="label=run_dir")
    args = parser.parse_args()
    rows = []
    for item in args.runs:
        label, _, run_dir = item.partition("=")
        rows.append(summarize(label, run_dir))
    base = rows[0]
    print(f"{'run':<22} {'steps':>5} {'val loss':>9} {'vs':>7} {'step s':>7} {'vs':>6} "
          f"{'gathered MiB':>12} {'vs':>6} {'peak RSS MiB':>12} {'vs':>6} {'exposed s':>9}")
    for r in rows:
        r["loss_ratio"] = r["final_validation_loss"] / base["final_validation_loss"]
        r["step_ratio"] = r["median_step_seconds"] / base["median_step_seconds"]
        r["gathered_ratio"] = r["peak_gathered_bytes"] / base["peak_gathered_bytes"]
        r["resident_ratio"] = r["peak_resident_bytes"] / base["peak_resident_bytes"]
        print(f"{r['label']:<22} {r['steps']:>5} {r['final_validation_loss']:>9.4f} {r['loss_ratio']:>6.3f}x "
              f"{r['median_step_seconds']:>7.3f} {r['step_ratio']:>5.2f}x {r['peak_gathered_bytes'] / 2**20:>12.2f} "
              f"{r['gathered_ratio']:>5.2f}x {r['peak_resident_bytes'] / 2**20:>12.1f} {r['resident_ratio']:>5.2f}x "
              f"{r['median_exposed_seconds']:>9.3f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
