#!/usr/bin/env bash
# Activation checkpointing on a long-sequence configuration: gpt-tiny with 1024-token windows,
# 2 ranks, 12 steps, with and without recomputation; a table of peak resident memory (the largest
# rank's) and step time. JSON lands in out/bench/.
#   bash bench/run_activation_checkpointing.sh [--set key=value ...]
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root_dir/out/bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$root_dir"
for recompute in false true; do
  mpirun --oversubscribe --bind-to none -np 2 build/apps/fsdp-train configs/gpt-fortunes-tiny.toml \
    --progress lines --steps 12 --output-dir "out/bench/ac-$recompute" \
    --set model.context=1024 --set train.seq_len=1024 --set train.global_batch=16 --set optimizer.warmup_steps=2 \
    --set eval.every=0 --set eval.batches=1 --set eval.sample_tokens=0 \
    --set fsdp.activation_checkpointing=$recompute "$@"
done
python3 bench/compare_runs.py --json out/bench/activation_checkpointing.json \
  plain=out/bench/ac-false recompute=out/bench/ac-true
