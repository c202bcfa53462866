#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (tests/fuzz/CMakeLists.txt) against the main build and
# fuzzes each for a fixed time, starting from the seeds in tests/fuzz/corpus/<target>/ after
# replaying every input kept in tests/fuzz/regressions/<target>/ (crashers found before, and the
# inputs of the crashes a review found by hand). A new crash fails the run; its input is copied to
# FUZZ_FINDINGS (default build/fuzz/findings/) to be kept as a regression input once fixed.
#   bash tests/fuzz/run_fuzz.sh BUILD_DIR [SECONDS_PER_TARGET]      (CTest `fuzz`: 10 s each)
# FUZZ_SEED (default 1) seeds libFuzzer's mutations, so that CTest's short run is the same search
# on every machine and a CI run does not fail on a new finding by luck; FUZZ_SEED=0 draws a seed
# (libFuzzer's own default), for the longer searches that find new crashes.
# Exit 77 (skipped) without clang's libFuzzer runtime.
set -uo pipefail
build_dir=$(cd "${1:?usage: run_fuzz.sh BUILD_DIR [SECONDS]}" && pwd)
seconds=${2:-20}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
out=$build_dir/fuzz
findings=${FUZZ_FINDINGS:-$out/findings}
if ! command -v clang++ > /dev/null || ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a > /dev/null 2>&1; then
  echo "skip: clang++ with libFuzzer (Debian: clang, libclang-rt-dev) is not installed"
  exit 77
fi
torch_cmake=$(sed -n 's/^Torch_DIR:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
torch_dir=$(cd "$torch_cmake/../../.." && pwd)
start=$SECONDS
cmake -S "$here" -B "$out" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFSDP_BUILD_DIR="$build_dir" -DTORCH_DIR="$torch_dir" > "$out.configure.log" 2>&1 ||
  { tail -20 "$out.configure.log"; exit 1; }
cmake --build "$out" -j "$(nproc)" > "$out.build.log" 2>&1 || { grep -m 10 -A 5 "error" "$out.build.log"; exit 1; }
echo "fuzz: built the targets in $((SECONDS - start)) s"
export ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1
failures=0
mkdir -p "$findings"
echo "fuzz: libFuzzer seed ${FUZZ_SEED:-1} (FUZZ_SEED; 0 draws one)"
printf '%-22s %8s %10s %8s %s\n' target seconds executions corpus result
for target in fuzz_safetensors fuzz_token_file fuzz_manifest fuzz_tokenizer_json fuzz_instructions fuzz_config \
  fuzz_model_files fuzz_run_files; do
  regressions=("$here/regressions/$target"/*)
  if [ -e "${regressions[0]}" ]; then
    if ! "$out/$target" "${regressions[@]}" > "$out/$target.regressions.log" 2>&1; then
      echo "FAIL $target: a kept regression input crashes again:"; tail -30 "$out/$target.regressions.log"
      failures=$((failures + 1))
      continue
    fi
  fi
  corpus=$out/corpus/$target
  mkdir -p "$corpus"
  "$out/$target" "$corpus" "$here/corpus/$target" -seed="${FUZZ_SEED:-1}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
    -max_len=65536 -artifact_prefix="$findings/$target-" -print_final_stats=1 > "$out/$target.log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/$target.log" | tail -1)
  kept=$(find "$corpus" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    printf '%-22s %8s %10s %8s %s\n' "$target" "$seconds" "${runs:-?}" "$kept" "no crash"
  else
    printf '%-22s %8s %10s %8s %s\n' "$target" "$seconds" "${runs:-?}" "$kept" "CRASH (exit $rc)"
    grep -m 1 -E "ERROR: |runtime error|deadly signal" "$out/$target.log"
    grep -A 12 "^    #0" "$out/$target.log" | head -14
    ls "$findings/$target-"* 2> /dev/null
    failures=$((failures + 1))
  fi
done
echo "fuzz: $((SECONDS - start)) s in all; $failures target(s) crashed"
[ $failures -eq 0 ]
