#!/usr/bin/env bash
# Installs whatever fsdp.cpp needs (only what is missing): Debian's packages, and libtorch from PyPI's
# torch wheel (scripts/requirements-torch.txt, pinned) into a virtual environment in .venv/; then
# configures and builds into build/. Idempotent: quiet when everything is already present.
# Usage: scripts/setup.sh            (run by scripts/train.sh and scripts/test.sh: everything)
#        FSDP_BUILD_TARGETS="fsdp-train" scripts/setup.sh                 (those targets only: the main job)
#        FSDP_EXTRA_PACKAGES="gnuplot-nox" scripts/setup.sh         (benchmarks' extras from Debian)
#        FSDP_EXTRA_REQUIREMENTS=scripts/requirements-peers.txt scripts/setup.sh   (extras from PyPI)
#        FSDP_TORCH_REQUIREMENTS=... FSDP_VENV=... FSDP_BUILD_DIR=... scripts/setup.sh  (another libtorch,
#          environment and build folder: scripts/test-oldest-torch.sh)
# The first run downloads the torch wheel and its CUDA libraries: 2.6 GB, about a minute here.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

packages=(
  cmake g++ make pkg-config
  python3 python3-venv python3-pip   # the virtual environment that holds the torch wheel
  libopenmpi-dev openmpi-bin
  libgtest-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev zlib1g-dev libpcre2-dev libutf8proc-dev
  libtcmalloc-minimal4               # the apps' malloc (include/fsdp/shard/host_heap.h)
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

# libtorch: the pinned torch wheel in .venv/. A stamp lists the hashes of the requirement files
# installed, so an unchanged environment costs nothing and a changed pin installs again.
venv=${FSDP_VENV:-$root_dir/.venv}
requirements=("${FSDP_TORCH_REQUIREMENTS:-$root_dir/scripts/requirements-torch.txt}")
# shellcheck disable=SC2206  # a space-separated list on purpose
requirements+=(${FSDP_EXTRA_REQUIREMENTS:-})
stamp="$venv/.fsdp-requirements"
# pip's own "No space left on device" comes after minutes of download and leaves a half-installed
# environment; the torch wheel with its CUDA libraries unpacks to about 5.2 GiB (2.6 GB downloaded).
require_free_space() {  # directory, GiB needed, what for
  local dir=$1 need_gib=$2 what=$3 avail_kib
  while [ ! -d "$dir" ]; do dir=$(dirname "$dir"); done
  avail_kib=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
  if [ "$avail_kib" -lt $((need_gib * 1024 * 1024)) ]; then
    echo "setup: $what need about $need_gib GiB free on the disk of $dir; it has $((avail_kib / 1024)) MiB." >&2
    echo "setup: free space there (df -h $dir), or set FSDP_VENV (and TMPDIR) to a folder on a larger disk" >&2
    exit 1
  fi
}
[ -x "$venv/bin/python" ] || rm -f "$stamp"
for file in "${requirements[@]}"; do
  [ -f "$file" ] || { echo "setup: no requirements file $file" >&2; exit 1; }
  hash=$(sha256sum "$file" | cut -d' ' -f1)
  grep -qx "$hash" "$stamp" 2>/dev/null && continue
  [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
  require_free_space "$venv" 7 "the wheels in $file, unpacked into ${venv#$root_dir/}/"
  require_free_space "${TMPDIR:-/tmp}" 1 "pip's download of the wheels in $file"
  echo "setup: installing into ${venv#$root_dir/}/ from PyPI: $(grep -v '^#' "$file" | xargs)"
  start=$SECONDS
  log=$(mktemp)
  if ! "$venv/bin/pip" install --disable-pip-version-check -q -r "$file" >"$log" 2>&1; then
    echo "setup: pip could not install $file into $venv:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  rm -f "$log"
  echo "setup: installed in $((SECONDS - start)) s (${venv#$root_dir/}/: $(du -sh "$venv" | cut -f1) on disk)"
  echo "$hash" >>"$stamp"
done
torch_prefix=$("$venv/bin/python" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)') || {
  echo "setup: the torch in $venv does not import; remove .venv/ and run again" >&2; exit 1; }

build_dir=${FSDP_BUILD_DIR:-$root_dir/build}
# A build configured against another libtorch (Debian's 1.13, an older pin) starts again.
if [ -f "$build_dir/CMakeCache.txt" ] && ! grep -q "^Torch_DIR:PATH=$torch_prefix/Torch$" "$build_dir/CMakeCache.txt"; then
  echo "setup: build/ was configured against another libtorch; configuring again"
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  mkdir -p "$build_dir"
  cmake -S "$root_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" \
    >"$build_dir/configure.log" 2>&1 || {
    echo "setup: cmake configure failed (log: $build_dir/configure.log):" >&2; tail -n 30 "$build_dir/configure.log" >&2
    rm -f "$build_dir/CMakeCache.txt"; exit 1; }
fi
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
# Memory per compiler process with libtorch headers is ~1.5 GiB: 2 jobs is safe on small machines.
# The build shows its progress (scripts/build-progress.sh); the whole output goes to build/build.log.
targets=${FSDP_BUILD_TARGETS:-all}
if [ "$targets" = all ]; then
  what="fsdp.cpp: libraries, programs, tests, benchmarks"
  estimate="about 8 minutes on 2 cores from scratch"
else
  what="$targets and the libraries they need"
  estimate="about 3 minutes on 2 cores from scratch for fsdp-train, 4 with fsdp-data and fsdp-ckpt"
fi
target_args=()
for t in $targets; do target_args+=(--target "$t"); done
bash "$root_dir/scripts/build-progress.sh" "$build_dir/build.log" "$what" "$estimate" -- \
  cmake --build "$build_dir" -j"$jobs" "${target_args[@]}" || exit 1
