#!/usr/bin/env bash
# A fine-tuning run per language family on its stand-in: a directory transformers makes with that
# family's own class (scripts/make_hf_model.py: random bf16 weights, 4 layers, width 128, the
# family's own parts), fine-tuned by fsdp-train on fsdp-data's fortune instructions (byte
# tokenizer, masked loss), 2 ranks, 60 steps of 16 x 256 tokens, AdamW 3e-3. Side by side in one
# run; prints each family's validation losses (steps 0, 20, 40, 60) and its median tokens/s, and
# writes JSON. The curves are what docs/fine-tuning.md shows.
#   bash bench/finetune_families.sh [OUT.json]      (build/ and .venv/ made by scripts/setup.sh)
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/finetune_families.json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
build=$root_dir/build
"$build/apps/fsdp-data" instructions --format prompt-completion --output "$work/chat.jsonl" > /dev/null
for family in llama qwen2 qwen3 mistral gemma3; do
  "$root_dir/.venv/bin/python" -c "
import sys; sys.path.insert(0, '$root_dir/scripts'); import make_hf_model
make_hf_model.make('$family', '$work/$family-base', vocab=256, dtype='bfloat16', hidden=128, layers=4,
                   rope_scaling=False, seed=1)" > /dev/null 2>&1
  cat > "$work/$family.toml" <<TOML
name = "$family-finetune"
output_dir = "$work/$family-run"
[model]
init_from = "$work/$family-base"
[data]
source = "instructions"
tokenizer = "byte"
chat_format = "plain"
train_jsonl = "$work/chat.jsonl"
validation_percent = 2
[train]
steps = 60
global_batch = 16
seq_len = 256
threads = 1
[optimizer]
lr = 3e-3
warmup_steps = 5
[eval]
every = 20
batches = 4
sample_tokens = 0
[checkpoint]
every = 0
TOML
  mpirun --oversubscribe --bind-to none -np 2 "$build/apps/fsdp-train" "$work/$family.toml" --progress lines \
    > "$work/$family.log" 2>&1 || { tail -20 "$work/$family.log"; exit 1; }
done
python3 - "$work" "$out_json" <<'PY'
import json, re, sys
work, out = sys.argv[1], sys.argv[2]
rows = []
print(f"{'family':8} {'validation loss at steps 0, 20, 40, 60':44} {'tok/s (median)':>14}")
for family in ("llama", "qwen2", "qwen3", "mistral", "gemma3"):
    losses = [json.loads(l)["validation_loss"] for l in open(f"{work}/{family}-run/metrics.jsonl") if "validation_loss" in l]
    done = [l for l in open(f"{work}/{family}.log").read().replace("\r", "\n").splitlines() if l.startswith("done:")]
    rate = re.search(r"([0-9.]+)k tok/s", done[-1]).group(1) if done else "?"
    rows.append({"family": family, "validation_losses": losses, "tokens_per_second_k": float(rate)})
    print(f"{family:8} {' -> '.join(f'{v:.4f}' for v in losses):44} {rate + 'k':>14}")
json.dump(rows, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
