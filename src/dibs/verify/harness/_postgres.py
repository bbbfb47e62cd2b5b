"""A throwaway PostgreSQL server: ``initdb`` in a fresh directory, on a free loopback port.

:class:`PostgresServer` runs ``initdb`` into a fresh temporary directory,
starts the server on ``127.0.0.1`` on a free port with password
authentication, and removes everything on :meth:`~PostgresServer.close`
(and, through a reaper, when this process dies without closing it).
PostgreSQL refuses to run as root, so when this process is root the server
runs as an unprivileged OS user (:func:`~dibs.verify.harness.server_os_user`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

from dibs._extras import needs
from dibs.verify.harness._process import (
    ServerSetupError,
    chown,
    ensure,
    free_ports,
    make_root,
    run_as,
    server_os_user,
)
from dibs.verify.harness._reaper import reap_when_gone

if TYPE_CHECKING:
    import psycopg

__all__ = ["ADMIN_ROLE", "APP_ROLE", "PostgresServer", "connect", "find_pg_bindir"]

ADMIN_ROLE = "dibs_admin"
"""The superuser ``initdb`` creates in a throwaway cluster."""

APP_ROLE = "dibs_app"
"""A login role without superuser rights that owns each database made by
:meth:`PostgresServer.create_database`: what an application runs as."""

_TOOLS = ("initdb", "pg_ctl", "postgres", "pg_basebackup")


def _candidates() -> list[Path]:
    found = [Path(env)] if (env := os.environ.get("DIBS_PG_BINDIR")) else []
    found += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
        reverse=True,
    )
    if initdb := shutil.which("initdb"):
        found.append(Path(initdb).resolve().parent)
    return found


def _bindir() -> Path | None:
    return next((b for b in _candidates() if all((b / t).is_file() for t in _TOOLS)), None)


def _has_btree_gist(bindir: Path) -> bool:
    roots = [bindir.parent / "share", Path("/usr/share/postgresql") / bindir.parent.name]
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        config = [str(bindir / "pg_config"), "--sharedir"]
        shared = subprocess.run(config, capture_output=True, text=True, check=True).stdout.strip()
        roots.insert(0, Path(shared))
    return any((root / "extension" / "btree_gist.control").is_file() for root in roots)


def find_pg_bindir() -> Path:
    """The directory of ``initdb``, ``pg_ctl``, ``postgres`` and ``pg_basebackup``.

    Looks at ``$DIBS_PG_BINDIR``, the newest ``/usr/lib/postgresql/*/bin``
    (Debian's layout), then ``initdb`` on ``PATH``. Raises
    :class:`ServerSetupError` when there is none.
    """
    bindir = _bindir()
    if (bindir is None or not _has_btree_gist(bindir)) and ensure("pg-ensure.sh") is None:
        bindir = _bindir()
    if bindir is None:
        raise ServerSetupError(
            "PostgreSQL server binaries not found: install Debian's postgresql package "
            "(scripts/pg-ensure.sh does, as root) or set DIBS_PG_BINDIR"
        )
    return bindir


def connect(url: str) -> psycopg.Connection[Any]:
    """An autocommit connection (psycopg, from the ``postgres`` extra)."""
    with needs("postgres", "the PostgreSQL harness"):
        import psycopg  # noqa: PLC0415 (the postgres extra)

    return psycopg.connect(url, autocommit=True)


class PostgresServer:
    """One private PostgreSQL cluster in a temporary directory, on loopback.

    ``durable=False`` (the default) turns ``fsync`` and ``full_page_writes``
    off: data survive a killed server process (the OS still has them) but not
    a machine crash, which is all a test needs. ``synchronous_commit`` stays
    on, so a committed claim is never lost when the server is stopped with
    ``immediate``. ``settings`` are added to ``postgresql.conf`` as given
    (quote strings: ``{"wal_keep_size": "'64MB'"}``).

    Raises :class:`ServerSetupError` when the server cannot be set up.
    """

    def __init__(
        self,
        *,
        durable: bool = False,
        max_connections: int = 200,
        settings: dict[str, str] | None = None,
        base_dir: str | None = None,
    ) -> None:
        self.bindir = find_pg_bindir()
        self.os_user = server_os_user()
        self.password = secrets.token_hex(16)
        self.app_password = secrets.token_hex(16)
        self.port = 0
        self._settings = {
            "listen_addresses": "'127.0.0.1'",
            "max_connections": str(max_connections),
            "fsync": "on" if durable else "off",
            "full_page_writes": "on" if durable else "off",
            "shared_buffers": "'128MB'",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
            **(settings or {}),
        }
        self.root = make_root("dibs-pg-", self.os_user, base_dir)
        # If this process dies without close() (SIGTERM, SIGKILL), the server and root go too.
        self._reaper = reap_when_gone(self.root)
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self._running = False
        self._closed = False
        # start, stop and close one at a time: a start while another thread's stop
        # still waits would put a new postmaster's PID in the file that pg_ctl stop
        # watches, and that stop would wait out its 60 s and fail.
        self._lifecycle = threading.RLock()
        try:
            self._initdb()
        except BaseException:
            self._remove_root()
            raise

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (on a new free port the first time) and wait until it accepts.

        Waits for a :meth:`stop` under way in another thread to end first.
        """
        with self._lifecycle:
            self._start()

    def _start(self) -> None:
        attempts = 5 if self.port == 0 else 1
        for attempt in range(attempts):
            if attempt or self.port == 0:
                (self.port,) = free_ports(1)
            self._write_port()
            done = self.pg_ctl("start", "-w", "-t", "120", "-l", str(self.logfile))
            if done.returncode == 0:
                self._running = True
                return
            if "could not bind" not in self.log_tail() and "in use" not in self.log_tail():
                break
        raise ServerSetupError(
            f"pg_ctl start failed:\n{done.stdout}{done.stderr}\n{self.log_tail()}"
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (clean), or ``immediate`` (like a crash)."""
        with self._lifecycle:
            if not self._running:
                return
            self._running = False
            done = self.pg_ctl("stop", "-w", "-t", "60", "-m", mode)
            if done.returncode != 0 and self.pid() is not None:
                raise ServerSetupError(f"pg_ctl stop failed: {done.stdout}{done.stderr}")

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again on the same port with the same data."""
        with self._lifecycle:
            self.stop(mode)
            self.start()

    def pid(self) -> int | None:
        """The postmaster's process ID, or None when it is not running."""
        try:
            pid = int((self.datadir / "postmaster.pid").read_text().split("\n", 1)[0])
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    @property
    def running(self) -> bool:
        """Whether :meth:`start` succeeded and :meth:`stop` was not called since."""
        return self._running

    def close(self) -> None:
        """Stop the server and delete its directory; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop("immediate")
        finally:
            pid = self.pid()
            if pid is not None:  # pg_ctl failed: do not leave a server behind
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGQUIT)
            self._remove_root()

    def __enter__(self) -> Self:
        if not self._running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- URLs and databases ---------------------------------------------------------------------

    def url(self, dbname: str = "postgres", *, admin: bool = True) -> str:
        """A ``postgresql://`` URL for ``dbname`` as the superuser or the app role."""
        role, password = (ADMIN_ROLE, self.password) if admin else (APP_ROLE, self.app_password)
        return f"postgresql://{role}:{quote(password)}@127.0.0.1:{self.port}/{quote(dbname)}"

    @property
    def admin_url(self) -> str:
        """The superuser's URL for the ``postgres`` maintenance database."""
        return self.url()

    def create_database(self, name: str | None = None, *, extension: bool = True) -> str:
        """Create a fresh database owned by the app role; return the app role's URL.

        With ``extension`` the superuser first creates ``btree_gist`` in it, the
        one step dibs needs a superuser for.
        """
        name = name or f"dibs_test_{secrets.token_hex(4)}"
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"database name must be a plain identifier, got {name!r}")
        with connect(self.admin_url) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,))
            verb = "ALTER" if exists.fetchone() else "CREATE"
            # The password is hex: no quoting needed.
            conn.execute(f"{verb} ROLE {APP_ROLE} LOGIN NOSUPERUSER PASSWORD '{self.app_password}'")
            conn.execute(f"CREATE DATABASE {name} OWNER {APP_ROLE}")
        if extension:
            with connect(self.url(name)) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        return self.url(name, admin=False)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever is still in it."""
        with connect(self.admin_url) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log, for error messages."""
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``pg_ctl -D <data> args...`` as the server's OS user; its output."""
        pg_ctl = [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args]
        return run_as(self.os_user, pg_ctl, self.root)

    # --- internals ------------------------------------------------------------------------------

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        chown(pwfile, self.os_user)
        initdb = [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", ADMIN_ROLE]
        initdb += ["--pwfile", str(pwfile), "--auth", "scram-sha-256", "--encoding", "UTF8"]
        done = run_as(self.os_user, [*initdb, "--locale", "C", "--no-sync"], self.root)
        pwfile.unlink()
        if done.returncode != 0:
            raise ServerSetupError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        self._configure()

    def _configure(self) -> None:
        with (self.datadir / "postgresql.conf").open("a") as f:
            f.write("\n# dibs.verify.harness\n")
            f.write(f"unix_socket_directories = '{self.root}'\n")
            for key, value in self._settings.items():
                f.write(f"{key} = {value}\n")

    def _write_port(self) -> None:
        (self.datadir / "postgresql.auto.conf").write_text(f"port = {self.port}\n")
        chown(self.datadir / "postgresql.auto.conf", self.os_user)

    def _remove_root(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._reaper.close()
