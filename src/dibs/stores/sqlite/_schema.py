"""The SQLite store's schemas (claims, jobs), upgraded by the one runner in ``dibs_meta``."""

from __future__ import annotations

import sqlite3

from dibs.stores._migrate import Migrations, sql_statements

__all__ = ["CLAIMS", "JOBS", "upgrade"]

CLAIMS = Migrations("dibs.stores.sqlite", "claims")
"""The claim tables; their version is ``schema_version`` in ``dibs_meta``."""

JOBS = Migrations("dibs.stores.sqlite", "jobs")
"""Durable mode's job tables; their version is ``jobs_schema_version`` in ``dibs_meta``."""

_KEYS = {"claims": "schema_version", "jobs": "jobs_schema_version"}


def upgrade(conn: sqlite3.Connection, schema: Migrations, where: str) -> None:
    """Bring ``schema`` up to date on ``conn``, which must be inside ``BEGIN IMMEDIATE``.

    The write lock serializes processes opening the file at once. Raises
    :class:`~dibs.SchemaError` for a schema newer than this code.
    """
    key = _KEYS[schema.name]
    has_meta = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dibs_meta'"
    ).fetchone()
    row = (
        conn.execute("SELECT value FROM dibs_meta WHERE key = ?", (key,)).fetchone()
        if has_meta
        else None
    )

    def run(script: str) -> None:
        # executescript() would COMMIT first; run the DDL inside our transaction.
        for statement in sql_statements(script):
            conn.execute(statement)

    if schema.upgrade(0 if row is None else int(row[0]), run, repr(where)):
        conn.execute(
            "CREATE TABLE IF NOT EXISTS dibs_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) "
            "WITHOUT ROWID"
        )
        conn.execute(
            "INSERT INTO dibs_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, str(schema.version)),
        )
