#!/usr/bin/env bash
# Two builds of fsdp-train side by side on one config: a change's step time before and after it,
# interleaved (before, after, before, after, ...) on the same machine in one run, then
# bench/compare_runs.py's table (median step after the first 5) and its JSON in out/bench/; the
# runs in a new out/bench/ab.XXXXXX/.
#   bash bench/ab_builds.sh BEFORE_FSDP_TRAIN AFTER_FSDP_TRAIN RANKS ROUNDS CONFIG [--set key=value ...]
# The "before" binary comes from a worktree of the earlier commit, built once:
#   git worktree add /tmp/before/src COMMIT
#   cmake -S /tmp/before/src -B /tmp/before/build -DCMAKE_BUILD_TYPE=Release \
#     -DCMAKE_PREFIX_PATH=$(.venv/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)') \
#     -DFSDP_BUILD_TESTS=OFF -DFSDP_BUILD_BENCH=OFF
#   cmake --build /tmp/before/build -j2 --target fsdp-train
set -euo pipefail
if [ $# -lt 5 ]; then
  sed -n 2,11p "$0" >&2
  exit 2
fi
before=$1 after=$2 ranks=$3 rounds=$4 config=$5
shift 5
for binary in "$before" "$after"; do
  [ -x "$binary" ] || { echo "ab_builds: '$binary' is not an executable fsdp-train" >&2; exit 2; }
done
root_dir=$(cd "$(dirname "$0")/.." && pwd)
cd "$root_dir"
mkdir -p out/bench
work=$(mktemp -d out/bench/ab.XXXXXX)  # this run's own directory: nothing earlier is overwritten
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
runs=()
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    binary=$before
    [ "$side" = after ] && binary=$after
    out="$work/$side-$round"
    mpirun --oversubscribe --bind-to none -np "$ranks" "$binary" "$config" --progress lines --output-dir "$out" \
      --set eval.every=0 --set eval.sample_tokens=0 --set train.report_every=0 "$@" >"$out.log" 2>&1 ||
      { echo "ab_builds: the $side run of round $round failed (log: $out.log):" >&2; tail -n 20 "$out.log" >&2; exit 1; }
    runs+=("$side-$round=$out")
  done
done
python3 bench/compare_runs.py --json out/bench/ab_builds.json "${runs[@]}"
