#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job: sharded training on 2 ranks.
# Extra arguments go to the training program (try --help).
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root_dir/scripts/setup.sh"
ranks=${FSDP_RANKS:-2}
mpi_env=()
if [ "$(id -u)" = 0 ]; then mpi_env=(-x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1); fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec mpirun --oversubscribe --bind-to none -np "$ranks" "${mpi_env[@]}" -x OMP_NUM_THREADS \
  "$root_dir/build/apps/fsdp-demo" "$@"
