#!/usr/bin/env bash
# bench/compare: fsdp.cpp FULL_SHARD at N = 1, 2, 4 beside plain libtorch in one process and
# PyTorch DDP (Debian's python3-torch, gloo) at N = 2, 4, same GPT, same global batch, one run.
# Installs what is missing (python3-torch, gnuplot-nox), builds, then runs bench/compare.py:
#   bash bench/compare.sh                    # table, out/bench/compare.json, docs/compare.png
#   bash bench/compare.sh --rounds 3         # compare.py's options (--help)
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
FSDP_EXTRA_PACKAGES="python3-torch gnuplot-nox" bash "$root_dir/scripts/setup.sh"
cd "$root_dir"
exec /usr/bin/python3 bench/compare.py --json out/bench/compare.json --plot docs/compare.png \
  --work-dir out/bench/compare "$@"
