#!/usr/bin/env bash
# The head and loss computed a chunk of tokens at a time (train.loss_chunk_tokens, models/
# linear_cross_entropy.h) against the composed head (logits [tokens, vocab], then cross-entropy):
# peak resident memory per rank at N = 2 (fsdp-train's own measurement, metrics.jsonl), loss and
# step time, side by side in one run, with fsdp-plan's prediction for each. Prints a table, writes JSON.
#   bash bench/chunked_loss_memory.sh [OUT.json]      (build/ made by scripts/setup.sh; BUILD=dir for another)
# The model: a Llama with Llama 3's vocabulary (128,256, untied; 4 layers, width 512, 8 heads over
# 2 key/value heads, SwiGLU 1536: 143 M parameters, 131 M of them embedding and head), random
# weights, the byte tokenizer's fortunes, 3 steps of 4 x 512 tokens per rank, AdamW, in fp32 and in
# bf16 compute. The chunk: 512 tokens.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/chunked_loss_memory.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
common=$'[model]\nname = "llama-small"\nvocab = 128256\ndim = 512\nlayers = 4\nheads = 8\nkv_heads = 2\nffn_hidden = 1536\ncontext = 512
[data]\nsource = "fortunes"\n[train]\nsteps = 3\nglobal_batch = 8\nseq_len = 512\nthreads = 1\nreport_every = 0
[eval]\nevery = 0\nbatches = 1\nsample_tokens = 0\n[optimizer]\nwarmup_steps = 0'
runs=${RUNS:-"fp32-composed fp32-chunked bf16-composed bf16-chunked"}  # RUNS="fp32-chunked" for a subset
for run in $runs; do
  [[ $run == *chunked ]] && body=${common/report_every = 0/report_every = 0$'\n'loss_chunk_tokens = 512} || body=${common/report_every = 0/report_every = 0$'\n'loss_chunk_tokens = 0}
  [[ $run == bf16* ]] && body+=$'\n[fsdp]\nparam_dtype = "bfloat16"'
  printf 'name = "%s"\noutput_dir = "%s"\n%s\n' "$run" "$work/$run" "$body" > "$work/$run.toml"
  mpirun --oversubscribe --bind-to none -np 2 "${BUILD:-$root_dir/build}/apps/fsdp-train" "$work/$run.toml" --progress lines > "$work/$run.log" 2>&1 \
    || { cat "$work/$run.log"; exit 1; }
done
python3 - "$work" "$out_json" $runs <<'PY'
import json, sys, datetime
work, out, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
rows = {}
for run in runs:
    records = [json.loads(l) for l in open(f"{work}/{run}/metrics.jsonl")]
    steps = [r for r in records if "peak_resident_bytes_per_rank" in r]
    start = next(r for r in records if "run_start" in r)
    rows[run] = {"peak_resident_bytes_per_rank": max(max(r["peak_resident_bytes_per_rank"]) for r in steps),
                 "predicted_bytes_per_rank": start.get("predicted_peak_bytes_per_rank"),
                 "median_step_seconds": sorted(r["step_seconds"] for r in steps)[len(steps) // 2],
                 "losses": [r["loss"] for r in steps]}
gib = 2 ** 30
print(f"{'run':14} {'peak per rank':>14} {'fsdp-plan':>10} {'step s':>7}  losses")
for run, r in rows.items():
    print(f"{run:14} {r['peak_resident_bytes_per_rank'] / gib:11.2f} GiB {(r['predicted_bytes_per_rank'] or 0) / gib:7.2f} GiB "
          f"{r['median_step_seconds']:7.2f}  {' '.join(f'{x:.6f}' for x in r['losses'])}")
ratios = {}
for dtype in ("fp32", "bf16"):
    if f"{dtype}-chunked" not in rows or f"{dtype}-composed" not in rows:
        continue
    a, b = rows[f"{dtype}-chunked"], rows[f"{dtype}-composed"]
    ratios[dtype] = a["peak_resident_bytes_per_rank"] / b["peak_resident_bytes_per_rank"]
    worst = max(abs(x - y) for x, y in zip(a["losses"], b["losses"]))
    print(f"{dtype}: chunked / composed peak per rank {ratios[dtype]:.2f}x "
          f"({(b['peak_resident_bytes_per_rank'] - a['peak_resident_bytes_per_rank']) / gib:.2f} GiB less); "
          f"largest loss difference {worst:.1e}")
json.dump({"date": datetime.date.today().isoformat(), "ranks": 2, "rows": rows, "chunked_over_composed": ratios},
          open(out, "w"), indent=2)
print(f"wrote {out}")
PY
