#!/usr/bin/env bash
# bench/under_load: fsdp.cpp and PyTorch DDP at N = 2, each alone and beside one busy core, one run.
# Installs what is missing, builds, then runs bench/under_load.py (its --help for options):
#   bash bench/under_load.sh                 # table and out/bench/under_load.json
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
bash "$root_dir/scripts/setup.sh"
cd "$root_dir"
exec .venv/bin/python bench/under_load.py --work-dir out/bench/under_load "$@"
