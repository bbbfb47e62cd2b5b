"""A unique enqueue inside the caller's REPEATABLE READ or SERIALIZABLE transaction.

Two real transactions take the same key at once: the caller's, whose snapshot was
taken first, and another that commits the key while the caller's waits on its row.
PostgreSQL aborts the caller's transaction with a serialization failure. That is
the caller's transaction's to retry as a whole, not a call to repeat, so dibs raises
:class:`dibs.TransactionConflict` (never the retryable-looking ``StoreUnavailable``);
rolled back and run again, the transaction sees the other's job and adds nothing.
SQLite's read transaction outdated by a commit (SQLITE_BUSY_SNAPSHOT) is the same case.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import IsolationLevel

import dibs
from dibs import StoreUnavailable, TransactionConflict
from dibs.tasks import Inserted, TaskProcessor, Unique
from eventually import eventually
from pg_fixtures import drop_schema, schema_url

GUARD = 60.0
LEVELS = [IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE]


@pytest.fixture
def place(pg_url: str) -> Iterator[tuple[str, str]]:
    """(store URL in a fresh schema, the database's plain URL for callers' connections)."""
    plain = pg_url.split("?", 1)[0]
    schema = f"t_{secrets.token_hex(6)}"
    yield schema_url(pg_url, schema), plain
    drop_schema(plain, schema)


def _processor(store: dibs.Store, mode: str) -> TaskProcessor:
    processor = TaskProcessor(store=store, take_jobs=False, sweep_every=None)
    window = None if mode == "refuse" else 60.0
    processor.task("mail", unique=Unique(key=("order",), window=window, mode=mode))(
        lambda order, note="": order
    )
    return processor


def _waiting_on_a_lock(admin: psycopg.Connection[Any], pid: int) -> bool:
    row = admin.execute(
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("mode", ["refuse", "replace", "debounce"])
@pytest.mark.parametrize("level", LEVELS, ids=lambda level: level.name)
def test_a_concurrent_enqueue_of_the_key_aborts_the_callers_snapshot_with_a_typed_error(
    place: tuple[str, str], level: IsolationLevel, mode: str
) -> None:
    """The caller's transaction (``level``) reads first, so its snapshot predates the other
    transaction's job; its enqueue of the key then waits on that job's uncommitted row,
    and fails when the other commits. The error is TransactionConflict (not
    StoreUnavailable); retried as a whole, the transaction finds the key held."""
    url, plain = place
    store = dibs.open(url)
    processor = _processor(store, mode)
    try:
        with (
            psycopg.connect(plain) as mine,
            psycopg.connect(plain) as theirs,
            psycopg.connect(plain, autocommit=True) as admin,
        ):
            mine.isolation_level = level
            mine.execute("SELECT 1")  # the snapshot is taken: before their job exists
            with theirs.transaction():
                first = processor.insert("mail", 1, connection=theirs)
                assert first.outcome == "added"
                caught: list[BaseException] = []

                def enqueue_mine() -> None:
                    try:
                        processor.insert("mail", 1, note="mine", connection=mine)
                    except BaseException as exc:
                        caught.append(exc)

                worker = threading.Thread(target=enqueue_mine)
                worker.start()
                eventually(
                    lambda: _waiting_on_a_lock(admin, mine.info.backend_pid),
                    "the caller's enqueue waits on their uncommitted job",
                )
            worker.join(GUARD)  # theirs committed as its block ended
            assert not worker.is_alive()
            assert len(caught) == 1, caught
            (error,) = caught
            assert isinstance(error, TransactionConflict), repr(error)
            assert not isinstance(error, StoreUnavailable)
            assert error.sqlstate == "40001"
            assert isinstance(error.__cause__, psycopg.errors.SerializationFailure)
            mine.rollback()
            # The whole transaction again: a new snapshot sees their job.
            with mine.transaction():
                again = processor.insert("mail", 1, note="mine", connection=mine)
            assert isinstance(again, Inserted)
            assert again.job_id == first.job_id
            assert again.outcome == ("duplicate" if mode == "refuse" else "replaced")
            assert len(store.job_table().find(name="mail")) == 1  # type: ignore[union-attr]
    finally:
        processor.shutdown(timeout=GUARD)
        store.close()


@pytest.mark.parametrize("level", LEVELS, ids=lambda level: level.name)
def test_a_key_committed_after_the_callers_snapshot_is_a_conflict_at_once(
    place: tuple[str, str], level: IsolationLevel
) -> None:
    """No waiting: the other transaction has already committed the key when the caller's
    (older snapshot) enqueues it. Also TransactionConflict, and the caller's connection
    is left for it to roll back, never committed or closed."""
    url, plain = place
    store = dibs.open(url)
    processor = _processor(store, "refuse")
    try:
        with psycopg.connect(plain) as mine:
            mine.isolation_level = level
            mine.execute("SELECT 1")
            theirs = processor.insert("mail", 2)  # the store's own transaction, committed
            with pytest.raises(TransactionConflict) as conflict:
                processor.insert("mail", 2, connection=mine)
            assert "roll back" in str(conflict.value)
            assert not mine.closed
            mine.rollback()
            assert processor.insert("mail", 2, connection=mine).job_id == theirs.job_id
            mine.commit()
    finally:
        processor.shutdown(timeout=GUARD)
        store.close()


def test_a_sqlite_read_transaction_outdated_by_a_commit_is_a_conflict(tmp_path: Path) -> None:
    """The caller's deferred transaction reads, the store commits the key, the caller's
    enqueue of it then cannot write on its old snapshot (SQLITE_BUSY_SNAPSHOT; no busy
    timeout helps): TransactionConflict, and its transaction run again finds the job."""
    path = tmp_path / "jobs.db"
    store = dibs.open(f"sqlite:///{path}")
    processor = _processor(store, "refuse")
    mine = sqlite3.connect(path, isolation_level=None)
    try:
        mine.execute("BEGIN")
        mine.execute("SELECT count(*) FROM dibs_jobs").fetchone()  # the snapshot
        theirs = processor.insert("mail", 3)
        with pytest.raises(TransactionConflict) as conflict:
            processor.insert("mail", 3, connection=mine)
        assert not isinstance(conflict.value, StoreUnavailable)
        assert conflict.value.sqlstate == "SQLITE_BUSY_SNAPSHOT"
        mine.execute("ROLLBACK")
        mine.execute("BEGIN")
        again = processor.insert("mail", 3, connection=mine)
        mine.execute("COMMIT")
        assert again.outcome == "duplicate" and again.job_id == theirs.job_id
    finally:
        mine.close()
        processor.shutdown(timeout=GUARD)
        store.close()
