"""Throwaway servers on loopback: PostgreSQL, streaming standbys, Patroni and etcd clusters.

The one harness behind ``dibs verify --cluster`` and dibs's own tests and
benchmarks. Every server lives in a fresh temporary directory, listens on
free ports of ``127.0.0.1`` only, runs as an unprivileged OS user when this
process is root (PostgreSQL refuses root), and is killed and deleted by its
``close()`` or context manager, and by a reaper when this process dies
without closing it (SIGTERM, SIGKILL).

* :class:`PostgresServer` — one server: ``initdb``, roles, ``btree_gist``,
  ``create_database()``, ``stop``/``start``/``restart``.
* :class:`ReplicatedCluster` — a primary and streaming :class:`Standby`
  servers (``pg_basebackup``); ``configure()``, ``kill()``, ``promote()``.
* :class:`EtcdCluster` — etcd members (:class:`EtcdMember`); ``kill``,
  ``restart``, ``pause``, ``resume`` and ``leader`` by member index.
* :class:`PostgresHA` — PostgreSQL under Patroni over a private etcd,
  ``fail_primary()``: the ``postgresql-ha`` cluster of ``dibs verify``.

The servers come from Debian's packages (``postgresql``, ``etcd-server``,
``patroni``). The harness installs nothing: a missing one is a
:class:`ServerSetupError` naming the package and the repository script that
installs it. Only when ``$DIBS_HARNESS_ENSURE`` names a directory of those
scripts (the tests set it to ``scripts/``) does it run the one that is needed.

``python -m dibs.verify.harness postgresql`` starts a server by hand (also
``replicated N``, ``etcd N``, ``postgresql-ha``), prints its URL, and removes
it on Ctrl-C. Needs the ``postgres`` extra for PostgreSQL.
"""

from __future__ import annotations

from dibs.verify.harness._etcd import EtcdCluster, EtcdMember, etcd_binary
from dibs.verify.harness._patroni import REPLICATION, PostgresHA
from dibs.verify.harness._postgres import ADMIN_ROLE, APP_ROLE, PostgresServer, find_pg_bindir
from dibs.verify.harness._process import (
    ServerSetupError,
    free_ports,
    process_tree,
    server_os_user,
    wait_for,
)
from dibs.verify.harness._reaper import reap_when_gone
from dibs.verify.harness._replication import REPLICATION_SETTINGS, ReplicatedCluster, Standby

__all__ = [
    "ADMIN_ROLE",
    "APP_ROLE",
    "REPLICATION",
    "REPLICATION_SETTINGS",
    "EtcdCluster",
    "EtcdMember",
    "PostgresHA",
    "PostgresServer",
    "ReplicatedCluster",
    "ServerSetupError",
    "Standby",
    "etcd_binary",
    "find_pg_bindir",
    "free_ports",
    "process_tree",
    "reap_when_gone",
    "server_os_user",
    "wait_for",
]
