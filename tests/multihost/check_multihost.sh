#!/usr/bin/env bash
# Training across two hosts made on this machine (tests/multihost/netns_hosts.sh: network
# namespaces, a veth pair, TCP only), and what happens when the network or a peer fails.
#   bash tests/multihost/check_multihost.sh BUILD_DIR [--report OUT.md]
# 1. equal:    20 steps of the main job's model at 2 ranks, one per host, against the same on one
#              host (shared memory): the same losses, printed to 9 digits, and the same checkpoint
#              (every slice's crc32 in the manifests).
# 2. link cut: mid-run the link goes down (and stays down). Every fsdp-train process must exit
#              within FSDP_COMM_TIMEOUT_MS + 15 s, with a message naming the operation and the rank.
# 3. SIGKILL:  mid-run the rank on the second host is killed. The same.
# For 2 and 3 it also reports the launcher's processes (mpirun, orted) still alive at that point;
# they are killed before the next case. Exit 77 (CTest: skipped) without root, `ip` or `unshare`.
set -uo pipefail
build_dir=$(cd "${1:?usage: check_multihost.sh BUILD_DIR [--report OUT.md]}" && pwd)
report=""
[ "${2:-}" = "--report" ] && report=${3:?--report needs a file}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root_dir=$(cd "$here/../.." && pwd)
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v unshare > /dev/null; then
  echo "skip: needs root, ip and unshare (network namespaces)"
  exit 77
fi
source "$here/netns_hosts.sh"
work=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
export FSDP_COMM_TIMEOUT_MS=${FSDP_COMM_TIMEOUT_MS:-10000}
timeout_s=$((FSDP_COMM_TIMEOUT_MS / 1000))
failures=0
rows=()

launcher_pids() { pgrep -f "^(mpirun|orted|prted|/usr/bin/orted)" -d' ' || true; }
train_pids() { pgrep -f "$build_dir/apps/fsdp-train" -d' ' || true; }
cleanup() {
  netns_heal 2> /dev/null
  for p in $(train_pids) $(launcher_pids); do kill -9 "$p" 2> /dev/null; done
  netns_down
  rm -rf "$work"
}
trap cleanup EXIT
check() {  # check OK WHAT
  if [ "$1" = 0 ]; then echo "ok   $2"; else echo "FAIL $2"; failures=$((failures + 1)); fi
}

netns_up || { echo "FAIL could not make the network namespaces"; exit 1; }
train=("$build_dir/apps/fsdp-train" "$root_dir/configs/gpt-fortunes-tiny.toml" --progress lines
       --set train.threads=1 --set train.report_every=0 --set eval.every=0 --set eval.sample_tokens=0 --set train.log_every=1)

# 1. Across hosts equals one host.
mpirun --oversubscribe --bind-to none -np 2 "${train[@]}" --steps 20 --set checkpoint.every=20 --output-dir "$work/one-host" \
  > "$work/one-host.log" 2>&1
netns_mpirun -np 2 "${train[@]}" --steps 20 --set checkpoint.every=20 --output-dir "$work/two-hosts" > "$work/two-hosts.log" 2>&1
rc=$?
losses() { python3 -c 'import json,sys; print(" ".join(f"{r[\"loss\"]:.9f}" for r in map(json.loads, open(sys.argv[1])) if "loss" in r and "step" in r and "evaluation" not in r))' "$1/metrics.jsonl" 2> /dev/null; }
crcs() { python3 -c 'import json,sys,glob; m=json.load(open(glob.glob(sys.argv[1]+"/checkpoints/*/manifest.json")[0])); print(json.dumps(m.get("files", m), sort_keys=True))' "$1" 2> /dev/null | sed 's/"[a-z_]*path[a-z_]*": "[^"]*"//g'; }
a=$(losses "$work/one-host"); b=$(losses "$work/two-hosts")
check $([ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && echo 0 || echo 1) \
  "2 hosts (TCP) give one host's losses bit for bit over 20 steps (last: ${b##* }; exit $rc)"
check $([ -n "$(crcs "$work/one-host")" ] && [ "$(crcs "$work/one-host")" = "$(crcs "$work/two-hosts")" ] && echo 0 || echo 1) \
  "2 hosts write the same checkpoint as one host (every slice's crc32)"

# 2 and 3: a fault mid-run; how long until every fsdp-train process is gone.
fault_case() {  # fault_case NAME ACTION
  local name=$1 action=$2 log="$work/$1.log"
  netns_mpirun -np 2 "${train[@]}" --steps 100000 --output-dir "$work/$name" > "$log" 2>&1 &
  local launcher=$!
  for _ in $(seq 1 240); do  # until 3 steps are done (up to 120 s)
    [ "$(grep -c '"step"' "$work/$name/metrics.jsonl" 2> /dev/null || echo 0)" -ge 3 ] && break
    sleep 0.5
  done
  local start=$SECONDS
  case $action in
    cut) netns_cut ;;
    kill) for p in $(train_pids); do [ "$(ip netns identify "$p")" = fsdp-h1 ] && kill -9 "$p"; done ;;
  esac
  local limit=$((timeout_s + 15)) waited=0
  while [ -n "$(train_pids)" ] && [ $((SECONDS - start)) -le $((limit + 45)) ]; do sleep 0.5; done
  waited=$((SECONDS - start))
  local left_train left_launcher message
  left_train=$(train_pids); left_launcher=$(launcher_pids)
  message=$(grep -h -m1 -E "did not complete|aborting|error" "$log" | head -1 | cut -c1-220)
  check $([ -z "$left_train" ] && [ $waited -le $limit ] && echo 0 || echo 1) \
    "$name: every fsdp-train process exited in ${waited} s (limit $limit s); left: ${left_train:-none}"
  check $(echo "$message" | grep -q "rank" && echo 0 || echo 1) "$name: the message names the operation and rank: $message"
  echo "     launcher processes still alive then: ${left_launcher:-none}"
  rows+=("| $name | ${waited} s | ${left_train:-none} | ${left_launcher:-none} | $message |")
  netns_heal
  for p in $left_train $left_launcher; do kill -9 "$p" 2> /dev/null; done
  wait "$launcher" 2> /dev/null
}
fault_case link-cut cut
fault_case sigkill kill

if [ -n "$report" ]; then
  {
    echo "| fault | until every fsdp-train exited | fsdp-train left | launcher left | first message |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } > "$report"
fi
[ $failures = 0 ] && echo "all checks passed" || echo "$failures check(s) failed"
[ $failures = 0 ]
