#!/usr/bin/env bash
# data.packing against one example to a row, side by side in one run: the fine-tune job
# (configs/llama-finetune-fortunes.toml, what scripts/finetune.sh runs) trained STEPS steps at
# N = 2, padded and packed, rounds alternating. Per mode: trained tokens per second (the answers'
# tokens the loss counts: neither padding nor prompts), all tokens per second (padding included,
# fsdp-train's progress line), step time, peak memory per rank, the rows' use and the validation
# loss after STEPS steps; medians over the steps after the first two and over rounds. The same
# global batch of 16 rows holds about 2.5x the examples packed, so the packed run also covers
# more data per step. Prints a table, writes JSON.
#   bash bench/packing_bench.sh [OUT.json]     (STEPS=20, ROUNDS=2; needs what scripts/finetune.sh
#                                               makes: runs/llama-fortunes-pretrain/hf, runs/data/fortune-chat.jsonl)
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/packing.json}
steps=${STEPS:-20}
rounds=${ROUNDS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
cd "$root_dir"
if [ ! -f runs/llama-fortunes-pretrain/hf/config.json ] || [ ! -f runs/data/fortune-chat.jsonl ]; then
  echo "packing_bench: run scripts/finetune.sh first (it makes runs/llama-fortunes-pretrain/hf and runs/data/fortune-chat.jsonl)"
  exit 2
fi
for round in $(seq 1 "$rounds"); do
  for mode in padded packed; do
    packing=false
    [ "$mode" = packed ] && packing=true
    mpirun --oversubscribe --bind-to none -np 2 build/apps/fsdp-train configs/llama-finetune-fortunes.toml \
      --set "output_dir=\"$work/$mode-$round\"" --set train.steps="$steps" --set eval.every="$steps" --set eval.batches=4 \
      --set eval.sample_tokens=0 --set checkpoint.every=0 --set train.report_every=0 --set data.packing=$packing \
      --progress lines >"$work/$mode-$round.log" 2>&1 || { tail -20 "$work/$mode-$round.log"; exit 1; }
  done
done
python3 - "$work" "$out_json" "$rounds" "$steps" <<'PY'
import datetime, json, re, statistics, sys
work, out, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
table = {}
for mode in ("padded", "packed"):
    trained, rates, seconds, memory, losses, use = [], [], [], [], [], None
    for r in range(1, rounds + 1):
        records = [json.loads(line) for line in open(f"{work}/{mode}-{r}/metrics.jsonl")]
        step_records = [x for x in records if "step_seconds" in x and not x.get("profiled")][2:]
        trained.append(statistics.median(x["trained_tokens_per_second"] for x in step_records))
        rates.append(statistics.median(x["tokens_per_second"] for x in step_records))
        seconds.append(statistics.median(x["step_seconds"] for x in step_records))
        memory.append(max(max(x["peak_resident_bytes_per_rank"]) for x in step_records))
        losses += [x["validation_loss"] for x in records if "validation_loss" in x and x.get("eval_step") == steps]
        log = open(f"{work}/{mode}-{r}.log").read()
        found = re.search(r"([0-9.]+)% of each row used \(([0-9.]+)% one example to a row\)", log)
        use = float(found.group(1)) if found else use
    table[mode] = {"trained_tokens_per_second": statistics.median(trained), "tokens_per_second": statistics.median(rates),
                   "step_seconds": statistics.median(seconds), "peak_resident_bytes_per_rank": max(memory),
                   "validation_loss": statistics.median(losses) if losses else None, "row_use_percent": use,
                   "rounds": {"trained_tokens_per_second": trained, "step_seconds": seconds}}
packed_log = open(f"{work}/packed-1.log").read()
found = re.search(r"([0-9.]+)% of each row used \(([0-9.]+)% one example to a row\)", packed_log)
if found:
    table["packed"]["row_use_percent"], table["padded"]["row_use_percent"] = float(found.group(1)), float(found.group(2))
ratio = table["packed"]["trained_tokens_per_second"] / table["padded"]["trained_tokens_per_second"]
print(f"configs/llama-finetune-fortunes.toml, N = 2, {steps} steps x {rounds} rounds (medians)")
print(f"{'mode':8} {'trained tok/s':>14} {'all tok/s':>10} {'step s':>8} {'peak/rank':>10} {'row use':>8} {'val loss':>9}")
for mode, row in table.items():
    print(f"{mode:8} {row['trained_tokens_per_second']:14.0f} {row['tokens_per_second']:10.0f} {row['step_seconds']:8.3f} "
          f"{row['peak_resident_bytes_per_rank'] / 2**20:8.0f} MiB {row['row_use_percent'] or 0:7.1f}% "
          f"{row['validation_loss'] if row['validation_loss'] is not None else float('nan'):9.4f}")
print(f"packed / padded trained tokens per second: {ratio:.2f}x")
json.dump({"date": datetime.date.today().isoformat(), "steps": steps, "rounds": rounds, "modes": table,
           "trained_tokens_ratio": ratio}, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
