#!/usr/bin/env bash
# bench/compare: fsdp.cpp FULL_SHARD at N = 1, 2, 4 beside plain libtorch in one process, and
# PyTorch 2.x DDP and FSDP2 on gloo at N = 2, 4 (our GPT, and transformers' GPT2LMHeadModel), same
# shapes, same global batch, one run. Installs what is missing (gnuplot-nox; transformers into
# .venv/), builds, then runs bench/compare.py:
#   bash bench/compare.sh                    # table, out/bench/compare.json, docs/compare.png
#   bash bench/compare.sh --rounds 3         # compare.py's options (--help)
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
FSDP_EXTRA_PACKAGES="gnuplot-nox" FSDP_EXTRA_REQUIREMENTS="$root_dir/scripts/requirements-peers.txt" \
  bash "$root_dir/scripts/setup.sh"
cd "$root_dir"
exec .venv/bin/python bench/compare.py --json out/bench/compare.json --plot docs/compare.png \
  --work-dir out/bench/compare "$@"
