#!/usr/bin/env bash
# Installs what is missing, builds, compiles and links the CUDA path (scripts/cuda-build-check.sh,
# where a CUDA toolkit is installed), and runs every test (unit and multi-rank).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit; FSDP_CUDA_BUILD_CHECK=skip leaves out
# the CUDA build.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The check scripts compare against Hugging Face's libraries (tokenizers, transformers) from PyPI;
# the report's check opens it in Debian's headless Chromium (selenium from PyPI drives it).
# clang and its libFuzzer runtime (libclang-rt-dev) build the fuzz targets (tests/fuzz/).
FSDP_EXTRA_PACKAGES="chromium chromium-driver clang libclang-rt-dev ${FSDP_EXTRA_PACKAGES:-}" \
  FSDP_EXTRA_REQUIREMENTS="$root_dir/scripts/requirements-peers.txt" bash "$root_dir/scripts/setup.sh"
if [ "${FSDP_CUDA_BUILD_CHECK:-auto}" != skip ]; then
  bash "$root_dir/scripts/cuda-build-check.sh"
fi
cd "$root_dir/build"
# Two tests at a time on two cores (at most 4): many wait on processes starting, Python importing
# or ranks pairing (docs/testing.md); a -j among the arguments overrides it. Tests that must run
# alone say so (RUN_SERIAL, tests/CMakeLists.txt).
jobs=$(nproc); [ "$jobs" -gt 4 ] && jobs=4
ctest --output-on-failure --timeout 600 -j "$jobs" "$@"
