#!/usr/bin/env bash
# Builds fsdp.cpp against the oldest libtorch it supports (scripts/requirements-torch-oldest.txt:
# torch 2.7.0, in .venv-oldest/, build in build-oldest/) and runs every test there. Not part of
# CI's run (it doubles the build: about 10 more minutes on 2 cores); run it when compat.h or the
# pinned version changes. Extra arguments go to ctest.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FSDP_TORCH_REQUIREMENTS="$root_dir/scripts/requirements-torch-oldest.txt" FSDP_VENV="$root_dir/.venv-oldest" \
  FSDP_BUILD_DIR="$root_dir/build-oldest" bash "$root_dir/scripts/setup.sh"
grep '^Torch_DIR' "$root_dir/build-oldest/CMakeCache.txt"
cd "$root_dir/build-oldest"
ctest --output-on-failure --timeout 600 "$@"
