"""A throwaway PostgreSQL server for tests and benchmarks: temporary, loopback-only.

:class:`PostgresServer` runs ``initdb`` into a fresh temporary directory,
starts the server on ``127.0.0.1`` on a free port with password
authentication, and removes everything on :meth:`~PostgresServer.close`.
PostgreSQL refuses to run as root, so when this process is root the server
runs as an unprivileged OS user: ``$DIBS_PG_OS_USER``, else ``postgres`` if it
exists, else a system user ``dibs-pg`` created on first use.

:func:`ensure_installed` finds the server binaries and, when they (or the OS
user) are missing, runs ``scripts/pg-ensure.sh``: the one place that installs
anything.

Test-only: this module is not part of the dibs package. Run ``python
tests/support/pgserver.py`` to start one by hand; it prints the URL and stops the
server on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import psycopg

from dibs.verify._reaper import reap_when_gone
from layout import SCRIPTS

__all__ = ["PostgresServer", "ServerSetupError", "ensure_installed", "find_bindir"]

ADMIN_ROLE = "dibs_admin"
"""The superuser ``initdb`` creates in a throwaway cluster."""

APP_ROLE = "dibs_app"
"""A login role without superuser rights that owns each database made by
:meth:`PostgresServer.create_database`: what an application runs as."""

_FALLBACK_OS_USER = "dibs-pg"

PG_ENSURE = SCRIPTS / "pg-ensure.sh"
"""The one script that installs PostgreSQL and creates its OS user."""


class ServerSetupError(RuntimeError):
    """Raised when a PostgreSQL server cannot be installed, initialized or started."""


def find_bindir() -> Path | None:
    """Return the directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None.

    Looks at ``$DIBS_PG_BINDIR``, then the newest ``/usr/lib/postgresql/*/bin``
    (Debian's layout), then ``initdb`` on ``PATH`` with symlinks resolved.
    """
    candidates: list[Path] = []
    if env := os.environ.get("DIBS_PG_BINDIR"):
        candidates.append(Path(env))
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: [int(x) for x in re.findall(r"\d+", p.parent.name)] or [0],
        reverse=True,
    )
    candidates.extend(versions)
    if found := shutil.which("initdb"):
        candidates.append(Path(found).resolve().parent)
    for bindir in candidates:
        if all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def ensure_installed() -> Path:
    """Return the server's bin directory, running ``scripts/pg-ensure.sh`` if it is missing.

    Raises :class:`ServerSetupError` when the script cannot provide it (not
    root, or no ``apt-get``).
    """
    bindir = find_bindir()
    if bindir is not None and _has_btree_gist(bindir):
        return bindir
    _pg_ensure()
    bindir = find_bindir()
    if bindir is None:
        raise ServerSetupError(f"{PG_ENSURE} ran but no initdb was found")
    return bindir


def _pg_ensure() -> None:
    done = subprocess.run([str(PG_ENSURE)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ServerSetupError(
            f"{PG_ENSURE} failed:\n{done.stderr.strip()}\nInstall Debian's 'postgresql' and "
            "'postgresql-contrib' packages, set DIBS_PG_BINDIR, or point DIBS_TEST_PG_URL at "
            "an existing server"
        )


def _has_btree_gist(bindir: Path) -> bool:
    sharedir = (
        _run([str(bindir / "pg_config"), "--sharedir"]) if (bindir / "pg_config").is_file() else ""
    )
    roots = [Path(sharedir.strip())] if sharedir.strip() else []
    roots.append(bindir.parent / "share")
    roots.append(Path("/usr/share/postgresql") / bindir.parent.name)
    return any((root / "extension" / "btree_gist.control").is_file() for root in roots)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def server_os_user() -> pwd.struct_passwd | None:
    """Return the OS user the server must run as, or None to run as this process.

    Has ``scripts/pg-ensure.sh`` create the system user ``dibs-pg`` when root
    and no other is available.
    """
    if os.geteuid() != 0:
        return None
    names = [os.environ.get("DIBS_PG_OS_USER", ""), "postgres", _FALLBACK_OS_USER]
    for name in filter(None, names):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    _pg_ensure()  # as root, it creates the system user dibs-pg
    try:
        return pwd.getpwnam(_FALLBACK_OS_USER)
    except KeyError:
        raise ServerSetupError(f"{PG_ENSURE} did not create OS user {_FALLBACK_OS_USER}") from None


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PostgresServer:
    """One private PostgreSQL cluster in a temporary directory, on loopback.

    ``durable=False`` (the default) turns ``fsync`` off: data survives a killed
    server process (the OS still has it) but not a machine crash, which is
    all a test needs. ``synchronous_commit`` stays on, so a committed claim is
    never lost when the server is stopped with ``immediate``.

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
        self.bindir = ensure_installed()
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
        base = (
            base_dir
            or os.environ.get("DIBS_PG_TMPDIR")
            or ("/tmp" if self.os_user is not None else None)
        )
        self.root = Path(tempfile.mkdtemp(prefix="dibs-pg-", dir=base))
        # If this process dies without close() (SIGTERM, SIGKILL), the server and root go too.
        self._reaper = reap_when_gone(self.root)
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self._running = False
        self._closed = False
        try:
            self._chown(self.root)
            self._initdb()
        except BaseException:
            self._remove_root()
            raise

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (on a new free port the first time) and wait until it accepts."""
        attempts = 5 if self.port == 0 else 1
        for attempt in range(attempts):
            if attempt or self.port == 0:
                self.port = free_port()
            self._write_port()
            done = self._pg_ctl("start", "-w", "-t", "120", "-l", str(self.logfile))
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
        if not self._running:
            return
        self._running = False
        done = self._pg_ctl("stop", "-w", "-t", "60", "-m", mode)
        if done.returncode != 0 and self.pid() is not None:
            raise ServerSetupError(f"pg_ctl stop failed: {done.stdout}{done.stderr}")

    def restart(self, mode: str = "fast") -> None:
        """Stop and start again on the same port with the same data."""
        self.stop(mode)
        self.start()

    def pid(self) -> int | None:
        """The postmaster's process ID, or None when it is not running."""
        try:
            first = (self.datadir / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
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
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)
            ).fetchone()
            verb = "ALTER" if exists else "CREATE"
            conn.execute(
                f"{verb} ROLE {APP_ROLE} LOGIN NOSUPERUSER PASSWORD "
                f"'{self.app_password}'"  # hex, no quoting needed
            )
            conn.execute(f"CREATE DATABASE {name} OWNER {APP_ROLE}")
        if extension:
            with psycopg.connect(self.url(name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        return self.url(name, admin=False)

    def drop_database(self, name: str) -> None:
        """Drop a database, disconnecting whoever is still in it."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server log, for error messages."""
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # --- internals ------------------------------------------------------------------------------

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        self._chown(pwfile)
        done = self._as_server_user(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                ADMIN_ROLE,
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ]
        )
        pwfile.unlink()
        if done.returncode != 0:
            raise ServerSetupError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        conf = self.datadir / "postgresql.conf"
        with conf.open("a") as f:
            f.write("\n# dibs tests/support/pgserver.py\n")
            f.write(f"unix_socket_directories = '{self.root}'\n")
            for key, value in self._settings.items():
                f.write(f"{key} = {value}\n")

    def _write_port(self) -> None:
        (self.datadir / "postgresql.auto.conf").write_text(f"port = {self.port}\n")
        self._chown(self.datadir / "postgresql.auto.conf")

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self._as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.datadir), *args])

    def _as_server_user(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        if self.os_user is not None:
            kwargs.update(user=self.os_user.pw_uid, group=self.os_user.pw_gid, extra_groups=[])
            env["HOME"] = str(self.root)
        return subprocess.run(
            cmd,
            env=env,
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            start_new_session=True,
            **kwargs,
        )

    def _chown(self, path: Path) -> None:
        if self.os_user is not None:
            os.chown(path, self.os_user.pw_uid, self.os_user.pw_gid)

    def _remove_root(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self._reaper.close()


def main() -> None:
    """Start a server, print its URLs, and stop it on Ctrl-C or SIGTERM."""
    with PostgresServer() as server:
        url = server.create_database("dibs")
        print(f"DIBS_TEST_PG_URL={url}")
        print(f"admin: {server.admin_url}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
