#!/usr/bin/env bash
# Make this machine able to run dibs's etcd tests: the etcd server binary.
#
# Idempotent; does nothing when `etcd` is already on PATH (or $DIBS_ETCD names
# it). The tests themselves (dibs.verify.harness) start private members on
# 127.0.0.1 in a temporary directory and remove them afterwards, so no service
# is left running. Debian's etcd-server package starts a system service on
# install; it is stopped and disabled here so that it holds no port.
#
# Usage: scripts/etcd-ensure.sh      prints the path of the etcd binary
set -euo pipefail
# One installer at a time (pytest -n workers, the chromium fixture): apt refuses a
# second apt, and the one that waits finds the package there when it gets the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"${TMPDIR:-/tmp}/dibs-apt.lock"
    flock 9
fi

if [[ -n "${DIBS_ETCD:-}" && -x "$DIBS_ETCD" ]]; then
    echo "$DIBS_ETCD"; exit 0
fi
if command -v etcd >/dev/null 2>&1; then
    command -v etcd; exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "etcd-ensure: etcd not found; run as root on Debian, or install etcd-server" \
         "yourself, or set DIBS_ETCD to the binary" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
# policy-rc.d 101: the package's service is not started during the install.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
fi
apt-get install -y -qq etcd-server etcd-client >&2
if [[ $made_policy -eq 1 ]]; then rm -f "$policy"; fi
if command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
fi
command -v etcd
