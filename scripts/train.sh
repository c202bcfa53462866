#!/usr/bin/env bash
# Installs what is missing, builds fsdp-train, and runs the main job: fsdp-train on 2 ranks with
# configs/gpt-fortunes-tiny.toml (a tiny GPT-2 learning to write fortunes).
#   bash scripts/train.sh                                   # the main job
#   bash scripts/train.sh configs/vit-fashion-mnist.toml    # another config
#   bash scripts/train.sh --set train.steps=100             # overrides (fsdp-train --help)
#   FSDP_RANKS=4 bash scripts/train.sh                      # another rank count
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The main job needs fsdp-train alone: the tests, benchmarks and other programs build with scripts/test.sh.
FSDP_BUILD_TARGETS=fsdp-train bash "$root_dir/scripts/setup.sh"
config="$root_dir/configs/gpt-fortunes-tiny.toml"
if [ $# -gt 0 ] && [[ "$1" == *.toml ]]; then
  config=$1
  shift
fi
ranks=${FSDP_RANKS:-2}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$root_dir"
# Ctrl-C: every rank saves a checkpoint at the end of its step, then exits (scripts/launch-ranks.sh).
source "$root_dir/scripts/launch-ranks.sh"
launch_ranks "$ranks" "$root_dir/build/apps/fsdp-train" "$config" "$@"
