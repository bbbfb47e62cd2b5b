"""Private clusters for ``dibs verify --cluster``: started on loopback, removed afterwards.

Everything runs from Debian's packages (``scripts/cluster-ensure.sh`` and
``scripts/pg-ensure.sh`` install them): ``etcd`` for :class:`EtcdCluster`,
and ``patroni`` with PostgreSQL's binaries for
:class:`~dibs.verify._cluster_pg.PostgresHA`. Each cluster lives in a fresh
temporary directory, listens on free ports of ``127.0.0.1`` only, and is
killed and deleted by :meth:`close` (also on an error, and by the context
manager).

This module is the cluster's lifecycle and its fault injectors; the fault
*plans* (when to inject which) are in :mod:`dibs.verify._cluster_run`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from dibs.verify._reaper import reap_when_gone

__all__ = [
    "ClusterSetupError",
    "EtcdCluster",
    "Member",
    "free_ports",
    "server_os_user",
    "wait_for",
]


class ClusterSetupError(RuntimeError):
    """A cluster could not be installed, started or brought to a healthy state."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for(what: str, probe: Any, patience: float, interval: float = 0.1) -> Any:
    """Call ``probe()`` until it returns something truthy; raise after ``patience`` seconds."""
    deadline = time.monotonic() + patience
    last: BaseException | None = None
    while True:
        try:
            found = probe()
        except Exception as exc:  # a server still starting refuses in many ways
            found, last = None, exc
        if found:
            return found
        if time.monotonic() > deadline:
            cause = f": {last!r}" if last is not None else ""
            raise ClusterSetupError(f"{what}: not within {patience:g} s{cause}")
        time.sleep(interval)


def server_os_user() -> pwd.struct_passwd | None:
    """The OS user PostgreSQL (and Patroni, which runs it) must run as; None: this process's.

    PostgreSQL refuses to run as root. As root this is ``$DIBS_PG_OS_USER``,
    else ``postgres`` (Debian's package creates it), else ``dibs-pg``
    (``scripts/pg-ensure.sh`` creates it).
    """
    if os.geteuid() != 0:
        return None
    for name in filter(None, (os.environ.get("DIBS_PG_OS_USER"), "postgres", "dibs-pg")):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ClusterSetupError(
        "running as root, and no unprivileged OS user for PostgreSQL: install Debian's "
        "postgresql package (it creates 'postgres'), run scripts/pg-ensure.sh, or set "
        "DIBS_PG_OS_USER"
    )


def require(program: str, package: str) -> str:
    """The path of ``program``, or :class:`ClusterSetupError` naming the package to install."""
    found = shutil.which(program)
    if found is None:
        raise ClusterSetupError(
            f"{program} not found: install Debian's {package} package "
            "(scripts/cluster-ensure.sh does, as root)"
        )
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (read from /proc), parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow the last ")".
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    """Send ``sig`` to each of ``pids``, ignoring those already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Member:
    """One server process of a cluster: its command line, data, log and process."""

    def __init__(self, name: str, argv: list[str], root: Path, env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.root = root
        self.env = env
        self.log = root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.user: pwd.struct_passwd | None = None

    def start(self) -> None:
        kwargs: dict[str, Any] = {}
        if self.user is not None:
            kwargs.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.root,
                start_new_session=True,
                **kwargs,
            )

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """``kill -9`` the member and everything it started (its machine dies)."""
        if self.process is None:
            return
        pids = process_tree(self.process.pid)
        signal_all(pids, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        self.process = None

    def terminate(self, patience: float = 30.0) -> None:
        """Stop the member cleanly (SIGTERM), then kill it if it does not go."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def pause(self) -> None:
        if self.process is not None:
            signal_all(process_tree(self.process.pid), signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            signal_all(process_tree(self.process.pid), signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _post_json(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


class EtcdCluster:
    """A private etcd cluster of ``members`` members on 127.0.0.1, from Debian's ``etcd``.

    :meth:`start` waits until every member answers and one is the leader.
    Fault injectors: :meth:`kill` (``kill -9``), :meth:`restart` (the same
    data directory: the member rejoins), :meth:`pause` / :meth:`resume`
    (SIGSTOP / SIGCONT), and :meth:`leader` finds the leader through each
    member's gateway ``/v3/maintenance/status``.
    """

    def __init__(self, members: int = 3, *, root: Path | None = None, name: str = "etcd") -> None:
        if members < 1:
            raise ValueError(f"an etcd cluster needs at least one member, got {members}")
        self.binary = require("etcd", "etcd-server")
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="dibs-etcd-")) if root is None else root
        # Killed without close() (SIGTERM, SIGKILL), the run leaves no member and no directory.
        self._reaper = reap_when_gone(self.root) if self._own_root else None
        self.name = name
        ports = free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        token = f"dibs-{name}-{os.getpid()}-{time.monotonic_ns()}"
        names = [f"{name}{i}" for i in range(members)]
        initial = ",".join(
            f"{n}=http://127.0.0.1:{p}" for n, p in zip(names, self.peer_ports, strict=True)
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self.members: list[Member] = []
        for i, n in enumerate(names):
            client = f"http://127.0.0.1:{self.client_ports[i]}"
            peer = f"http://127.0.0.1:{self.peer_ports[i]}"
            argv = [
                self.binary,
                "--name",
                n,
                "--data-dir",
                str(self.root / f"{n}.data"),
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                initial,
                "--initial-cluster-token",
                token,
                "--initial-cluster-state",
                "new",
                "--log-level",
                "warn",
            ]
            self.members.append(Member(n, argv, self.root, env))

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, patience: float = 60.0) -> None:
        """Start every member; return once all answer and one leads."""
        try:
            for m in self.members:
                m.start()
            for i in range(len(self.members)):
                wait_for(f"etcd member {i} answering", lambda i=i: self.status(i), patience)
            self.wait_leader(patience)
        except BaseException:
            tails = "\n".join(f"--- {m.name}\n{m.log_tail()}" for m in self.members)
            self.close()
            raise ClusterSetupError(f"etcd cluster did not start:\n{tails}") from None

    def close(self) -> None:
        """Kill every member and delete the cluster's directory; safe to call twice."""
        for m in self.members:
            m.resume()
            m.kill()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._reaper is not None:
            self._reaper.close()

    def __enter__(self) -> Self:
        self.start()
        return self

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
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def url(self, prefix: str = "") -> str:
        """The dibs store URL: ``etcd://h:p,h:p,h:p[/prefix]``."""
        return "etcd://" + ",".join(self.endpoints) + (f"/{prefix}" if prefix else "")

    # --- state and faults -----------------------------------------------------------------------

    def status(self, index: int, timeout: float = 1.0) -> dict[str, Any]:
        """Member ``index``'s ``/v3/maintenance/status`` (member ID, leader ID, revision...)."""
        return _post_json(
            f"http://{self.endpoints[index]}/v3/maintenance/status", {}, timeout=timeout
        )

    def leader(self) -> int | None:
        """The index of the member that is leader now, as the live members see it; or None."""
        ids: dict[str, int] = {}
        leaders: set[str] = set()
        for i, m in enumerate(self.members):
            if not m.alive:
                continue
            try:
                st = self.status(i, timeout=0.5)
            except (OSError, urllib.error.URLError, ValueError):
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

        index: int = wait_for("an etcd leader", probe, patience) - 1
        return index

    def kill(self, index: int) -> None:
        """``kill -9`` member ``index``."""
        self.members[index].kill()

    def restart(self, index: int, *, graceful: bool = True, patience: float = 60.0) -> None:
        """Stop member ``index`` (SIGTERM, or kill -9), start it on its data, wait for it."""
        m = self.members[index]
        if graceful:
            m.terminate()
        else:
            m.kill()
        m.argv[m.argv.index("--initial-cluster-state") + 1] = "existing"
        m.start()
        wait_for(f"etcd member {index} answering again", lambda: self.status(index), patience)

    def pause(self, index: int) -> None:
        """SIGSTOP member ``index``: it stops answering, peers and clients time out on it."""
        self.members[index].pause()

    def resume(self, index: int) -> None:
        """SIGCONT member ``index``."""
        self.members[index].resume()
