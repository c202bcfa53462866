#!/usr/bin/env bash
# The fine-tuning job, from a Hugging Face model directory in to one out: instruction data from
# Debian's fortunes (fsdp-data instructions), fsdp-train on 2 ranks with
# configs/llama-finetune-fortunes.toml (masked loss, Llama 3's chat format), then fsdp-ckpt export
# --hf-dir of the last checkpoint, which transformers' from_pretrained loads.
#   bash scripts/finetune.sh                                   # a stand-in model made here
#   FSDP_MODEL_DIR=~/models/Llama-3.2-1B-Instruct bash scripts/finetune.sh --set train.steps=200
# Without FSDP_MODEL_DIR the model is a small random Llama with Llama 3's real tokenizer, made by
# transformers (scripts/make_hf_model.py; transformers comes from scripts/requirements-peers.txt):
# weights cannot be downloaded here. The C++ run path uses no Python either way.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root_dir"
model_dir=${FSDP_MODEL_DIR:-}
if [ -z "$model_dir" ]; then
  FSDP_EXTRA_REQUIREMENTS="$root_dir/scripts/requirements-peers.txt" bash scripts/setup.sh
  model_dir=runs/hf/llama3-tiny
  tokenizers=${FSDP_TOKENIZERS_DIR:-$root_dir/../shared/data/tokenizers}
  if [ ! -f "$model_dir/config.json" ]; then
    [ -f "$tokenizers/llama3/tokenizer.json" ] || { echo "finetune: no $tokenizers/llama3/tokenizer.json (set FSDP_TOKENIZERS_DIR or FSDP_MODEL_DIR)" >&2; exit 1; }
    .venv/bin/python scripts/make_hf_model.py --family llama --out "$model_dir" --tokenizer-dir "$tokenizers/llama3" \
      --hidden 128 --layers 4 --tie --context 2048
  fi
else
  bash scripts/setup.sh
fi
data=runs/data/fortune-chat.jsonl
if [ ! -f "$data" ]; then
  mkdir -p "$(dirname "$data")"
  build/apps/fsdp-data instructions --output "$data"
fi
ranks=${FSDP_RANKS:-2}
mpi_env=()
if [ "$(id -u)" = 0 ]; then mpi_env=(-x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
output=runs/llama-finetune-fortunes
rm -rf "$output/checkpoints"   # the export below takes this run's last checkpoint, not an older run's
mpirun --oversubscribe --bind-to none -np "$ranks" "${mpi_env[@]}" build/apps/fsdp-train configs/llama-finetune-fortunes.toml \
  --set "model.init_from=\"$model_dir\"" --set "data.train_jsonl=\"$data\"" "$@"
latest=$(ls -d "$output"/checkpoints/step-[0-9]* | grep -v '\.partial$' | sort | tail -1)
rm -rf "$output/hf"
mpirun --oversubscribe --bind-to none -np "$ranks" "${mpi_env[@]}" build/apps/fsdp-ckpt export "$latest" --hf-dir "$output/hf"
echo "fine-tuned model: $output/hf (transformers: AutoModelForCausalLM.from_pretrained(\"$output/hf\"))"
