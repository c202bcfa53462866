#!/usr/bin/env bash
# Installs whatever fsdp.cpp needs from Debian's packages (only what is missing), then configures
# and builds into build/. Idempotent: quiet when everything is already present.
# Usage: scripts/setup.sh            (sourced or run by scripts/train.sh and scripts/test.sh)
#        FSDP_EXTRA_PACKAGES="python3-torch gnuplot-nox" scripts/setup.sh   (benchmarks' extras)
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  cmake g++ make pkg-config
  libtorch-dev libopenblas0-pthread   # without OpenBLAS, Debian's libtorch uses the reference BLAS (~5x slower)
  libopenmpi-dev openmpi-bin
  libgtest-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev
  fortunes dataset-fashion-mnist
)
# shellcheck disable=SC2206  # a space-separated list on purpose
packages+=(${FSDP_EXTRA_PACKAGES:-})

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing missing Debian packages: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo_cmd=(sudo)
  fi
  log=$(mktemp)
  if ! { "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
         "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
    echo "setup: apt-get failed while installing: ${missing[*]}" >&2
    tail -n 30 "$log" >&2
    echo "setup: full log in $log" >&2
    exit 1
  fi
  rm -f "$log"
fi

build_dir="$root_dir/build"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  mkdir -p "$build_dir"
  cmake -S "$root_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >"$build_dir/configure.log" 2>&1 || {
    echo "setup: cmake configure failed (log: $build_dir/configure.log):" >&2; tail -n 30 "$build_dir/configure.log" >&2
    rm -f "$build_dir/CMakeCache.txt"; exit 1; }
fi
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
# Memory per compiler process with libtorch headers is ~1.5 GiB: 2 jobs is safe on small machines.
build_log="$build_dir/build.log"
if ! cmake --build "$build_dir" -j"$jobs" >"$build_log" 2>&1; then
  echo "setup: build failed; the errors (full log in $build_log):" >&2
  grep -E -A3 'error|Error' "$build_log" | head -n 60 >&2 || tail -n 40 "$build_log" >&2
  exit 1
fi
