#!/usr/bin/env bash
# Installs what is missing, builds, compiles and links the CUDA path (scripts/cuda-build-check.sh,
# where a CUDA toolkit is installed), and runs every test (unit and multi-rank).
# Extra arguments go to ctest, e.g. scripts/test.sh -L unit; FSDP_CUDA_BUILD_CHECK=skip leaves out
# the CUDA build.
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The check scripts compare against Hugging Face's libraries (tokenizers, transformers) from PyPI;
# the report's check opens it in Debian's headless Chromium (selenium from PyPI drives it).
# clang and its libFuzzer runtime (libclang-rt-dev) build the fuzz targets (tests/fuzz/);
# clang-format checks the layout (CTest `format`).
FSDP_EXTRA_PACKAGES="chromium chromium-driver clang clang-format libclang-rt-dev ${FSDP_EXTRA_PACKAGES:-}" \
  FSDP_EXTRA_REQUIREMENTS="$root_dir/scripts/requirements-peers.txt" bash "$root_dir/scripts/setup.sh"

# The CUDA compile check runs beside the tests, at the lowest CPU priority: the tests leave about a
# quarter of two cores idle (processes starting, Python importing, ranks pairing), and the check's
# compiler fills it instead of running for about 4 minutes before them. Its output goes to
# build-cuda/check.log and is shown when the tests are done.
cuda_check_pid=
cuda_check_log="$root_dir/build-cuda/check.log"
if [ "${FSDP_CUDA_BUILD_CHECK:-auto}" != skip ]; then
  mkdir -p "$root_dir/build-cuda"
  echo "test: the CUDA compile check runs beside the tests (nice 19; log: ${cuda_check_log#$root_dir/})"
  # A process group of its own (job control, set -m), so that an interrupted run leaves no compiler
  # behind; the same session, because Linux's autogroups weigh nice only within a session (setsid
  # would give the compiler an equal share beside the tests).
  set -m
  nice -n 19 bash "$root_dir/scripts/cuda-build-check.sh" </dev/null >"$cuda_check_log" 2>&1 &
  cuda_check_pid=$!
  set +m
  trap '[ -z "$cuda_check_pid" ] || kill -- "-$cuda_check_pid" 2>/dev/null || true' EXIT
fi

cd "$root_dir/build"
# Two tests at a time on two cores (at most 4): many wait on processes starting, Python importing
# or ranks pairing (docs/testing.md); a -j among the arguments overrides it. Tests that must run
# alone say so (RUN_SERIAL, tests/CMakeLists.txt).
jobs=$(nproc); [ "$jobs" -gt 4 ] && jobs=4
tests_status=0
ctest --output-on-failure --timeout 600 -j "$jobs" "$@" || tests_status=$?

cuda_status=0
if [ -n "$cuda_check_pid" ]; then
  start=$SECONDS
  wait "$cuda_check_pid" || cuda_status=$?
  cuda_check_pid=
  [ $((SECONDS - start)) -gt 1 ] && echo "test: waited $((SECONDS - start)) s for the CUDA compile check after the tests"
  if [ "$cuda_status" -eq 0 ]; then
    grep -E '^cuda-build-check:' "$cuda_check_log" || tail -n 3 "$cuda_check_log"
    # The CUDA build's fsdp-train runs without a GPU as far as --check goes: fsdp-plan --fit's GPU
    # setups must be accepted by it as they are, with no note that the build cannot run them.
    if [ -x "$root_dir/build-cuda/apps/fsdp-train" ]; then
      fit_log="$root_dir/build-cuda/fit_configs.log"
      if OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 python3 "$root_dir/tests/cli/fit_configs.py" \
          "$root_dir/build" "$(command -v mpirun)" --train "$root_dir/build-cuda/apps/fsdp-train" >"$fit_log" 2>&1; then
        echo "test: the CUDA build's fsdp-train --check accepts fsdp-plan --fit's GPU setups (log: ${fit_log#$root_dir/})"
      else
        cuda_status=1
        echo "test: the CUDA build's fsdp-train --check refused fsdp-plan --fit's GPU setups (log: $fit_log):" >&2
        grep -E '^FAIL' "$fit_log" >&2 || tail -n 20 "$fit_log" >&2
      fi
    fi
  else
    echo "test: the CUDA compile check failed (exit $cuda_status; log: $cuda_check_log):" >&2
    tail -n 40 "$cuda_check_log" >&2
  fi
fi
[ "$tests_status" -eq 0 ] || exit "$tests_status"
exit "$cuda_status"
