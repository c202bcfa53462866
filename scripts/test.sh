#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test (unit and multi-rank).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root_dir/scripts/setup.sh"
cd "$root_dir/build"
ctest --output-on-failure --timeout 600 "$@"
