"""The async store's connection: psycopg's ``AsyncConnection``, waiting on its socket for less.

psycopg's own wait (:func:`psycopg.waiting.wait_async`) registers a reader on
the event loop, arms a timer, and removes both again, for every round trip;
and when the awaiting task is cancelled mid-statement it asks the server to
cancel the statement. :class:`AsyncStoreConnection` keeps one reader on its
socket for as long as the socket lives and arms no timer, so a round trip costs
one future; its reader reads what arrives at once and wakes the waiting task
only when a whole answer is in (never for half a result, never for bytes
already read). A task cancelled while its statement is on the wire or on the
server leaves it there: a task of the connection's own (:attr:`finishing`)
reads the statement's answer to its end, and the connection goes back to its
pool idle, never mid-statement and never with the statement cancelled (see
``AsyncPostgresStore``).

The reader must leave the loop before libpq closes the socket (a lost
connection, ``close()``): a later socket may get the same number, and the
loop would keep the stale registration in its place. So every libpq call this
module makes, and every step of psycopg's generators it drives, is followed by
a look at the socket, and a connection that lost it stops watching at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, TypeVar

import psycopg
from psycopg.rows import TupleRow
from psycopg.waiting import Ready, Wait

__all__ = ["AsyncStoreConnection"]

logger = logging.getLogger("dibs.stores.postgres")

_RV = TypeVar("_RV")

_WAIT_R = int(Wait.R)
_WAIT_W = int(Wait.W)
_READY_R = int(Ready.R)
_READY_W = int(Ready.W)
_OK = psycopg.pq.ConnStatus.OK


class AsyncStoreConnection(psycopg.AsyncConnection[TupleRow]):
    """An ``AsyncConnection`` whose waits cost one future each; see the module docstring.

    Used only as a pool's ``connection_class`` in the async PostgreSQL store.
    """

    finishing: asyncio.Task[None] | None = None
    """The statement a cancelled task left on this connection, being read to its end.

    Set when a wait is cancelled mid-statement; whoever holds the connection
    must let this task end before the connection goes back to its pool."""

    _fd: int = -1  # the socket the loop watches for this connection, or -1
    _loop: asyncio.AbstractEventLoop | None = None
    _waiter: asyncio.Future[None] | None = None
    _wants: int = 0  # what the waiting generator asked for: Wait.R, Wait.W or Wait.RW
    _ready: int = 0  # what the loop saw since: Ready.R | Ready.W
    _writing: bool = False  # a writer is registered too, for this wait
    _unread: bool = False  # the reader took in bytes that no waiter was woken for

    async def wait(self, gen: Any, interval: Any = None, timeout: float | None = None) -> Any:
        """Drive a psycopg generator on this connection to its end; its value.

        A bounded wait (psycopg's own, when it cancels or closes) is psycopg's.
        """
        if timeout is not None:
            self._unwatch()
            if interval is None:
                return await super().wait(gen, timeout=timeout)
            return await super().wait(gen, interval, timeout)
        try:
            state = next(gen)
        except StopIteration as done:
            return done.value
        except BaseException:
            self._check_socket()
            raise
        return await self._drive(gen, state, hand_off=True)

    async def _drive(self, gen: Any, state: int, *, hand_off: bool) -> Any:
        while True:
            try:
                waiter = self._arm(state)
                if waiter is None:  # bytes the reader took in with nobody waiting
                    ready = _READY_R
                else:
                    try:
                        await waiter
                    finally:
                        self._waiter = None
                        if self._writing:
                            self._stop_writing()
                    ready = self._ready
            except asyncio.CancelledError:
                if hand_off:  # the statement stays: read it to its end in a task of its own
                    # The reader may have taken its answer in already: look first.
                    self._unread = True
                    loop = asyncio.get_running_loop()
                    self.finishing = loop.create_task(self._finish(gen, state))
                raise
            except OSError as exc:  # the socket went away under the loop
                self._unwatch()
                raise psycopg.OperationalError("connection socket closed") from exc
            try:
                state = gen.send(ready)
            except StopIteration as done:
                return done.value
            except BaseException:
                self._check_socket()
                raise

    async def _finish(self, gen: Any, state: int) -> None:
        """Read a statement whose task was cancelled to its end; its answer is nobody's."""
        try:
            await self._drive(gen, state, hand_off=False)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the caller left; the pool judges the connection
            logger.debug("a cancelled call's statement ended with %r", exc)

    def _arm(self, state: int) -> asyncio.Future[None] | None:
        """The future the loop answers once the socket can do what ``state`` asks.

        None when the reader already took bytes in that nobody was woken for:
        the generator looks at them first.
        """
        fd = self.pgconn.socket  # raises OperationalError once libpq lost the socket
        loop = asyncio.get_running_loop()
        if fd != self._fd or loop is not self._loop:
            self._unwatch()
            loop.add_reader(fd, self._readable)
            self._fd, self._loop = fd, loop
        if self._unread:
            self._unread = False
            return None
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter, self._wants, self._ready = waiter, state, 0
        if state & _WAIT_W:
            loop.add_writer(fd, self._writable)
            self._writing = True
        return waiter

    def _stop_writing(self) -> None:
        self._writing = False
        if self._loop is not None and self._fd >= 0:
            self._loop.remove_writer(self._fd)

    def _readable(self) -> None:
        """The loop's reader: take in what came, and wake the waiter once it has an answer."""
        pgconn = self.pgconn
        waiter = self._waiter
        try:
            # Read now, so the loop's next poll does not see these bytes again.
            pgconn.consume_input()
            if (
                waiter is not None
                and self._wants == _WAIT_R
                and not waiter.done()
                and pgconn.is_busy()
            ):
                return  # part of an answer: wait for the rest
        except psycopg.Error:  # the server went away: the waiter's generator meets it
            self._check_socket()
        if waiter is not None and not waiter.done():
            self._ready |= _READY_R
            waiter.set_result(None)
        else:  # the task that waited was cancelled, or has not waited yet
            self._unread = True

    def _writable(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._ready |= _READY_W
            waiter.set_result(None)

    def _check_socket(self) -> None:
        """Stop watching a socket libpq closed (or replaced), before anyone reuses its number.

        A broken connection stops too: libpq closes its socket when it is freed.
        """
        if self._fd < 0:
            return
        try:
            fd = self.pgconn.socket if self.pgconn.status == _OK else -1
        except psycopg.Error:
            fd = -1
        if fd != self._fd:
            self._unwatch()

    def unwatch_if_broken(self) -> None:
        """For the pool: a broken connection it drops (without ``close()``) leaves the loop."""
        self._check_socket()

    def _unwatch(self) -> None:
        loop, fd, writing = self._loop, self._fd, self._writing
        self._fd, self._loop, self._writing = -1, None, False
        if loop is not None and fd >= 0 and not loop.is_closed():
            # A closed socket's registration goes too: the selector forgets it even
            # when the kernel refuses the change (EBADF), and so do we.
            if writing:
                with contextlib.suppress(OSError):
                    loop.remove_writer(fd)
            with contextlib.suppress(OSError):
                loop.remove_reader(fd)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            self._ready |= _READY_R  # let the generator meet whatever happened
            waiter.set_result(None)

    async def close(self) -> None:
        self._unwatch()
        await super().close()
