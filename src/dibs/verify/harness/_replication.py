"""A throwaway PostgreSQL primary with streaming standbys: temporary, loopback-only.

:class:`ReplicatedCluster` starts a primary (:class:`PostgresServer`) and
``standbys`` streaming replicas made with ``pg_basebackup``, each in its own
temporary directory on its own free port, and removes them all on
:meth:`~ReplicatedCluster.close`. A standby is named ``s1``, ``s2``, … (its
``application_name``, as ``synchronous_standby_names`` names it).

Faults: :meth:`ReplicatedCluster.kill` is ``kill -9`` of a server's
postmaster and every backend (as when its machine dies);
:meth:`ReplicatedCluster.promote` makes a standby the primary. Settings that
``synchronous_standby_names`` and friends need are changed with
:meth:`ReplicatedCluster.configure` (``ALTER SYSTEM`` and a reload).
"""

from __future__ import annotations

import signal
from types import TracebackType
from typing import Self
from urllib.parse import quote

from dibs.verify.harness._postgres import ADMIN_ROLE, APP_ROLE, PostgresServer, connect
from dibs.verify.harness._process import (
    ServerSetupError,
    chown,
    process_tree,
    run_as,
    signal_all,
    wait_for,
)

__all__ = ["REPLICATION_SETTINGS", "ReplicatedCluster", "Standby"]

REPLICATION_SETTINGS = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "hot_standby": "on",
    "wal_keep_size": "'64MB'",
}
"""What a primary needs in ``postgresql.conf`` to serve streaming standbys."""

_PATIENCE = 60.0


class Standby(PostgresServer):
    """A streaming replica of ``primary``, made with ``pg_basebackup``; not started yet."""

    def __init__(self, primary: PostgresServer, name: str) -> None:
        self.primary = primary
        self.name = name
        super().__init__(settings=dict(REPLICATION_SETTINGS))
        # The roles and their passwords are the primary's: the data directory is a copy.
        self.password = primary.password
        self.app_password = primary.app_password

    def _initdb(self) -> None:
        conninfo = (
            f"postgresql://{ADMIN_ROLE}:{quote(self.primary.password)}@127.0.0.1:"
            f"{self.primary.port}/postgres"
        )
        backup = [str(self.bindir / "pg_basebackup"), "-d", conninfo, "-D", str(self.datadir)]
        backup += ["-X", "stream", "--checkpoint", "fast", "--no-sync"]
        done = run_as(self.os_user, backup, self.root)
        if done.returncode != 0:
            raise ServerSetupError(f"pg_basebackup failed:\n{done.stdout}\n{done.stderr}")
        (self.datadir / "standby.signal").touch()
        chown(self.datadir / "standby.signal", self.os_user)
        self._conninfo = f"{conninfo}?application_name={self.name}"
        with (self.datadir / "postgresql.conf").open("a") as f:
            f.write(f"\n# dibs.verify.harness: standby {self.name}\n")
            f.write(f"unix_socket_directories = '{self.root}'\n")

    def _write_port(self) -> None:
        # postgresql.auto.conf is rewritten whole: the primary's ALTER SYSTEM
        # settings (synchronous_standby_names) do not come along.
        auto = self.datadir / "postgresql.auto.conf"
        auto.write_text(f"port = {self.port}\nprimary_conninfo = '{self._conninfo}'\n")
        chown(auto, self.os_user)


class ReplicatedCluster:
    """A primary with ``standbys`` streaming replicas, on loopback; started on construction.

    ``synchronous`` sets ``synchronous_standby_names`` on the primary (for
    example ``"ANY 1 (s1, s2)"``, or ``"ghost"`` for a standby that never
    comes, so that every commit waits). ``durable`` turns ``fsync`` and
    ``full_page_writes`` on (see :class:`PostgresServer`); ``settings`` are
    the primary's beyond :data:`REPLICATION_SETTINGS`. Raises
    :class:`ServerSetupError` when a server cannot be set up.
    """

    def __init__(
        self,
        standbys: int = 1,
        *,
        synchronous: str | None = None,
        durable: bool = False,
        settings: dict[str, str] | None = None,
    ) -> None:
        conf = {**REPLICATION_SETTINGS, **(settings or {})}
        self.primary = PostgresServer(settings=conf, durable=durable)
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
        """The primary, then the standbys."""
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
            (ADMIN_ROLE, self.primary.password) if admin else (APP_ROLE, self.primary.app_password)
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
        with connect(server.admin_url) as conn:
            for key, value in settings.items():
                conn.execute(f"ALTER SYSTEM SET {key} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")

        def applied() -> bool:
            with connect(server.admin_url) as conn:
                rows = conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(settings),)
                ).fetchall()
            seen = {str(name): value for name, value in rows}
            return all(seen.get(k) == v for k, v in settings.items())

        wait_for(f"settings {settings} on port {server.port}", applied, _PATIENCE, 0.05)

    def wait_streaming(self, standby: Standby) -> None:
        """Wait until the primary lists ``standby`` as streaming."""
        with connect(self.primary.admin_url) as conn:

            def streaming() -> bool:
                row = conn.execute(
                    "SELECT 1 FROM pg_stat_replication WHERE application_name = %s "
                    "AND state = 'streaming'",
                    (standby.name,),
                ).fetchone()
                return row is not None

            try:
                wait_for(f"standby {standby.name} streaming", streaming, _PATIENCE, 0.05)
            except ServerSetupError as exc:
                raise ServerSetupError(f"{exc}:\n{standby.log_tail()}") from None

    def kill(self, server: PostgresServer) -> None:
        """``kill -9`` of the server's postmaster and every backend, as when its machine dies."""
        pid = server.pid()
        if pid is None:
            return
        signal_all(process_tree(pid), signal.SIGKILL)
        wait_for(f"the server on port {server.port} gone", lambda: server.pid() is None, _PATIENCE)
        server._running = False

    def promote(self, standby: Standby, **settings: str) -> None:
        """Promote ``standby`` and wait until it accepts writes; then apply ``settings``."""
        done = standby.pg_ctl("promote", "-w", "-t", "120")
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
