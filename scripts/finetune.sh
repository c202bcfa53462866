#!/usr/bin/env bash
# The fine-tuning job, from a Hugging Face model directory in to one out, on nothing but a clone of
# this repository and Debian's fortunes:
#   1. fsdp-data train-tokenizer: a byte-level BPE tokenizer (vocab 4096, Llama 3's chat tokens)
#      trained on the fortunes, as a Hugging Face tokenizer.json;
#   2. fsdp-train configs/llama-fortunes-pretrain.toml: a small Llama pretrained on the fortunes with
#      it, exported by fsdp-ckpt export --hf-dir: the "pretrained model" a user would download;
#   3. fsdp-data instructions: requests ("Tell me a fortune about love.") with fortunes as answers;
#   4. fsdp-train configs/llama-finetune-fortunes.toml: that directory fine-tuned on them in Llama 3's
#      chat format (the loss over the answers only), then exported again, for transformers'
#      from_pretrained. The run's sample is the model's answer to a request.
#   bash scripts/finetune.sh                                        # steps 1-4
#   bash scripts/finetune.sh --set train.steps=200                  # overrides go to step 4
#   FSDP_MODEL_DIR=~/models/Llama-3.2-1B-Instruct bash scripts/finetune.sh   # your model: step 3-4
# Steps 1-2 run once (runs/tokenizers/fortunes-bpe, runs/llama-fortunes-pretrain/hf are kept);
# FSDP_PRETRAIN_STEPS sets step 2's length (400). FSDP_RUNS_DIR puts everything this script writes
# under another directory than runs/ (the guides' checks use their own). Python is used nowhere.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root_dir"
FSDP_BUILD_TARGETS="fsdp-train fsdp-data fsdp-ckpt" bash scripts/setup.sh
ranks=${FSDP_RANKS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Ctrl-C: every rank saves a checkpoint at the end of its step, then exits (scripts/launch-ranks.sh).
source "$root_dir/scripts/launch-ranks.sh"
run() { launch_ranks "$ranks" "$@"; }
# The newest published checkpoint of a run directory.
latest_checkpoint() { ls -d "$1"/checkpoints/step-[0-9]* | grep -E '/step-[0-9]+$' | sort | tail -1; }
# A run of an earlier call of this script is moved aside (DIR.1, DIR.2, ...), never deleted:
# fsdp-train refuses to start a new run in a directory holding another (docs/checkpoints.md).
set_aside_previous_run() {
  local dir=$1 n=1
  [ -e "$dir/run.json" ] || [ -e "$dir/metrics.jsonl" ] || [ -d "$dir/checkpoints" ] || return 0
  while [ -e "$dir.$n" ]; do n=$((n + 1)); done
  echo "finetune: the previous run in $dir is kept as $dir.$n"
  mv "$dir" "$dir.$n"
}

model_dir=${FSDP_MODEL_DIR:-}
runs=${FSDP_RUNS_DIR:-runs}
if [ -z "$model_dir" ]; then
  tokenizer=$runs/tokenizers/fortunes-bpe
  if [ ! -f "$tokenizer/tokenizer.json" ]; then
    echo "finetune: 1. a tokenizer for the fortunes"
    build/apps/fsdp-data train-tokenizer --output-dir "$tokenizer" --vocab-size 4096
  fi
  pretrain=$runs/llama-fortunes-pretrain
  model_dir=$pretrain/hf
  if [ ! -f "$model_dir/config.json" ]; then
    echo "finetune: 2. pretraining a small Llama on the fortunes (the stand-in for a downloaded model)"
    set_aside_previous_run "$pretrain"
    run build/apps/fsdp-train configs/llama-fortunes-pretrain.toml --output-dir "$pretrain" \
      --set "data.tokenizer_json=\"$tokenizer/tokenizer.json\"" \
      --set "train.steps=${FSDP_PRETRAIN_STEPS:-400}" --set "checkpoint.every=${FSDP_PRETRAIN_STEPS:-400}" \
      --set "optimizer.warmup_steps=$(( ${FSDP_PRETRAIN_STEPS:-400} < 20 ? 1 : 20 ))" --progress lines
    run build/apps/fsdp-ckpt export "$(latest_checkpoint "$pretrain")" --hf-dir "$model_dir"
  else
    echo "finetune: 1-2. reusing $model_dir (remove it to pretrain again)"
  fi
fi

data=$runs/data/fortune-chat.jsonl
if [ ! -f "$data" ]; then
  echo "finetune: 3. instructions from the fortunes"
  mkdir -p "$(dirname "$data")"
  build/apps/fsdp-data instructions --output "$data"
fi
echo "finetune: 4. fine-tuning $model_dir to answer with fortunes"
output=$runs/llama-finetune-fortunes
output_given=no
previous=
for arg in "$@"; do  # a --output-dir of the caller's is the run's directory, and the export's
  [ "$previous" = --output-dir ] && output=$arg && output_given=yes
  case $arg in --output-dir=*) output=${arg#--output-dir=}; output_given=yes ;; esac
  previous=$arg
done
output_flag=()
[ $output_given = no ] && output_flag=(--output-dir "$output")
# The export below takes this run's last checkpoint, not an older run's (unless this call continues it).
case " $* " in *" --resume "*) ;; *) set_aside_previous_run "$output" ;; esac
run build/apps/fsdp-train configs/llama-finetune-fortunes.toml "${output_flag[@]}" \
  --set "model.init_from=\"$model_dir\"" --set "data.train_jsonl=\"$data\"" "$@"
run build/apps/fsdp-ckpt export "$(latest_checkpoint "$output")" --hf-dir "$output/hf"
echo "fine-tuned model: $output/hf (transformers: AutoModelForCausalLM.from_pretrained(\"$output/hf\"))"
