#!/usr/bin/env bash
# bf16 against fp32 on the main job's model: gpt-tiny on fortunes, 200 steps at 2 ranks, once
# with float32 parameters, with bfloat16 gather/compute and float32 reduction, and with bfloat16
# reduction too, then a table of final validation loss, step time and gathered bytes. JSON lands
# in out/bench/.
#   bash bench/run_mixed_precision.sh [--set key=value ...]
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root_dir/out/bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$root_dir"
for dtypes in float32:float32 bfloat16:float32 bfloat16:bfloat16; do
  param=${dtypes%:*} reduce=${dtypes#*:}
  mpirun --oversubscribe --bind-to none -np 2 build/apps/fsdp-train configs/gpt-fortunes-tiny.toml \
    --progress lines --steps 200 --output-dir "out/bench/mp-$param-$reduce" \
    --set eval.every=0 --set eval.sample_tokens=0 --set fsdp.param_dtype=$param --set fsdp.reduce_dtype=$reduce "$@"
done
python3 bench/compare_runs.py --json out/bench/mixed_precision.json fp32=out/bench/mp-float32-float32 \
  bf16-params=out/bench/mp-bfloat16-float32 bf16-params+reduce=out/bench/mp-bfloat16-bfloat16
