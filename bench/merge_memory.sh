#!/usr/bin/env bash
# Peak resident memory per rank of `fsdp-ckpt export --merge` (LoRA adapters merged into the
# weights), for one or more builds side by side on the same checkpoint: N = 2 ranks, each rank's
# peak from GNU time, the median of ROUNDS runs. Prints a table and writes JSON.
#   bash bench/merge_memory.sh [BUILD_DIR ...]        (default: build/)
# The model: a 302 M-parameter Llama (12 layers, width 1536, 12 heads over 4 key/value heads, SwiGLU
# 4096, byte vocabulary), random weights; LoRA rank 16 on all seven projections, trained one step by
# the first build's fsdp-train (checkpoint.every = 1); the export writes fp32. Before 2026-12-02 the
# export computed every layer's full-size delta (B A, fp32) on every rank before writing anything:
# 1.2 GB here, 28 GB for Llama 3 8B.
# Environment: ROUNDS (3), OUT (runs/bench/merge_memory.json).
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
builds=("$@")
[ ${#builds[@]} -gt 0 ] || builds=("$root_dir/build")
rounds=${ROUNDS:-3}
out_json=${OUT:-$root_dir/runs/bench/merge_memory.json}
[ -x /usr/bin/time ] || { echo "merge_memory: needs GNU time (apt-get install time)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mkdir -p "$(dirname "$out_json")"

cat >"$work/lora.toml" <<TOML
name = "merge-memory"
output_dir = "$work/run"
[model]
name = "llama-small"
dim = 1536
layers = 12
heads = 12
kv_heads = 4
ffn_hidden = 4096
context = 128
[data]
source = "fortunes"
[train]
steps = 1
global_batch = 2
seq_len = 64
threads = 1
report_every = 0
[optimizer]
lr = 1e-2
[eval]
every = 0
batches = 1
sample_tokens = 0
[checkpoint]
every = 1
[lora]
rank = 16
alpha = 32
targets = "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"
base_dtype = "float32"
TOML
mpirun --oversubscribe --bind-to none -np 2 "${builds[0]}/apps/fsdp-train" "$work/lora.toml" --progress lines >"$work/train.log" 2>&1 ||
  { tail -20 "$work/train.log"; exit 1; }
checkpoint=$(ls -d "$work"/run/checkpoints/step-* | tail -1)

for b in "${!builds[@]}"; do
  for round in $(seq 1 "$rounds"); do
    rm -rf "$work/merged"
    mpirun --oversubscribe --bind-to none -np 2 bash -c \
      '/usr/bin/time -f "%M" -o "'"$work"'/rss.'"$b.$round"'.${OMPI_COMM_WORLD_RANK}" "$0" "$@"' \
      "${builds[$b]}/apps/fsdp-ckpt" export "$checkpoint" --hf-dir "$work/merged" --merge >"$work/export.log" 2>&1 ||
      { tail -20 "$work/export.log"; exit 1; }
  done
done

python3 - "$work" "$out_json" "$rounds" "${builds[@]}" <<'PY'
import datetime, json, statistics, sys
work, out, rounds, builds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
rows = []
for b, build in enumerate(builds):
    peaks = [max(int(open(f"{work}/rss.{b}.{r}.{rank}").read().split()[-1]) for rank in (0, 1)) * 1024
             for r in range(1, rounds + 1)]
    rows.append({"build": build, "peak_rss_bytes_per_rank_max": statistics.median(peaks), "rounds": peaks})
first = rows[0]["peak_rss_bytes_per_rank_max"]
print(f"fsdp-ckpt export --merge, 302 M Llama, LoRA rank 16 on 7 projections, N = 2 (median of {rounds})")
print(f"{'build':<40} {'peak RSS, largest rank':>24} {'vs first':>9}")
for r in rows:
    print(f"{r['build'][-40:]:<40} {r['peak_rss_bytes_per_rank_max'] / 2**30:>20.2f} GiB {r['peak_rss_bytes_per_rank_max'] / first:>8.2f}x")
json.dump({"date": datetime.date.today().isoformat(), "bench": "merge_memory", "rows": rows}, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
