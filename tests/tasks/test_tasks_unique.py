"""Unique jobs (``@task(unique=Unique(...))``) on every store with a job table.

Keys, windows, the states that count, and the three modes, driven with a
FakeClock shared by the store and the processor; the job table's own calls
(take, finish, cancel) move jobs between states at chosen times, so no worker
thread is needed. The caller's rollback test runs a worker: the job runs once.
"""

from __future__ import annotations

import itertools
import secrets
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dibs
from conftest import StoreMaker, kinds_offering
from dibs import FakeClock, InvalidInput, Store
from dibs.stores.jobs import Job, JobTable
from dibs.tasks import Inserted, TaskProcessor, Unique
from dibs.tasks._time import DURATION_MAX
from dibs.tasks._unique import WINDOW_MIN
from dibs.testing.strategies import names
from pg_fixtures import drop_schema, schema_url

QUICK = True

T0 = 1_800_000_000.0
GUARD = 60.0


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(make_store: StoreMaker, clock: FakeClock) -> Store:
    return make_store(clock)


@pytest.fixture
def tasks(store: Store, clock: FakeClock) -> Iterator[TaskProcessor]:
    """A processor that adds jobs and runs none: the tests move the rows themselves."""
    processor = TaskProcessor(store=store, clock=clock, take_jobs=False, sweep_every=None)
    yield processor
    processor.shutdown(timeout=GUARD)


def _table(store: Store) -> JobTable:
    table = store.job_table()
    assert table is not None
    return table


def _rows(store: Store, name: str | None = None) -> list[Job]:
    return _table(store).find(name=name)


def _run(store: Store, job_id: str, kind: str = "ok") -> None:
    """Take ``job_id`` (the only due job) and finish it as ``kind``."""
    (taken,) = _table(store).take(None, 1, 30.0, "test-holder")
    assert taken.id == job_id and taken.fence is not None
    assert _table(store).finish(job_id, taken.fence, kind, "null") is not None


# --- keys ---------------------------------------------------------------------------------


def test_refuse_returns_the_standing_job_and_adds_nothing(tasks: TaskProcessor) -> None:
    @tasks.task("send", unique=Unique())
    def send(user: int, text: str = "hi") -> None: ...

    first = tasks.insert("send", 1)
    assert first.outcome == "added" and not first.duplicate
    # Every argument is the default key, bound to the signature: these are one call.
    for again in (tasks.insert("send", 1, "hi"), tasks.insert("send", user=1)):
        assert again == Inserted(first.job_id, "duplicate") and again.duplicate
    assert tasks.enqueue("send", 1) == first.job_id
    assert tasks.insert("send", 1, "other").outcome == "added"
    assert tasks.insert("send", 2).outcome == "added"
    assert len(_rows(tasks.store)) == 3  # type: ignore[arg-type]


def test_a_key_of_chosen_arguments_or_of_a_function(tasks: TaskProcessor) -> None:
    @tasks.task("by-user", unique=Unique(key=("user",)))
    def by_user(user: int, text: str) -> None: ...

    @tasks.task("by-fn", unique=Unique(key=lambda order, **_: f"order-{order['id']}"))
    def by_fn(order: dict[str, Any], note: str = "") -> None: ...

    @tasks.task("one-at-a-time", unique=Unique(key=()))
    def one(n: int) -> None: ...

    a = tasks.insert("by-user", 7, "a")
    assert tasks.insert("by-user", user=7, text="b") == Inserted(a.job_id, "duplicate")
    b = tasks.insert("by-fn", {"id": 1, "total": 5})
    assert tasks.insert("by-fn", {"id": 1, "total": 9}, note="x").job_id == b.job_id
    c = tasks.insert("one-at-a-time", 1)
    assert tasks.insert("one-at-a-time", 2).job_id == c.job_id
    # Keys are per task: another task's job never holds this one's key.
    assert tasks.insert("by-user", 1, "x").outcome == "added"


def test_insert_tells_a_plain_keys_duplicate_too(tasks: TaskProcessor) -> None:
    @tasks.task("plain")
    def plain(n: int) -> None: ...

    first = tasks.insert("plain", 1, key="k")
    assert first.outcome == "added"
    assert tasks.insert("plain", 2, key="k") == Inserted(first.job_id, "duplicate")


def test_a_per_call_rule_overrides_the_tasks(tasks: TaskProcessor) -> None:
    @tasks.task("plain")
    def plain(n: int) -> None: ...

    rule = Unique(key=())
    first = tasks.insert("plain", 1, unique=rule)
    assert tasks.insert("plain", 2, unique=rule).job_id == first.job_id
    assert tasks.insert("plain", 2).outcome == "added"  # no rule: plain enqueue


# --- windows --------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [WINDOW_MIN, 1.0, 3600.0, timedelta(days=2)])
def test_a_job_counts_for_its_window_and_not_after(
    tasks: TaskProcessor, clock: FakeClock, window: float | timedelta
) -> None:
    seconds = window.total_seconds() if isinstance(window, timedelta) else window

    @tasks.task("w", unique=Unique(window=window))
    def w(n: int) -> None: ...

    first = tasks.insert("w", 1)
    clock.advance(seconds / 2)
    assert tasks.insert("w", 1) == Inserted(first.job_id, "duplicate")
    clock.advance(seconds)
    second = tasks.insert("w", 1)
    assert second.outcome == "added" and second.job_id != first.job_id
    # The expired one is still a job (it runs); it no longer holds the key.
    assert {j.id for j in _rows(tasks.store)} == {first.job_id, second.job_id}  # type: ignore[arg-type]


def test_the_longest_window_and_none_keep_the_key(tasks: TaskProcessor, clock: FakeClock) -> None:
    @tasks.task("long", unique=Unique(window=DURATION_MAX))
    def long(n: int) -> None: ...

    @tasks.task("forever", unique=Unique())
    def forever(n: int) -> None: ...

    a, b = tasks.insert("long", 1), tasks.insert("forever", 1)
    clock.advance(400 * 24 * 3600)
    assert tasks.insert("long", 1).job_id == a.job_id
    assert tasks.insert("forever", 1).job_id == b.job_id


# --- states -------------------------------------------------------------------------------


def test_by_default_waiting_and_running_jobs_count_and_finished_ones_do_not(
    tasks: TaskProcessor, store: Store
) -> None:
    @tasks.task("t", unique=Unique())
    def t(n: int) -> None: ...

    first = tasks.insert("t", 1, delay=0)
    (taken,) = _table(store).take(None, 1, 30.0, "h")
    assert tasks.insert("t", 1) == Inserted(first.job_id, "duplicate")  # running counts
    assert taken.fence is not None
    _table(store).finish(first.job_id, taken.fence, "ok", "null")
    assert tasks.insert("t", 1).outcome == "added"


@pytest.mark.parametrize(("state", "kind"), [("done", "ok"), ("failed", "error"),
                                             ("cancelled", "cancelled")])  # fmt: skip
def test_a_finished_state_counts_when_chosen_until_the_window_ends(
    tasks: TaskProcessor, store: Store, clock: FakeClock, state: str, kind: str
) -> None:
    @tasks.task("t", unique=Unique(window=60, states=[state, "running", "pending"]))
    def t(n: int) -> None: ...

    first = tasks.insert("t", 1)
    _run(store, first.job_id, kind)
    assert _table(store).get(first.job_id).state == state  # type: ignore[union-attr]
    assert tasks.insert("t", 1) == Inserted(first.job_id, "duplicate")
    clock.advance(60)
    assert tasks.insert("t", 1).outcome == "added"


def test_a_cancelled_pending_job_frees_its_key_unless_cancelled_counts(
    tasks: TaskProcessor,
) -> None:
    @tasks.task("a", unique=Unique())
    def a(n: int) -> None: ...

    @tasks.task("b", unique=Unique(states=("pending", "running", "cancelled")))
    def b(n: int) -> None: ...

    for name, frees in (("a", True), ("b", False)):
        first = tasks.insert(name, 1)
        assert tasks.cancel(first.job_id)
        assert (tasks.insert(name, 1).outcome == "added") is frees


def test_retrying_a_job_whose_key_another_holds_is_refused_not_an_error(
    tasks: TaskProcessor, store: Store
) -> None:
    @tasks.task("t", unique=Unique())
    def t(n: int) -> None: ...

    first = tasks.insert("t", 1)
    _run(store, first.job_id, "error")
    second = tasks.insert("t", 1)
    assert second.outcome == "added"
    assert tasks.retry(first.job_id) is False  # two would count: the index would refuse
    assert tasks.cancel(second.job_id)
    assert tasks.retry(first.job_id) is True


# --- modes --------------------------------------------------------------------------------


def test_replace_gives_the_waiting_job_the_new_call_and_leaves_a_running_one(
    tasks: TaskProcessor, store: Store, clock: FakeClock
) -> None:
    @tasks.task("r", unique=Unique(key=("user",), mode="replace"))
    def r(user: int, text: str) -> None: ...

    first = tasks.insert("r", 1, "old", delay=100)
    again = tasks.insert("r", 1, "new", delay=5)
    assert again == Inserted(first.job_id, "replaced")
    job = _table(store).get(first.job_id)
    assert job is not None and job.args == '[[1, "new"], {}]' and job.run_at == T0 + 5
    clock.advance(5)
    _table(store).take(None, 1, 30.0, "h")
    # Running: not touched, and the call adds nothing (it counts while running).
    assert tasks.insert("r", 1, "newer") == Inserted(first.job_id, "duplicate")
    assert _table(store).get(first.job_id).args == '[[1, "new"], {}]'  # type: ignore[union-attr]
    assert len(_rows(store)) == 1


def test_debounce_runs_once_with_the_last_call_after_a_quiet_window(
    tasks: TaskProcessor, store: Store, clock: FakeClock
) -> None:
    @tasks.task("d", unique=Unique(key=(), window=5, mode="debounce"))
    def d(n: int) -> None: ...

    first = tasks.insert("d", 1)
    for n in (2, 3, 4):
        clock.advance(3)  # inside the window: pushed back again
        assert tasks.insert("d", n) == Inserted(first.job_id, "replaced")
        assert _table(store).take(None, 5, 30.0, "h") == []
    clock.advance(5)
    (taken,) = _table(store).take(None, 5, 30.0, "h")
    assert taken.id == first.job_id and taken.args == "[[4], {}]"
    assert taken.run_at == T0 + 9 + 5
    assert tasks.insert("d", 5) == Inserted(first.job_id, "duplicate")  # it has started
    assert taken.fence is not None
    _table(store).finish(first.job_id, taken.fence, "ok", "null")
    assert tasks.insert("d", 6).outcome == "added"


# --- bad input: typed errors naming the field, nothing added ---------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mode": "skip"}, "unique.mode"),
        ({"key": "user"}, "unique.key"),
        ({"key": ("user", 3)}, "unique.key"),
        ({"key": ("not an identifier",)}, "unique.key"),
        ({"key": 5}, "unique.key"),
        ({"window": 0}, "unique.window"),
        ({"window": -1}, "unique.window"),
        ({"window": WINDOW_MIN / 2}, "unique.window"),
        ({"window": float("nan")}, "unique.window"),
        ({"window": DURATION_MAX * 2}, "unique.window"),
        ({"window": True}, "unique.window"),
        ({"window": "60"}, "unique.window"),
        ({"states": "pending"}, "unique.states"),
        ({"states": ("pending",)}, "unique.states"),
        ({"states": ("running", "done")}, "unique.states"),
        ({"states": ("pending", "running", "waiting")}, "unique.states"),
        ({"states": None}, "unique.states"),
        ({"mode": "debounce"}, "unique.window"),
        ({"mode": "debounce", "window": 1, "states": ("pending", "running", "done")},
         "unique.states"),
    ],
)  # fmt: skip
def test_bad_options_are_invalid_input_naming_the_field(
    options: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput) as raised:
        Unique(**options)
    assert raised.value.field == field


def test_bad_calls_are_invalid_input_and_add_nothing(tasks: TaskProcessor) -> None:
    with pytest.raises(InvalidInput) as raised:
        tasks.task("x", unique={"key": ()})  # type: ignore[arg-type]
    assert raised.value.field == "unique"
    with pytest.raises(InvalidInput) as raised:

        @tasks.task("y", unique=Unique(key=("missing",)))
        def y(user: int) -> None: ...

    assert raised.value.field == "unique.key"

    made: list[object] = [7, "", None, "\ud800", b"k", ["k"]]

    @tasks.task("fn", unique=Unique(key=lambda n: made[n]))
    def fn(n: int) -> None: ...

    for n in range(len(made)):
        with pytest.raises(InvalidInput) as raised:
            tasks.insert("fn", n)
        assert raised.value.field == "unique.key"

    @tasks.task("deb", unique=Unique(window=1, mode="debounce"))
    def deb(n: int) -> None: ...

    with pytest.raises(InvalidInput) as raised:
        tasks.insert("deb", 1, delay=5)
    assert raised.value.field == "delay"
    with pytest.raises(InvalidInput) as raised:
        tasks.insert("deb", 1, key="k")
    assert raised.value.field == "key"
    with pytest.raises(InvalidInput) as raised:
        tasks.enqueue_many("deb", [(1,), (2,)], delay=5)  # a batch is checked as one call
    assert raised.value.field == "delay"
    with pytest.raises(InvalidInput) as raised:
        tasks.insert_many("deb", [(1,), (2,)], key="k")
    assert raised.value.field == "key"
    with pytest.raises(InvalidInput) as raised:
        tasks.insert_many("deb", [(1,), (1, 2, 3)])  # the second is bad: neither is added
    assert raised.value.field == "args"
    with pytest.raises(InvalidInput) as raised:
        tasks.insert("deb", 1, 2, 3)  # does not fit the signature: it could never run
    assert raised.value.field == "args"
    assert _rows(tasks.store) == []  # type: ignore[arg-type]


# --- Hypothesis: any JSON arguments, windows at both ends, shuffled states ---------------------

_json = st.recursive(
    st.none() | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=()), max_size=8),  # lone surrogates too
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(st.characters(blacklist_categories=()), max_size=4), children,
                      max_size=3),
    max_leaves=8,
)  # fmt: skip
_states = st.lists(
    st.sampled_from(["pending", "running", "done", "failed", "cancelled"]), max_size=6
).flatmap(lambda extra: st.permutations(["pending", "running", *extra]))
_windows = (
    st.none()
    | st.floats(min_value=WINDOW_MIN, max_value=DURATION_MAX)
    | st.sampled_from([WINDOW_MIN, DURATION_MAX])
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=_json, other=_json, text=names(), window=_windows, states=_states)
def test_any_arguments_make_a_stable_key(
    tasks: TaskProcessor, clock: FakeClock, value: Any, other: Any, text: str,
    window: float | None, states: list[str],
) -> None:  # fmt: skip
    rule = Unique(window=window, states=states)
    assert set(rule.states) == set(states) and len(rule.states) == len(set(states))
    name = f"h-{next(_COUNTER)}"  # a fresh task per example: keys never meet across them

    @tasks.task(name, unique=rule)
    def h(value: Any, text: str, other: Any = None) -> None: ...

    first = tasks.insert(name, value, text, other)
    assert first.outcome == "added"
    assert tasks.insert(name, value=value, text=text, other=other).job_id == first.job_id
    changed = tasks.insert(name, [value], text, other)
    assert changed.outcome == "added"
    assert len(_rows(tasks.store, name)) == 2  # type: ignore[arg-type]
    if window is not None:
        clock.advance(window * (1 + 1e-9) + 1e-6)  # just past it, whatever the rounding
        assert tasks.insert(name, value, text, other).outcome == "added"


_COUNTER = itertools.count()


# --- the caller's transaction ---------------------------------------------------------------


def _worker(store: Store, seen: list[int]) -> TaskProcessor:
    processor = TaskProcessor(store=store, workers=2, poll=0.02, sweep_every=None)

    @processor.task("order-mail", unique=Unique(key=("order",)))
    def mail(order: int) -> int:
        seen.append(order)
        return order

    return processor


def test_a_rolled_back_sqlite_enqueue_frees_its_key_and_the_next_one_runs_once(
    tmp_path: Any,
) -> None:
    path = tmp_path / "u.db"
    store = dibs.open(f"sqlite:///{path}")
    seen: list[int] = []
    processor = _worker(store, seen)
    try:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE orders (id INTEGER)")
        conn.execute("INSERT INTO orders VALUES (1)")
        first = processor.insert("order-mail", 1, connection=conn)
        assert processor.insert("order-mail", 1, connection=conn) == Inserted(
            first.job_id, "duplicate"
        )
        conn.rollback()  # the order and its job go; so must the key
        assert _rows(store) == []
        again = processor.insert("order-mail", 1, connection=conn)
        assert again.outcome == "added"
        conn.commit()
        conn.close()
        assert processor.result(again.job_id, timeout=GUARD) == 1
        later = processor.insert("order-mail", 1)  # done: the key is free again
        assert later.outcome == "added"
        assert processor.result(later.job_id, timeout=GUARD) == 1
        assert seen.count(1) == 2 and len(_rows(store)) == 2
    finally:
        processor.shutdown(timeout=GUARD)
        store.close()


def test_a_rolled_back_postgres_enqueue_frees_its_key_and_the_next_one_runs_once(
    pg_url: str,
) -> None:
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    store = dibs.open(schema_url(pg_url, schema))
    seen: list[int] = []
    processor = _worker(store, seen)
    try:
        with psycopg.connect(pg_url.split("?", 1)[0]) as conn:
            with pytest.raises(ZeroDivisionError), conn.transaction():
                first = processor.insert("order-mail", 1, connection=conn)
                assert processor.insert("order-mail", 1, connection=conn).job_id == first.job_id
                raise ZeroDivisionError
            assert _rows(store) == []
            with conn.transaction():
                again = processor.insert("order-mail", 1, connection=conn)
            assert again.outcome == "added"
        assert processor.result(again.job_id, timeout=GUARD) == 1
        assert processor.join(GUARD)
        assert seen == [1] and len(_rows(store)) == 1
    finally:
        processor.shutdown(timeout=GUARD)
        store.close()
        drop_schema(pg_url.split("?", 1)[0], schema)


# --- async def tasks ------------------------------------------------------------------------


def test_an_async_task_is_unique_too_and_runs_once(tmp_path: Any) -> None:
    """``dibs.aio`` has no task processor: the async face of tasks is ``async def`` tasks,
    run on the processor's loop; their jobs are unique by the same rule."""
    store = dibs.open(f"sqlite:///{tmp_path / 'a.db'}")
    seen: list[int] = []
    processor = TaskProcessor(store=store, poll=0.02, sweep_every=None)
    try:

        @processor.task("async-mail", unique=Unique(key=("order",), states=(
            "pending", "running", "done")))  # fmt: skip
        async def mail(order: int, note: str = "") -> int:
            seen.append(order)
            return order

        first = processor.insert("async-mail", 3)
        assert processor.result(first.job_id, timeout=GUARD) == 3
        # Done counts (no window): every later call is the same job, which ran once.
        assert processor.insert("async-mail", order=3, note="x") == Inserted(
            first.job_id, "duplicate"
        )
        assert seen == [3]
    finally:
        processor.shutdown(timeout=GUARD)
        store.close()
