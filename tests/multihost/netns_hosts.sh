#!/usr/bin/env bash
# Two "hosts" on this machine: network namespaces fsdp-h0 and fsdp-h1 (each with its own hostname,
# through a UTS namespace per process) joined by a veth pair, 10.77.0.1 <-> 10.77.0.2. mpirun runs
# in fsdp-h0 and starts the remote daemon in fsdp-h1 through netns_rsh.sh instead of ssh; ranks talk
# TCP only (no shared memory across hosts). Needs root and `ip`.
#   source tests/multihost/netns_hosts.sh; netns_up; netns_mpirun -np 2 PROGRAM ARGS...; netns_down
# netns_cut / netns_heal take the link down and up (from fsdp-h0's side).
NETNS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

netns_down() {
  ip netns del fsdp-h0 2> /dev/null || true
  ip netns del fsdp-h1 2> /dev/null || true
  rm -rf /etc/netns/fsdp-h0 /etc/netns/fsdp-h1
}

netns_up() {
  netns_down
  ip netns add fsdp-h0 && ip netns add fsdp-h1 || return 1
  ip link add fsdp-v0 netns fsdp-h0 type veth peer name fsdp-v1 netns fsdp-h1 || return 1
  ip -n fsdp-h0 addr add 10.77.0.1/24 dev fsdp-v0 && ip -n fsdp-h1 addr add 10.77.0.2/24 dev fsdp-v1 || return 1
  for h in 0 1; do
    ip -n fsdp-h$h link set lo up && ip -n fsdp-h$h link set fsdp-v$h up || return 1
    # `ip netns exec` bind-mounts these over /etc/hosts: each host resolves both names.
    mkdir -p /etc/netns/fsdp-h$h
    printf '127.0.0.1 localhost\n10.77.0.1 fsdp-h0\n10.77.0.2 fsdp-h1\n' > /etc/netns/fsdp-h$h/hosts
    # As the launch recipe recommends for real hosts (docs/across-hosts.md): a connection whose
    # data goes unacknowledged fails after ~13 s of retransmissions instead of ~15 minutes.
    ip netns exec fsdp-h$h sysctl -qw net.ipv4.tcp_retries2=5 || return 1
  done
}

netns_cut() { ip -n fsdp-h0 link set fsdp-v0 down; }
netns_heal() { ip -n fsdp-h0 link set fsdp-v0 up; }
# Until host fsdp-h1 reaches fsdp-h0 over the link again (a TCP connect to a closed port answers
# at once with a reset when the link is up; up to 10 s).
netns_wait_link() {
  for _ in $(seq 1 50); do
    ip netns exec fsdp-h1 timeout 1 bash -c 'exec 3<>/dev/tcp/10.77.0.1/9' 2> /dev/null
    [ $? -ne 124 ] && [ -n "$(ip -n fsdp-h0 -br link show fsdp-v0 | grep -w UP)" ] && return 0
    sleep 0.2
  done
}

# mpirun on host fsdp-h0 with one slot on each host (extra arguments follow mpirun's).
netns_mpirun() {
  ip netns exec fsdp-h0 unshare --uts sh -c 'hostname fsdp-h0; exec "$@"' sh \
    mpirun --allow-run-as-root --host fsdp-h0:1,fsdp-h1:1 --mca plm_rsh_agent "$NETNS_DIR/netns_rsh.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_keepalive_time "${NETNS_KEEPALIVE_S:-300}" --mca oob_tcp_keepalive_intvl "${NETNS_KEEPALIVE_INTVL_S:-2}" --mca oob_tcp_keepalive_probes "${NETNS_KEEPALIVE_PROBES:-3}" \
    --bind-to none -x OMP_NUM_THREADS -x FSDP_COMM_TIMEOUT_MS -x PATH -x LD_LIBRARY_PATH "$@"
}
