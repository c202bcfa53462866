#!/usr/bin/env bash
# Sharded save/load and safetensors export of GPT-2 124M at 2 ranks; JSON lands in out/bench/.
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root_dir/out/bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun --oversubscribe --bind-to none -np 2 "$root_dir/build/bench/checkpoint_bench" --model gpt2 \
  --json "$root_dir/out/bench/checkpoint_np2.json" "$@"
