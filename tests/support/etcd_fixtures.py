"""etcd for the test session: one private member (:mod:`dibs.verify.harness`), shared by prefix.

:func:`session_cluster` is the one single-member cluster a test session
shares (the ``etcd_url`` fixture); tests keep apart by key prefix
(:func:`fresh_prefix`). :func:`cluster` starts a cluster of a test's own.
Both keep their data on ``/dev/shm`` when there is one (Raft's fsyncs then
cost nothing) and elect in half a second after a fault.
"""

from __future__ import annotations

import atexit
import os
import secrets
import threading
from collections.abc import Iterator

import pytest

from dibs.verify.harness import EtcdCluster

__all__ = ["cluster", "etcd_url", "fresh_prefix", "session_cluster"]

_SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def cluster(size: int = 1) -> EtcdCluster:
    """Start a fresh ``size``-member cluster on loopback; close it (or use ``with``) when done."""
    return EtcdCluster(size, name="m", election_timeout=500, base_dir=_SHM).start()


_session: EtcdCluster | None = None
_session_lock = threading.Lock()  # guards _session


def session_cluster() -> EtcdCluster:
    """The session's single-member cluster, started on first use and closed at exit."""
    global _session
    with _session_lock:
        if _session is None:
            _session = cluster(1)
            atexit.register(_close_session)
        return _session


def _close_session() -> None:
    global _session
    with _session_lock:
        if _session is not None:
            session, _session = _session, None
            session.close()


def fresh_prefix() -> str:
    """A key prefix no other test uses, so tests share one cluster without meeting."""
    return f"t-{secrets.token_hex(6)}"


@pytest.fixture(scope="session")
def etcd_url() -> Iterator[str]:
    """``etcd://127.0.0.1:<port>`` of the session's member (no prefix: add one per test)."""
    yield session_cluster().url()
    _close_session()
