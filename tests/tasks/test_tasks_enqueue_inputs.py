"""What ``enqueue``/``enqueue_many`` accept, on every store with a job table.

The caller's ``connection=`` must reach *this* store (the same SQLite file,
the same PostgreSQL database and schema), whatever factories it was made
with; arguments JSON cannot hold raise ``InvalidInput`` and add nothing.
Only the sync face: ``dibs.aio`` has no task processor.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sqlite3
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row, namedtuple_row

import dibs
from conftest import StoreMaker, kinds_offering
from dibs import InvalidInput, Store
from dibs.tasks import TaskProcessor
from dibs.tasks._jobs import job_table
from pg_fixtures import schema_url

GUARD = 60.0


CONNECTION_KINDS = ["sqlite", "postgresql"]
"""The job tables that take a caller's connection (``enqueue(connection=)``)."""


@pytest.fixture(params=kinds_offering("job_table"))
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(make_store: StoreMaker) -> Store:
    return make_store()


@pytest.fixture
def client(store: Store) -> Iterator[TaskProcessor]:
    """A processor that adds jobs and runs none: every row it adds stays to be looked at."""
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)

    @processor.task("echo")
    def echo(*args: Any, **kwargs: Any) -> Any:
        return [list(args), kwargs]

    yield processor
    processor.shutdown(timeout=GUARD)


def _rows(processor: TaskProcessor) -> list[str]:
    return [job.id for job in job_table(processor.store).find()]  # type: ignore[arg-type]


# --- connection= reaches this store, not another with a job table ---------------------------


@pytest.fixture
def other_place(make_store: StoreMaker, request: pytest.FixtureRequest) -> Iterator[str]:
    """A URL of *another* store with a job table: another SQLite file, or another
    PostgreSQL database holding a schema of the same name."""
    if make_store.kind == "sqlite":
        yield f"sqlite:///{make_store.tmp_path / 'other.db'}"
        return
    admin = request.getfixturevalue("pg_admin_url")
    name = f"dibs_other_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = urlunsplit(urlsplit(admin.split("?")[0])._replace(path=f"/{name}"))
    yield schema_url(url, make_store.pg_schema)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def _connect(url: str, **options: Any) -> Any:
    """The caller's own connection to the database of store URL ``url``."""
    if url.startswith("sqlite:///"):
        text_factory = options.pop("text_factory", str)
        conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, **options)
        conn.text_factory = text_factory
        conn.row_factory = sqlite3.Row
        return conn
    return psycopg.connect(url.partition("?")[0], **options)


def _begin(conn: Any) -> None:
    if isinstance(conn, sqlite3.Connection):
        conn.execute("BEGIN IMMEDIATE")


def _end(conn: Any, commit: bool) -> None:
    if isinstance(conn, sqlite3.Connection):
        if conn.in_transaction:
            conn.execute("COMMIT" if commit else "ROLLBACK")
    else:
        conn.commit() if commit else conn.rollback()


@pytest.mark.parametrize("store_kind", CONNECTION_KINDS, indirect=True)  # memory takes none
def test_a_connection_to_another_store_is_refused(
    make_store: StoreMaker, client: TaskProcessor, other_place: str
) -> None:
    """Before: the job landed in the other store's table and its ID was unknown here."""
    with dibs.open(other_place) as other:
        other_table = job_table(other)  # the other store has a job table of its own
        conn = _connect(other_place)
        try:
            _begin(conn)
            with pytest.raises(InvalidInput) as raised:
                client.enqueue("echo", 1, connection=conn)
            assert raised.value.field == "connection"
            with pytest.raises(InvalidInput):
                client.enqueue_many("echo", [(1,), (2,)], connection=conn)
            _end(conn, commit=True)
        finally:
            conn.close()
        assert other_table.find() == [] and _rows(client) == []


@pytest.mark.parametrize("store_kind", CONNECTION_KINDS, indirect=True)  # memory takes none
def test_a_connection_to_a_database_without_the_store_is_refused(
    make_store: StoreMaker, client: TaskProcessor, other_place: str
) -> None:
    """No job table there at all: refused before anything is sent that could fail and spoil
    the caller's transaction (PostgreSQL), which stays usable."""
    conn = _connect(other_place)
    try:
        _begin(conn)
        with pytest.raises(InvalidInput) as raised:
            client.enqueue("echo", 1, connection=conn)
        assert raised.value.field == "connection"
        assert conn.execute("SELECT 1").fetchone()[0] == 1  # still usable
        _end(conn, commit=False)
    finally:
        conn.close()


@pytest.mark.parametrize("store_kind", ["sqlite"], indirect=True)
def test_the_stores_file_by_another_path_is_accepted(
    make_store: StoreMaker, client: TaskProcessor
) -> None:
    """The same file is the same store, however it is spelled (here: through a symlink)."""
    link = make_store.tmp_path / "link.db"
    os.symlink(make_store.tmp_path / "dibs.db", link)
    conn = sqlite3.connect(link, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        job_id = client.enqueue("echo", 1, connection=conn)
        conn.execute("COMMIT")
    finally:
        conn.close()
    assert _rows(client) == [job_id]


@pytest.mark.parametrize("store_kind", ["sqlite"], indirect=True)
def test_a_temporary_job_table_on_the_connection_is_refused(
    make_store: StoreMaker, client: TaskProcessor
) -> None:
    """A TEMP table of the same name would hide the store's own from our statements."""
    conn = sqlite3.connect(make_store.tmp_path / "dibs.db", isolation_level=None)
    try:
        conn.execute("CREATE TEMP TABLE dibs_jobs AS SELECT * FROM main.dibs_jobs WHERE 0")
        with pytest.raises(InvalidInput) as raised:
            client.enqueue("echo", 1, connection=conn)
        assert raised.value.field == "connection"
    finally:
        conn.close()
    assert _rows(client) == []


# --- connection= works whatever the caller's factories ---------------------------------------


def _caller_factories(kind: str) -> list[dict[str, Any]]:
    if kind == "sqlite":
        return [
            {"text_factory": bytes},
            {"text_factory": lambda b: b.decode().upper()},
            {"text_factory": bytearray},
            {"detect_types": sqlite3.PARSE_DECLTYPES | sqlite3.PARSE_COLNAMES},
            {},
        ]
    return [
        {"cursor_factory": psycopg.RawCursor},
        {"cursor_factory": psycopg.ClientCursor},
        {"row_factory": dict_row},
        {"row_factory": namedtuple_row},
        {"autocommit": True},
        {},
    ]


@pytest.mark.parametrize("store_kind", CONNECTION_KINDS, indirect=True)  # memory takes none
@pytest.mark.parametrize("commit", [True, False])
def test_any_connection_the_driver_allows_gives_the_right_ids(
    make_store: StoreMaker, client: TaskProcessor, commit: bool
) -> None:
    """Before: text_factory=bytes gave a wrong ID (``"b'j-…'"``); RawCursor a TypeError."""
    added: list[str] = []
    for options in _caller_factories(make_store.kind):
        conn = _connect(make_store.url, **dict(options))
        try:
            _begin(conn)
            job_id = client.enqueue("echo", "x", connection=conn)
            ids = client.enqueue_many("echo", [("a",), ("b",)], connection=conn)
            keyed = client.enqueue("echo", "k", key=f"k-{len(added)}", connection=conn)
            again = client.enqueue("echo", "k", key=f"k-{len(added)}", connection=conn)
            assert again == keyed, options  # the standing job's ID, read back as text
            _end(conn, commit)
            autocommitted = getattr(conn, "autocommit", False) is True
        finally:
            conn.close()
        for one in (job_id, *ids, keyed):
            assert isinstance(one, str) and one.startswith("j-"), (options, one)
        if commit or autocommitted:
            added += [job_id, *ids, keyed]
        assert sorted(_rows(client)) == sorted(added), options


@pytest.mark.parametrize("store_kind", CONNECTION_KINDS, indirect=True)  # memory takes none
def test_a_batch_on_an_autocommit_connection_is_still_all_or_none(
    make_store: StoreMaker, client: TaskProcessor
) -> None:
    """No transaction of the caller's (psycopg autocommit; SQLite isolation_level=None and
    no BEGIN): the batch makes its own, so a batch larger than one INSERT (200 rows)
    cannot be half added. Before, on SQLite, each INSERT committed on its own."""
    if make_store.kind == "sqlite":
        conn: Any = sqlite3.connect(make_store.tmp_path / "dibs.db", isolation_level=None)
        sent: list[str] = []
        conn.set_trace_callback(sent.append)
    else:
        conn = psycopg.connect(make_store.url.partition("?")[0], autocommit=True)
    try:
        ids = client.enqueue_many("echo", [(n,) for n in range(450)], connection=conn)
        if isinstance(conn, sqlite3.Connection):
            inserts = [i for i, text in enumerate(sent) if text.startswith("INSERT")]
            begins = [i for i, text in enumerate(sent) if text.startswith("BEGIN")]
            commits = [i for i, text in enumerate(sent) if text == "COMMIT"]
            assert len(inserts) == 3 and len(begins) == len(commits) == 1, sent
            assert begins[0] < inserts[0] and inserts[-1] < commits[0]
            assert not conn.in_transaction
        else:
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        conn.close()
    assert sorted(_rows(client)) == sorted(ids) and len(set(ids)) == 450


# --- arguments JSON cannot hold -----------------------------------------------------------------


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


UNENCODABLE: list[Any] = [
    _circular(),
    10**5000,  # past Python's int -> str digit limit (4300 by default)
    math.nan,
    math.inf,
    -math.inf,
    {1: "a"},  # JSON would make it {"1": "a"}
    {"ok": [{None: 1}]},
    {(1, 2): "tuple key"},
    {1, 2},
    object(),
    b"bytes",
    _deep(200_000),  # deeper than any stack
]


@pytest.mark.parametrize("bad", UNENCODABLE, ids=lambda v: type(v).__name__)
def test_arguments_json_cannot_hold_are_invalid_input_and_add_nothing(
    client: TaskProcessor, bad: Any
) -> None:
    """Before: a circular list, a huge int or a deep nest raised a bare ValueError (or
    RecursionError); NaN and int keys were stored as something else."""
    with pytest.raises(InvalidInput) as raised:
        client.enqueue("echo", 1, bad)
    assert raised.value.field == "args"
    with pytest.raises(InvalidInput) as raised:
        client.enqueue("echo", 1, value=bad)
    assert raised.value.field == "kwargs"
    with pytest.raises(InvalidInput) as raised:  # the last call spoils the whole batch
        client.enqueue_many("echo", [(1,), {"x": 2}, ((3,), {"bad": bad})])
    assert raised.value.field == "kwargs"
    with pytest.raises(InvalidInput):
        client.enqueue_many("echo", [(1,), (bad,)])
    assert _rows(client) == []


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**4000), max_value=10**4000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(JSON, max_size=3), kwargs=st.dictionaries(st.text(max_size=8), JSON, max_size=3)
)
def test_every_json_value_is_accepted_and_comes_back_as_given(
    client: TaskProcessor, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """The accepted domain: whatever JSON holds (str keys, finite floats, ints up to the
    digit limit), stored and decoded unchanged."""
    job_id = client.enqueue("echo", *args, **{f"k_{k}": v for k, v in kwargs.items()})
    row = job_table(client.store).get(job_id)  # type: ignore[arg-type]
    assert row is not None
    assert json.loads(row.args) == [args, {f"k_{k}": v for k, v in kwargs.items()}]


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, {1: "a"}, 10**5000], ids=["nan", "inf", "int-key", "huge-int"]
)
def test_a_result_json_cannot_hold_fails_its_attempt(store: Store, bad: Any) -> None:
    """Before: NaN and infinities were stored as non-standard JSON (``NaN``, which
    ``dibs jobs show --json`` then printed) and ``{1: "a"}`` came back as ``{"1": "a"}``."""
    with TaskProcessor(store=store, workers=1, poll=0.02, sweep_every=None) as processor:

        @processor.task("give")
        def give() -> Any:
            return bad

        job_id = processor.enqueue("give")
        with pytest.raises(dibs.tasks.JobFailed) as failed:
            processor.result(job_id, timeout=GUARD)
        assert processor.job(job_id).state == "failed"
        assert failed.value.error is not None and "Error" in failed.value.error
