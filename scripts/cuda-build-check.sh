#!/usr/bin/env bash
# Compiles and links the CUDA path (FSDP_CUDA=ON: the NCCL backend, CUDA device memory, fused AdamW)
# into build-cuda/, against the CUDA torch wheel that scripts/setup.sh installed in .venv/, the
# wheel's NCCL, and the machine's CUDA toolkit (nvcc, cudart). Nothing runs: a machine without a GPU
# still catches a GPU build error before a device run. scripts/test.sh calls it after setup.sh.
#   bash scripts/cuda-build-check.sh            # skips, saying so, where no CUDA toolkit is installed
#   FSDP_CUDA_BUILD_CHECK=require bash ...      # fails instead of skipping
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root_dir/.venv"
[ -x "$venv/bin/python" ] || { echo "cuda-build-check: no .venv/; run scripts/setup.sh first" >&2; exit 1; }

nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
if [ -z "$nvcc" ]; then
  if [ "${FSDP_CUDA_BUILD_CHECK:-auto}" = require ]; then
    echo "cuda-build-check: no nvcc (PATH, CUDA_HOME, /usr/local/cuda): cannot build the CUDA path" >&2; exit 1
  fi
  echo "cuda-build-check: skipped: no CUDA toolkit here (nvcc not found)"
  exit 0
fi
cuda_home=$(dirname "$(dirname "$nvcc")")
torch_prefix=$("$venv/bin/python" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)')
# The NCCL the wheel's libtorch_cuda loads (nvidia-nccl), so that both sides agree on one library.
nccl_root=$("$venv/bin/python" -W ignore -c '
import glob, site
print(next((p.rsplit("/include/", 1)[0] for d in site.getsitepackages()
            for p in sorted(glob.glob(d + "/nvidia/nccl/include/nccl.h"))), ""))')
[ -n "$nccl_root" ] || nccl_root=$cuda_home

build_dir="$root_dir/build-cuda"
# Compiled without optimization (a build type of no flags: -O0, no -g): nothing here runs but
# `fsdp-train --check`, and an error in compiling or linking shows the same; unoptimized, every
# inline function is still emitted and linked. The GPU machine builds Release (scripts/gpu-check.sh).
build_type=CompileCheck
if [ -f "$build_dir/CMakeCache.txt" ] && { ! grep -q "^Torch_DIR:PATH=$torch_prefix/Torch$" "$build_dir/CMakeCache.txt" ||
  ! grep -q "^CMAKE_BUILD_TYPE:STRING=$build_type$" "$build_dir/CMakeCache.txt"; }; then
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
fi
mkdir -p "$build_dir"
start=$SECONDS
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  PATH="$cuda_home/bin:$PATH" NCCL_ROOT=$nccl_root CUDA_HOME=$cuda_home cmake -S "$root_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=$build_type \
    -DFSDP_CUDA=ON -DFSDP_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$torch_prefix" \
    >"$build_dir/configure.log" 2>&1 || {
    echo "cuda-build-check: configure failed (log: $build_dir/configure.log):" >&2
    tail -n 30 "$build_dir/configure.log" >&2
    rm -f "$build_dir/CMakeCache.txt"; exit 1; }
fi
jobs=$(( $(nproc) < 2 ? 1 : 2 ))
# The trainer: every library source, the CUDA-only ones (NCCL, device memory, the fused kernels)
# included, linked against the CUDA libraries. The test binaries that scripts/gpu-check.sh also
# builds on a GPU machine are not rebuilt here: their sources hold no CUDA-only code (nothing
# branches on FSDP_WITH_CUDA), the CPU build compiles them against the same headers, and they link
# what fsdp-train links. That saves about 4 of this check's 9 minutes in CI.
if ! bash "$root_dir/scripts/build-progress.sh" "$build_dir/build.log" "the CUDA path of fsdp-train (compile and link only, nothing runs)" \
    "about 1.5 minutes on 2 cores from scratch, unoptimized" -- cmake --build "$build_dir" -j"$jobs" --target fsdp-train; then
  echo "cuda-build-check: the CUDA path does not build (above)" >&2
  exit 1
fi
echo "cuda-build-check: CUDA path compiled and linked in $((SECONDS - start)) s ($build_dir: fsdp-train; not run)"
