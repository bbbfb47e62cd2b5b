"""A private etcd cluster on loopback, from Debian's ``etcd``: started, faulted, removed.

:class:`EtcdCluster` runs ``members`` members of one new cluster on free
ports of ``127.0.0.1``, with their data in a fresh temporary directory, and
:meth:`~EtcdCluster.close` kills them and deletes it (a reaper does too when
this process dies without closing). Fault injectors, by member index:
:meth:`~EtcdCluster.kill` (``kill -9``), :meth:`~EtcdCluster.restart` (on
its own data: the member rejoins), :meth:`~EtcdCluster.pause` /
:meth:`~EtcdCluster.resume` (SIGSTOP / SIGCONT); :meth:`~EtcdCluster.leader`
finds the leader through each member's gateway ``/v3/maintenance/status``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from dibs.verify.harness._process import (
    Process,
    ServerSetupError,
    find_program,
    free_ports,
    wait_for,
)
from dibs.verify.harness._reaper import reap_when_gone

__all__ = ["EtcdCluster", "EtcdMember", "etcd_binary"]

_ATTEMPTS = 5
"""Starts on fresh ports when a member dies at once (a port taken under us)."""


def etcd_binary() -> str:
    """``$DIBS_ETCD``, or ``etcd`` on ``PATH``; raises :class:`ServerSetupError` naming
    Debian's ``etcd-server`` package when there is none."""
    return find_program(
        "etcd", "etcd-server", "etcd-ensure.sh", "cluster-ensure.sh", env="DIBS_ETCD"
    )


def _post(endpoint: str, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{endpoint}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


class EtcdMember(Process):
    """One etcd process of an :class:`EtcdCluster`; its ports and data outlive restarts."""

    def __init__(self, name: str, root: Path, client_port: int, peer_port: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        super().__init__(name, [], root, env)
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = root / f"{name}.data"

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:<client port>``, as an ``etcd://`` URL lists it."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        """Alive and not paused: it answers."""
        return self.alive and not self.paused

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        """This member's ``/v3/maintenance/status`` (member ID, leader ID, revision...)."""
        return _post(self.endpoint, "/v3/maintenance/status", {}, timeout)


class EtcdCluster:
    """``members`` members of one fresh etcd cluster on loopback; :meth:`close` removes them.

    ``election_timeout`` (milliseconds; the heartbeat is a tenth of it) is
    etcd's default when None; tests shorten it so that an election after a
    fault takes a moment. ``base_dir`` holds the cluster's directory (the
    default temporary directory when None); ``root`` puts the members in a
    directory someone else owns and removes. Raises :class:`ServerSetupError`
    when ``etcd`` is missing.
    """

    def __init__(
        self,
        members: int = 3,
        *,
        root: Path | None = None,
        name: str = "etcd",
        election_timeout: int | None = None,
        base_dir: str | None = None,
        binary: str | None = None,
    ) -> None:
        if members < 1:
            raise ValueError(f"an etcd cluster needs at least one member, got {members}")
        self.binary = binary or etcd_binary()
        self._own_root = root is None
        self.root = root or Path(tempfile.mkdtemp(prefix="dibs-etcd-", dir=base_dir))
        # Killed without close() (SIGTERM, SIGKILL), the run leaves no member and no directory.
        self._reaper = reap_when_gone(self.root) if self._own_root else None
        self.name = name
        self.size = members
        self.election_timeout = election_timeout
        self.members: list[EtcdMember] = []
        self._attempt = 0
        self._place()

    def _place(self) -> None:
        """Members on fresh ports and in fresh data directories, not started."""
        ports = free_ports(2 * self.size)
        tag = f"{self.name}-{self._attempt}-" if self._attempt else ""
        self.members = [
            EtcdMember(f"{self.name}{i}", self.root, ports[i], ports[self.size + i])
            for i in range(self.size)
        ]
        for m in self.members:
            m.data_dir = self.root / f"{tag}{m.name}.data"
        token = f"dibs-{self.name}-{os.getpid()}-{time.monotonic_ns()}"
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        timing = []
        if self.election_timeout is not None:
            timing = [
                f"--heartbeat-interval={max(1, self.election_timeout // 10)}",
                f"--election-timeout={self.election_timeout}",
            ]
        for m in self.members:
            m.argv = [
                self.binary,
                f"--name={m.name}",
                f"--data-dir={m.data_dir}",
                f"--listen-client-urls=http://{m.endpoint}",
                f"--advertise-client-urls=http://{m.endpoint}",
                f"--listen-peer-urls={m.peer_url}",
                f"--initial-advertise-peer-urls={m.peer_url}",
                f"--initial-cluster={initial}",
                f"--initial-cluster-token={token}",
                "--initial-cluster-state=new",
                "--log-level=warn",
                *timing,
            ]

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, patience: float = 60.0) -> Self:
        """Start every member; return once all answer and one leads.

        A member that dies at once (its port taken under us) makes a new
        start on fresh ports. A cluster already started is left as it is.
        Raises :class:`ServerSetupError` with the members' logs when the
        cluster does not come up.
        """
        if any(m.process is not None for m in self.members):
            return self
        try:
            while True:
                for m in self.members:
                    m.start()
                try:
                    wait_for("every etcd member answering", self._answering, patience)
                    self.wait_leader(patience)
                    return self
                except ServerSetupError:
                    died = not all(m.alive for m in self.members)
                    if not died or self._attempt + 1 >= _ATTEMPTS:
                        raise
                for m in self.members:
                    m.kill()
                self._attempt += 1
                self._place()
        except BaseException:
            tails = "\n".join(f"--- {m.name}\n{m.log_tail()}" for m in self.members)
            self.close()
            raise ServerSetupError(f"etcd cluster did not start:\n{tails}") from None

    def _answering(self) -> bool:
        if not all(m.alive for m in self.members):
            raise ServerSetupError("an etcd member exited")
        for m in self.members:
            m.status()  # raises until it answers
        return True

    def close(self) -> None:
        """Kill every member and delete the cluster's directory; safe to call twice."""
        for m in self.members:
            m.kill()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._reaper is not None:
            self._reaper.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- addresses ------------------------------------------------------------------------------

    @property
    def endpoints(self) -> list[str]:
        """``127.0.0.1:port`` of every member's client URL."""
        return [m.endpoint for m in self.members]

    def url(self, prefix: str = "") -> str:
        """The dibs store URL: ``etcd://h:p,h:p,h:p[/prefix]``."""
        return "etcd://" + ",".join(self.endpoints) + (f"/{prefix}" if prefix else "")

    # --- state and faults -----------------------------------------------------------------------

    def status(self, index: int, timeout: float = 1.0) -> dict[str, Any]:
        """Member ``index``'s ``/v3/maintenance/status``."""
        return self.members[index].status(timeout)

    def leader(self) -> int | None:
        """The index of the member that is leader now, as the live members see it; or None."""
        ids: dict[str, int] = {}
        leaders: set[str] = set()
        for i, m in enumerate(self.members):
            if not m.running:
                continue
            try:
                st = m.status(timeout=0.5)
            except (OSError, ValueError):
                continue
            ids[str(st["header"]["member_id"])] = i
            if st.get("leader") and str(st["leader"]) != "0":
                leaders.add(str(st["leader"]))
        if len(leaders) != 1:
            return None
        return ids.get(leaders.pop())

    def wait_leader(self, patience: float = 30.0, *, not_: int | None = None) -> int:
        """Wait until a leader is elected (other than member ``not_``); return its index."""

        def probe() -> int | None:
            found = self.leader()
            return None if found is None or found == not_ else found + 1  # 0 is falsy

        return wait_for("an etcd leader", probe, patience) - 1

    def wait_ready(self, patience: float = 60.0) -> None:
        """Wait until a write goes through some running member (a leader commits it)."""

        def put() -> bool:
            for m in self.members:
                if m.running:
                    try:
                        _post(m.endpoint, "/v3/kv/put", {"key": "X19yZWFkeV9f", "value": ""}, 2.0)
                        return True
                    except (OSError, ValueError):
                        continue
            return False

        wait_for("an etcd write", put, patience, 0.05)

    def kill(self, index: int) -> None:
        """``kill -9`` member ``index`` (its data stay: :meth:`restart` brings it back)."""
        self.members[index].kill()

    def restart(self, index: int, *, graceful: bool = True, patience: float = 60.0) -> None:
        """Stop member ``index`` (SIGTERM, or kill -9), start it on its data, wait for it."""
        m = self.members[index]
        if graceful:
            m.terminate()
        else:
            m.kill()
        m.argv = [a for a in m.argv if not a.startswith("--initial-cluster-state=")]
        m.argv.append("--initial-cluster-state=existing")
        m.start()
        wait_for(f"etcd member {index} answering again", m.status, patience)

    def pause(self, index: int) -> None:
        """SIGSTOP member ``index``: it stops answering, peers and clients time out on it."""
        self.members[index].pause()

    def resume(self, index: int) -> None:
        """SIGCONT member ``index``."""
        self.members[index].resume()
