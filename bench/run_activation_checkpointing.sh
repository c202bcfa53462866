#!/usr/bin/env bash
# Activation checkpointing, none, every block and every k-th block (fsdp.activation_checkpointing_every),
# side by side: the Llama 3.2 1B block shape scaled to this machine (llama-small: 8 blocks of width
# 256, grouped-query attention, SwiGLU) with 512-token windows, 2 ranks, STEPS steps; a table of peak
# resident memory (the largest rank's) and step time from bench/compare_runs.py. JSON lands in
# out/bench/activation_checkpointing.json.
#   bash bench/run_activation_checkpointing.sh [--set key=value ...]   (MODES="off 1 2 4" STEPS=12)
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root_dir/out/bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$root_dir"
modes=${MODES:-off 1 2 4} steps=${STEPS:-12}
runs=()
for mode in $modes; do
  if [ "$mode" = off ]; then
    recompute=(--set fsdp.activation_checkpointing=false)
    label=none
  else
    recompute=(--set fsdp.activation_checkpointing=true --set fsdp.activation_checkpointing_every="$mode")
    label="every_$mode"
  fi
  mpirun --oversubscribe --bind-to none -np 2 build/apps/fsdp-train configs/llama-fortunes-small.toml \
    --progress lines --steps "$steps" --output-dir "out/bench/ac-$label" \
    --set model.context=512 --set train.seq_len=512 --set train.global_batch=16 --set train.micro_batches=1 \
    --set optimizer.warmup_steps=2 --set eval.every=0 --set eval.batches=1 --set eval.sample_tokens=0 \
    "${recompute[@]}" "$@"
  runs+=("$label=out/bench/ac-$label")
done
python3 bench/compare_runs.py --json out/bench/activation_checkpointing.json "${runs[@]}"
