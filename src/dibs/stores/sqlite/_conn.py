"""Connections to one SQLite database: shared by the SQLite store and its durable job table.

A small pool, not one connection per thread: a connection is checked out for one
operation and comes back after it, so a thousand short-lived threads use a
handful of file descriptors, not two each until ``close()``. ``:memory:`` is one
connection that every thread takes in turn (each ``sqlite3`` connection to
``:memory:`` would be a database of its own).

fork(). SQLite keeps, per process, what it believes about its POSIX locks on a
file (one record per inode, shared by every connection to that file). A child
inherits that belief but not the locks, which belong to the parent. A
connection the child opens on the same file joins the inherited record and so
takes no lock of its own; when the parent's last connection closes, it finds
no other holder, checkpoints and deletes the WAL, and the child keeps
committing into the deleted file. Closing the inherited connection in the child
is no cure: SQLite's cleanup on close may delete the WAL under other processes
(https://www.sqlite.org/howtocorrupt.html#fork). So:

- Before a fork (``os.register_at_fork``), every pool in the process stops
  handing out connections, waits up to its ``busy_timeout`` for calls in other
  threads to finish, and closes its idle connections. The child then inherits
  no SQLite state for the file, and opens connections of its own; the parent
  reopens as it needs.
- A connection still in use at the fork (a call that outlived the wait) is
  abandoned in the child: never used and never closed (an extra reference keeps
  even interpreter shutdown from closing it). Its file is then refused in the
  child with :class:`~dibs.StoreClosed`, by this pool and by any pool opened
  later, because no connection to it can be correct in that process.
- A ``:memory:`` database belongs to the process that opened it: the child's
  copy would grant what the parent also grants, so it is refused in the child.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TypeVar

from dibs.exceptions import StoreClosed, StoreMisconfigured, StoreUnavailable
from dibs.stores._fork import abandon
from dibs.stores._retry import retrying

__all__ = ["IDLE_LIMIT", "SQLitePool", "file_id"]

IDLE_LIMIT = 16
"""Idle connections a pool keeps; more are closed when they come back."""

_T = TypeVar("_T")

logger = logging.getLogger("dibs.stores.sqlite")

# Pools of this process, for the fork hooks. The lock guards the set; the fork hooks hold it
# from before the fork until after it, so no pool is created halfway through a fork.
_registry_lock = threading.Lock()
_pools: weakref.WeakSet[SQLitePool] = weakref.WeakSet()
# Files this process must not touch: (st_dev, st_ino) -> why. Written only in a fork child.
_refused_files: dict[tuple[int, int], str] = {}


def _busy(exc: Exception) -> bool:
    """Whether ``exc`` is SQLite's transient error: another connection holds the lock."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    message = str(exc).lower()
    return "locked" in message or "busy" in message


def _rollback(conn: sqlite3.Connection) -> None:
    """End whatever transaction ``conn`` is in; check-in discards it if this fails."""
    if conn.in_transaction:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


class SQLitePool:
    """Connections to ``path``, one per concurrent operation, reused; fork-aware.

    Lock order: a pool's ``_cond`` is never held while taking another pool's, except by the
    fork hooks, which hold ``_registry_lock`` and then take each pool's in turn.
    """

    def __init__(self, path: str, *, busy_timeout: float, synchronous: str) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.synchronous = synchronous
        self.memory = path == ":memory:"
        # The last call failed (logged once per outage); unguarded: a race costs a log line.
        self._failing = False
        # _lock guards every field below; _cond is on it. The claim path takes _lock directly
        # (no Python-level frames) and wakes waiters only when there are some.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._idle: list[sqlite3.Connection] = []  # LIFO: the warmest statement cache first
        self._busy: dict[sqlite3.Connection, int] = {}  # checked out -> owner thread ident
        self._opening = 0  # connections being opened outside the lock
        self._forking = False  # between the fork hooks: hand nothing out
        self._closed = False
        self._refused: str | None = None  # why this pool cannot be used in this process
        self._pid = os.getpid()
        self._file: tuple[int, int] | None = None
        if not self.memory:
            self._file = file_id(path)
            if self._file in _refused_files:
                raise StoreClosed(_refused_files[self._file])
        with _registry_lock:
            _pools.add(self)
        if self.memory:
            self._idle.append(self._open())  # the database itself: lives until close()

    # --- checkout -------------------------------------------------------------------------------

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """A connection of this process, for one operation (no nesting on one pool)."""
        conn = self._checkout()
        try:
            yield conn
        finally:
            self._checkin(conn)

    @contextmanager
    def transaction(self, begin: str = "BEGIN IMMEDIATE") -> Iterator[sqlite3.Connection]:
        """One transaction; whatever happens, the connection comes back outside it.

        A failed COMMIT may leave SQLite inside the transaction (a deferred constraint,
        ``SQLITE_BUSY``) or roll it back itself (``SQLITE_FULL``, I/O errors): either way
        it is rolled back here, so the next operation starts clean.
        """
        with self.connection() as conn:
            conn.execute(begin)
            try:
                yield conn
            except BaseException:
                _rollback(conn)
                raise
            if conn.in_transaction:  # a losing claim may already have rolled back
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise

    def run(self, work: Callable[[sqlite3.Connection], _T], begin: str = "BEGIN IMMEDIATE") -> _T:
        """``work(conn)`` in one transaction, like :meth:`transaction` without its generator."""
        conn = self._checkout()
        try:
            conn.execute(begin)
            try:
                result = work(conn)
                if conn.in_transaction:
                    conn.execute("COMMIT")
            except BaseException:
                _rollback(conn)
                raise
            return result
        finally:
            # Checked out above by this thread in this process, and nothing here forks.
            self._checkin(conn, same_process=True)

    def retrying(self, work: Callable[[], _T]) -> _T:
        """Run ``work``, retrying while the database is busy, up to ``busy_timeout``.

        Every other SQLite error is :class:`~dibs.StoreUnavailable` at once.
        """
        started = time.monotonic()
        try:
            answer = work()
        except Exception as exc:
            # The retry loop and its closures are built only once a try failed: most calls
            # succeed at once, and the claim path pays for every object it makes.
            answer = self._retry(work, exc, started)
        if self._failing:
            self._failing = False
            logger.info("SQLite store %r answers again", self.path)
        return answer

    def _retry(self, work: Callable[[], _T], first: Exception, started: float) -> _T:
        """:meth:`retrying` after its first try raised ``first``: the same loop, the same errors."""

        def gave_up(exc: Exception, tries: int) -> Exception:
            return StoreUnavailable(
                f"SQLite store {self.path!r} stayed busy for {self.busy_timeout:g}s: {exc}"
            )

        pending: list[Exception] = [first]

        def again() -> _T:
            if pending:  # the loop meets the first try's error as its own first failure
                raise pending.pop()
            return work()

        seconds = self.busy_timeout - (time.monotonic() - started)  # counted from the first try
        try:
            return retrying(again, transient=_busy, gave_up=gave_up, seconds=seconds, logger=logger)
        except StoreUnavailable as exc:
            self._failed(exc)
            raise
        except sqlite3.DatabaseError as exc:
            error = StoreUnavailable(f"SQLite store {self.path!r}: {exc}")
            self._failed(error)
            raise error from exc

    def _failed(self, error: StoreUnavailable) -> None:
        if not self._failing:  # once per outage, not once per call
            self._failing = True
            logger.warning("%s", error)

    def close(self) -> None:
        """Close idle connections now, and busy ones as they come back."""
        with self._cond:
            self._adopt_if_forked()
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        for conn in idle:
            with suppress(sqlite3.Error):
                conn.close()

    def _wait(self, timeout: float | None = None) -> None:
        """Under ``_lock``: wait for a change (a connection back, a fork over)."""
        self._waiting += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._waiting -= 1

    def _checkout(self) -> sqlite3.Connection:
        me = threading.get_ident()
        with self._lock:
            # The common case, tested inline (what _check_usable checks, one getpid()).
            if (
                self._idle
                and not (self._closed or self._forking or _refused_files)
                and self._refused is None
                and self._pid == os.getpid()
            ):
                conn = self._idle.pop()
                self._busy[conn] = me
                return conn
            while True:
                self._check_usable()
                if self._forking:
                    self._wait()
                elif self._idle:
                    conn = self._idle.pop()
                    self._busy[conn] = me
                    return conn
                elif self.memory:
                    self._wait()  # the one connection is in use by another thread
                else:
                    break
            self._opening += 1
        try:
            conn = self._open()
        except BaseException:
            with self._lock:
                self._opening -= 1
                self._cond.notify_all()
            raise
        with self._lock:
            self._opening -= 1
            self._busy[conn] = me
            self._cond.notify_all()
        return conn

    def _checkin(self, conn: sqlite3.Connection, *, same_process: bool = False) -> None:
        # Unlocked reads (each atomic under the GIL): the fork hooks change these only when
        # this connection is abandoned, and the locked pop below decides. ``same_process``:
        # the caller checked the connection out in this process itself (no getpid(), a
        # system call, on the claim path).
        if (not same_process and self._pid != os.getpid()) or conn not in self._busy:
            return  # carried across fork(): abandoned, never touched again
        if conn.in_transaction:
            _rollback(conn)
        healthy = not conn.in_transaction
        with self._lock:
            if self._busy.pop(conn, None) is None:
                return  # adopted by a fork that bypassed Python's hooks: abandoned
            keep = not self._closed and (self.memory or (healthy and len(self._idle) < IDLE_LIMIT))
            if keep:
                self._idle.append(conn)
            if self._waiting:
                self._cond.notify_all()
        if not keep:
            with suppress(sqlite3.Error):
                conn.close()

    def _check_usable(self) -> None:
        """Under ``_cond``: raise if this pool must not hand out connections here."""
        if self._closed:
            raise StoreClosed(f"SQLite store {self.path!r} is closed")
        self._adopt_if_forked()
        if self._refused is not None:
            raise StoreClosed(self._refused)
        if self._file is not None and self._file in _refused_files:
            raise StoreClosed(_refused_files[self._file])

    def _open(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,  # we issue BEGIN ourselves
                check_same_thread=False,  # pooled: used by one thread at a time, any thread
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            raise _open_error(self.path, exc) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            conn.execute("PRAGMA foreign_keys = OFF")
        except sqlite3.Error as exc:
            conn.close()
            raise StoreUnavailable(f"cannot open SQLite store {self.path!r}: {exc}") from exc
        if self._file is None and not self.memory:
            self._file = file_id(self.path)  # the file exists now
        return conn

    # --- fork -----------------------------------------------------------------------------------

    def _before_fork(self) -> None:
        if self.memory:
            return  # refused in the child whatever happens; nothing to quiesce
        me = threading.get_ident()
        deadline = time.monotonic() + self.busy_timeout
        with self._cond:
            if self._pid != os.getpid():
                return
            self._forking = True
            # Calls in other threads finish within about busy_timeout; wait for them so the
            # child inherits no connection. The forking thread's own are not waited for.
            while self._opening or any(owner != me for owner in self._busy.values()):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._wait(remaining)
            idle, self._idle = self._idle, []
        for conn in idle:  # in the parent, where closing is right; reopened on demand
            with suppress(sqlite3.Error):
                conn.close()

    def _after_fork_in_parent(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()

    def _after_fork_in_child(self) -> None:
        # Other threads did not come along: a lock one of them held would never be released.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waiting = 0
        self._forking = False
        self._adopt_if_forked()

    def _adopt_if_forked(self) -> None:
        """In a process this pool was not opened in: abandon what came along, refuse if unsafe.

        Runs from the fork hook, or at the next use if the fork bypassed Python's hooks.
        """
        pid = os.getpid()
        if self._pid == pid:
            return
        inherited = [*self._idle, *self._busy]
        in_flight = bool(self._busy) or self._opening > 0
        self._idle, self._busy, self._opening = [], {}, 0
        abandon(*inherited)  # sqlite3_close() in the child is unsafe
        if self.memory:
            self._refused = (
                f"a sqlite:///:memory: store belongs to the process that opened it "
                f"(pid {self._pid}); this forked child (pid {pid}) must open its own"
            )
        elif inherited or in_flight:
            # The before-fork hook closes idle connections, so anything that came along was
            # in use (or the fork bypassed the hook): SQLite's record for the file is stale.
            why = (
                f"SQLite store {self.path!r}: a call was in flight in another thread when "
                f"process {self._pid} forked this one (pid {pid}); SQLite state carried "
                f"across fork() can neither be used nor closed safely, so this process must "
                f"not use that file. Fork while no store call is running"
            )
            self._refused = why
            self._file = self._file or file_id(self.path)
            if self._file is not None:
                _refused_files[self._file] = why
        self._pid = pid


def _open_error(path: str, exc: sqlite3.Error) -> StoreMisconfigured | StoreUnavailable:
    """Why SQLite could not open ``path`` (it only says "unable to open database file")."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        why = f"the directory {folder!r} does not exist; create it first"
    elif not os.path.isdir(folder):
        why = f"{folder!r} is not a directory"
    elif os.path.isdir(path):
        why = "it is a directory, not a database file"
    elif not os.access(folder, os.W_OK | os.X_OK):
        why = f"this process may not create files in {folder!r}"
    elif os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        why = "this process may not read and write it"
    else:
        return StoreUnavailable(f"cannot open SQLite store {path!r}: {exc}")
    return StoreMisconfigured(f"cannot open SQLite store {path!r}: {why}", cause=why)


def file_id(path: str) -> tuple[int, int] | None:
    """The file at ``path`` as ``(device, inode)``, or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _before_fork() -> None:
    _registry_lock.acquire()
    for pool in list(_pools):
        with suppress(Exception):  # a fork hook must never raise
            pool._before_fork()


def _after_fork_in_parent() -> None:
    for pool in list(_pools):
        with suppress(Exception):
            pool._after_fork_in_parent()
    _registry_lock.release()


def _after_fork_in_child() -> None:
    for pool in list(_pools):
        with suppress(Exception):
            pool._after_fork_in_child()
    _registry_lock.release()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
