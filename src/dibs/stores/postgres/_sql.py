"""The PostgreSQL store's schemas and the statements it sends.

The schemas are ``.sql`` files in ``sql/claims`` and ``sql/jobs``, upgraded by
the one runner (:mod:`dibs.stores._migrate`) under an advisory lock. Every
statement names its tables through ``{s}``, the store's schema (a plain
identifier checked by the store).

Locks, in the one order every transaction here takes them (docs/design.md, principle 7):
unit rows in ``(resource, slot)`` order, then span rows in ``(resource,
start)`` order, then claim rows in ``id`` order, then the request row. Names
compare by code point (``COLLATE "C"``), never by the database's collation,
which may differ between databases. A claim takes its targets in that order
because the client sorts them so (Python compares str by code point);
confirm, extend and release lock the claim's unit and span rows before its
claim row;
the sweeper only ever uses ``SKIP LOCKED`` and so never waits. The request row
is the exception: a claim with a request ID takes it first, but only a claim
with the same request ID ever waits on it, and that one holds nothing yet.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from dibs.stores._migrate import Migrations

__all__ = ["CLAIMS", "JOBS", "SCHEMA_VERSION", "Statements", "schema_version", "upgrade"]

CLAIMS = Migrations("dibs.stores.postgres", "claims")
"""The claim tables and functions; their version is ``schema_version`` in ``{s}.meta``."""

JOBS = Migrations("dibs.stores.postgres", "jobs")
"""Durable mode's job tables; their version is ``jobs_schema_version`` in ``{s}.meta``."""

SCHEMA_VERSION = CLAIMS.version
"""The claim schema version this code writes and understands."""

_KEYS = {"claims": "schema_version", "jobs": "jobs_schema_version"}


def schema_version(
    conn: psycopg.Connection[TupleRow], schema: str, migrations: Migrations = CLAIMS
) -> int:
    """The version of ``migrations`` recorded in ``schema`` (0: not there yet)."""
    # An MVCC scan of the catalog, not to_regclass(): the latter goes through a
    # cache that may still say "absent" just after another process created it.
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = 'meta'",
        (schema,),
    ).fetchone()
    if row is None:
        return 0
    found = conn.execute(
        sql.SQL("SELECT value FROM {}.meta WHERE key = %s").format(sql.Identifier(schema)),
        (_KEYS[migrations.name],),
    ).fetchone()
    return int(found[0]) if found else 0


def upgrade(conn: psycopg.Connection[TupleRow], schema: str, migrations: Migrations) -> None:
    """Bring ``migrations`` up to date in ``schema`` and record its version.

    Run inside a transaction holding the schema's advisory lock. Raises
    :class:`~dibs.SchemaError` for a schema newer than this code.
    """
    s = sql.Identifier(schema).as_string(conn)

    def run(script: str) -> None:
        conn.execute(script.replace("{s}", s).encode())

    found = schema_version(conn, schema, migrations)
    if migrations.upgrade(found, run, f"PostgreSQL schema {schema!r}"):
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.meta (key, value) VALUES (%s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"
            ).format(sql.Identifier(schema)),
            (_KEYS[migrations.name], str(migrations.version)),
        )


class Statements:
    """The statements a store sends, rendered once for its schema.

    With ``test_clock`` every statement takes the test clock's time as a
    parameter; otherwise the hot path reads ``clock_timestamp()`` and the
    others pass NULL for it. (Rendered to bytes up front: psycopg would
    re-render a ``sql.Composed`` on every call.)
    """

    def __init__(self, schema: str, *, test_clock: bool) -> None:
        s = sql.Identifier(schema)

        def render(text: str) -> bytes:
            return sql.SQL(text).format(s=s).as_bytes(None)

        self.claim = render(
            "SELECT * FROM {s}.claim(%s, %s, %s, %s, %s, %s, %s, %s::text[], %s::text[], "
            "%s::text[], %s::text[], %s::numeric[], %s::numeric[])"
        )
        # The hot path: one free unit, no request ID. One statement, no PL/pgSQL:
        # the unit insert is the check; the fence is drawn by the claims insert,
        # which reads the unit insert's row, so only after the unit is held.
        # No row back means the unit was occupied: the full function decides.
        # Confirmed claims only (no expiry): the claim is dated by a clock read
        # after the unit insert, which may have waited behind a concurrent
        # release of the unit. A hold's expiry would have to be fixed before
        # that wait, so holds take the claim function, which dates them after.
        now = "%s::timestamptz" if test_clock else "clock_timestamp()"
        stamp = "t.now" if test_clock else "clock_timestamp()"
        self.claim_free_unit = render(
            f"WITH t AS (SELECT {now} AS now), "
            "u AS (INSERT INTO {s}.units (resource, slot, claim_id, expires_at) "
            "SELECT %s, %s, nextval('{s}.claim_ids'), t.now + make_interval(secs => %s::float8) "
            "FROM t ON CONFLICT DO NOTHING RETURNING claim_id, expires_at) "
            "INSERT INTO {s}.claims (id, holder, targets, state, fence, expires_at, "
            "created_at, updated_at) "
            "SELECT u.claim_id, %s, %s, CASE WHEN u.expires_at IS NULL THEN 'confirmed' "
            "ELSE 'held' END, nextval('{s}.fences'), u.expires_at, c.stamp, c.stamp "
            # LATERAL on u's row: the clock is read once u's insert has happened.
            f"FROM u, t, LATERAL (SELECT {stamp} AS stamp WHERE u.claim_id IS NOT NULL) c "
            "RETURNING id, fence, expires_at, created_at"
        )
        self.transition = render("SELECT * FROM {s}.transition(%s, %s, %s, %s, %s, %s)")
        self.sweep = render("SELECT * FROM {s}.sweep(%s, %s, %s)")
        self.get = render(
            "SELECT id, holder, targets, state, fence, expires_at, taken_over, request_id, "
            "created_at, updated_at, coalesce(%s, clock_timestamp()) "
            "FROM {s}.claims WHERE id = %s"
        )
        self.log = render(
            "SELECT id, holder, targets, state, fence, expires_at, taken_over, request_id, "
            "created_at, updated_at FROM {s}.claims ORDER BY fence"
        )
        self.claims_of = render(
            "WITH t AS (SELECT coalesce(%s, clock_timestamp()) AS now) "
            "SELECT id, holder, targets, state, fence, expires_at, taken_over, request_id, "
            "created_at, updated_at, t.now FROM {s}.claims c, t WHERE c.holder = %s "
            "AND (c.state = 'confirmed' OR (c.state = 'held' AND c.expires_at > t.now)) "
            "ORDER BY c.fence"
        )
        self.holder_of_unit = render(
            "SELECT c.holder FROM {s}.units u JOIN {s}.claims c ON c.id = u.claim_id "
            "WHERE u.resource = %s AND u.slot = %s "
            "AND (u.expires_at IS NULL OR u.expires_at > coalesce(%s, clock_timestamp()))"
        )
        self.holder_of_span = render(
            "SELECT c.holder FROM {s}.spans x JOIN {s}.claims c ON c.id = x.claim_id "
            "WHERE x.resource = %s AND x.kind = %s AND x.span && numrange(%s, %s, '[)') "
            "AND (x.expires_at IS NULL OR x.expires_at > coalesce(%s, clock_timestamp())) "
            "LIMIT 1"
        )
