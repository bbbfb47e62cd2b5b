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


REPLICATED = (
    "(current_setting('synchronous_standby_names') = '' "
    "OR current_setting('synchronous_commit') IN ('off', 'local') "
    "OR pg_logical_emit_message(true, 'dibs', '') IS NOT NULL)"
)
"""A condition that is always true, and with synchronous standbys writes a transactional
WAL message: it gives the statement's transaction an ID and a commit record, written
after every commit the statement saw, so that its commit waits until the synchronous
standbys have all of them. An answer read from another commit (a replay, a confirm
already done) must not be acknowledged while the primary alone has that commit: its
wait for the standbys may have been cancelled, or still be under way in another
session. Without synchronous standbys it writes nothing."""


class Statements:
    """The statements a store sends, rendered once for its schema.

    With ``test_clock`` every statement takes the test clock's time as the
    parameter ``now``; otherwise they read ``clock_timestamp()``. (Rendered to
    bytes up front: psycopg would re-render a ``sql.Composed`` on every call.)

    The hot path is plain SQL: a single-unit claim, confirm, extend and
    release are each one statement on the unit row, which is the claim
    (schema version 4). What they cannot settle (a live claim in the way, a
    group or span claim, a request ID seen before, a claim that is not the
    caller's live hold) they leave to the functions ``claim_v4`` and
    ``transition_v4``, and say so by answering no row.
    """

    def __init__(self, schema: str, *, test_clock: bool) -> None:
        s = sql.Identifier(schema)
        now = "%(now)s::timestamptz" if test_clock else "clock_timestamp()"

        def render(text: str) -> bytes:
            return sql.SQL(text.replace("NOW", now)).format(s=s).as_bytes(None)

        self.claim = render(
            "SELECT * FROM {s}.claim_v4(%(holder)s, %(targets)s, %(ttl)s, %(rid)s, %(fp)s, "
            "%(now)s, %(retention)s, %(ures)s::text[], %(uslot)s::text[], %(sres)s::text[], "
            "%(skind)s::text[], %(slo)s::numeric[], %(shi)s::numeric[], %(mode)s, %(undo)s) "
            f"WHERE {REPLICATED}"  # a replay, a recorded refusal: see REPLICATED
        )
        # One unit, in one statement. A replay of a live request is a plain
        # read (nothing is written: no WAL, no commit record), except with
        # synchronous standbys: then REPLICATED makes its commit wait for them. A unit never
        # claimed (or purged) is one INSERT against the primary key, the check;
        # the claim ID and fence are drawn only when the snapshot shows the
        # unit free, and an insert racing a first attempt in flight waits on
        # the unique index, then does nothing. A unit whose claim was released,
        # or whose hold died, answers "reuse": claim_reuse then replaces it.
        # No row back: the function decides (a live claim in the way, a
        # request ID seen before, a dead group member, a lost race).
        seen = (
            "seen AS (SELECT u.id, u.holder, u.state, u.fence, u.expires_at, u.taken_over, "
            "u.fingerprint, u.created_at, u.updated_at, u.resource, u.slot "
            "FROM {s}.units_v4 u WHERE u.request_id = %(rid)s AND u.fingerprint IS NOT NULL)"
        )
        self.claim_unit = render(
            f"WITH {seen}, "
            "o AS (SELECT u.state, u.expires_at FROM {s}.units_v4 u "
            "WHERE u.resource = %(r)s AND u.slot = %(sl)s), "
            "f AS (SELECT nextval('{s}.claim_ids') AS id, nextval('{s}.fences') AS v, NOW AS n "
            "WHERE NOT EXISTS (SELECT 1 FROM seen) AND NOT EXISTS (SELECT 1 FROM o)), "
            "ins AS (INSERT INTO {s}.units_v4 (resource, slot, id, holder, state, fence, "
            "expires_at, request_id, fingerprint, created_at, updated_at) "
            "SELECT %(r)s, %(sl)s, f.id, %(h)s, %(st)s, f.v, "
            "f.n + make_interval(secs => %(ttl)s), %(rid)s, %(fp)s, f.n, f.n "
            "FROM f ON CONFLICT DO NOTHING RETURNING id, state, fence, expires_at, created_at) "
            "SELECT 'new', id, state, fence, expires_at, created_at, NULL::text, NULL::text, "
            "NULL::boolean, NULL::timestamptz, NULL::timestamptz FROM ins "
            "UNION ALL SELECT 'replay', seen.id, seen.state, seen.fence, seen.expires_at, "
            "seen.created_at, seen.holder, seen.fingerprint, seen.taken_over, seen.updated_at, "
            "NOW FROM seen WHERE seen.state <> 'request' AND seen.resource = %(r)s "
            "AND seen.slot = %(sl)s "
            "AND seen.created_at > NOW - make_interval(secs => %(retention)s) "
            f"AND {REPLICATED} "
            "UNION ALL SELECT 'reuse', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL "
            "FROM o WHERE NOT EXISTS (SELECT 1 FROM seen) "
            "AND (o.state IN ('released', 'free', 'expired') "
            "OR (o.state = 'held' AND o.expires_at <= NOW))"
        )
        # The same without a request ID, the most common claim: the INSERT
        # alone (about half the server time of the statement above). No row
        # back: the unit's row exists, and claim_reuse or the function decides.
        self.claim_fresh = render(
            "INSERT INTO {s}.units_v4 (resource, slot, id, holder, state, fence, expires_at, "
            "created_at, updated_at) SELECT %(r)s, %(sl)s, nextval('{s}.claim_ids'), %(h)s, "
            "%(st)s, nextval('{s}.fences'), t.n + make_interval(secs => %(ttl)s), t.n, t.n "
            "FROM (SELECT NOW AS n) t WHERE NOT EXISTS (SELECT 1 FROM {s}.units_v4 u "
            "WHERE u.resource = %(r)s AND u.slot = %(sl)s) ON CONFLICT DO NOTHING "
            "RETURNING 'new', id, state, fence, expires_at, created_at, NULL::text, NULL::text, "
            "NULL::boolean, NULL::timestamptz, NULL::timestamptz"
        )
        # A unit whose claim was released, or whose hold died: one UPDATE
        # conditional on the claim observed there (its ID and fence, and that
        # it is still released or dead: re-checked under the row lock), which
        # copies that claim into claims_v4 (released, or expired and taken
        # over) and its live request ID into a reservation row. The fence is
        # drawn after that claim's, which is the row's latest.
        self.claim_reuse = render(
            f"WITH {seen}, "
            "o AS (SELECT u.id, u.holder, u.state, u.fence, u.expires_at, u.request_id, "
            "u.fingerprint, u.created_at, u.updated_at FROM {s}.units_v4 u "
            "WHERE u.resource = %(r)s AND u.slot = %(sl)s AND NOT EXISTS (SELECT 1 FROM seen) "
            "AND (u.state IN ('released', 'free', 'expired') "
            "OR (u.state = 'held' AND u.expires_at <= NOW)) FOR UPDATE OF u), "
            # f reads the clock only once o holds the row lock: a claim that waited
            # for it (behind a sweep's batch, say) is stamped after the wait, never
            # before a change it could not see.
            "f AS (SELECT nextval('{s}.claim_ids') AS id, nextval('{s}.fences') AS v, NOW AS n "
            "FROM o), "
            "up AS (UPDATE {s}.units_v4 x SET id = f.id, holder = %(h)s, state = %(st)s, "
            "fence = f.v, expires_at = f.n + make_interval(secs => %(ttl)s), taken_over = false, "
            "request_id = %(rid)s, fingerprint = %(fp)s, taken = NULL, created_at = f.n, "
            "updated_at = f.n FROM o, f WHERE x.resource = %(r)s AND x.slot = %(sl)s "
            "AND x.id = o.id AND x.fence = o.fence "
            "AND (x.state IN ('released', 'free', 'expired') "
            "OR (x.state = 'held' AND x.expires_at <= f.n)) "
            "RETURNING x.id, x.state, x.fence, x.expires_at, x.created_at, f.n, o.id AS oid, "
            "o.holder AS oholder, o.state AS ostate, o.fence AS ofence, o.expires_at AS oexp, "
            "o.request_id AS orid, o.fingerprint AS ofp, o.created_at AS ocreated, "
            "o.updated_at AS oupdated), "
            "arch AS (INSERT INTO {s}.claims_v4 (id, holder, targets, state, fence, expires_at, "
            "taken_over, request_id, created_at, updated_at) SELECT up.oid, up.oholder, "
            "jsonb_build_array(jsonb_build_array('u', %(r)s::text, %(sl)s::text))::text, "
            "CASE WHEN up.ostate = 'released' THEN 'released' ELSE 'expired' END, up.ofence, "
            "up.oexp, up.ostate <> 'released', up.orid, up.ocreated, "
            "CASE WHEN up.ostate = 'released' THEN up.oupdated ELSE up.n END "
            "FROM up WHERE up.ostate <> 'free' ON CONFLICT (id) DO NOTHING), "
            "res AS (INSERT INTO {s}.units_v4 (resource, slot, id, state, fence, request_id, "
            "fingerprint, created_at, updated_at) SELECT '', up.orid, up.oid, 'request', 0, "
            "up.orid, up.ofp, up.ocreated, up.ocreated FROM up "
            "WHERE up.ofp IS NOT NULL AND up.ostate <> 'free' ON CONFLICT DO NOTHING) "
            # A new claim's fingerprint column carries the ID of the dead hold
            # it took over (None after a release), for the store's DEBUG log.
            "SELECT 'new', id, state, fence, expires_at, created_at, NULL::text, "
            "CASE WHEN up.ostate IN ('held', 'expired') THEN up.oid::text END, "
            "NULL::boolean, NULL::timestamptz, NULL::timestamptz FROM up"
        )
        # Confirm, extend and release of a single-unit claim: one UPDATE of its
        # row, conditional on its holder, fence and liveness (re-checked under
        # the row lock). Each keeps the row's indexed columns, so it is a HOT
        # update. No row back: transition_v4 says why (or handles a group).
        # One clock read per statement (t.n), so that updated_at, expires_at
        # and the liveness check agree. Under a wait for the row, PostgreSQL
        # re-checks the conditions on the new row: a takeover, a release or a
        # sweep that changed it makes them fail; only the holder's own
        # concurrent extend leaves it held and live. (A statement that finds
        # the hold dead takes no lock: transition_v4 then judges the loss
        # under the row lock, so it waits for a takeover in flight and
        # answers taken_over, never an 'expired' dated after its stamp.)
        # The row is found by its claim ID alone: the holder is compared in the
        # "C" collation (byte-wise, as every deterministic collation compares
        # for equality), which the holder index cannot serve, so no plan reads
        # the holder's claims one by one. Without the table's statistics (a new
        # or busy table that autovacuum has not analyzed yet) the planner
        # preferred that index: a confirm read every row of its holder (issue 27).
        mine = 'u.id = %(id)s AND u.holder = %(h)s COLLATE "C" AND u.fence = %(f)s'
        self.confirm = render(
            "UPDATE {s}.units_v4 u SET state = 'confirmed', expires_at = NULL, updated_at = t.n "
            "FROM (SELECT NOW AS n) t "
            f"WHERE {mine} AND u.state = 'held' "
            "AND u.expires_at > t.n "
            "RETURNING u.resource, u.slot, u.request_id, u.created_at, u.updated_at"
        )
        self.extend = render(
            "UPDATE {s}.units_v4 u SET expires_at = t.n + make_interval(secs => %(ttl)s), "
            "updated_at = t.n FROM (SELECT NOW AS n) t "
            f"WHERE {mine} AND u.state = 'held' "
            "AND u.expires_at > t.n "
            "RETURNING u.resource, u.slot, u.request_id, u.created_at, u.updated_at, u.expires_at"
        )
        self.release = render(
            "UPDATE {s}.units_v4 u SET state = 'released', expires_at = NULL, updated_at = t.n "
            "FROM (SELECT NOW AS n) t "
            f"WHERE {mine} "
            "AND (u.state = 'confirmed' OR (u.state = 'held' AND u.expires_at > t.n)) "
            "RETURNING true"
        )
        self.transition = render(
            "SELECT * FROM {s}.transition_v4(%(op)s, %(id)s, %(h)s, %(f)s, %(ttl)s, %(now)s) "
            # A retried confirm or release that finds its first attempt done writes
            # nothing, and answers from a commit the standbys may lack: see REPLICATED.
            f"WHERE {REPLICATED}"
        )
        self.sweep = render("SELECT * FROM {s}.sweep_v4(%(now)s, %(retention)s, %(batch)s)")
        cols = (
            "id, holder, targets, state, fence, expires_at, taken_over, request_id, "
            "created_at, updated_at"
        )
        unit_cols = (
            "u.id, u.holder, jsonb_build_array(jsonb_build_array('u', u.resource, u.slot))::text, "
            "u.state, u.fence, u.expires_at, u.taken_over, u.request_id, u.created_at, "
            "u.updated_at"
        )
        # Each claim's mode comes last ('exclusive', or 'shared': schema version 5).
        self.get = render(f"SELECT {cols}, NOW, mode FROM {{s}}.claim_by_id_v4(%(id)s)")
        self.log = render(
            f"SELECT {unit_cols}, 'exclusive' FROM {{s}}.units_v4 u "
            "WHERE u.state IN ('held', 'confirmed', 'released', 'expired') "
            f"UNION ALL SELECT {cols}, coalesce(mode, 'exclusive') FROM {{s}}.claims_v4 "
            "ORDER BY 5"
        )
        self.claims_of = render(
            f"WITH t AS (SELECT NOW AS now) SELECT {unit_cols}, t.now, 'exclusive' "
            "FROM {s}.units_v4 u, t WHERE u.holder = %(h)s "
            "AND (u.state = 'confirmed' OR (u.state = 'held' AND u.expires_at > t.now)) "
            "UNION ALL SELECT c.id, c.holder, c.targets, c.state, c.fence, c.expires_at, "
            "c.taken_over, c.request_id, c.created_at, c.updated_at, t.now, "
            "coalesce(c.mode, 'exclusive') "
            "FROM {s}.claims_v4 c, t WHERE c.holder = %(h)s "
            "AND (c.state = 'confirmed' OR (c.state = 'held' AND c.expires_at > t.now)) "
            "ORDER BY 5"
        )
        # A marker (id 0: readers there) names one live reader.
        self.holder_of_unit = render(
            "SELECT coalesce(u.holder, c.holder, (SELECT rc.holder FROM {s}.readers_v5 r "
            "JOIN {s}.claims_v4 rc ON rc.id = r.claim_id WHERE u.id = 0 "
            "AND r.resource = u.resource AND r.slot = u.slot AND (rc.state = 'confirmed' "
            "OR (rc.state = 'held' AND rc.expires_at > NOW)) ORDER BY rc.id LIMIT 1)) "
            "FROM {s}.units_v4 u "
            "LEFT JOIN {s}.claims_v4 c ON u.state = 'member' AND c.id = u.id "
            "WHERE u.resource = %(r)s AND u.slot = %(sl)s "
            "AND u.state IN ('held', 'confirmed', 'member') "
            "AND (u.expires_at IS NULL OR u.expires_at > NOW)"
        )
        self.holder_of_span = render(
            "SELECT c.holder FROM {s}.spans_v4 x JOIN {s}.claims_v4 c ON c.id = x.claim_id "
            "WHERE x.resource = %(r)s AND x.kind = %(kind)s "
            "AND x.span && numrange(%(lo)s, %(hi)s, '[)') "
            "AND (x.expires_at IS NULL OR x.expires_at > NOW) LIMIT 1"
        )
