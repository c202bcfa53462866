#!/usr/bin/env bash
# bf16 and fp16 against fp32 compute for every config in configs/, side by side in one run: each
# config trained STEPS steps at N = 2 in fp32; in bf16 as every bf16 run computed before 2026-12-02
# (train.attention = "fused", train.bf16_matmul = "native": libtorch's bf16 kernels); in bf16
# with both "auto" (attention in fp32 on the CPU; fp32 GEMMs on bf16 operands on a CPU without
# bf16 instructions, the faster of the two GEMMs, measured at start, on one with them); in bf16 with fp32 GEMMs on bf16 operands whatever the CPU
# ("bf16-fp32gemm": train.bf16_matmul = "fp32"), or with libtorch's bf16 GEMMs and attention on
# "auto" ("bf16-nativegemm": what "auto" took on a CPU with bf16 instructions before it measured);
# and in fp16 with loss scaling, attention "auto". Rounds alternate the modes;
# the table shows the median step's throughput and the peak memory per rank (fsdp-train's own,
# metrics.jsonl), and which bf16 GEMMs "auto" measured faster at start where it measured (a CPU with
# bf16 instructions). Prints a table, writes JSON.
#   bash bench/dtype_table.sh [OUT.json]     (build/ made by scripts/setup.sh; STEPS=60, ROUNDS=2,
#                                             MODES="fp32 bf16-native bf16-auto fp16-auto",
#                                             CONFIGS="configs/a.toml ...": these only,
#                                             SETS="model.vision_layers=12 ...": more --set overrides)
# The fine-tuning configs need what scripts/finetune.sh makes (runs/tokenizers/fortunes-bpe,
# runs/llama-fortunes-pretrain/hf, runs/data/fortune-chat.jsonl): a config whose inputs are
# missing is left out, saying so.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/dtype_table.json}
steps=${STEPS:-60}
rounds=${ROUNDS:-2}
modes=${MODES:-fp32 bf16-native bf16-auto fp16-auto}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
cd "$root_dir"
configs=()
for config in ${CONFIGS:-configs/*.toml}; do
  case $config in
    *pretrain*) [ -f runs/tokenizers/fortunes-bpe/tokenizer.json ] || { echo "left out $config: run scripts/finetune.sh first"; continue; } ;;
    *finetune*) [ -f runs/llama-fortunes-pretrain/hf/config.json ] && [ -f runs/data/fortune-chat.jsonl ] ||
                  { echo "left out $config: run scripts/finetune.sh first"; continue; } ;;
  esac
  configs+=("$config")
done
for round in $(seq 1 "$rounds"); do
  for config in "${configs[@]}"; do
    name=$(basename "$config" .toml)
    for mode in $modes; do
      dtype=float32 attention=auto matmul=auto
      case $mode in
        fp32) ;;
        bf16-native) dtype=bfloat16 attention=fused matmul=native ;;
        bf16-auto) dtype=bfloat16 ;;
        bf16-fp32gemm) dtype=bfloat16 matmul=fp32 ;;
        bf16-nativegemm) dtype=bfloat16 matmul=native ;;
        fp16-auto) dtype=float16 ;;
        *) echo "dtype_table.sh: unknown mode '$mode' in MODES (fp32, bf16-native, bf16-auto, bf16-fp32gemm, bf16-nativegemm, fp16-auto)"; exit 2 ;;
      esac
      mpirun --oversubscribe --bind-to none -np 2 build/apps/fsdp-train "$config" --set "output_dir=\"$work/$name-$mode-$round\"" \
        --set train.steps="$steps" --set eval.every=0 --set eval.batches=1 --set eval.max_items=100 --set eval.sample_tokens=0 \
        --set checkpoint.every=0 --set train.report_every=0 --set "fsdp.param_dtype=\"$dtype\"" --set "train.attention=\"$attention\"" --set "train.bf16_matmul=\"$matmul\"" \
        $(for s in ${SETS:-}; do printf -- '--set %s ' "$s"; done) \
        --progress lines >"$work/$name-$mode-$round.log" 2>&1 || { tail -20 "$work/$name-$mode-$round.log"; exit 1; }
    done
  done
done
python3 - "$work" "$out_json" "$rounds" "$modes" "${configs[@]}" <<'PY'
import datetime, json, statistics, sys
work, out, rounds, modes, configs = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(), sys.argv[5:]
rows = []
for config in configs:
    name = config.rsplit("/", 1)[-1][:-5]
    row = {"config": config}
    for mode in modes:
        rates, peaks = [], []
        for r in range(1, rounds + 1):
            records = [json.loads(l) for l in open(f"{work}/{name}-{mode}-{r}/metrics.jsonl")]
            steps = [x for x in records if "step_seconds" in x][1:]  # the first step warms up
            key = "tokens_per_second" if "tokens_per_second" in steps[0] else "images_per_second"
            rates.append(statistics.median(x[key] for x in steps))
            peaks.append(max(max(x["peak_resident_bytes_per_rank"]) for x in steps))
        start = next(x for x in records if "run_start" in x)  # the last round's: which bf16 GEMMs "auto" took
        row[mode] = {"rate": statistics.median(rates), "unit": key.split("_per_")[0], "peak_bytes": max(peaks),
                     "bf16_matmul": start.get("bf16_matmul"), "bf16_matmul_seconds": start.get("bf16_matmul_seconds")}
    rows.append(row)
print(f"{'config':26}" + "".join(f" {m:>12}" for m in modes) + "".join(f" {m + '/fp32':>15}" for m in modes if m != "fp32")
      + "".join(f" {'peak ' + m:>15}" for m in modes))
for row in rows:
    unit = "tok/s" if row[modes[0]]["unit"] == "tokens" else "img/s"
    line = f"{row['config'][8:-5]:26}" + "".join(f" {row[m]['rate']:>6.0f} {unit}" for m in modes)
    if "fp32" in modes:
        line += "".join(f" {row[m]['rate'] / row['fp32']['rate']:>14.2f}x" for m in modes if m != "fp32")
    line += "".join(f" {row[m]['peak_bytes'] / 2**20:>11.0f} MiB" for m in modes)
    chosen = [f"{m}: {row[m]['bf16_matmul']} GEMMs" for m in modes if row[m].get("bf16_matmul_seconds")]
    print(line + ("  (" + ", ".join(chosen) + ", measured at start)" if chosen else ""))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({"date": datetime.date.today().isoformat(), "bench": "dtype_table", "ranks": 2, "cpu": cpu, "modes": modes, "rows": rows}, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
