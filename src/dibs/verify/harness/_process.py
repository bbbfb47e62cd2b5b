"""What every throwaway server shares: free ports, waiting, its OS user, its process tree.

A :class:`Process` is one server process (an etcd member, a Patroni agent)
started in its own session, as the server's OS user when this process is
root, with its output in a log file; it can be killed with everything it
started, stopped cleanly, paused and resumed. :func:`find_program` finds a
server's binary and, only when ``$DIBS_HARNESS_ENSURE`` names a directory of
``*-ensure.sh`` scripts (the repository's ``scripts/``, as the tests set it),
runs the one that installs what is missing: left to itself the harness
installs nothing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "Process",
    "ServerSetupError",
    "ensure",
    "find_program",
    "free_ports",
    "make_root",
    "process_tree",
    "run_as",
    "server_os_user",
    "signal_all",
    "wait_for",
]

T = TypeVar("T")

ENSURE_ENV = "DIBS_HARNESS_ENSURE"
"""Names the directory of ``pg-ensure.sh``, ``etcd-ensure.sh`` and ``cluster-ensure.sh``."""

_FALLBACK_OS_USER = "dibs-pg"


class ServerSetupError(RuntimeError):
    """A server or cluster could not be found, installed, started or brought to health."""


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


def wait_for(what: str, probe: Callable[[], T | None], patience: float, interval: float = 0.1) -> T:
    """Call ``probe()`` until it returns something truthy, and return that.

    Raises :class:`ServerSetupError` naming ``what`` (and the last error
    ``probe`` raised) after ``patience`` seconds; a probe gives up at once by
    raising :class:`ServerSetupError` itself.
    """
    deadline = time.monotonic() + patience
    last: BaseException | None = None
    while True:
        try:
            found = probe()
        except ServerSetupError:
            raise
        except Exception as exc:  # a server still starting refuses in many ways
            found, last = None, exc
        if found:
            return found
        if time.monotonic() > deadline:
            cause = f": {last!r}" if last is not None else ""
            raise ServerSetupError(f"{what}: not within {patience:g} s{cause}")
        time.sleep(interval)


_ensured: dict[str, subprocess.CompletedProcess[str]] = {}
_ensure_lock = threading.Lock()  # guards _ensured: one install at a time in this process


def ensure(script: str) -> str | None:
    """Run ``$DIBS_HARNESS_ENSURE/<script>`` once, if that variable is set; why it failed, or None.

    Without the variable nothing runs and the answer is ``"not run"``: a
    user's ``dibs verify --cluster`` never installs anything.
    """
    scripts = os.environ.get(ENSURE_ENV)
    if not scripts:
        return "not run"
    path = str(Path(scripts) / script)
    with _ensure_lock:
        done = _ensured.get(path)
        if done is None:
            done = subprocess.run([path], capture_output=True, text=True, timeout=900, check=False)
            _ensured[path] = done
    return None if done.returncode == 0 else f"{script} failed: {done.stderr.strip()}"


def find_program(program: str, package: str, *scripts: str, env: str | None = None) -> str:
    """The path of ``program`` (``$env`` first, then ``PATH``), installed by ``scripts[0]``
    if allowed (:func:`ensure`).

    Raises :class:`ServerSetupError` naming the Debian ``package`` and the scripts that
    install it.
    """
    found = (os.environ.get(env) if env else None) or shutil.which(program)
    if found is None and ensure(scripts[0]) is None:
        found = shutil.which(program)
    if found is None:
        named = " or ".join(f"scripts/{s}" for s in scripts)
        raise ServerSetupError(
            f"{program} not found: install Debian's {package} package ({named} does, as root)"
        )
    return found


def server_os_user() -> pwd.struct_passwd | None:
    """The OS user PostgreSQL (and Patroni, which runs it) must run as; None: this process's.

    PostgreSQL refuses to run as root. As root this is ``$DIBS_PG_OS_USER``,
    else ``postgres`` (Debian's package creates it), else ``dibs-pg``
    (``scripts/pg-ensure.sh`` creates it). Raises :class:`ServerSetupError`
    when there is none.
    """
    if os.geteuid() != 0:
        return None
    names = [os.environ.get("DIBS_PG_OS_USER"), "postgres", _FALLBACK_OS_USER]
    for attempt in range(2):
        for name in filter(None, names):
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
        if attempt == 0 and ensure("pg-ensure.sh") is not None:
            break
    raise ServerSetupError(
        "running as root, and no unprivileged OS user for PostgreSQL: install Debian's "
        "postgresql package (it creates 'postgres'), run scripts/pg-ensure.sh, or set "
        "DIBS_PG_OS_USER"
    )


def make_root(prefix: str, user: pwd.struct_passwd | None, base_dir: str | None = None) -> Path:
    """A fresh directory for one server, owned by its OS ``user``.

    In ``base_dir``, else ``$DIBS_PG_TMPDIR``, else ``/tmp`` when the server
    runs as another user (it must reach the directory), else the default.
    """
    base = base_dir or os.environ.get("DIBS_PG_TMPDIR") or ("/tmp" if user is not None else None)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    chown(root, user)
    return root


def chown(path: Path, user: pwd.struct_passwd | None) -> None:
    """Give ``path`` to ``user`` (None: leave it to this process's)."""
    if user is not None:
        os.chown(path, user.pw_uid, user.pw_gid)


def server_env(root: Path, user: pwd.struct_passwd | None, drop: tuple[str, ...]) -> dict[str, str]:
    """This process's environment without the variables starting with ``drop``, for a server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["LC_ALL"] = "C"
    if user is not None:
        env["HOME"] = str(root)
    return env


def _as_user(user: pwd.struct_passwd | None) -> dict[str, Any]:
    if user is None:
        return {}
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def run_as(
    user: pwd.struct_passwd | None, cmd: list[str], root: Path
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end in ``root`` as ``user``, in a session of its own; its output."""
    return subprocess.run(
        cmd,
        env=server_env(root, user, ("PG",)),
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
        start_new_session=True,
        **_as_user(user),
    )


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


class Process:
    """One server process: its command line, directory, log and OS user."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        root: Path,
        env: dict[str, str],
        user: pwd.struct_passwd | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        self.root = root
        self.env = env
        self.user = user
        self.log = root / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    def start(self) -> None:
        """Start the process (again, after a kill), appending to its log."""
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.root,
                start_new_session=True,
                **_as_user(self.user),
            )
        self.paused = False

    @property
    def alive(self) -> bool:
        """Whether the process was started and has not ended."""
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """``kill -9`` the process and everything it started (its machine dies)."""
        if self.process is None:
            return
        signal_all(process_tree(self.process.pid), signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        self.process = None
        self.paused = False

    def terminate(self, patience: float = 30.0) -> None:
        """Stop the process cleanly (SIGTERM), then kill it if it does not go."""
        if self.process is None:
            return
        self.resume()
        self.process.terminate()
        try:
            self.process.wait(timeout=patience)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def pause(self) -> None:
        """SIGSTOP the process and its children: they stop answering, sockets stay open."""
        if self.alive:
            signal_all(process_tree(self.pid), signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process is not None:
            signal_all(process_tree(self.process.pid), signal.SIGCONT)
            self.paused = False

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the log, for error messages."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
