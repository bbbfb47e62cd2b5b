"""PostgreSQL claim schema version 4: a populated version-3 schema upgraded in place.

Version 3 is frozen in tests/support/schemas/postgres_claims_v3.sql, and the store
is populated through version 3's own functions (what version-3 code sent),
with a test clock: live holds, confirmed claims, a released claim, request
IDs granted and refused, a group, a span, a dead hold and a swept one. After
the upgrade every claim reads back as it was, every request ID replays, the
fences go on rising, and the rules (the reason rule, takeover) hold for the
claims that came across. Old and new code never run side by side unnoticed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

import dibs
from dibs import (
    ClaimState,
    FakeClock,
    HoldLost,
    HoldLostReason,
    RequestConflict,
    SchemaError,
    Span,
    Target,
    Unit,
)
from dibs._model import fingerprint, normalize_targets, targets_to_text
from dibs.stores.postgres._sql import SCHEMA_VERSION
from layout import SCHEMAS
from pg_fixtures import drop_schema, schema_url

pytestmark = pytest.mark.timeout(120)

_SCHEMAS = SCHEMAS
T0 = 1_800_000_000.0
_V3_CLAIM = (
    "SELECT * FROM {s}.claim(%s, %s, %s, %s, %s, %s, %s, %s::text[], %s::text[], "
    "%s::text[], %s::text[], %s::numeric[], %s::numeric[])"
)
_V3_TRANSITION = "SELECT * FROM {s}.transition(%s, %s, %s, %s, %s, %s)"


def _at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class V3:
    """What version-3 code sent: its functions, called on one connection."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn, self.s = conn, schema

    def claim(
        self,
        targets: list[Target],
        holder: str,
        *,
        ttl: float | None = None,
        request_id: str | None = None,
        now: float = T0,
    ) -> tuple[Any, ...]:
        units = sorted(
            (t for t in targets if isinstance(t, Unit)), key=lambda u: (u.resource, u.slot)
        )
        spans = [t for t in targets if isinstance(t, Span)]
        normalized = normalize_targets(targets)
        text = targets_to_text(normalized)
        row = self.conn.execute(
            _V3_CLAIM.format(s=self.s),
            (
                holder,
                text,
                ttl,
                request_id,
                fingerprint(holder, normalized, None if ttl is None else float(ttl))
                if request_id
                else None,
                _at(now),
                3600.0,
                [u.resource for u in units],
                [u.slot for u in units],
                [x.resource for x in spans] or None,
                [x.kind for x in spans] or None,
                [x.start for x in spans] or None,
                [x.end for x in spans] or None,
            ),
        ).fetchone()
        assert row is not None
        return tuple(row)

    def transition(self, op: str, row: tuple[Any, ...], now: float) -> str:
        claim_id, holder, fence = row[2], row[3], row[6]
        got = self.conn.execute(
            _V3_TRANSITION.format(s=self.s), (op, claim_id, holder, fence, None, _at(now))
        ).fetchone()
        assert got is not None
        return str(got[0])

    def sweep(self, now: float) -> None:
        self.conn.execute(f"SELECT * FROM {self.s}.sweep(%s, 3600, 1000)", (_at(now),))


@pytest.fixture
def v3_schema(pg_url: str) -> Iterator[tuple[str, str]]:
    """A schema as dibs schema version 3 made it; yields (its store URL, its name)."""
    schema = f"v3_{datetime.now().microsecond}_{id(object())}"[:40]
    frozen = (_SCHEMAS / "postgres_claims_v3.sql").read_text()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(frozen.replace("{s}", schema).encode())
        conn.execute(f"INSERT INTO {schema}.meta (key, value) VALUES ('schema_version', '3')")
    yield schema_url(pg_url, schema), schema
    drop_schema(pg_url, schema)


def _populate(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[Any, ...]]:
    v3 = V3(conn, schema)
    made = {
        "hold": v3.claim([Unit("seat", "a")], "alice", ttl=600, request_id="r-hold"),
        "confirmed": v3.claim([Unit("seat", "b")], "bob", request_id="r-confirmed"),
        "held_then_confirmed": v3.claim([Unit("seat", "c")], "carol", ttl=600),
        "released": v3.claim([Unit("seat", "d")], "dave", ttl=600, request_id="r-released"),
        "group": v3.claim(
            [Unit("row", "1"), Unit("row", "2")], "erin", ttl=600, request_id="r-group"
        ),
        "span": v3.claim([Span("room", 0, 10)], "frank", request_id="r-span"),
        "dead": v3.claim([Unit("seat", "f")], "gina", ttl=5),
        "swept": v3.claim([Unit("seat", "g"), Span("hall", 0, 5)], "hank", ttl=5),
        "refused": v3.claim([Unit("seat", "b")], "ivan", request_id="r-refused"),
    }
    assert all(row[0] == "granted" for key, row in made.items() if key != "refused")
    assert made["refused"][0] == "taken"
    assert v3.transition("confirm", made["held_then_confirmed"], T0 + 1) == "ok"
    assert v3.transition("release", made["released"], T0 + 1) == "ok"
    v3.sweep(T0 + 10)  # marks "dead" and "swept" expired; "dead" stays unswept below
    conn.execute(
        f"UPDATE {schema}.claims SET state = 'held' WHERE id = %s", (made["dead"][2],)
    )  # a dead hold no sweep has marked
    return made


def _before(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[Any, ...]]:
    rows = conn.execute(
        f"SELECT id, holder, targets, state, fence, expires_at, taken_over, request_id, "
        f"created_at, updated_at FROM {schema}.claims"
    ).fetchall()
    return {str(r[0]): tuple(r) for r in rows}


def test_a_populated_version_3_schema_is_upgraded_in_place(
    pg_url: str, v3_schema: tuple[str, str]
) -> None:
    url, schema = v3_schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        made = _populate(conn, schema)
        before = _before(conn, schema)
        (last_fence,) = conn.execute(f"SELECT max(fence) FROM {schema}.claims").fetchone() or (0,)
    clock = FakeClock(T0 + 20)
    with dibs.open(url, clock=clock, request_retention=600) as store:
        # Every claim reads back as it was (a dead hold reads expired, as before).
        for claim_id, row in before.items():
            claim = store.get(claim_id)
            assert claim is not None, claim_id
            (
                _,
                holder,
                targets,
                state,
                fence,
                expires_at,
                taken_over,
                request_id,
                created,
                updated,
            ) = row
            assert (claim.holder, claim.fence, claim.request_id) == (holder, fence, request_id)
            assert claim.targets == dibs._model.targets_from_text(targets)
            expected = "expired" if state == "held" and expires_at <= _at(T0 + 20) else state
            assert claim.state.value == expected, claim_id
            assert (claim.expires_at, claim.created_at, claim.updated_at) == (
                expires_at,
                created,
                updated,
            )
            assert claim.taken_over == taken_over
        assert {c.id for c in store.claim_log().claims()} == set(before)

        # Who holds what, as before.
        assert store.holder_of(Unit("seat", "a")) == "alice"
        assert store.holder_of(Unit("seat", "b")) == "bob"
        assert store.holder_of(Unit("seat", "c")) == "carol"
        assert store.holder_of(Unit("seat", "d")) is None
        assert store.holder_of(Unit("row", "2")) == "erin"
        # Every old claim is exclusive (schema 5's shared holds): no reader beside it.
        for target in (Unit("seat", "a"), Unit("row", "2"), Span("room", 5, 6)):
            refused_reader = store.claim(target, holder="reader", mode="shared")
            assert not refused_reader and refused_reader.taken == (target,), target
        assert store.holder_of(Span("room", 5, 6)) == "frank"
        assert store.holder_of(Unit("seat", "f")) is None
        assert [c.id for c in store.claims_of("erin")] == [str(made["group"][2])]

        # Every request ID replays its outcome; other input conflicts.
        for key, target in (("hold", [Unit("seat", "a")]), ("confirmed", [Unit("seat", "b")]),
                            ("released", [Unit("seat", "d")]),
                            ("group", [Unit("row", "1"), Unit("row", "2")]),
                            ("span", [Span("room", 0, 10)])):  # fmt: skip
            ttl = None if key in ("confirmed", "span") else 600
            again = store.claim(target, holder=made[key][3], ttl=ttl, request_id=f"r-{key}")
            assert again.granted and again.replayed and again.claim is not None, key
            assert again.claim.id == str(made[key][2])
        refused = store.claim(Unit("seat", "b"), holder="ivan", request_id="r-refused")
        assert not refused and refused.replayed and refused.taken == (Unit("seat", "b"),)
        with pytest.raises(RequestConflict):
            store.claim(Unit("seat", "zz"), holder="alice", ttl=600, request_id="r-hold")

        # The migrated live hold is still its holder's, under its fence.
        hold = made["hold"]
        confirmed = store.confirm(str(hold[2]), holder="alice", fence=hold[6])
        assert confirmed.state is ClaimState.CONFIRMED
        assert store.release(str(hold[2]), holder="alice", fence=hold[6])

        # New claims take over the dead and the swept holds, with higher fences.
        taker = store.claim(Unit("seat", "f"), holder="rival", ttl=60).claim
        assert taker is not None and taker.fence > last_fence
        dead = store.get(str(made["dead"][2]))
        assert dead is not None and dead.state is ClaimState.EXPIRED and dead.taken_over
        with pytest.raises(HoldLost) as lost:
            store.confirm(str(made["swept"][2]), holder="hank", fence=made["swept"][6])
        assert lost.value.reason is HoldLostReason.EXPIRED
        assert store.claim(Span("hall", 1, 2), holder="rival")
        with pytest.raises(HoldLost) as lost:
            store.confirm(str(made["swept"][2]), holder="hank", fence=made["swept"][6])
        assert lost.value.reason is HoldLostReason.TAKEN_OVER
        reuse = store.claim(Unit("seat", "d"), holder="zed").claim
        assert reuse is not None and reuse.fence > taker.fence
        released = store.get(str(made["released"][2]))
        assert released is not None and released.state is ClaimState.RELEASED

        # The group's transitions still go through its claim row.
        group = made["group"]
        assert store.confirm(str(group[2]), holder="erin", fence=group[6])
        assert store.release(str(group[2]), holder="erin", fence=group[6])
        assert store.claim([Unit("row", "1")], holder="next")
        clock.advance(7200)
        swept = store.sweep()
        assert swept.purged_claims >= 3 and swept.purged_requests >= 5, swept
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
        assert row.fetchone() == (str(SCHEMA_VERSION),)
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}  # fmt: skip
    assert tables == {"meta", "units_v4", "claims_v4", "spans_v4", "readers_v5"} | (
        tables & {"jobs"}
    )


def test_version_3_code_still_running_after_the_upgrade_fails_loudly(
    pg_url: str, v3_schema: tuple[str, str]
) -> None:
    url, schema = v3_schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        v3 = V3(conn, schema)
        held = v3.claim([Unit("seat", "1")], "alice", ttl=600)
        with dibs.open(url):
            pass  # a new process upgrades the schema under the running old one
        for call in (
            lambda: v3.claim([Unit("seat", "2")], "bob", ttl=600),
            lambda: v3.transition("confirm", held, T0),
            lambda: v3.sweep(T0),
        ):
            with pytest.raises(psycopg.Error) as raised:
                call()
            assert raised.value.sqlstate == "DB009"
            assert "upgraded to version 4" in str(raised.value)
        # Version 3's plain statements find no tables of the meaning they knew.
        for query in (
            f"INSERT INTO {schema}.units (resource, slot, claim_id, expires_at) "
            "VALUES ('seat', '3', 1, NULL)",
            f"SELECT id FROM {schema}.claims WHERE id = 1",
        ):
            with pytest.raises(psycopg.errors.UndefinedTable):
                conn.execute(query)


def test_version_4_code_on_a_schema_that_is_not_version_4_says_so(pg_url: str) -> None:
    schema = f"w_{id(object())}"[:40]
    with dibs.open(schema_url(pg_url, schema)) as store:
        assert store.claim(Unit("seat", "1"), holder="alice")
        # Another version of dibs changed the schema under this process.
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE {schema}.units_v4 RENAME TO units_v5")
            conn.execute(f"UPDATE {schema}.meta SET value = '7' WHERE key = 'schema_version'")
        with pytest.raises(SchemaError) as raised:
            store.claim(Unit("seat", "2"), holder="bob")
        assert (raised.value.found, raised.value.supported) == (7, SCHEMA_VERSION)
        assert "version 7" in str(raised.value)
    with pytest.raises(SchemaError) as raised:
        dibs.open(schema_url(pg_url, schema))  # and a newer schema is refused at open
    assert (raised.value.found, raised.value.supported) == (7, SCHEMA_VERSION)
    drop_schema(pg_url, schema)


def test_old_code_refuses_to_open_a_version_4_schema(pg_url: str) -> None:
    """The version check version-3 code runs at open: it refuses any newer version."""
    schema = f"x_{id(object())}"[:40]
    with dibs.open(schema_url(pg_url, schema)):
        pass
    from dibs.stores._migrate import Migrations

    class Version3(Migrations):
        version = 3  # what version-3 code's runner reports

    with psycopg.connect(pg_url) as conn:
        (found,) = conn.execute(
            f"SELECT value::int FROM {schema}.meta WHERE key = 'schema_version'"
        ).fetchone() or (0,)
    with pytest.raises(SchemaError) as raised:
        Version3("dibs.stores.postgres", "claims").check(found, f"PostgreSQL schema {schema!r}")
    assert (raised.value.found, raised.value.supported) == (SCHEMA_VERSION, 3)
    drop_schema(pg_url, schema)


def test_ids_and_fences_after_the_upgrade_exceed_every_earlier_one(
    pg_url: str, v3_schema: tuple[str, str]
) -> None:
    url, schema = v3_schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        v3 = V3(conn, schema)
        for i in range(5):  # refusals draw claim IDs but no fences: IDs run ahead
            v3.claim([Unit("seat", "1")], f"h{i}")
        row = conn.execute(
            f"SELECT (SELECT last_value FROM {schema}.claim_ids), "
            f"(SELECT last_value FROM {schema}.fences)"
        ).fetchone()
        assert row is not None
        top_id, top_fence = row
    with dibs.open(url) as store:
        for i in range(3):
            claim = store.claim(Unit("new", str(i)), holder="x", ttl=60).claim
            assert claim is not None and int(claim.id) > top_id and claim.fence > top_fence
            assert store.get(claim.id) == claim
        assert store.get(str(top_id + 100)) is None


# --- the upgrade is linear in the claims --------------------------------------------------------

_BULK_V3 = (
    # Claims 1..n: a held group of two units every tenth, otherwise a single unit; every
    # third with a granted request, every seventh also a lost request record.
    """INSERT INTO {s}.claims (id, holder, targets, state, fence, expires_at, request_id,
                               created_at, updated_at)
       SELECT i, 'h' || i %% 97,
              CASE WHEN i %% 10 = 0 THEN '[["u","row","' || i || 'a"],["u","row","' || i || 'b"]]'
                   ELSE '[["u","seat","' || i || '"]]' END,
              'held', i, now() + interval '1 hour',
              CASE WHEN i %% 3 = 0 THEN 'r-' || i END, now(), now()
       FROM generate_series(1, %(n)s) i""",
    """INSERT INTO {s}.units (resource, slot, claim_id, expires_at)
       SELECT 'seat', id::text, id, expires_at FROM {s}.claims WHERE id %% 10 <> 0
       UNION ALL SELECT 'row', id || 'a', id, expires_at FROM {s}.claims WHERE id %% 10 = 0
       UNION ALL SELECT 'row', id || 'b', id, expires_at FROM {s}.claims WHERE id %% 10 = 0""",
    """INSERT INTO {s}.requests (request_id, fingerprint, claim_id, created_at)
       SELECT request_id, 'fp-' || id, id, now() FROM {s}.claims WHERE request_id IS NOT NULL
       UNION ALL
       SELECT 'lost-' || i, 'fp', NULL, now() FROM generate_series(7, %(n)s, 7) i""",
    "ANALYZE {s}.claims",
    "ANALYZE {s}.units",
    "ANALYZE {s}.requests",
)


def _rescans(node: dict[str, Any], inner: bool = False) -> list[str]:
    """The scans of a whole table in ``node``'s plan that run once per row of something else."""
    kind = node["Node Type"]
    per_row = inner or (
        node.get("Parent Relationship") == "SubPlan"
        and not str(node.get("Subplan Name", "")).startswith("hashed")
    )
    found = [f"{kind} on {node.get('Relation Name')}"] if per_row and kind == "Seq Scan" else []
    children = node.get("Plans", [])
    for i, child in enumerate(children):
        found += _rescans(child, per_row or (kind == "Nested Loop" and i == 1))
    return found


def test_no_upgrade_step_scans_a_table_once_per_row(
    pg_url: str, v3_schema: tuple[str, str]
) -> None:
    # Every statement of version 4's step, explained on a populated version-3 schema just
    # before it runs: a nested loop over a sequential scan would make the upgrade quadratic.
    from dibs.stores._migrate import sql_statements
    from dibs.stores.postgres._sql import CLAIMS

    _, schema = v3_schema
    with psycopg.connect(pg_url) as conn:
        for statement in _BULK_V3:
            conn.execute(
                statement.replace("{s}", schema).encode(), {"n": 5000} if "%" in statement else None
            )
        conn.commit()
        explained = 0
        # Comments first: one of them holds a semicolon.
        for template in sql_statements(re.sub(r"--[^\n]*", "", CLAIMS.steps[3])):
            statement = template.replace("{s}", schema)
            if statement.split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE", "WITH"):
                plan = conn.execute(f"EXPLAIN (FORMAT JSON) {statement}".encode()).fetchone()
                assert plan is not None
                assert _rescans(plan[0][0]["Plan"]) == [], statement
                explained += 1
            conn.execute(statement.encode())
        conn.rollback()
    assert explained == 4
