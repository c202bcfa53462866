#!/usr/bin/env bash
# Training across two hosts made on this machine (tests/multihost/netns_hosts.sh: network
# namespaces, a veth pair, TCP only), and what happens when the network or a peer fails.
#   bash tests/multihost/check_multihost.sh BUILD_DIR [--report OUT.md]
# 1. equal:    20 steps of the main job's model at 2 ranks, one per host, against the same on one
#              host (shared memory): the same losses, printed to 9 digits, and the same checkpoint
#              (each rank file's crc32 in the manifests).
# 2. link cut: mid-run the link goes down (and stays down). Every fsdp-train process must exit
#              within FSDP_COMM_TIMEOUT_MS + 15 s, with a message naming the operation and the rank.
# 3. SIGKILL:  mid-run the rank on the second host is killed. The same.
# For 2 and 3 it also checks that the launcher's processes (mpirun, orted) are gone within
# FSDP_COMM_TIMEOUT_MS + 50 s (none left behind), and reports when. Exit 77 (CTest: skipped) without root, `ip` or `unshare`.
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

launcher_pids() { for name in mpirun mpiexec orterun orted prted; do pgrep -x "$name"; done | tr '\n' ' ' | sed 's/ $//'; }
train_pids() { pgrep -x fsdp-train -d' ' || true; }
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
       --set train.threads=1 --set train.report_every=0 --set eval.every=0 --set eval.sample_tokens=0 --set train.log_every=1
       --set optimizer.warmup_steps=5)

# 1. Across hosts equals one host.
mpirun --oversubscribe --bind-to none -np 2 "${train[@]}" --steps 20 --set checkpoint.every=20 --output-dir "$work/one-host" \
  > "$work/one-host.log" 2>&1
netns_mpirun -np 2 "${train[@]}" --steps 20 --set checkpoint.every=20 --output-dir "$work/two-hosts" > "$work/two-hosts.log" 2>&1
rc=$?
[ $rc = 0 ] || tail -n 20 "$work/two-hosts.log"
[ $rc = 0 ] || tail -n 20 "$work/two-hosts.log"
rc=$?
losses() { python3 -c 'import json,sys; print(" ".join("%.9f" % r.get("loss") for r in map(json.loads, open(sys.argv[1])) if "grad_norm" in r))' "$1/metrics.jsonl" 2> /dev/null; }
crcs() { python3 -c 'import json,sys,glob; m=json.load(open(glob.glob(sys.argv[1]+"/checkpoints/*/manifest.json")[0])); print(json.dumps(m.get("files", m), sort_keys=True))' "$1" 2> /dev/null | sed 's/"[a-z_]*path[a-z_]*": "[^"]*"//g'; }
a=$(losses "$work/one-host"); b=$(losses "$work/two-hosts")
check $([ $rc = 0 ] && [ -n "$a" ] && [ "$a" = "$b" ] && echo 0 || echo 1) \
  "2 hosts (TCP) give one host's losses bit for bit over 20 steps (last: ${b##* }; exit $rc)"
check $([ -n "$(crcs "$work/one-host")" ] && [ "$(crcs "$work/one-host")" = "$(crcs "$work/two-hosts")" ] && echo 0 || echo 1) \
  "2 hosts write the same checkpoint as one host (each rank file's crc32 in the manifest)"

# 2 and 3: a fault mid-run; how long until every fsdp-train process, then every launcher process
# (mpirun, orted), is gone.
fault_case() {  # fault_case NAME ACTION KEEPALIVE_S CHECKED
  local name=$1 action=$2 log="$work/$1.log" launcher="" attempt started=0
  # mpirun now and then fails to start the remote daemon ("an inability to create a connection
  # back to mpirun"), more often right after the link came back: such a launch is retried.
  for attempt in 1 2 3; do
    rm -rf "${work:?}/$name"
    NETNS_KEEPALIVE_S=$3 netns_mpirun -np 2 "${train[@]}" --steps 100000 --output-dir "$work/$name" > "$log" 2>&1 &
    launcher=$!
    for _ in $(seq 1 240); do  # until 3 steps are done (up to 120 s), or the launch failed
      kill -0 "$launcher" 2> /dev/null || break
      if [ -f "$work/$name/metrics.jsonl" ] && [ "$(grep -c '"step"' "$work/$name/metrics.jsonl")" -ge 3 ]; then
        started=1
        break
      fi
      sleep 0.5
    done
    [ $started = 1 ] && break
    echo "     $name: launch $attempt did not start training; its log ends: $(grep -m1 -E 'inability|ERROR|error' "$log" | cut -c1-120)"
    for p in $(train_pids) $(launcher_pids); do kill -9 "$p" 2> /dev/null; done
    wait "$launcher" 2> /dev/null
    sleep 2
  done
  local start=$SECONDS limit=$((timeout_s + 15)) train_s="" launcher_s=""
  case $action in
    cut) netns_cut ;;
    kill) for p in $(train_pids); do [ "$(ip netns identify "$p")" = fsdp-h1 ] && kill -9 "$p"; done ;;
  esac
  while [ $((SECONDS - start)) -le $((limit + 35)) ]; do
    [ -z "$train_s" ] && [ -z "$(train_pids)" ] && train_s=$((SECONDS - start))
    [ -z "$launcher_s" ] && [ -z "$(launcher_pids)" ] && launcher_s=$((SECONDS - start))
    [ -n "$train_s" ] && [ -n "$launcher_s" ] && break
    sleep 0.5
  done
  local left_train left_launcher message
  left_train=$(train_pids); left_launcher=$(launcher_pids)
  message=$(grep -h -m1 -E "did not complete|exited on signal|aborting" "$log" | head -1 | cut -c1-200)
  if [ "$4" = checked ]; then
    check $([ -z "$left_train" ] && [ "${train_s:-999}" -le $limit ] && echo 0 || echo 1) \
      "$name: every fsdp-train process exited in ${train_s:-more than $((limit + 35))} s (limit $limit s)"
    # The launcher's exit is its keepalive's and the kernel's business (docs/across-hosts.md):
    # checked is that none of its processes is left behind.
    check $([ -z "$left_launcher" ] && echo 0 || echo 1) \
      "$name: mpirun and orted exited in ${launcher_s:-more than $((limit + 35))} s (left behind: ${left_launcher:-none})"
    check $(echo "$message" | grep -q "rank" && echo 0 || echo 1) "$name: the first message names the operation or rank: $message"
    [ -n "$message" ] || { echo "     the run's log ends:"; tail -n 15 "$log" | sed 's/^/       /'; }
  else
    echo "     (not checked) $name: fsdp-train gone after ${train_s:-more than $((limit + 35))} s, launcher after ${launcher_s:-more than $((limit + 35))} s (left: ${left_launcher:-none})"
  fi
  rows+=("| $name | ${train_s:->$((limit + 35))} s | ${launcher_s:->$((limit + 35))} s | ${left_train:-none} / ${left_launcher:-none} | $message |")
  netns_heal
  for p in $(train_pids) $(launcher_pids); do kill -9 "$p" 2> /dev/null; done
  wait "$launcher" 2> /dev/null
  netns_wait_link
}
# Open MPI's daemons notice a dead link by TCP keepalive on their control connection: 300 s idle,
# then 9 probes 20 s apart, by default. The launch recipe (docs/across-hosts.md) shortens it to
# 3 s idle then 4 probes 3 s apart: the launcher notices a dead link 12-15 s after it died, after
# fsdp-train's own timeout (10 s here) has named the collective that waited; the rank that timed
# out leaves it that time before aborting (MPI_Abort's messages on the dead link would silence
# the keepalive). With probes 2 s apart Open MPI noticed first, 6-11 s after the cut, and its line
# named only the host.
export NETNS_KEEPALIVE_INTVL_S=3 NETNS_KEEPALIVE_PROBES=4
fault_case link-cut cut 3 checked
fault_case sigkill kill 3 checked
[ "${FSDP_MULTIHOST_DEFAULT_KEEPALIVE:-0}" = 1 ] && fault_case link-cut-default-keepalive cut 300 unchecked

if [ -n "$report" ]; then
  {
    echo "| fault | every fsdp-train exited after | mpirun and orted exited after | left behind (fsdp-train / launcher) | first message |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
  } > "$report"
fi
[ $failures = 0 ] && echo "all checks passed" || echo "$failures check(s) failed"
[ $failures = 0 ]
