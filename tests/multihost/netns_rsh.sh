#!/usr/bin/env bash
# mpirun's remote-shell agent for tests/multihost/netns_hosts.sh: instead of `ssh HOST COMMAND`,
# runs COMMAND in the network namespace named HOST, under HOST as its hostname.
host=$1
shift
while [ "${1:-}" != "" ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options, if any
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
