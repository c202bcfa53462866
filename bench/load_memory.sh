#!/usr/bin/env bash
# Host memory while loading a Hugging Face directory (model.init_from) under LoRA, per rank at N = 2:
# the peak resident memory (VmHWM) from the start of the process to the first step, against the
# rank's parameter shard, for a bf16 base and an NF4 base (QLoRA), side by side. Prints a table
# and writes JSON.
#   bash bench/load_memory.sh [OUT.json]      (build/ and .venv/ made by scripts/setup.sh)
# The model: a transformers-made bf16 Llama (scripts/make_hf_model.py: 22 layers, width 2048, MLP
# 4096, vocabulary 512; 832.7 M parameters, 1.55 GiB on disk as four files), random weights.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/load_memory.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
PYTHONPATH="$root_dir/scripts" "$root_dir/.venv/bin/python" -c "
import sys, make_hf_model
make_hf_model.make('llama', sys.argv[1], vocab=512, dtype='bfloat16', layers=22, hidden=2048, context=256, max_shard_size='500MB')
" "$work/model" > /dev/null 2>&1
for base in bfloat16 nf4; do
  cat > "$work/$base.toml" <<TOML
name = "load-$base"
output_dir = "$work/out-$base"
[model]
init_from = "$work/model"
[data]
source = "fortunes"
[train]
steps = 1
global_batch = 2
seq_len = 64
threads = 1
report_every = 0
[eval]
every = 0
batches = 1
sample_tokens = 0
[optimizer]
warmup_steps = 0
[fsdp]
param_dtype = "bfloat16"
[lora]
rank = 16
alpha = 32
targets = "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"
base_dtype = "$base"
TOML
  FSDP_MEMORY_TRACE=1 mpirun --oversubscribe --bind-to none -np 2 "$root_dir/build/apps/fsdp-train" "$work/$base.toml" \
    --progress lines > "$work/$base.log" 2>&1 || { cat "$work/$base.log"; exit 1; }
done
python3 - "$work" "$out_json" <<'PY'
import json, re, sys, datetime
work, out = sys.argv[1], sys.argv[2]
rows = {}
for base in ("bfloat16", "nf4"):
    log = open(f"{work}/{base}.log").read()
    peaks = [float(m) for m in re.findall(r"step 0 until start\s+peak: resident\s+([\d.]+) MiB", log)]
    shard = float(re.search(r"per rank: ([\d.]+) MiB of parameter shards", log).group(1))
    rows[base] = {"load_peak_resident_mib_per_rank": peaks, "parameter_shard_mib": shard}
print(f"{'base':9} {'parameter shard':>16} {'peak while loading (each rank)':>32}")
for base, r in rows.items():
    print(f"{base:9} {r['parameter_shard_mib']:12.1f} MiB {', '.join(f'{p:.0f}' for p in r['load_peak_resident_mib_per_rank']):>28} MiB")
json.dump({"date": datetime.date.today().isoformat(), "ranks": 2, "model_parameters": 832.66e6, "rows": rows},
          open(out, "w"), indent=2)
print(f"wrote {out}")
PY
