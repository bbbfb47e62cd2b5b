"""PostgreSQL at the edges: collations, fresh databases, raw driver errors, the reason rule."""

from __future__ import annotations

import contextlib
import itertools
import random
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import psycopg.errors
import pytest

import dibs
from dibs import (
    FakeClock,
    HoldLost,
    HoldLostReason,
    InvalidInput,
    Span,
    StoreUnavailable,
    Target,
    Unit,
)
from dibs._model import targets_to_text
from dibs._request import ClaimRequest
from dibs.stores.postgres import PostgresStore
from dibs.stores.postgres._sql import SCHEMA_VERSION
from eventually import eventually
from layout import SCHEMAS
from pg_fixtures import schema_url

pytestmark = pytest.mark.timeout(120)

_SCHEMAS = SCHEMAS

_TIMES = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))


def _on_database(url: str, name: str) -> str:
    """``url`` pointed at database ``name`` (same role and server)."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


@pytest.fixture
def en_us_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh database whose default collation is ICU's en-US (not code-point order)."""
    name = f"dibs_en_us_{secrets.token_hex(4)}"
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(
            f"CREATE DATABASE {name} LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C' "
            "TEMPLATE template0"
        )
        # A deadlock costs deadlock_timeout (1 s by default) before it is detected.
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"ALTER DATABASE {name} SET deadlock_timeout = '20ms'")
    url = _on_database(pg_admin_url, name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    yield url
    with psycopg.connect(pg_admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --- one lock order, whatever the database's collation ------------------------------------------

# Names whose first and last swap between code-point order (Python's sort,
# the "C" collation) and en-US: "Z" sorts before lower case by code point but
# after it in en-US, "~" after letters by code point but before them in en-US.
# So a claimant locking in one order and a confirm locking in the other each
# take their first row, then meet at the other's first: a deadlock, unless one
# of them finished before the other started.
_MIXED = ["Z", *(f"m{i:02}" for i in range(24)), "~"]


def test_en_us_really_orders_these_names_differently(en_us_url: str) -> None:
    with psycopg.connect(en_us_url) as conn:
        rows = conn.execute("SELECT v FROM unnest(%s::text[]) v ORDER BY v", (_MIXED,)).fetchall()
        in_c = conn.execute(
            'SELECT v FROM unnest(%s::text[]) v ORDER BY v COLLATE "C"', (_MIXED,)
        ).fetchall()
    assert [r[0] for r in rows] == [_MIXED[-1], *_MIXED[1:-1], _MIXED[0]]
    assert [r[0] for r in in_c] == sorted(_MIXED)


def test_c_collation_is_code_point_order(pg_url: str) -> None:
    # The lock order dibs relies on: Python sorts str by code point, and "C"
    # compares UTF-8 bytes, which order like code points (astral ones included).
    names = ["", "a", "A", "~", "é", "é", "ÿ", "\u0100", "\uffff", "\U0001f600", "\U0010ffff"]
    names += [n + "x" for n in names] + ["a\x01", "a\x7f", "\u00e9\u0301"]
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            'SELECT v FROM unnest(%s::text[]) v ORDER BY v COLLATE "C"', (names,)
        ).fetchall()
    assert [r[0] for r in rows] == sorted(names)


def _race(
    holder_store: dibs.Store,
    rival_store: dibs.Store,
    clock: FakeClock,
    targets: list[Target],
    *,
    swept: bool,
    db_url: str,
) -> dict[str, Any]:
    """A late confirm of a dead group hold against a takeover of the same targets.

    Made to overlap every time: a third transaction holds the row of the
    middle target (which both sides lock between their first and their last
    row, in either order) until both sides wait, so each has taken its first
    row before either can take its last.
    """
    held = holder_store.claim(targets, holder="late", ttl=1).claim
    assert held is not None
    clock.advance(2)
    if swept:
        assert holder_store.sweep().expired >= 1  # this hold, and earlier rounds' rivals
    answers: dict[str, Any] = {"held": held}

    def confirm() -> None:
        try:
            answers["confirm"] = holder_store.confirm(held.id, holder="late", fence=held.fence)
        except (HoldLost, StoreUnavailable) as exc:
            answers["confirm"] = exc

    def take_over() -> None:
        try:
            answers["rival"] = rival_store.claim(targets, holder="rival", ttl=60)
        except StoreUnavailable as exc:
            answers["rival"] = exc

    schema = holder_store.schema  # type: ignore[attr-defined]
    middle = targets[len(targets) // 2]
    with psycopg.connect(db_url) as blocker:
        if isinstance(middle, Unit):
            blocker.execute(
                f"SELECT 1 FROM {schema}.units_v4 WHERE resource = %s AND slot = %s FOR UPDATE",
                (middle.resource, middle.slot),
            )
        else:
            blocker.execute(
                f"SELECT 1 FROM {schema}.spans_v4 WHERE resource = %s FOR UPDATE",
                (middle.resource,),
            )
        threads = [threading.Thread(target=confirm), threading.Thread(target=take_over)]
        for thread in threads:
            thread.start()
        eventually(
            lambda: not any(t.is_alive() for t in threads) or _waiting(blocker) >= 2,
            "both calls wait on the blocked row",
        )
        blocker.rollback()
    for thread in threads:
        thread.join()
    return answers


def _waiting(conn: psycopg.Connection[Any]) -> int:
    """How many sessions of this database wait for a lock."""
    row = conn.execute(
        "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        "WHERE NOT l.granted AND a.datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])


def _answered(answer: object) -> bool:
    return not isinstance(answer, StoreUnavailable)


@pytest.mark.parametrize("swept", [False, True], ids=["dead", "swept"])
@pytest.mark.parametrize("kind", ["units", "spans"])
def test_late_confirms_racing_takeovers_never_deadlock_under_en_us(
    en_us_url: str, kind: str, swept: bool
) -> None:
    clock = FakeClock()
    url = schema_url(en_us_url)
    outcomes: Counter[str] = Counter()
    rounds = 5
    # No retries: a deadlock surfaces as StoreUnavailable caused by 40P01.
    with (
        dibs.open(url, clock=clock, max_retries=0) as holder_store,
        dibs.open(url, clock=clock, max_retries=0) as rival_store,
    ):
        for n in range(rounds):
            targets: list[Target] = (
                [Unit(f"r{n}", name) for name in _MIXED]
                if kind == "units"
                else [Span(f"{name}/{n}", 0, 10) for name in _MIXED]
            )
            answers = _race(
                holder_store, rival_store, clock, targets, swept=swept, db_url=en_us_url
            )
            failed = [a for a in (answers["confirm"], answers["rival"]) if not _answered(a)]
            if failed:
                outcomes.update(type(a.__cause__).__name__ for a in failed)
                continue
            # The hold was dead for both: the rival wins, and the confirm hears
            # why, whichever ran first.
            assert isinstance(answers["confirm"], HoldLost) and answers["rival"]
            assert answers["confirm"].reason in (HoldLostReason.EXPIRED, HoldLostReason.TAKEN_OVER)
            final = holder_store.get(answers["held"].id)
            assert final is not None
            # Taken over, whether or not a sweep had marked it expired first.
            outcomes[str(answers["confirm"].reason) if final.taken_over else "not taken over"] += 1
    assert set(outcomes) <= {"expired", "taken_over"}, dict(outcomes)
    assert outcomes["expired"] + outcomes["taken_over"] == rounds


# --- first opens of many schemas in one fresh database ------------------------------------------


def _open_at_once(url: str, schemas: int) -> list[BaseException]:
    """Open ``schemas`` new schemas at ``url`` from as many threads at once; return the errors."""
    barrier = threading.Barrier(schemas)
    errors: list[BaseException] = []

    def first_open(n: int) -> None:
        barrier.wait()
        try:
            with dibs.open(schema_url(url, f"s{n}")) as store:
                assert store.claim(Span("room", 0, 1), holder=f"h{n}")
        except BaseException as exc:  # collected, so that every thread is joined
            errors.append(exc)

    threads = [threading.Thread(target=first_open, args=(n,)) for n in range(schemas)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_first_opens_of_many_schemas_in_a_fresh_database_all_succeed(pg_admin_url: str) -> None:
    # btree_gist is per database, the schema lock per schema: the extension
    # needs a lock of its own, or concurrent creators trip its unique index
    # (without it, 7 of 8 first opens failed, every round).
    for _ in range(2):
        name = f"dibs_fresh_{secrets.token_hex(4)}"
        with psycopg.connect(pg_admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        try:
            errors = _open_at_once(_on_database(pg_admin_url, name), 8)
        finally:
            with psycopg.connect(pg_admin_url, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE {name} WITH (FORCE)")
        assert not errors, errors


# --- the reason rule: a swept hold, a kind switch ------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(pg_schema_url: str, clock: FakeClock) -> Iterator[dibs.Store]:
    with dibs.open(pg_schema_url, clock=clock, request_retention=60) as opened:
        yield opened


def _dead_hold(store: dibs.Store, clock: FakeClock, targets: Target | list[Target]) -> dibs.Claim:
    held = store.claim(targets, holder="late", ttl=1).claim
    assert held is not None
    clock.advance(2)
    return held


def _reason(store: dibs.Store, claim: dibs.Claim) -> HoldLostReason:
    with pytest.raises(HoldLost) as lost:
        store.confirm(claim.id, holder=claim.holder, fence=claim.fence)
    return lost.value.reason


@pytest.mark.parametrize("swept", [False, True])
@pytest.mark.parametrize(
    ("held", "taker"),
    [
        (Unit("seat", "1"), Unit("seat", "1")),
        ([Unit("seat", "1"), Unit("seat", "2")], Unit("seat", "2")),
        (Span("room", 0, 10), Span("room", 5, 15)),
        # A kind switch: a dead span of the other kind would have blocked it.
        (Span("room", 0, 10), Span("room", *_TIMES)),
        ([Span("room", 0, 10), Span("room", 20, 30)], Span("room", *_TIMES)),
    ],
    ids=["unit", "group", "span", "kind-switch", "kind-switch-two"],
)
def test_a_later_claim_on_its_targets_takes_a_dead_hold_over(
    store: dibs.Store, clock: FakeClock, held: Any, taker: Target, swept: bool
) -> None:
    claim = _dead_hold(store, clock, held)
    if swept:
        assert store.sweep().expired == 1
        assert _reason(store, claim) is HoldLostReason.EXPIRED
    assert store.claim(taker, holder="rival", ttl=60)
    after = store.get(claim.id)
    assert after is not None and after.state is dibs.ClaimState.EXPIRED and after.taken_over
    assert _reason(store, claim) is HoldLostReason.TAKEN_OVER
    assert not store.release(claim.id, holder="late", fence=claim.fence)
    assert store.holder_of(taker) == "rival"


@pytest.mark.parametrize("swept", [False, True])
def test_a_claim_beside_a_dead_hold_does_not_take_it_over(
    store: dibs.Store, clock: FakeClock, swept: bool
) -> None:
    claim = _dead_hold(store, clock, [Unit("seat", "1"), Span("room", 0, 10)])
    if swept:
        store.sweep()
    assert store.claim([Unit("seat", "2"), Span("room", 10, 20)], holder="rival")
    assert _reason(store, claim) is HoldLostReason.EXPIRED


def _rows_of(url: str, schema: str, claim: dibs.Claim) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            f"SELECT (SELECT count(*) FROM {schema}.units_v4 WHERE id = %(id)s AND state <> "
            f"'request') + (SELECT count(*) FROM {schema}.spans_v4 WHERE claim_id = %(id)s)",
            {"id": int(claim.id)},
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_swept_hold_keeps_its_rows_until_it_is_purged(
    pg_url: str, store: dibs.Store, clock: FakeClock
) -> None:
    schema = store.schema  # type: ignore[attr-defined]
    claim = _dead_hold(store, clock, [Unit("seat", "1"), Span("room", 0, 10)])
    assert store.sweep().expired == 1
    assert _rows_of(pg_url, schema, claim) == 2
    assert store.holder_of(Unit("seat", "1")) is None
    assert store.claim(Unit("other"), holder="x")  # the newest claim is never purged
    clock.advance(61)
    assert store.sweep().purged_claims == 1
    assert store.get(claim.id) is None
    assert _rows_of(pg_url, schema, claim) == 0
    assert store.claim([Unit("seat", "1"), Span("room", 0, 10)], holder="rival")


# --- schema versions 1 and 2 -----------------------------------------------------------------


def _old_schema(url: str, schema: str, version: int) -> None:
    """Create ``schema`` as dibs schema ``version`` made it, holding one live hold.

    The old versions' SQL is frozen in tests/support/schemas: the package ships only
    the steps and the current functions.
    """
    frozen = (_SCHEMAS / f"postgres_claims_v{version}.sql").read_text()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(frozen.replace("{s}", schema).encode())
        conn.execute(
            f"INSERT INTO {schema}.meta (key, value) VALUES ('schema_version', %s)", (str(version),)
        )
        unit = Unit("seat", "old")
        conn.execute(
            f"SELECT * FROM {schema}.claim(%s, %s, %s, %s, %s, %s, %s, %s::text[], %s::text[], "
            "%s::text[], %s::text[], %s::numeric[], %s::numeric[])",
            (
                *("alice", targets_to_text((unit,)), None, None, None, None, 60.0),
                *([unit.resource], [unit.slot], None, None, None, None),
            ),
        )


def _function_source(url: str, schema: str, name: str) -> str:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s",
            (schema, name),
        ).fetchall()
    assert len(rows) == 1
    return str(rows[0][0])


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_schema_is_upgraded_to_the_current_version_in_place(
    pg_url: str, pg_schema_url: str, version: int
) -> None:
    schema = pg_schema_url.rsplit("schema=", 1)[1]
    _old_schema(pg_url, schema, version)
    clock = FakeClock()
    with dibs.open(pg_schema_url, clock=clock) as store:
        assert store.holder_of(Unit("seat", "old")) == "alice"
        assert not store.claim(Unit("seat", "old"), holder="bob")
        # Version 3's behaviour: a swept hold is still taken over.
        claim = _dead_hold(store, clock, [Unit("seat", "1"), Span("room", 0, 10)])
        store.sweep()
        assert store.claim(Unit("seat", "2"), holder="bob")
        assert _reason(store, claim) is HoldLostReason.EXPIRED
        assert store.claim(Span("room", *_TIMES), holder="bob")  # a kind switch
        assert _reason(store, claim) is HoldLostReason.TAKEN_OVER
    with psycopg.connect(pg_url) as conn:
        row = conn.execute(f"SELECT value FROM {schema}.meta WHERE key = 'schema_version'")
        assert row.fetchone() == (str(SCHEMA_VERSION),)
    assert 'COLLATE "C"' in _function_source(pg_url, schema, "transition_v4")
    assert 'COLLATE "C"' in _function_source(pg_url, schema, "sweep_v4")
    assert "NOT c.taken_over" in _function_source(pg_url, schema, "take_over_v4")
    assert "v_lost integer" in _function_source(pg_url, schema, "take_all_v4")


# --- no raw driver error escapes -----------------------------------------------------------------


def _options(url: str, *settings: str) -> str:
    """``url`` with libpq ``options`` setting server parameters for its sessions."""
    options = "%20".join(f"-c%20{s.replace('=', '%3D')}" for s in settings)
    return f"{url}&options={options}"


def test_lock_timeout_is_store_unavailable(pg_schema_url: str, pg_url: str) -> None:
    with dibs.open(pg_schema_url) as store:
        held = store.claim(Unit("seat", "1"), holder="alice", ttl=60).claim
        assert held is not None
    schema = pg_schema_url.rsplit("schema=", 1)[1]
    with (
        dibs.open(_options(pg_schema_url, "lock_timeout=100")) as store,
        psycopg.connect(pg_url) as blocker,
    ):
        blocker.execute(f"SELECT 1 FROM {schema}.units_v4 FOR UPDATE")
        blocker.execute(
            f"INSERT INTO {schema}.units_v4 (resource, slot, id, state, fence, created_at, "
            "updated_at) VALUES ('seat', '2', 0, 'free', 0, now(), now())"
        )
        # A claim refused by a live hold reads it and never waits (schema version 4).
        assert not store.claim(Unit("seat", "1"), holder="bob", ttl=5)
        for call in (
            lambda: store.claim(Unit("seat", "2"), holder="bob"),
            lambda: store.extend(held.id, holder="alice", fence=held.fence, ttl=5),
            lambda: store.confirm(held.id, holder="alice", fence=held.fence),
        ):
            with pytest.raises(StoreUnavailable) as raised:
                call()
            assert isinstance(raised.value.__cause__, psycopg.errors.LockNotAvailable)
        blocker.rollback()
        assert store.confirm(held.id, holder="alice", fence=held.fence)


def test_a_read_only_server_is_store_unavailable(pg_url: str, pg_schema_url: str) -> None:
    with dibs.open(pg_schema_url) as store:
        held = store.claim(Unit("seat", "1"), holder="alice", ttl=60).claim
        assert held is not None
    # What a hot standby answers to a write: SQLSTATE 25006.
    read_only = _options(pg_schema_url, "default_transaction_read_only=on")
    with dibs.open(read_only) as store:
        for call in (
            lambda: store.claim(Unit("seat", "2"), holder="bob"),
            lambda: store.claim(Unit("seat", "2"), holder="bob", ttl=5, request_id="r"),
            lambda: store.confirm(held.id, holder="alice", fence=held.fence),
            lambda: store.extend(held.id, holder="alice", fence=held.fence, ttl=5),
            lambda: store.release(held.id, holder="alice", fence=held.fence),
            store.sweep,
        ):
            with pytest.raises(StoreUnavailable) as raised:
                call()
            assert isinstance(raised.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)
        # Reads still answer.
        assert store.holder_of(Unit("seat", "1")) == "alice"
        assert store.get(held.id) == held
    # A first open cannot create its schema there either.
    with pytest.raises(StoreUnavailable) as raised:
        dibs.open(_options(schema_url(pg_url), "default_transaction_read_only=on"))
    assert isinstance(raised.value.__cause__, psycopg.errors.ReadOnlySqlTransaction)


def test_calls_racing_close_raise_store_closed(pg_schema_url: str) -> None:
    store = dibs.open(pg_schema_url, pool_max=1)
    errors: list[BaseException] = []
    started = threading.Barrier(9)

    def claim_until_closed(worker: int) -> None:
        started.wait()
        for n in itertools.count():
            try:
                store.claim(Unit(f"w{worker}", str(n)), holder="h", ttl=60)
            except BaseException as exc:  # every thread ends on an error: close() is coming
                errors.append(exc)
                return

    threads = [threading.Thread(target=claim_until_closed, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    started.wait()
    # Most workers are queued for the one connection when the pool closes.
    eventually(lambda: store.holder_of(Unit("w0", "3")) is not None, "the workers got going")
    store.close()
    for thread in threads:
        thread.join()
    assert [type(e) for e in errors] == [dibs.StoreClosed] * 8, errors
    with pytest.raises(dibs.StoreClosed):
        store.now()


def test_a_pool_closed_underneath_is_store_unavailable(pg_schema_url: str) -> None:
    with dibs.open(pg_schema_url) as store:
        store._pool.close()  # type: ignore[attr-defined]
        for call in (lambda: store.claim(Unit("seat", "1"), holder="alice"), store.now):
            with pytest.raises(StoreUnavailable):
                call()


# Outside the input domain (Store's checks refuse them first); the store's own
# boundary must still never let the driver's error through.
_UNSTORABLE = ["nul\x00name", "lone\udc80surrogate"]


@pytest.mark.parametrize("name", _UNSTORABLE)
def test_names_postgresql_cannot_store_are_invalid_input(store: dibs.Store, name: str) -> None:
    pg: Any = store
    unit = Unit("seat", "1")
    for call in (
        lambda: pg._claim(ClaimRequest.of((Unit(name, "1"),), "alice", None, None)),
        lambda: pg._claim(ClaimRequest.of((Unit("seat", name),), "alice", None, 5.0)),
        lambda: pg._claim(ClaimRequest.of((unit,), name, None, None)),
        lambda: pg._claim(ClaimRequest.of((unit,), "alice", name, None)),
        lambda: pg._claim(ClaimRequest.of((Span(name, 0, 1),), "alice", None, None)),
        lambda: pg._holder_of(Unit(name, "")),
        lambda: pg._claims_of(name),
    ):
        with pytest.raises(InvalidInput) as raised:
            call()
        assert raised.value.value == name
    claim = store.claim(unit, holder="alice", ttl=5).claim
    assert claim is not None
    with pytest.raises(InvalidInput):
        pg._confirm(claim.id, name, claim.fence)
    for op in (pg._confirm, pg._release):
        with pytest.raises(InvalidInput) as raised:
            op(claim.id, "alice", 2**63)  # past bigint
        assert raised.value.field == "fence"
    # Nothing was stored on the way.
    assert store.claims_of("alice") == [claim]


def test_a_value_the_server_rejects_is_invalid_input(store: dibs.Store) -> None:
    claim = store.claim(Unit("seat", "1"), holder="alice", ttl=5).claim
    assert claim is not None
    pg: Any = store
    # Past PostgreSQL's timestamps (Store's checks cap a TTL far below this).
    with pytest.raises(InvalidInput) as raised:
        pg._extend(claim.id, "alice", claim.fence, 1e15)
    assert isinstance(raised.value.__cause__, psycopg.errors.DatetimeFieldOverflow)
    assert store.get(claim.id) == claim


def _name(seed: int, chars: int = 341) -> str:
    """An incompressible name of ``3 * chars + 1`` UTF-8 bytes."""
    rng = random.Random(seed)
    return "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(chars)) + "x"


def test_names_at_the_length_limit_are_stored(store: dibs.Store) -> None:
    # 1024 UTF-8 bytes each, incompressible: the keys' indexes must take them.
    name = _name

    unit, span = Unit(name(1), name(2)), Span(name(3), 0, 1)
    result = store.claim([unit, span], holder=name(4), request_id=name(5), ttl=60)
    assert result and result.claim is not None
    assert store.holder_of(unit) == store.holder_of(span) == name(4)
    again = store.claim([unit, span], holder=name(4), request_id=name(5), ttl=60)
    assert again.replayed and again.claim == result.claim
    assert store.confirm(result.claim.id, holder=name(4), fence=result.claim.fence)


@pytest.mark.parametrize("url", ["postgresql://[::1/db", "{pg_url}?no_such_libpq_option=1"])
def test_a_malformed_connection_string_is_invalid_input(pg_url: str, url: str) -> None:
    # Refused at once: no pool retrying it until pool_timeout, no raw ValueError.
    with pytest.raises(InvalidInput) as raised:
        dibs.open(url.format(pg_url=pg_url), pool_timeout=60)
    assert raised.value.field == "url"
    with pytest.raises(InvalidInput):
        PostgresStore.from_url(url.format(pg_url=pg_url), pool_timeout=60)
    with pytest.raises(InvalidInput):
        PostgresStore("host=localhost no_such_libpq_option=1", pool_timeout=60)


def test_a_name_past_postgresqls_limits_is_invalid_input(store: dibs.Store) -> None:
    # Far outside the input domain: a key too big for its index page (54000).
    pg: Any = store
    huge: Unit = object.__new__(Unit)  # past the domain's check, as a driver-level test must be
    huge.__setstate__((_name(1, 1000), ""))
    with pytest.raises(InvalidInput) as raised:
        pg._claim(ClaimRequest.of((huge,), "alice", None, None))
    assert isinstance(raised.value.__cause__, psycopg.errors.ProgramLimitExceeded)


# --- fork: a child never touches the parent's sessions -----------------------------------------


@pytest.mark.parametrize("child_closes", [False, True])
def test_a_store_open_across_fork_works_in_parent_and_child(
    pg_url: str, child_closes: bool
) -> None:
    # Before: the child's queries went down the parent's pooled sessions, and the
    # parent's next call failed with "prepared statement _pg3_0 already exists".
    import os

    url = schema_url(pg_url, f"f_{secrets.token_hex(4)}")
    with dibs.open(url) as store:
        assert store.claim(Unit("before"), holder="parent")
        rounds = 40
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit code
            code = 0
            try:
                for i in range(rounds):
                    if not store.claim(Unit(f"child-{i}"), holder="child"):
                        code = 1
                if child_closes:
                    store.close()
            except BaseException:
                code = 2
            os._exit(code)
        granted = [bool(store.claim(Unit(f"parent-{i}"), holder="parent")) for i in range(rounds)]
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert all(granted)
        after = [bool(store.claim(Unit(f"after-{i}"), holder="parent")) for i in range(5)]
        assert all(after)
    with dibs.open(url) as fresh:
        assert len(fresh.claims_of("child")) == rounds
        assert len(fresh.claims_of("parent")) == 1 + rounds + 5
