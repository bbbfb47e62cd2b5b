#!/usr/bin/env bash
# Make this machine able to run `dibs verify --cluster` (and its tests): Debian's
# etcd server (etcd 3 members, and the store Patroni keeps its leader key in) and
# Patroni 3 (the failover manager of the postgresql-ha cluster). PostgreSQL itself
# comes from scripts/pg-ensure.sh.
#
# Idempotent; does nothing when both are already there. The clusters themselves
# are started by dibs (src/dibs/verify/harness/) in a temporary directory on
# 127.0.0.1 and removed afterwards, so no service is left running; the packages'
# own system services are stopped and disabled if the install started them.
#
# Usage: scripts/cluster-ensure.sh
set -euo pipefail
# One installer at a time (pytest -n workers, the chromium fixture): apt refuses a
# second apt, and the one that waits finds the package there when it gets the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"${TMPDIR:-/tmp}/dibs-apt.lock"
    flock 9
fi

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "cluster-ensure: ${missing[*]} not found; run as root on Debian, or install" \
         "Debian's etcd-server, etcd-client and patroni packages yourself" >&2
    exit 1
fi
echo "cluster-ensure: installing Debian's ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
# The etcd-server package starts a system etcd on the default ports; the tests
# start their own on free ports and want nothing else listening.
if command -v systemctl >/dev/null 2>&1 && systemctl is-system-running >/dev/null 2>&1; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
fi
