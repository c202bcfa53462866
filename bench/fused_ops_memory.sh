#!/usr/bin/env bash
# Llama's RMSNorm, rotary, SwiGLU and add + RMSNorm as fused operations (train.fused_ops, models/fused_ops.h)
# against their composed references (train.fused_ops = false) on the CPU: peak resident memory per
# rank at N = 2 (fsdp-train's own measurement, metrics.jsonl), median step time and losses, side by
# side in one run (fused and composed alternate, two rounds). Prints a table, writes JSON.
#   bash bench/fused_ops_memory.sh [OUT.json]      (build/ made by scripts/setup.sh)
# The model: a Llama whose blocks hold the memory (the byte vocabulary, 256; 8 layers, width 512,
# 8 heads over 2 key/value heads, SwiGLU 2048: 25 M parameters), random weights, the fortunes,
# 3 steps of 2 x 1024 tokens per rank, AdamW, fp32 and bf16 compute. On the CPU the fused forward
# computes the reference's values; what differs is the backward (closed form, in fp32) and what is
# kept for it: SwiGLU keeps gate and up, not silu(gate) too; each norm its input and 1/rms per row, not
# an fp32 copy of its input and its output (rotary keeps only its tables either way).
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/fused_ops_memory.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
common=$'[model]\nname = "llama-small"\nvocab = 256\ndim = 512\nlayers = 8\nheads = 8\nkv_heads = 2\nffn_hidden = 2048\ncontext = 1024
[data]\nsource = "fortunes"\n[train]\nsteps = 3\nglobal_batch = 4\nseq_len = 1024\nthreads = 1\nreport_every = 0
[eval]\nevery = 0\nbatches = 1\nsample_tokens = 0\n[optimizer]\nwarmup_steps = 0'
runs=""
for round in 1 2; do
  for dtype in fp32 bf16; do
    for ops in fused composed; do
      run="$dtype-$ops-$round"
      runs+=" $run"
      body=${common/report_every = 0/report_every = 0$'\n'fused_ops = $([ $ops = fused ] && echo true || echo false)}
      [ $dtype = bf16 ] && body+=$'\n[fsdp]\nparam_dtype = "bfloat16"'
      printf 'name = "%s"\noutput_dir = "%s"\n%s\n' "$run" "$work/$run" "$body" > "$work/$run.toml"
      mpirun --oversubscribe --bind-to none -np 2 "$root_dir/build/apps/fsdp-train" "$work/$run.toml" --progress lines > "$work/$run.log" 2>&1 \
        || { cat "$work/$run.log"; exit 1; }
    done
  done
done
python3 - "$work" "$out_json" $runs <<'PY'
import json, sys, datetime, statistics
work, out, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {}
for run in runs:
    records = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
    steps = [r for r in records if "peak_resident_bytes_per_rank" in r]
    key = run.rsplit("-", 1)[0]  # fp32-fused, ...: the rounds pooled
    row = rows.setdefault(key, {"peak_resident_bytes_per_rank": [], "step_seconds": [], "losses": []})
    row["peak_resident_bytes_per_rank"].append(max(max(r["peak_resident_bytes_per_rank"]) for r in steps))
    row["step_seconds"] += [r["step_seconds"] for r in steps[1:]]  # the first step pays first-touch faults
    row["losses"] = [r["loss"] for r in steps]  # the same every round (deterministic)
gib = 2 ** 30
print(f"{'run':14} {'peak per rank':>14} {'median step':>12}  losses")
for key, r in rows.items():
    r["peak"] = max(r["peak_resident_bytes_per_rank"])
    r["median_step_seconds"] = statistics.median(r["step_seconds"])
    print(f"{key:14} {r['peak'] / gib:11.3f} GiB {r['median_step_seconds']:10.2f} s  {' '.join(f'{x:.6f}' for x in r['losses'])}")
summary = {}
for dtype in ("fp32", "bf16"):
    a, b = rows[f"{dtype}-fused"], rows[f"{dtype}-composed"]
    summary[dtype] = {"peak_ratio": a["peak"] / b["peak"], "step_time_ratio": a["median_step_seconds"] / b["median_step_seconds"],
                      "largest_loss_difference": max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))}
    s = summary[dtype]
    print(f"{dtype}: fused / composed peak per rank {s['peak_ratio']:.2f}x ({(b['peak'] - a['peak']) / gib:.3f} GiB less), "
          f"step time {s['step_time_ratio']:.2f}x, largest loss difference {s['largest_loss_difference']:.1e}")
json.dump({"date": datetime.date.today().isoformat(), "ranks": 2, "rows": rows, "fused_over_composed": summary},
          open(out, "w"), indent=2)
print(f"wrote {out}")
PY
