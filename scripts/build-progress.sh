#!/usr/bin/env bash
# Runs a CMake build and shows it as it goes, keeping the full output in a log:
#   scripts/build-progress.sh LOG WHAT ESTIMATE -- cmake --build DIR ...
# WHAT names what is built ("fsdp-train and its libraries"), ESTIMATE how long it takes on this kind
# of machine ("about 4 minutes on 2 cores"). On a terminal one line is redrawn in place with CMake's
# percentage and the file being compiled; otherwise (CI, a log) a line is printed for each target
# reached and every 10 percent. Exits with the build's status; on failure prints the errors.
set -uo pipefail
log=$1 what=$2 estimate=$3
shift 3
[ "${1:-}" = "--" ] && shift
start=$SECONDS
echo "build: $what ($estimate; log: ${log#$PWD/})"
terminal=0
[ -t 1 ] && terminal=1
# The build's output goes through a pipe to the log and to the progress filter at once, with
# nothing that polls between them. Following the log with tail -F held the first line back until
# the build's last write twice in CI under load (2026-12-05 and 2026-12-06: 4 s into a 4 s build),
# even with the log created before tail started; it never did on an idle machine.
awk_line_by_line=(awk)
awk -W version 2>&1 | grep -q mawk && awk_line_by_line=(awk -W interactive)
# CMake's lines look like "[ 42%] Building CXX object .../src/x.cpp.o".
"$@" 2>&1 | tee "$log" | "${awk_line_by_line[@]}" -v terminal="$terminal" -v start="$start" '
  function elapsed() { return strftime("%M:%S", systime() - start_time, 1) }
  BEGIN { start_time = systime(); last_tenth = -1 }
  /^\[ *[0-9]+%\]/ {
    match($0, /[0-9]+%/); percent = substr($0, RSTART, RLENGTH - 1) + 0
    item = $0; sub(/^\[ *[0-9]+%\] /, "", item)
    if (item ~ /^Building/) { n = split(item, parts, " "); file = parts[n]; sub(/.*\.dir\//, "", file); sub(/\.o$/, "", file); item = "compiling " file }
    else if (item ~ /^Linking/) { n = split(item, parts, " "); item = "linking " parts[n] }
    else if (item ~ /^Built target/) { item = "built " substr(item, 14) }
    if (terminal == 1) {
      line = sprintf("  [%3d%%] %s  %s", percent, elapsed(), item)
      printf "\r%-100.100s", line; fflush()
    } else if (item ~ /^built / || int(percent / 10) > last_tenth) {
      printf "  [%3d%%] %s  %s\n", percent, elapsed(), item; fflush()
      last_tenth = int(percent / 10)
    }
  }
  END { if (terminal == 1) printf "\r%-100s\r", "" }'
status=${PIPESTATUS[0]}
if [ $status -ne 0 ]; then
  echo "build: failed after $((SECONDS - start)) s; the errors (full log in ${log#$PWD/}):" >&2
  grep -E -A3 'error|Error' "$log" | head -n 60 >&2 || tail -n 40 "$log" >&2
  exit $status
fi
echo "build: done in $((SECONDS - start)) s"
