#!/usr/bin/env bash
# Builds the Debian package: fsdp-cpp_<version>_amd64.deb in build/, with the libtorch libraries
# the programs need bundled (FSDP_BUNDLE_LIBTORCH), so it installs and runs on a fresh Debian 12
# (scripts/test-deb.sh checks that). Uses the project's build/ (scripts/setup.sh makes it).
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root_dir/scripts/setup.sh"
cd "$root_dir/build"
cmake -DFSDP_BUNDLE_LIBTORCH=ON . > /dev/null
trap 'cmake -DFSDP_BUNDLE_LIBTORCH=OFF . > /dev/null' EXIT   # a plain cmake --install stays small
cmake --build . -j2 > /dev/null
cpack -G DEB > cpack.log 2>&1 || { tail -n 30 cpack.log; exit 1; }
ls -la "$root_dir"/build/fsdp-cpp_*_amd64.deb
