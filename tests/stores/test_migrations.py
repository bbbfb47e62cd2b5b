"""The one migration runner: numbered steps, functions from their current file, no downgrades.

Every schema dibs owns is upgraded here from every earlier version, populated:
SQLite's claim tables (version 1, and 1 -> 2 with every kind of claim) and job
tables (unversioned, "0"), and PostgreSQL's job tables (unversioned).
PostgreSQL's claim schema versions 1 and 2 are upgraded in
tests/stores/test_postgres_edges.py, version 3 (populated, to version 4) in
tests/stores/test_postgres_upgrade.py. The earlier versions' SQL is frozen in
tests/support/schemas, so that editing a shipped step cannot quietly
change what "an earlier version" means here.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path

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
from dibs._model import fingerprint, span_bound_to_number, targets_to_text
from dibs.stores._migrate import Migrations, sql_statements
from dibs.stores.jobs import Job
from dibs.stores.sqlite import SCHEMA_VERSION, SQLiteStore
from dibs.stores.sqlite._schema import CLAIMS, JOBS, upgrade
from layout import ROOT, SCHEMAS
from sqlite_v1 import build_v1

QUICK = True  # in `pytest -m quick` (conftest.is_quick: not slow, no server)

JOB = Job(id="j1", name="send", args="[[], {}]", run_at=0.0, attempt=1, max_attempts=3,
          state="pending")  # fmt: skip


# --- the runner ---------------------------------------------------------------------------------


def _package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> Migrations:
    name = f"fake_sql_{len(sys.modules)}"
    root = tmp_path / name
    for path, text in {"__init__.py": "", **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    return Migrations(name, "demo")


STEPS = {
    "sql/demo/0001_tables.sql": "CREATE TABLE t (a);",
    "sql/demo/0002_functions_only.sql": "-- only the function changed",
    "sql/demo/0003_column.sql": "ALTER TABLE t ADD b;",
    "sql/demo/functions/f.sql": "FUNCTION f v3",
    "sql/demo/functions/g.sql": "FUNCTION g v3",
}


@pytest.mark.parametrize(
    ("found", "ran"),
    [
        (0, ["CREATE TABLE t (a);", "ALTER TABLE t ADD b;", "FUNCTION f v3", "FUNCTION g v3"]),
        (1, ["ALTER TABLE t ADD b;", "FUNCTION f v3", "FUNCTION g v3"]),
        (2, ["ALTER TABLE t ADD b;", "FUNCTION f v3", "FUNCTION g v3"]),
        (3, []),
    ],
)
def test_missing_steps_run_in_order_then_every_function_is_recreated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: int, ran: list[str]
) -> None:
    migrations = _package(tmp_path, monkeypatch, STEPS)
    assert migrations.version == 3
    scripts: list[str] = []
    assert migrations.upgrade(found, scripts.append, "db") is bool(ran)
    assert scripts == ran


def test_a_newer_schema_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    migrations = _package(tmp_path, monkeypatch, STEPS)
    with pytest.raises(SchemaError) as raised:
        migrations.upgrade(4, [].append, "'x.db'")
    assert (raised.value.found, raised.value.supported) == (4, 3)
    assert "'x.db' has dibs demo schema version 4" in str(raised.value)


def test_steps_must_be_numbered_without_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrations = _package(tmp_path, monkeypatch, {"sql/demo/0002_b.sql": "SELECT 1;"})
    with pytest.raises(AssertionError, match=r"1\.\.n"):
        _ = migrations.version


def test_the_shipped_schemas_are_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"stores/*/sql/**/*.sql"' in pyproject
    for package in ("dibs.stores.sqlite", "dibs.stores.postgres"):
        for name in ("claims", "jobs"):
            assert Migrations(package, name).version >= 1


# --- SQLite -------------------------------------------------------------------------------------


def _sqlite_file(path: Path, *frozen: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for name in frozen:
        conn.executescript((SCHEMAS / name).read_text())
    return conn


def test_a_populated_version_1_sqlite_file_opens_with_its_claims(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    conn = _sqlite_file(path, "sqlite_claims_v1.sql")
    conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('schema_version', '1')")
    conn.execute(
        "INSERT INTO dibs_claims (fence, holder, targets, state, created_at, updated_at) "
        """VALUES (7, 'alice', '[["u","seat","1"]]', 'confirmed', 1, 1)"""
    )
    conn.execute("INSERT INTO dibs_units (resource, slot, fence) VALUES ('seat', '1', 7)")
    conn.close()
    with dibs.open(f"sqlite:///{path}") as store:
        assert store.holder_of(Unit("seat", "1")) == "alice"
        assert not store.claim(Unit("seat", "1"), holder="bob")
        granted = store.claim(Unit("seat", "2"), holder="bob").claim
        assert granted is not None and granted.fence > 7


def test_unversioned_sqlite_job_tables_are_upgraded_with_their_rows(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    SQLiteStore(path).close()
    conn = _sqlite_file(path, "sqlite_jobs_v0.sql")
    conn.execute(
        "INSERT INTO dibs_jobs (id, name, args, run_at, attempt, max_attempts, state, retries, "
        "failures) VALUES ('j1', 'send', '[[], {}]', 0, 1, 3, 'pending', 0, 0)"
    )
    conn.close()
    with SQLiteStore(path) as store:
        jobs = store.job_table()
        assert jobs.get("j1") == JOB
    conn = sqlite3.connect(path)
    row = conn.execute("SELECT value FROM dibs_meta WHERE key = 'jobs_schema_version'").fetchone()
    assert row == ("3",)  # upgraded through every step
    conn.execute("UPDATE dibs_meta SET value = '9' WHERE key = 'jobs_schema_version'")
    conn.commit()
    conn.close()
    with SQLiteStore(path) as store, pytest.raises(SchemaError) as raised:
        store.job_table()
    assert (raised.value.found, raised.value.supported) == (9, 3)


# --- PostgreSQL ---------------------------------------------------------------------------------


def test_unversioned_postgres_job_tables_are_upgraded_with_their_rows(
    pg_url: str, pg_schema_url: str
) -> None:
    schema = pg_schema_url.rsplit("schema=", 1)[1]
    dibs.open(pg_schema_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute((SCHEMAS / "postgres_jobs_v0.sql").read_text().replace("{s}", schema).encode())
        conn.execute(
            f"INSERT INTO {schema}.jobs (id, name, args, run_at, attempt, max_attempts, state, "
            "retries, failures) VALUES ('j1', 'send', '[[], {}]', 0, 1, 3, 'pending', 0, 0)"
        )
    with dibs.open(pg_schema_url) as store:
        jobs = store.job_table()
        assert jobs is not None and jobs.get("j1") == JOB
    with psycopg.connect(pg_url, autocommit=True) as conn:
        query = f"SELECT value FROM {schema}.meta WHERE key = 'jobs_schema_version'"
        assert conn.execute(query).fetchone() == ("3",)  # every step
        conn.execute(f"UPDATE {schema}.meta SET value = '9' WHERE key = 'jobs_schema_version'")
    with dibs.open(pg_schema_url) as store, pytest.raises(SchemaError) as raised:
        store.job_table()
    assert (raised.value.found, raised.value.supported) == (9, 3)


# --- SQLite claims: version 1 -> 2, the unit row is the claim ------------------------------------

T0 = 1_800_000_000.0


def _us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _v1_claim(
    conn: sqlite3.Connection,
    fence: int,
    holder: str,
    targets: list[Target],
    state: str,
    *,
    expires: float | None = None,
    taken_over: bool = False,
    request: tuple[str, float | None] | None = None,
    rows: bool = True,
) -> None:
    """Write one claim as version 1 did: claim row, unit/span rows while it blocks, request row."""
    text = targets_to_text(targets)
    conn.execute(
        "INSERT INTO dibs_claims (fence, holder, targets, state, expires_at, taken_over, "
        "request_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (fence, holder, text, state, None if expires is None else _us(expires), int(taken_over),
         request and request[0], _us(T0 + fence), _us(T0 + fence)),
    )  # fmt: skip
    for target in targets if rows else ():
        if isinstance(target, Unit):
            conn.execute(
                "INSERT OR REPLACE INTO dibs_units (resource, slot, fence) VALUES (?, ?, ?)",
                (target.resource, target.slot, fence),
            )
        else:
            conn.execute(
                "INSERT INTO dibs_spans (resource, lo, hi, kind, fence) VALUES (?, ?, ?, ?, ?)",
                (target.resource, span_bound_to_number(target.start),
                 span_bound_to_number(target.end), target.kind, fence),
            )  # fmt: skip
    if request is not None:
        conn.execute(
            "INSERT INTO dibs_requests (request_id, fingerprint, fence, taken, created_at) "
            "VALUES (?, ?, ?, NULL, ?)",
            (request[0], fingerprint(holder, targets, request[1]), fence, _us(T0 + fence)),
        )


def _seat(n: int | str) -> Unit:
    return Unit("seat", str(n))


ROOM_A = Span("room", 10, 20)
ROOM_B = Span("room", 30, 40)


def _populated_v1(path: Path) -> None:
    conn = _sqlite_file(path, "sqlite_claims_v1.sql")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO dibs_meta (key, value) VALUES ('schema_version', '1')")
    _v1_claim(conn, 1, "alice", [_seat(1)], "confirmed", request=("r-confirmed", None))
    _v1_claim(conn, 2, "bob", [_seat(2)], "held", expires=T0 + 300, request=("r-held", 300.0))
    _v1_claim(conn, 3, "carol", [_seat(3)], "held", expires=T0 + 10)  # dead, not swept
    _v1_claim(conn, 4, "dave", [_seat(4)], "expired", expires=T0 + 5)  # swept
    _v1_claim(conn, 5, "erin", [_seat(5)], "released", request=("r-released", None), rows=False)
    _v1_claim(conn, 6, "frank", [_seat(6)], "expired", expires=T0 + 6, taken_over=True)
    _v1_claim(conn, 7, "gina", [_seat(6)], "confirmed")  # took seat 6 over
    group = [Unit("row", "1"), Unit("row", "2")]
    _v1_claim(conn, 8, "hank", group, "held", expires=T0 + 300, request=("r-group", 300.0))
    _v1_claim(conn, 9, "ivy", [ROOM_A], "confirmed")
    _v1_claim(conn, 10, "jack", [Unit("row", "3"), ROOM_B], "held", expires=T0 + 10)
    conn.execute(
        "INSERT INTO dibs_requests (request_id, fingerprint, fence, taken, created_at) "
        "VALUES ('r-lost', ?, NULL, ?, ?)",
        (fingerprint("kim", [_seat(1)], None), targets_to_text([_seat(1)]), _us(T0 + 11)),
    )
    _v1_claim(conn, 12, "luke", [_seat(12)], "released", rows=False)  # the highest fence
    conn.execute("COMMIT")
    conn.close()


def test_a_populated_version_1_file_is_upgraded_in_place_with_every_claim(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v1.db"
    _populated_v1(path)
    clock = FakeClock(T0 + 100)
    with SQLiteStore(path, clock=clock) as store:
        log = store.claim_log()
        assert log is not None
        claims = {c.fence: c for c in log.claims()}
        assert sorted(claims) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12]
        expected = {
            1: ("alice", (_seat(1),), ClaimState.CONFIRMED, False, "r-confirmed"),
            2: ("bob", (_seat(2),), ClaimState.HELD, False, "r-held"),
            3: ("carol", (_seat(3),), ClaimState.HELD, False, None),  # as stored
            4: ("dave", (_seat(4),), ClaimState.EXPIRED, False, None),
            5: ("erin", (_seat(5),), ClaimState.RELEASED, False, "r-released"),
            6: ("frank", (_seat(6),), ClaimState.EXPIRED, True, None),
            7: ("gina", (_seat(6),), ClaimState.CONFIRMED, False, None),
            8: ("hank", (Unit("row", "1"), Unit("row", "2")), ClaimState.HELD, False, "r-group"),
            9: ("ivy", (ROOM_A,), ClaimState.CONFIRMED, False, None),
            10: ("jack", (Unit("row", "3"), ROOM_B), ClaimState.HELD, False, None),
            12: ("luke", (_seat(12),), ClaimState.RELEASED, False, None),
        }
        for fence, (holder, targets, state, taken_over, request_id) in expected.items():
            claim = claims[fence]
            assert claim.id == str(fence)
            assert (claim.holder, claim.targets, claim.state) == (holder, targets, state)
            assert (claim.taken_over, claim.request_id) == (taken_over, request_id)
            assert claim.created_at.timestamp() == T0 + fence
            got = store.get(str(fence))
            assert got is not None and got.holder == holder and got.targets == targets
        dead = store.get("3")
        assert dead is not None and dead.state is ClaimState.EXPIRED  # judged on read

        # Who holds what, as before.
        assert store.holder_of(_seat(1)) == "alice"
        assert store.holder_of(_seat(2)) == "bob"
        assert store.holder_of(_seat(3)) is None
        assert store.holder_of(_seat(5)) is None
        assert store.holder_of(_seat(6)) == "gina"
        assert store.holder_of(Unit("row", "2")) == "hank"
        assert store.holder_of(Span("room", 15, 16)) == "ivy"
        assert [c.fence for c in store.claims_of("hank")] == [8]
        assert [c.fence for c in store.claims_of("alice")] == [1]
        assert not store.claim(Span("room", 19, 25), holder="zed")

        # Replays answer as the first time; a reused ID with other input conflicts.
        again = store.claim(_seat(1), holder="alice", request_id="r-confirmed")
        assert again.replayed and again.claim is not None and again.claim.fence == 1
        again = store.claim(_seat(2), holder="bob", request_id="r-held", ttl=300)
        assert again.replayed and again.claim is not None and again.claim.fence == 2
        group = [Unit("row", "1"), Unit("row", "2")]
        again = store.claim(group, holder="hank", request_id="r-group", ttl=300)
        assert again.replayed and again.claim is not None and again.claim.fence == 8
        lost = store.claim(_seat(1), holder="kim", request_id="r-lost")
        assert lost.replayed and not lost and lost.taken == (_seat(1),)
        released = store.claim(_seat(5), holder="erin", request_id="r-released")
        assert released.replayed and released.claim is not None and released.claim.fence == 5
        with pytest.raises(RequestConflict):
            store.claim(_seat(9), holder="alice", request_id="r-confirmed")

        # Fences keep rising past the highest, a released claim's.
        fresh = store.claim(_seat(13), holder="mia").claim
        assert fresh is not None and fresh.fence == 13

        # Every reason survives, and taking over applies the reason rule.
        def reason(fence: int, holder: str) -> HoldLostReason:
            with pytest.raises(HoldLost) as raised:
                store.confirm(str(fence), holder=holder, fence=fence)
            return raised.value.reason

        assert reason(3, "carol") is HoldLostReason.EXPIRED
        assert reason(4, "dave") is HoldLostReason.EXPIRED
        assert reason(5, "erin") is HoldLostReason.RELEASED
        assert reason(6, "frank") is HoldLostReason.TAKEN_OVER
        assert reason(10, "jack") is HoldLostReason.EXPIRED
        assert store.claim(_seat(3), holder="yan")
        assert store.claim(_seat(4), holder="yan")
        assert store.claim(Unit("row", "3"), holder="yan")
        assert reason(3, "carol") is HoldLostReason.TAKEN_OVER
        assert reason(4, "dave") is HoldLostReason.TAKEN_OVER
        assert reason(10, "jack") is HoldLostReason.TAKEN_OVER
        assert store.claim(_seat(5), holder="yan")  # erin's released claim stays released
        assert reason(5, "erin") is HoldLostReason.RELEASED

        # Live ones go on: bob confirms, alice releases, and seat 1 is free again.
        confirmed = store.confirm("2", holder="bob", fence=2)
        assert confirmed.state is ClaimState.CONFIRMED
        assert store.release("1", holder="alice", fence=1)
        assert store.claim(_seat(1), holder="kim")
        old = store.get("1")
        assert old is not None and old.state is ClaimState.RELEASED and old.holder == "alice"
        assert store.integrity_check() == "ok"
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM dibs_meta WHERE key = 'schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    conn.close()


def test_readers_on_an_upgraded_file_meet_its_old_writers(tmp_path: Path) -> None:
    # Version 3 adds shared claims: every claim from before is exclusive, and a
    # reader is refused where an old claim lives and takes over where one died.
    path = tmp_path / "v1.db"
    _populated_v1(path)
    clock = FakeClock(T0 + 100)
    with SQLiteStore(path, clock=clock) as store:
        log = store.claim_log()
        assert log is not None
        assert {c.mode for c in log.claims()} == {"exclusive"}
        for live in (_seat(1), _seat(2), Unit("row", "1"), ROOM_A):
            assert not store.claim(live, holder="reader", mode="shared"), live
        assert store.claim(_seat(3), holder="reader", mode="shared")  # carol's dead hold
        old = store.get("3")
        assert old is not None and old.taken_over
        assert store.claim(Span("room", 30, 35), holder="reader", mode="shared")  # jack's
        assert store.claim(_seat(3), holder="another", mode="shared")
        assert not store.claim(_seat(3), holder="writer")
        with pytest.raises(RequestConflict):  # an old request ID keeps its fingerprint
            store.claim(_seat(2), holder="bob", ttl=300.0, request_id="r-held", mode="shared")
        assert store.claim(_seat(2), holder="bob", ttl=300.0, request_id="r-held").replayed
        assert store.integrity_check() == "ok"


def test_a_version_1_process_on_an_upgraded_file_fails_loudly(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    _populated_v1(path)
    old = sqlite3.connect(path, isolation_level=None)  # a v1 dibs, open before the upgrade
    assert old.execute("SELECT count(*) FROM dibs_units").fetchone() == (8,)
    SQLiteStore(path).close()
    # Its next statement, whatever it is, names a table that no longer exists.
    for statement in (
        "INSERT INTO dibs_units (resource, slot, fence) VALUES ('seat', '99', 99)",
        "INSERT INTO dibs_claims (holder, targets, state, created_at, updated_at) "
        "VALUES ('x', '[]', 'held', 0, 0)",
        "SELECT * FROM dibs_spans",
        "SELECT * FROM dibs_requests",
    ):
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            old.execute(statement)
    old.close()


def test_an_older_dibs_refuses_a_newer_schema_and_a_newer_dibs_upgrades_an_older_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The code of schema version 1, as a package holding only its step.
    v1_code = _package(tmp_path, monkeypatch, {"sql/claims/0001_tables.sql": CLAIMS.steps[0]})
    v1_code = Migrations(v1_code.package, "claims")
    assert v1_code.version == 1 < SCHEMA_VERSION
    old_file, new_file = tmp_path / "old.db", tmp_path / "new.db"
    conn = sqlite3.connect(old_file, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    upgrade(conn, v1_code, str(old_file))
    conn.execute("COMMIT")
    conn.close()
    SQLiteStore(new_file).close()

    conn = sqlite3.connect(new_file, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    with pytest.raises(SchemaError) as raised:
        upgrade(conn, v1_code, str(new_file))
    assert (raised.value.found, raised.value.supported) == (SCHEMA_VERSION, 1)
    conn.execute("ROLLBACK")
    conn.close()

    with SQLiteStore(old_file) as store:  # found version 1: upgraded, not used as it is
        assert store.claim(_seat(1), holder="a")
    conn = sqlite3.connect(old_file)
    assert conn.execute("SELECT value FROM dibs_meta WHERE key = 'schema_version'").fetchone() == (
        str(SCHEMA_VERSION),
    )
    conn.close()


# --- upgrades are linear in the claims --------------------------------------------------------


def _upgrade_steps(path: Path) -> int:
    """SQLite VM instructions (in hundreds) that upgrading the file at ``path`` runs."""
    conn = sqlite3.connect(path, isolation_level=None)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    conn.set_progress_handler(count, 100)
    conn.execute("BEGIN IMMEDIATE")
    upgrade(conn, CLAIMS, str(path))
    conn.execute("COMMIT")
    conn.set_progress_handler(None, 0)
    conn.close()
    return steps


def test_upgrading_a_version_1_file_costs_the_same_per_claim_at_any_size(tmp_path: Path) -> None:
    # Counted work, not time: a quadratic step (a scan per claim) makes the larger
    # file cost about 4x more per claim; a linear one about the same.
    per_claim = {}
    for claims in (500, 2000):
        path = tmp_path / f"v1-{claims}.db"
        build_v1(path, claims)
        per_claim[claims] = _upgrade_steps(path) / claims
    assert per_claim[2000] < 1.5 * per_claim[500], per_claim


def _explain_rows(conn: sqlite3.Connection, statement: str) -> list[tuple[int, int, str]]:
    return [(r[0], r[1], r[3]) for r in conn.execute("EXPLAIN QUERY PLAN " + statement)]


def _rescans(plan: list[tuple[int, int, str]]) -> list[str]:
    """The full-table scans in ``plan`` that run once per row of something else."""
    parent_of = {node: parent for node, parent, _ in plan}
    detail_of = {node: detail for node, _, detail in plan}
    scans_under: dict[int, int] = {}
    found = []
    for _, parent, detail in plan:
        if not detail.startswith("SCAN ") or detail.startswith("SCAN CONSTANT"):
            continue
        scans_under[parent] = scans_under.get(parent, 0) + 1
        if scans_under[parent] > 1:  # a nested loop whose inner side is a scan
            found.append(detail)
        up = parent
        while up:
            if detail_of.get(up, "").startswith("CORRELATED"):  # a scan per outer row
                found.append(detail)
                break
            up = parent_of.get(up, 0)
    return found


@pytest.mark.parametrize("schema", ["claims", "jobs"])
def test_no_sqlite_upgrade_step_scans_a_table_once_per_row(tmp_path: Path, schema: str) -> None:
    # Every statement of every step, explained on a populated file just before it runs.
    path = tmp_path / "old.db"
    if schema == "claims":
        build_v1(path, 200)
        migrations, found = CLAIMS, 1
    else:
        SQLiteStore(path).close()
        conn = _sqlite_file(path, "sqlite_jobs_v0.sql")
        conn.execute(
            "INSERT INTO dibs_jobs (id, name, args, run_at, attempt, max_attempts, state, "
            "retries, failures) VALUES ('j1', 'send', '[[], {}]', 0, 1, 3, 'running', 0, 0)"
        )
        conn.close()
        migrations, found = JOBS, 0
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    explained = 0
    for script in migrations.steps[found:]:
        for statement in sql_statements(script):
            if statement.split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE", "WITH"):
                assert _rescans(_explain_rows(conn, statement)) == [], statement
                explained += 1
            conn.execute(statement)
    conn.execute("ROLLBACK")
    conn.close()
    assert explained > 0


def test_a_second_opener_waits_for_an_upgrade_in_progress_and_finds_it_done(
    tmp_path: Path,
) -> None:
    # The upgrade holds the write lock (BEGIN IMMEDIATE) until it commits; another
    # process opening the file meanwhile waits for it (busy_timeout), then finds it current.
    path = tmp_path / "v1.db"
    build_v1(path, 100)
    upgrading = sqlite3.connect(path, isolation_level=None)
    upgrading.execute("BEGIN IMMEDIATE")
    upgrade(upgrading, CLAIMS, str(path))
    opened: list[object] = []
    opener = threading.Thread(target=lambda: opened.append(_open_or_error(path)))
    opener.start()
    opener.join(0.5)  # only to let it reach the lock; nothing is judged by the clock
    assert opened == []  # still waiting, not failed
    upgrading.execute("COMMIT")
    upgrading.close()
    opener.join(60)
    assert opened == [f"version {SCHEMA_VERSION}, claim 20 held by holder-20"]


def _open_or_error(path: Path) -> object:
    try:
        with SQLiteStore(path) as store:
            claim = store.get("20")
            assert claim is not None
            return f"version {SCHEMA_VERSION}, claim 20 held by {claim.holder}"
    except Exception as exc:  # reported to the test's thread
        return exc
