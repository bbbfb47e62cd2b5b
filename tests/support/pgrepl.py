"""A throwaway PostgreSQL primary with streaming standbys, for tests: temporary, loopback-only.

:class:`ReplicatedCluster` starts a primary (:class:`pgserver.PostgresServer`)
and ``standbys`` streaming replicas made with ``pg_basebackup``, each in its
own temporary directory on its own free port, and removes them all on
:meth:`~ReplicatedCluster.close`. A standby is named ``s1``, ``s2``, … (its
``application_name``, as ``synchronous_standby_names`` names it).

Faults: :meth:`ReplicatedCluster.kill` is ``kill -9`` of a server's whole
process group (the postmaster and every backend, as when its machine dies);
:meth:`ReplicatedCluster.promote` makes a standby the primary. Settings that
``synchronous_standby_names`` and friends need are changed with
:meth:`ReplicatedCluster.configure` (``ALTER SYSTEM`` and a reload).

Test-only: not part of the dibs package. Run ``python tests/support/pgrepl.py`` to
start a primary with one standby by hand.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from types import TracebackType
from typing import Self
from urllib.parse import quote

import psycopg

from pgserver import ADMIN_ROLE, PostgresServer, ServerSetupError

__all__ = ["ReplicatedCluster", "Standby"]

_REPLICATION = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "wal_keep_size": "'64MB'",
}


class Standby(PostgresServer):
    """A streaming replica of ``primary``, made with ``pg_basebackup``; not started yet."""

    def __init__(self, primary: PostgresServer, name: str) -> None:
        self.primary = primary
        self.name = name
        super().__init__(settings=dict(_REPLICATION))
        # The roles and their passwords are the primary's: the data directory is a copy.
        self.password = primary.password
        self.app_password = primary.app_password

    def _initdb(self) -> None:
        conninfo = (
            f"postgresql://{ADMIN_ROLE}:{quote(self.primary.password)}@127.0.0.1:"
            f"{self.primary.port}/postgres"
        )
        done = self._as_server_user(
            [
                str(self.bindir / "pg_basebackup"),
                "-d",
                conninfo,
                "-D",
                str(self.datadir),
                "-X",
                "stream",
                "--checkpoint",
                "fast",
                "--no-sync",
            ]
        )
        if done.returncode != 0:
            raise ServerSetupError(f"pg_basebackup failed:\n{done.stdout}\n{done.stderr}")
        (self.datadir / "standby.signal").touch()
        self._chown(self.datadir / "standby.signal")
        self._conninfo = f"{conninfo}?application_name={self.name}"
        with (self.datadir / "postgresql.conf").open("a") as f:
            f.write(f"\n# dibs tests/support/pgrepl.py: standby {self.name}\n")
            f.write(f"unix_socket_directories = '{self.root}'\n")

    def _write_port(self) -> None:
        # postgresql.auto.conf is rewritten whole: the primary's ALTER SYSTEM
        # settings (synchronous_standby_names) do not come along.
        auto = self.datadir / "postgresql.auto.conf"
        auto.write_text(f"port = {self.port}\nprimary_conninfo = '{self._conninfo}'\n")
        self._chown(auto)


class ReplicatedCluster:
    """A primary with ``standbys`` streaming replicas, on loopback; started on construction.

    ``synchronous`` sets ``synchronous_standby_names`` on the primary (for
    example ``"ANY 1 (s1, s2)"``, or ``"ghost"`` for a standby that never
    comes, so that every commit waits). ``durable`` turns ``fsync`` and
    ``full_page_writes`` on (see :class:`pgserver.PostgresServer`). Raises :class:`ServerSetupError`
    when a server cannot be set up.
    """

    def __init__(
        self, standbys: int = 1, *, synchronous: str | None = None, durable: bool = False
    ) -> None:
        self.primary = PostgresServer(settings=dict(_REPLICATION), durable=durable)
        self.standbys: list[Standby] = []
        try:
            self.primary.start()
            for i in range(standbys):
                standby = Standby(self.primary, f"s{i + 1}")
                self.standbys.append(standby)
                standby.start()
            for standby in self.standbys:
                self.wait_streaming(standby)
            if synchronous is not None:
                self.configure(self.primary, synchronous_standby_names=synchronous)
        except BaseException:
            self.close()
            raise

    @property
    def servers(self) -> list[PostgresServer]:
        return [self.primary, *self.standbys]

    def url(self, dbname: str = "postgres", *, admin: bool = False, order: str = "") -> str:
        """A multi-host URL over every server, ``target_session_attrs=read-write``.

        ``order`` is a string of server indexes (``"10"``: the first standby
        first, then the primary); by default the primary first.
        """
        servers = self.servers
        picked = [servers[int(i)] for i in order] if order else servers
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in picked)
        role, password = (
            (ADMIN_ROLE, self.primary.password)
            if admin
            else ("dibs_app", self.primary.app_password)
        )
        return (
            f"postgresql://{role}:{quote(password)}@{hosts}/{quote(dbname)}"
            "?target_session_attrs=read-write"
        )

    def create_database(self, name: str | None = None) -> str:
        """A fresh database owned by the app role (replicated to every standby); its name."""
        url = self.primary.create_database(name)
        return url.rsplit("/", 1)[1]

    def configure(self, server: PostgresServer, **settings: str) -> None:
        """``ALTER SYSTEM SET`` each setting on ``server``, reload, and wait until new sessions
        see every value (the postmaster reloads a moment after the signal)."""
        with psycopg.connect(server.admin_url, autocommit=True) as conn:
            for key, value in settings.items():
                conn.execute(f"ALTER SYSTEM SET {key} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")
        for _ in range(1200):
            with psycopg.connect(server.admin_url, autocommit=True) as conn:
                seen = dict(
                    conn.execute(
                        "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                        (list(settings),),
                    ).fetchall()
                )
            if all(seen.get(k) == v for k, v in settings.items()):
                return
            time.sleep(0.05)
        raise ServerSetupError(f"settings {settings} never took effect on {server.port}")

    def wait_streaming(self, standby: Standby) -> None:
        """Wait until the primary lists ``standby`` as streaming."""
        with psycopg.connect(self.primary.admin_url, autocommit=True) as conn:
            for _ in range(1200):
                row = conn.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE application_name = %s "
                    "AND state = 'streaming'",
                    (standby.name,),
                ).fetchone()
                if row:
                    return
                time.sleep(0.05)
        raise ServerSetupError(f"standby {standby.name} never streamed:\n{standby.log_tail()}")

    def kill(self, server: PostgresServer) -> None:
        """``kill -9`` of the server's postmaster and every backend, as when its machine dies."""
        pid = server.pid()
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
        for _ in range(1200):
            if server.pid() is None:
                break
            time.sleep(0.05)
        server._running = False

    def promote(self, standby: Standby, **settings: str) -> None:
        """Promote ``standby`` and wait until it accepts writes; then apply ``settings``."""
        done = standby._pg_ctl("promote", "-w", "-t", "120")
        if done.returncode != 0:
            raise ServerSetupError(f"pg_ctl promote failed:\n{done.stdout}{done.stderr}")
        if settings:
            self.configure(standby, **settings)

    def close(self) -> None:
        """Stop and remove every server; safe to call twice."""
        for server in reversed(self.servers):
            server.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def main() -> None:
    """Start a primary with one synchronous standby, print the URL, stop on Ctrl-C."""
    with ReplicatedCluster(1, synchronous="s1") as cluster:
        name = cluster.create_database("dibs")
        print(f"DIBS_TEST_PG_URL={cluster.url(name)}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)


if __name__ == "__main__":
    main()
