#!/usr/bin/env bash
# Runs comm_bench at 2 and 4 ranks; JSON lands in out/bench/.
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root_dir/out/bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for n in 2 4; do
  mpirun --oversubscribe --bind-to none -np "$n" "$root_dir/build/bench/comm_bench" \
    --json "$root_dir/out/bench/comm_np$n.json" "$@"
done
