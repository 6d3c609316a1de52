#!/usr/bin/env bash
# Two emulated nodes on this machine for multi-node tests: this host (address 10.77.0.1) and a
# network namespace "tsnode1" (10.77.0.2, its own host name through a UTS namespace entered by the
# launch agent), joined by a veth pair vts0 <-> vts1. MPI between them is TCP over the veth.
#   tests/multinode/netns_nodes.sh up [RATE]   # RATE e.g. 50mbit: a slower link (tbf on both ends)
#   tests/multinode/netns_nodes.sh down
# Exit code 77 with the reason where namespaces cannot be made (not root, no iproute2).
set -euo pipefail
ns=tsnode1
case "${1:?up|down}" in
down)
    ip link del vts0 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    ;;
up)
    command -v ip >/dev/null || { echo "cannot make nodes: iproute2 (ip) missing" >&2; exit 77; }
    [ "$(id -u)" = 0 ] || { echo "cannot make nodes: network namespaces need root" >&2; exit 77; }
    "$0" down
    ip netns add "$ns" || { echo "cannot make nodes: ip netns add failed" >&2; exit 77; }
    ip link add vts0 type veth peer name vts1
    ip link set vts1 netns "$ns"
    ip addr add 10.77.0.1/24 dev vts0
    ip link set vts0 up
    ip netns exec "$ns" ip addr add 10.77.0.2/24 dev vts1
    ip netns exec "$ns" ip link set vts1 up
    ip netns exec "$ns" ip link set lo up
    if [ -n "${2:-}" ]; then
        # netem is not in every kernel (not in this one): a token bucket limits the rate.
        tc qdisc add dev vts0 root tbf rate "$2" burst 64kb latency 200ms
        ip netns exec "$ns" tc qdisc add dev vts1 root tbf rate "$2" burst 64kb latency 200ms
    fi
    ;;
*)
    echo "usage: $0 up [RATE] | down" >&2
    exit 2
    ;;
esac
