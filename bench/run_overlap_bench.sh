#!/usr/bin/env bash
# overlap_bench at 4 ranks (as asked) and 2 ranks (one rank per core here), then once more at 4
# ranks with --fresh-pages (no memory reuse) to show what page faults cost. JSON in out/bench/.
#   bash bench/run_overlap_bench.sh [overlap_bench options]
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root_dir/out/bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
for n in 4 2; do
  mpirun --oversubscribe --bind-to none -np "$n" "$root_dir/build/bench/overlap_bench" \
    --json "$root_dir/out/bench/overlap_np$n.json" "$@"
done
mpirun --oversubscribe --bind-to none -np 4 "$root_dir/build/bench/overlap_bench" --fresh-pages \
  --json "$root_dir/out/bench/overlap_np4_fresh_pages.json" "$@"
