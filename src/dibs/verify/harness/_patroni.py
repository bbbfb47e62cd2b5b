"""``postgresql-ha``: PostgreSQL 15 with two streaming standbys, managed by Patroni over etcd.

Three members on 127.0.0.1, each a Patroni 3 agent (Debian's ``patroni``)
running its own PostgreSQL from Debian's binaries, with a private 3-member
etcd (:class:`~dibs.verify.harness.EtcdCluster`) as Patroni's store (its
``etcd3`` DCS). Clients reach whichever member is primary with one libpq
multi-host URL and ``target_session_attrs=read-write``; libpq tries the hosts
in turn.

Replication (``replication=``):

* ``"sync"`` — Patroni's ``synchronous_mode`` with ``synchronous_node_count``
  1: the primary names one of its two standbys in
  ``synchronous_standby_names``, a commit returns only once that standby has
  flushed it, and Patroni promotes only that standby (the one it records in
  etcd). If the named standby is lost, Patroni names the other. (Quorum
  commit, ``ANY 1 (a, b)`` managed by Patroni, came in Patroni 4; 3.0 names one.)
* ``"async"`` — the misconfiguration: no synchronous standby, and Patroni's
  guard against promoting a lagging standby (``maximum_lag_on_failover``,
  1 MiB by default) lifted, as a user who raised it to "always fail over"
  would. A failover then loses whatever the new primary had not received.

The failover fault (:meth:`PostgresHA.fail_primary`) kills the primary's
whole member, Patroni agent and PostgreSQL alike, with ``kill -9``: its
machine dies. (Killing only the postmaster is no failover: Patroni restarts it
in place as primary while it holds the leader key.) With ``lag`` it first
stops (SIGSTOP) every standby's WAL receiver for that many seconds and kills
them with the primary, so that what they had not received dies with them:
every run, the standbys are behind when the primary dies. Synchronous
replication must lose nothing even so: the commits of that window wait,
unacknowledged, for a standby that never confirms them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import time
import urllib.error
import urllib.request
from functools import partial
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

from dibs.verify.harness._etcd import EtcdCluster
from dibs.verify.harness._postgres import connect, find_pg_bindir
from dibs.verify.harness._process import (
    Process,
    ServerSetupError,
    chown,
    find_program,
    free_ports,
    make_root,
    process_tree,
    server_env,
    server_os_user,
    signal_all,
    wait_for,
)
from dibs.verify.harness._reaper import reap_when_gone

__all__ = ["REPLICATION", "PostgresHA"]

REPLICATION = ("sync", "async")

ADMIN, APP, REPLICATOR = "dibs_admin", "dibs_app", "replicator"
DBNAME = "dibs"

_TTL, _LOOP_WAIT, _RETRY_TIMEOUT = 6, 1, 2
"""Patroni's leader key lives ``_TTL`` s unrenewed; agents loop every ``_LOOP_WAIT`` s.
Patroni's rule: ``loop_wait + 2 * retry_timeout <= ttl``."""


class PostgresHA:
    """A Patroni-managed PostgreSQL primary with two standbys, and the etcd it runs on."""

    def __init__(
        self, *, replication: str = "sync", members: int = 3, durable: bool = False
    ) -> None:
        """``durable``: keep ``fsync`` and ``full_page_writes`` on, as a production server
        would (``dibs doctor`` flags them off); the verify runs turn them off, since a
        killed process loses nothing the OS keeps, to spare the shared machine's disk."""
        if replication not in REPLICATION:
            raise ValueError(f"replication must be one of {REPLICATION}, got {replication!r}")
        self.replication = replication
        self.durable = durable
        self.patroni = find_program("patroni", "patroni", "cluster-ensure.sh")
        self.bindir = find_pg_bindir()
        self.user = server_os_user()
        self.root = make_root("dibs-pgha-", self.user, "/tmp")
        # Killed without close() (SIGTERM, SIGKILL), the run leaves no server and no directory.
        self._reaper = reap_when_gone(self.root)
        self.admin_password = secrets.token_hex(12)
        self.app_password = secrets.token_hex(12)
        self.repl_password = secrets.token_hex(12)
        self.etcd = EtcdCluster(3, root=self.root, name="dcs")
        ports = free_ports(2 * members)
        self.pg_ports, self.rest_ports = ports[:members], ports[members:]
        env = server_env(self.root, self.user, ("PG", "PYTHON"))
        self.members: list[Process] = []
        for i in range(members):
            config = self.root / f"pg{i}.yml"
            member = Process(f"pg{i}", [self.patroni, str(config)], self.root, env, self.user)
            member.log.touch()
            chown(member.log, self.user)
            self.members.append(member)

    # --- configuration --------------------------------------------------------------------------

    def _config(self, i: int) -> dict[str, Any]:
        name = f"pg{i}"
        sync = self.replication == "sync"
        dcs: dict[str, Any] = {
            "ttl": _TTL,
            "loop_wait": _LOOP_WAIT,
            "retry_timeout": _RETRY_TIMEOUT,
            "synchronous_mode": sync,
            "synchronous_node_count": 1,
            "postgresql": {
                "use_pg_rewind": False,
                "use_slots": True,
                "parameters": {
                    "max_connections": 200,
                    "max_wal_senders": 10,
                    "max_replication_slots": 10,
                    "wal_keep_size": "256MB",
                    "hot_standby": "on",
                    "wal_level": "replica",
                },
            },
        }
        if not sync:
            dcs["maximum_lag_on_failover"] = 1 << 40  # the misconfiguration: any lag fails over
        return {
            "scope": f"dibs-verify-{os.getpid()}",
            "name": name,
            "log": {"level": "WARNING"},
            "restapi": {
                "listen": f"127.0.0.1:{self.rest_ports[i]}",
                "connect_address": f"127.0.0.1:{self.rest_ports[i]}",
            },
            "etcd3": {"hosts": self.etcd.endpoints},
            "bootstrap": {
                "dcs": dcs,
                "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_ports[i]}",
                "connect_address": f"127.0.0.1:{self.pg_ports[i]}",
                "data_dir": str(self.root / f"{name}.data"),
                "bin_dir": str(self.bindir),
                "pgpass": str(self.root / f"{name}.pgpass"),
                # pg_basebackup's default spread checkpoint takes minutes on an idle primary.
                "basebackup": [{"checkpoint": "fast"}],
                "authentication": {
                    "superuser": {"username": ADMIN, "password": self.admin_password},
                    "replication": {"username": REPLICATOR, "password": self.repl_password},
                },
                "parameters": {
                    "unix_socket_directories": str(self.root),
                    "shared_buffers": "64MB",
                    "log_min_messages": "warning",
                    **self._durability(),
                },
                "pg_hba": [
                    "local all all trust",
                    f"host replication {REPLICATOR} 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }

    def _durability(self) -> dict[str, str]:
        if self.durable:
            return {}
        # Data survive a killed process (the OS keeps them), not a machine crash:
        # enough here, and far lighter on a shared CI machine.
        return {"fsync": "off", "full_page_writes": "off"}

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, patience: float = 120.0) -> None:
        """Start etcd, the first member (it bootstraps), then the standbys; wait until healthy."""
        try:
            self.etcd.start()
            for i, m in enumerate(self.members):
                # Written once etcd is up: a start on fresh ports changes its endpoints.
                config = self.root / f"{m.name}.yml"
                config.write_text(json.dumps(self._config(i), indent=1))  # JSON is YAML
                chown(config, self.user)
            self.members[0].start()
            wait_for("pg0 to lead", partial(self._is_role, 0, "primary"), patience)
            self._create_database()
            for m in self.members[1:]:
                m.start()
            for i in range(1, len(self.members)):
                wait_for(f"pg{i} a standby", partial(self._is_role, i, "replica"), patience)
            wait_for("the standbys streaming", lambda: self._streaming() >= 2, patience)
            if self.replication == "sync":
                wait_for("a synchronous standby", self._sync_standby, patience)
        except BaseException:
            tails = "\n".join(f"--- {m.name}\n{m.log_tail()}" for m in self.members)
            self.close()
            raise ServerSetupError(f"postgresql-ha did not start:\n{tails}") from None

    def close(self) -> None:
        """Kill every member and etcd, and delete the directory; safe to call twice."""
        for m in self.members:
            m.resume()
            m.kill()
        self._kill_strays()
        self.etcd.close()
        shutil.rmtree(self.root, ignore_errors=True)
        self._reaper.close()

    def _kill_strays(self) -> None:
        """Any postgres left running from this cluster's data directories (an orphaned one)."""
        for i in range(len(self.members)):
            self._kill_strays_of(i)

    def _kill_strays_of(self, i: int) -> None:
        pidfile = self.root / f"pg{i}.data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().split("\n", 1)[0])
            signal_all(process_tree(pid), signal.SIGKILL)

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

    # --- URLs -----------------------------------------------------------------------------------

    def _hosts(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.pg_ports)

    def url(self, *, admin: bool = False, dbname: str = DBNAME) -> str:
        """The libpq multi-host URL of the primary, whichever member it is."""
        role, pw = (ADMIN, self.admin_password) if admin else (APP, self.app_password)
        return (
            f"postgresql://{role}:{quote(pw)}@{self._hosts()}/{dbname}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def member_url(self, i: int) -> str:
        """The superuser's URL of member ``i`` alone (primary or standby)."""
        return (
            f"postgresql://{ADMIN}:{quote(self.admin_password)}@127.0.0.1:{self.pg_ports[i]}"
            f"/postgres?connect_timeout=2"
        )

    # --- state ----------------------------------------------------------------------------------

    def _rest(self, i: int, path: str, timeout: float = 1.0) -> tuple[int, dict[str, Any]]:
        url = f"http://127.0.0.1:{self.rest_ports[i]}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            return exc.code, json.loads(body) if body.startswith(b"{") else {}

    def _role(self, i: int) -> str | None:
        if not self.members[i].alive:
            return None
        try:
            status, body = self._rest(i, "/patroni")
        except (OSError, ValueError):
            return None
        if status != 200 or body.get("state") != "running":
            return None
        role = body.get("role")
        return "primary" if role in ("master", "primary") else str(role)

    def _is_role(self, i: int, role: str) -> bool:
        return self._role(i) == role

    def primary(self) -> int | None:
        """The index of the member that runs as primary now, or None."""
        found = [i for i in range(len(self.members)) if self._role(i) == "primary"]
        return found[0] if len(found) == 1 else None

    def _streaming(self) -> int:
        p = self.primary()
        if p is None:
            return 0
        _, body = self._rest(p, "/patroni")
        names = {m.name for m in self.members}
        return sum(
            1
            for r in body.get("replication", [])
            if r.get("state") == "streaming" and r.get("application_name") in names
        )

    def _sync_standby(self) -> bool:
        p = self.primary()
        if p is None:
            return False
        _, body = self._rest(p, "/patroni")
        return any(r.get("sync_state") == "sync" for r in body.get("replication", []))

    def _create_database(self) -> None:
        conn = wait_for(
            "the primary accepting connections",
            lambda: connect(self.url(admin=True, dbname="postgres")),
            60.0,
        )
        with conn:
            conn.execute(f"CREATE ROLE {APP} LOGIN PASSWORD '{self.app_password}'")  # hex
            conn.execute(f"CREATE DATABASE {DBNAME} OWNER {APP}")
        with connect(self.url(admin=True)) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")

    def wal_receivers(self, i: int) -> list[int]:
        """The process IDs of member ``i``'s WAL receiver (a standby has one)."""
        with connect(self.member_url(i)) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver'"
            ).fetchall()
        return [int(r[0]) for r in rows]

    # --- the failover fault ---------------------------------------------------------------------

    def fail_primary(
        self, *, lag: float = 0.0, record: Any = None, patience: float = 120.0
    ) -> dict[str, Any]:
        """Kill the primary's member with ``kill -9``; return once another member is primary.

        With ``lag`` > 0 every standby's WAL receiver is stopped that many
        seconds before the kill and killed with it (see the module's text).
        ``record(event)``, if given, is called with each step as it happens.
        Returns the old and new primary's index and the seconds between the
        kill and the promotion Patroni reported.
        """
        note = record if record is not None else (lambda event: None)
        old = self._wait_primary("a primary to fail", patience)
        stopped: list[int] = []
        if lag > 0:
            for i, m in enumerate(self.members):
                if i != old and m.alive:
                    stopped += self.wal_receivers(i)
            signal_all(stopped, signal.SIGSTOP)
            note({"f": "standbys-behind", "receivers": len(stopped), "seconds": lag})
            time.sleep(lag)
        self.members[old].kill()
        self._kill_strays_of(old)
        killed = time.monotonic()
        note({"f": "failover", "member": f"pg{old}"})
        # What the stopped receivers had not written dies with them.
        signal_all(stopped, signal.SIGKILL)
        signal_all(stopped, signal.SIGCONT)
        new = self._wait_primary("Patroni to promote a standby", patience, not_=old)
        promoted = time.monotonic() - killed
        note({"f": "promoted", "member": f"pg{new}", "seconds": round(promoted, 3)})
        return {"old": old, "new": new, "promoted_after": promoted}

    def _wait_primary(self, what: str, patience: float, *, not_: int | None = None) -> int:
        """Wait until one member (other than ``not_``) runs as primary; its index."""

        def probe() -> int | None:
            p = self.primary()
            return None if p is None or p == not_ else p + 1  # index 0 is falsy

        index: int = wait_for(what, probe, patience, interval=0.05) - 1
        return index
