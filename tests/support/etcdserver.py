"""Throwaway etcd members for tests and tools: temporary, loopback-only.

:func:`cluster` starts ``n`` members of one new cluster on ``127.0.0.1``, on
free ports, with their data in a fresh temporary directory (on ``/dev/shm``
when there is one: Raft's fsyncs then cost nothing), and
:meth:`EtcdCluster.close` stops them and removes it. Each :class:`Member` can
be killed (``kill -9``), paused (``SIGSTOP``), resumed and restarted on its
own data, which is what fault injection needs.

:func:`session_cluster` is the one single-member cluster a test session
shares (the ``etcd_url`` fixture); tests keep apart by prefix.

:func:`ensure_installed` finds the ``etcd`` binary and, when it is missing,
runs ``scripts/etcd-ensure.sh``: the one place that installs anything.

Test-only: not part of the dibs package. ``python tests/support/etcdserver.py 3``
starts three members by hand, prints the URL and stops them on Ctrl-C.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

from dibs.verify._reaper import reap_when_gone
from layout import SCRIPTS

__all__ = [
    "EtcdCluster",
    "EtcdSetupError",
    "Member",
    "cluster",
    "ensure_installed",
    "etcd_url",
    "fresh_prefix",
    "session_cluster",
]

ETCD_ENSURE = SCRIPTS / "etcd-ensure.sh"
"""The one script that installs etcd."""

_START_TIMEOUT = 60.0


class EtcdSetupError(RuntimeError):
    """Raised when etcd cannot be installed or a cluster cannot be started."""


def ensure_installed() -> str:
    """The path of the ``etcd`` binary, installing it with ``scripts/etcd-ensure.sh`` if needed."""
    found = os.environ.get("DIBS_ETCD") or shutil.which("etcd")
    if found:
        return found
    done = subprocess.run(
        [str(ETCD_ENSURE)], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise EtcdSetupError(f"scripts/etcd-ensure.sh failed: {done.stderr.strip()}")
    return done.stdout.strip().splitlines()[-1]


def _free_ports(count: int) -> list[int]:
    """Ports free now (held open together, so they differ); a race with others is retried."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _post(
    endpoint: str, path: str, body: dict[str, object], timeout: float = 2.0
) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://{endpoint}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


class Member:
    """One etcd process of an :class:`EtcdCluster`; its ports and data outlive restarts."""

    def __init__(
        self, binary: str, name: str, data_dir: Path, client_port: int, peer_port: int
    ) -> None:
        self.binary = binary
        self.name = name
        self.data_dir = data_dir
        self.client_port = client_port
        self.peer_port = peer_port
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._log = data_dir.parent / f"{name}.log"

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<client port>``, as an ``etcd://`` URL lists it."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def start(self, initial_cluster: str, state: str = "new") -> None:
        """Start (or restart, on its data directory) this member's process."""
        args = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls=http://{self.endpoint}",
            f"--advertise-client-urls=http://{self.endpoint}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            f"--initial-cluster={initial_cluster}",
            f"--initial-cluster-state={state}",
            "--initial-cluster-token=dibs-test",
            "--logger=zap",
            "--log-level=error",
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        with open(self._log, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        self.paused = False

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """``kill -9`` the member (its data stays, so :meth:`restart` brings it back)."""
        if self.process is not None and self.process.poll() is None:
            if self.paused:
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=30)
        self.paused = False

    def pause(self) -> None:
        """``SIGSTOP``: the member stops answering but keeps its sockets open."""
        if self.process is not None and self.process.poll() is None and not self.paused:
            os.kill(self.process.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """``SIGCONT`` after :meth:`pause`."""
        if self.process is not None and self.paused:
            os.kill(self.process.pid, signal.SIGCONT)
            self.paused = False

    def status(self) -> dict[str, object] | None:
        """This member's ``/v3/maintenance/status``, or None when it does not answer."""
        try:
            return _post(self.endpoint, "/v3/maintenance/status", {}, timeout=1.0)
        except (OSError, ValueError):
            return None

    def log_tail(self) -> str:
        try:
            return self._log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""


class EtcdCluster:
    """``n`` members of one fresh cluster on loopback; :meth:`close` removes everything."""

    def __init__(self, size: int = 1, *, binary: str | None = None) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one member, got {size}")
        self.size = size
        self.binary = binary or ensure_installed()
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix="dibs-etcd-", dir=base))
        # If this process dies without close() (SIGTERM, SIGKILL), the members and root go too.
        self._reaper = reap_when_gone(self.root)
        self.members: list[Member] = []

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def url(self, prefix: str | None = None) -> str:
        """The ``etcd://`` URL naming every member, with an optional key prefix."""
        tail = f"/{prefix}" if prefix else ""
        return f"etcd://{','.join(self.endpoints)}{tail}"

    def start(self) -> Self:
        """Start every member and wait until the cluster has a leader; retries a port clash."""
        for attempt in range(5):
            ports = _free_ports(2 * self.size)
            self.members = [
                Member(
                    self.binary,
                    f"m{i}",
                    self.root / f"m{i}-{attempt}",
                    ports[2 * i],
                    ports[2 * i + 1],
                )
                for i in range(self.size)
            ]
            for m in self.members:
                m.start(self.initial_cluster)
            try:
                self.wait_ready()
                return self
            except EtcdSetupError:
                if all(m.running for m in self.members):
                    raise
                for m in self.members:  # a port taken under us: try fresh ones
                    m.kill()
        raise EtcdSetupError("etcd would not start:\n" + self.members[0].log_tail())

    def wait_ready(self, timeout: float = _START_TIMEOUT) -> None:
        """Wait until a running member reports a leader and a write goes through."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not any(m.running for m in self.members):
                raise EtcdSetupError("etcd exited:\n" + self.members[0].log_tail())
            for m in self.members:
                if not m.running or m.paused:
                    continue
                try:
                    _post(m.endpoint, "/v3/kv/put", {"key": "X19yZWFkeV9f", "value": ""})
                    return
                except (OSError, ValueError):
                    continue
            time.sleep(0.05)
        raise EtcdSetupError(
            f"etcd cluster of {self.size} had no leader within {timeout:g} s:\n"
            + self.members[0].log_tail()
        )

    def leader(self) -> Member | None:
        """The member that is the leader now, or None if no running member knows one."""
        by_id: dict[str, Member] = {}
        leader_id = None
        for m in self.members:
            if not m.running or m.paused:
                continue
            status = m.status()
            if status is None:
                continue
            header = status.get("header")
            if isinstance(header, dict):
                by_id[str(header.get("member_id"))] = m
            leader_id = str(status.get("leader"))
        return by_id.get(leader_id) if leader_id is not None else None

    def restart(self, member: Member) -> None:
        """Bring a killed member back on its own data directory."""
        member.kill()
        member.start(self.initial_cluster, state="existing")

    def close(self) -> None:
        """Stop every member (``SIGCONT`` first if paused) and remove the data."""
        for m in self.members:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                m.kill()
        shutil.rmtree(self.root, ignore_errors=True)
        self._reaper.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def cluster(size: int = 1) -> EtcdCluster:
    """Start a fresh ``size``-member cluster on loopback; close it (or use ``with``) when done."""
    return EtcdCluster(size).start()


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


if __name__ == "__main__":
    with cluster(int(sys.argv[1]) if len(sys.argv) > 1 else 1) as running:
        print(running.url(), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
