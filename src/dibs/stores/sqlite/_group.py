"""Group commit: the write operations of many threads of one process in one transaction.

A caller hands in its work (a function of a connection, which reads the store
clock itself) and waits. One caller at a time leads: it takes every work
queued so far (up to :data:`MAX_BATCH`), runs them in one ``BEGIN IMMEDIATE``
transaction, each inside a ``SAVEPOINT`` of its own, commits, and only then
answers each caller; then it hands the lead to the first caller that queued
meanwhile. While one batch waits for its commit (``synchronous=full``: for the
disk), the next one gathers.

- **Atomic, each on its own.** A work that raises (a lost hold, a request
  conflict, bad input) rolls back to its savepoint; the others in the batch
  are untouched and the caller gets its exception.
- **Linearization point** of a work: its turn inside the batch, under the
  write lock that the whole batch holds; works run one after another in
  arrival order, each seeing those before it.
- **Nothing is answered before its commit.** If the commit fails, nothing in
  the batch happened: every work is run again (busy) or its caller gets the
  error. A driver error inside one work aborts the transaction (SQLite may
  already have rolled it back): that caller gets
  :class:`~dibs.StoreUnavailable` and the rest run again in a new batch.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from dibs.exceptions import StoreUnavailable
from dibs.stores.sqlite._conn import SQLitePool, _busy

__all__ = ["MAX_BATCH", "GroupCommit"]

MAX_BATCH = 256
"""Works in one transaction at most, so that one batch's latency stays bounded."""

_T = TypeVar("_T")


class _Pending(Generic[_T]):
    """One caller's work and, once its batch committed (or failed), its outcome."""

    __slots__ = ("error", "event", "finished", "lead", "value", "work")

    def __init__(self, work: Callable[[sqlite3.Connection], _T]) -> None:
        self.work = work
        self.event = threading.Event()  # set when finished, or when told to lead
        self.lead = False
        self.finished = False
        self.value: _T | None = None
        self.error: BaseException | None = None

    def finish(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error, self.finished = value, error, True
        self.event.set()


class _Poisoned(Exception):
    """Internal: work ``index`` of the batch hit a driver error; the transaction is void."""

    def __init__(self, index: int, error: sqlite3.Error) -> None:
        self.index = index
        self.error = error


class GroupCommit:
    """Runs the works of concurrent callers in shared write transactions on ``pool``."""

    def __init__(self, pool: SQLitePool) -> None:
        self._pool = pool
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()  # guards _queue and _leading
        self._queue: list[_Pending[Any]] = []
        self._leading = False

    def run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` in the next batch and return its value (or raise its error) after commit."""
        pending: _Pending[_T] = _Pending(work)
        with self._lock:
            self._queue.append(pending)
            if not self._leading:
                self._leading = pending.lead = True
        if not pending.lead:
            pending.event.wait()
        if not pending.finished:  # told to lead: our work is in the queue still
            self._lead()
        if pending.error is not None:
            raise pending.error
        return pending.value  # type: ignore[return-value]  # set by finish()

    def _lead(self) -> None:
        with self._lock:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
        try:
            self._run(batch)
        except BaseException as exc:  # KeyboardInterrupt and the like: nobody may hang
            # The interrupt is the leading thread's own, not the others': to them the
            # batch was cut short (rolled back, or committed just before), which is
            # StoreUnavailable: retry with the same request ID to learn the outcome.
            for pending in batch:
                if not pending.finished:
                    error = StoreUnavailable(
                        f"SQLite store {self._pool.path!r}: the thread leading this write's "
                        f"shared transaction was interrupted ({type(exc).__name__})"
                    )
                    error.__cause__ = exc
                    pending.finish(error=error)
            raise
        finally:
            with self._lock:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.event.set()
                else:
                    self._leading = False

    def _run(self, batch: list[_Pending[Any]]) -> None:
        while batch:
            try:
                outcomes = self._pool.retrying(lambda: self._attempt(batch))
            except _Poisoned as poisoned:
                failed = batch.pop(poisoned.index)
                try:
                    self._pool.retrying(functools.partial(_reraise, poisoned.error))
                except Exception as exc:  # handed to its caller
                    failed.finish(error=exc)
                continue
            except Exception as exc:  # gave up (busy), or the commit failed: nothing happened
                for pending in batch:
                    pending.finish(error=exc)
                return
            for pending, (value, error) in zip(batch, outcomes, strict=True):
                pending.finish(value, error)
            return

    def _attempt(self, batch: list[_Pending[Any]]) -> list[tuple[Any, BaseException | None]]:
        outcomes: list[tuple[Any, BaseException | None]] = []
        with self._pool.transaction("BEGIN IMMEDIATE") as conn:
            for index, pending in enumerate(batch):
                conn.execute("SAVEPOINT dibs_batch_item")
                try:
                    value = pending.work(conn)
                except sqlite3.Error as exc:
                    if _busy(exc):
                        raise  # the whole batch waits and runs again
                    raise _Poisoned(index, exc) from exc
                except Exception as exc:  # the caller's error, after commit
                    conn.execute("ROLLBACK TO dibs_batch_item")
                    conn.execute("RELEASE dibs_batch_item")
                    outcomes.append((None, exc))
                else:
                    conn.execute("RELEASE dibs_batch_item")
                    outcomes.append((value, None))
        return outcomes


def _reraise(error: sqlite3.Error) -> None:
    """Raise ``error`` again, for the pool to translate into a dibs error."""
    raise error


# A fork child starts with no batch: the parent's queued callers and its leader did not come
# along (nor, maybe, the holder of the lock). The pool decides whether the file is usable.
_instances: weakref.WeakSet[GroupCommit] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for group in list(_instances):
        group._reset()


os.register_at_fork(after_in_child=_after_fork_in_child)
