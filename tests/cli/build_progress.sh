#!/usr/bin/env bash
# scripts/build-progress.sh shows a build's lines while it runs, not only at its end. Debian's awk
# (mawk) reads a pipe in 4 KB blocks unless told otherwise: until 2026-12-02 every line of a
# build's progress appeared at once when the build had finished. A fake build prints its first
# line, waits 3 s and ends; that line must reach the terminal at least 2 s before the end.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fake='echo "[ 10%] Building CXX object CMakeFiles/x.dir/src/a.cpp.o"; sleep 3; echo "[100%] Built target x"'
bash "$root/scripts/build-progress.sh" "$work/build.log" "a fake build" "3 s" -- bash -c "$fake" |
  while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done >"$work/out"
end=$(date +%s.%N)
first=$(grep "compiling src/a.cpp" "$work/out" | cut -d' ' -f1 || true)
[ -n "$first" ] || { echo "FAIL: no progress line for the file being compiled:"; cat "$work/out"; exit 1; }
early=$(awk -v first="$first" -v end="$end" 'BEGIN { printf "%.1f", end - first }')
if awk -v early="$early" 'BEGIN { exit !(early < 2) }'; then
  echo "FAIL: the first progress line came only $early s before the build ended (the build waited 3 s after it):"
  cat "$work/out"
  exit 1
fi
echo "ok   the first progress line came $early s before the build ended"
