"""``python -m dibs.verify.harness KIND [N]``: start a throwaway server by hand, until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

from dibs.verify.harness import (
    EtcdCluster,
    PostgresHA,
    PostgresServer,
    ReplicatedCluster,
    ServerSetupError,
)

KINDS = ("postgresql", "replicated", "etcd", "postgresql-ha")


@contextlib.contextmanager
def _started(kind: str, count: int) -> Iterator[list[str]]:
    """The kind's servers, running; the lines to print."""
    if kind == "postgresql":
        with PostgresServer() as server:
            url = server.create_database("dibs")
            yield [f"DIBS_TEST_PG_URL={url}", f"admin: {server.admin_url}"]
    elif kind == "replicated":
        names = ", ".join(f"s{i + 1}" for i in range(count))
        with ReplicatedCluster(count, synchronous=f"ANY 1 ({names})" if count else None) as c:
            yield [f"DIBS_TEST_PG_URL={c.url(c.create_database('dibs'))}"]
    elif kind == "etcd":
        with EtcdCluster(count) as etcd:
            yield [etcd.url()]
    else:
        with PostgresHA() as ha:
            yield [ha.url(), f"admin: {ha.url(admin=True)}"]


def main(argv: list[str] | None = None) -> int:
    """Start the servers, print their URLs, wait for Ctrl-C or SIGTERM; 2 when they cannot start."""
    parser = argparse.ArgumentParser(prog="python -m dibs.verify.harness", description=__doc__)
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("count", nargs="?", type=int, default=1, help="standbys or members")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with _started(args.kind, args.count) as lines:
            print("\n".join(lines), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    except ServerSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
