"""PostgreSQL for the test session: a private server, or ``$DIBS_TEST_PG_URL``.

Without ``DIBS_TEST_PG_URL`` the first test that needs PostgreSQL starts a
throwaway server (:class:`dibs.verify.harness.PostgresServer`; tests/conftest.py
lets the harness run ``scripts/pg-ensure.sh`` when the machine has none) and the
session stops and deletes it at the end. Either way the session works in a fresh database, and
every store gets a fresh schema in it. Nothing here ever skips.
"""

from __future__ import annotations

import atexit
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from dibs.verify.harness import PostgresServer

__all__ = [
    "drop_schema",
    "pg_admin_url",
    "pg_schema_url",
    "pg_url",
    "private_pg_server",
    "schema_url",
    "session_database",
]


class _Session:
    """The session's database: its URL, a superuser-ish URL, and how to clean up."""

    def __init__(self) -> None:
        self.server: PostgresServer | None = None
        self.dropped_db: str | None = None
        external = os.environ.get("DIBS_TEST_PG_URL")
        if external:
            self.url, self.admin_url = self._fresh_database_on(external)
        else:
            self.server = PostgresServer()
            self.server.start()
            self.url = self.server.create_database()
            self.admin_url = self.server.admin_url

    def _fresh_database_on(self, url: str) -> tuple[str, str]:
        name = f"dibs_test_{secrets.token_hex(4)}"
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
        except psycopg.errors.InsufficientPrivilege:
            return url, url  # no CREATEDB: share the given database; schemas keep tests apart
        self.dropped_db = name
        parts = urlsplit(url)
        fresh = urlunsplit(parts._replace(path=f"/{name}"))
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        self._external_admin = url
        return fresh, url

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        elif self.dropped_db is not None:
            with psycopg.connect(self._external_admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {self.dropped_db} WITH (FORCE)")


_session: _Session | None = None
_session_lock = threading.Lock()  # guards _session


def session_database() -> tuple[str, str]:
    """Return (app URL, admin URL) of the session's database, starting it on first use."""
    global _session
    with _session_lock:
        if _session is None:
            _session = _Session()
            atexit.register(_close_session)
        return _session.url, _session.admin_url


def _close_session() -> None:
    global _session
    with _session_lock:
        if _session is not None:
            session, _session = _session, None
            session.close()


def schema_url(url: str, schema: str | None = None) -> str:
    """``url`` with a ``schema=`` option naming a fresh (or the given) dibs schema."""
    schema = schema or f"t_{secrets.token_hex(6)}"
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


def drop_schema(url: str, schema: str) -> None:
    """Drop a dibs schema from the database at ``url``."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The session database's URL (a role without superuser rights when we started it)."""
    url, _ = session_database()
    yield url
    _close_session()


@pytest.fixture(scope="session")
def pg_admin_url(pg_url: str) -> str:
    """A URL whose role may create databases and signal backends."""
    return session_database()[1]


@pytest.fixture
def pg_schema_url(pg_url: str) -> Iterator[str]:
    """A store URL in a fresh schema of the session database, dropped afterwards."""
    schema = f"t_{secrets.token_hex(6)}"
    yield schema_url(pg_url, schema)
    drop_schema(pg_url, schema)


@pytest.fixture
def private_pg_server() -> Iterator[PostgresServer]:
    """A server of this test's own, to restart or crash at will (always local)."""
    with PostgresServer() as server:
        yield server


def lock_waiters(watch: psycopg.Connection[Any], application_name: str) -> int:
    """How many sessions named ``application_name`` wait for a lock now (pg_stat_activity):
    how interleaving tests see a statement parked inside another's window, never by time."""
    row = watch.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = %s",
        (application_name,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def answer_in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` on a started thread; its answer (or the exception it raised) lands in
    the returned list, for the caller to check once the thread is joined."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # the answer under test, checked by the caller
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out
