#!/usr/bin/env bash
# netns-hosts.sh — two network namespaces that stand in for two "hosts" on one
# machine, joined by a veth pair, for testing multi-node launches without a cluster.
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2.
#
#   netns-hosts.sh check              exit 0 if namespaces can be made here, else 77
#                                     with the reason on stderr
#   netns-hosts.sh up A B             namespaces A and B; in each, lo up and an interface
#                                     named veth-tpi: A has 10.99.0.1/24, B 10.99.0.2/24
#   netns-hosts.sh down A B           delete them (the veth pair goes with them); no error
#                                     when they are already gone
#   netns-hosts.sh agent [-opts] HOST CMD...
#                                     what Open MPI's plm_rsh_agent calls instead of ssh:
#                                     run CMD in namespace HOST the way ssh would (the
#                                     words joined and given to sh -c); ssh options skipped
#
# The addresses exist only inside the two namespaces, so nothing on the machine's own
# network changes. Both ends are named veth-tpi, so one --iface veth-tpi (btl/oob
# _tcp_if_include, NCCL_SOCKET_IFNAME) fits both "hosts", as one name fits a real cluster.
set -euo pipefail

IFACE=veth-tpi
ADDR_A=10.99.0.1/24
ADDR_B=10.99.0.2/24

die() {
    echo "netns-hosts: $*" >&2
    exit 1
}

skip() {
    echo "netns-hosts: SKIP: $*" >&2
    exit 77
}

name_ok() { [[ $1 =~ ^[A-Za-z0-9_.-]{1,32}$ ]] || die "bad namespace name '$1'"; }

cmd_check() {
    command -v ip >/dev/null || skip "no 'ip' command (install iproute2)"
    [ "$(id -u)" -eq 0 ] || skip "not root: creating network namespaces needs root"
    local probe=tpi-probe-$$
    ip netns add "$probe" 2>/dev/null || skip "'ip netns add' was denied (no CAP_SYS_ADMIN, or /run/netns not writable)"
    if ! ip -n "$probe" link set lo up 2>/dev/null; then
        ip netns del "$probe" 2>/dev/null || true
        skip "cannot configure a namespace (ip netns exec / setns denied)"
    fi
    if ! ip -n "$probe" link add tpi-p0 type veth peer name tpi-p1 2>/dev/null; then
        ip netns del "$probe" 2>/dev/null || true
        skip "cannot create a veth pair (veth module missing?)"
    fi
    ip netns del "$probe"
}

cmd_up() {
    local a=$1 b=$2
    name_ok "$a"
    name_ok "$b"
    ip netns add "$a"
    ip netns add "$b"
    # Made directly inside the namespaces: the names never exist in the root
    # namespace, so parallel test runs with other namespace names cannot collide.
    ip link add "$IFACE" netns "$a" type veth peer name "$IFACE" netns "$b"
    ip -n "$a" addr add "$ADDR_A" dev "$IFACE"
    ip -n "$b" addr add "$ADDR_B" dev "$IFACE"
    for ns in "$a" "$b"; do
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$IFACE" up
    done
    # wait for the link to come up both ways (usually immediate)
    for _ in $(seq 50); do
        ip netns exec "$a" ping -c1 -W1 "${ADDR_B%/*}" >/dev/null 2>&1 && return 0
        command -v ping >/dev/null || return 0
        sleep 0.1
    done
    die "veth between $a and $b does not pass traffic"
}

cmd_down() {
    local ns
    for ns in "$@"; do
        name_ok "$ns"
        # processes still inside keep a namespace alive; they were started by our test
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "${TPI_NETNS_TMP:-/tmp}/netns-hosts.$ns"
    done
}

cmd_agent() {
    # ssh-style options before the host (Open MPI passes none to a custom agent, but be safe)
    while (($#)) && [[ $1 == -* ]]; do shift; done
    (($# >= 2)) || die "agent: usage: agent HOST CMD..."
    local host=$1
    shift
    name_ok "$host"
    # A real host has its own /tmp and name: Open MPI's session directory
    # (TMPDIR/ompi.HOSTNAME.UID/...) would otherwise be made by two daemons at once,
    # and logs could not tell the hosts apart. So each "host" gets its own TMPDIR and,
    # in a UTS namespace of its own, its namespace name as host name.
    local dir=${TPI_NETNS_TMP:-/tmp}/netns-hosts.$host
    [ -d "$dir" ] || mkdir -m 700 "$dir"
    # ssh hands the remote shell one string; Open MPI quotes its arguments for that.
    exec ip netns exec "$host" env TMPDIR="$dir" unshare --uts /bin/sh -c \
        'hostname "$1" && exec /bin/sh -c "$2"' sh "$host" "$*"
}

(($#)) || die "usage: netns-hosts.sh check | up A B | down A B | agent HOST CMD..."
op=$1
shift
case $op in
check) cmd_check ;;
up)
    (($# == 2)) || die "usage: up A B"
    cmd_up "$1" "$2"
    ;;
down) cmd_down "$@" ;;
agent) cmd_agent "$@" ;;
*) die "unknown operation '$op'" ;;
esac
