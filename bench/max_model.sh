#!/usr/bin/env bash
# bench/max_model: the largest GPT that trains 3 steps with each rank capped at 5 GiB (a memory
# cgroup per rank, bench/memory_cap.sh): fsdp.cpp at N = 4, PyTorch DDP and FSDP2 at N = 4, one plain
# libtorch process; and fsdp.cpp at N = 4 with no per-rank cap against the machine's bound.
# Needs root (cgroups). Installs what is missing, builds, then runs bench/max_model.py:
#   bash bench/max_model.sh                            # all four; out/bench/max_model.json
#   bash bench/max_model.sh --only fsdp4_capped        # max_model.py's options (--help)
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
bash "$root_dir/scripts/setup.sh"
cd "$root_dir"
exec .venv/bin/python bench/max_model.py --json out/bench/max_model.json --work-dir out/bench/max_model "$@"
