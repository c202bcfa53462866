#!/usr/bin/env bash
# memory_cap.sh LIMIT_BYTES REPORT_DIR command [args...]
#
# Runs the command in a memory cgroup of its own, capped at LIMIT_BYTES ("max": no cap, only
# accounting): an emulated device memory for one rank. GPUs each have their own memory while the
# ranks here share one machine's, so bench/max_model.py starts every rank through this script:
#   mpirun -np 4 bench/memory_cap.sh 5368709120 out/caps build/apps/fsdp-train config.toml
# Over the cap the kernel's OOM killer ends the rank (exit 137) and mpirun ends the others. After
# the command, REPORT_DIR/rank<R>.json gets {rank, limit_bytes, peak_bytes, oom_kills, exit_code}
# (peak: the cgroup's own high-water mark, page cache included); the cgroup is removed.
# Needs a writable cgroup hierarchy (root; cgroup v1 memory controller, or v2 with the memory
# controller delegated); otherwise it says so and exits 3 without running the command.
set -uo pipefail
if [ $# -lt 3 ]; then
  echo "usage: memory_cap.sh LIMIT_BYTES|max REPORT_DIR command [args...]" >&2
  exit 2
fi
limit=$1 report_dir=$2
shift 2
if ! [[ "$limit" =~ ^[0-9]+$ || "$limit" == max ]]; then
  echo "memory_cap.sh: LIMIT_BYTES must be a whole number of bytes or 'max', got '$limit'" >&2
  exit 2
fi
rank=${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${SLURM_PROCID:-0}}}

if [ -f /sys/fs/cgroup/cgroup.controllers ]; then  # v2: one unified hierarchy
  version=2
  parent=/sys/fs/cgroup$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
else  # v1: the memory controller's own hierarchy
  version=1
  parent=/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
fi
group="$parent/fsdp-cap-$$-rank$rank"
if ! mkdir "$group" 2>/dev/null; then
  echo "memory_cap.sh: cannot create the cgroup '$group' (cgroup v$version; needs root and a writable hierarchy)" >&2
  exit 3
fi
cleanup() { rmdir "$group" 2>/dev/null; }
trap cleanup EXIT
if [ "$version" = 1 ]; then
  [ "$limit" = max ] || echo "$limit" > "$group/memory.limit_in_bytes" || exit 3
else
  echo "$limit" > "$group/memory.max" 2>/dev/null || {
    echo "memory_cap.sh: cannot set memory.max in '$group' (is the memory controller delegated to '$parent'?)" >&2
    exit 3
  }
  # No swapping past the cap (a device has no swap); absent when swap is not accounted.
  [ ! -e "$group/memory.swap.max" ] || echo 0 > "$group/memory.swap.max"
fi

# The child joins the cgroup before it becomes the command, so everything it allocates counts.
sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' memory_cap "$group" "$@" &
child=$!
trap 'kill -TERM $child 2>/dev/null' TERM INT
wait $child
code=$?
wait $child 2>/dev/null  # a trapped signal interrupts the first wait

if [ "$version" = 1 ]; then
  peak=$(cat "$group/memory.max_usage_in_bytes")
  oom=$(awk '$1 == "oom_kill" {print $2}' "$group/memory.oom_control")
else
  peak=$(cat "$group/memory.peak" 2>/dev/null || echo -1)
  oom=$(awk '$1 == "oom_kill" {print $2}' "$group/memory.events")
fi
mkdir -p "$report_dir"
printf '{"rank": %s, "limit_bytes": "%s", "peak_bytes": %s, "oom_kills": %s, "exit_code": %s}\n' \
  "$rank" "$limit" "${peak:--1}" "${oom:-0}" "$code" > "$report_dir/rank$rank.json"
exit $code
