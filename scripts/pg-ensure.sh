#!/usr/bin/env bash
# Make this machine able to run dibs's PostgreSQL tests: the server binaries
# (with btree_gist) and, when run as root, an unprivileged OS user to run them.
#
# Idempotent; does nothing when everything is already there. The test suite
# itself (dibs.verify.harness, which runs this script when the tests set
# DIBS_HARNESS_ENSURE) starts a private server in a temporary
# directory on 127.0.0.1 and removes it afterwards, so no service is left
# running. Set DIBS_TEST_PG_URL to use an existing server instead.
#
# Usage: scripts/pg-ensure.sh      prints the server's bin directory
set -euo pipefail
# One installer at a time (pytest -n workers, the chromium fixture): apt refuses a
# second apt, and the one that waits finds the package there when it gets the lock.
if command -v flock >/dev/null 2>&1; then
    exec 9>"${TMPDIR:-/tmp}/dibs-apt.lock"
    flock 9
fi

find_bindir() {
    if [[ -n "${DIBS_PG_BINDIR:-}" && -x "$DIBS_PG_BINDIR/initdb" ]]; then
        echo "$DIBS_PG_BINDIR"; return 0
    fi
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
    if [[ -n "$dir" && -x "$dir/initdb" && -x "$dir/pg_ctl" ]]; then
        echo "$dir"; return 0
    fi
    if command -v initdb >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v initdb)")"; return 0
    fi
    return 1
}

has_btree_gist() {
    local share
    share=$("$1/pg_config" --sharedir 2>/dev/null || echo "/usr/share/postgresql/$(basename "$(dirname "$1")")")
    [[ -f "$share/extension/btree_gist.control" ]]
}

bindir=$(find_bindir || true)
if [[ -z "$bindir" ]] || ! has_btree_gist "$bindir"; then
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "pg-ensure: PostgreSQL server not found; run as root on Debian, or install" \
             "postgresql + postgresql-contrib yourself, or set DIBS_TEST_PG_URL" >&2
        exit 1
    fi
    echo "pg-ensure: installing Debian's postgresql and postgresql-contrib" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends postgresql postgresql-contrib >&2
    bindir=$(find_bindir)
fi

# PostgreSQL refuses to run as root: give the test harness a user to run it as.
if [[ $(id -u) -eq 0 ]] && ! id "${DIBS_PG_OS_USER:-postgres}" >/dev/null 2>&1 \
        && ! id dibs-pg >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin dibs-pg
    echo "pg-ensure: created system user dibs-pg" >&2
fi

echo "$bindir"
