"""The two thin drivers that run the etcd store's plans: blocking and asyncio, over httpx.

Both talk to etcd's v3 JSON gateway (``POST /v3/...``) and share what a
failure means (:func:`_verdict`): a request that never left (the connection
was refused or timed out) goes to the next member; so does a read, a lease
grant or a request etcd refused before proposing it (no leader, too many
requests) even after it was sent. A write whose answer never came, or that
failed after it may have been proposed, has an unknown outcome:
:class:`~dibs.StoreUnavailable` (the caller retries with its request ID),
and the next request starts at the next member. A member that is dead or
paused therefore costs one short timeout, not every request.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
import time
import weakref
from collections.abc import Generator
from typing import Any, TypeAlias, TypeVar

from dibs._extras import needs

with needs("etcd", "the etcd:// store"):
    import httpx

from dibs.exceptions import InvalidInput, StoreMisconfigured, StoreUnavailable
from dibs.stores.etcd._keys import Settings
from dibs.stores.etcd._parts import Call, LeaseGone, Plan

__all__ = ["AsyncDriver", "SyncDriver"]

_T = TypeVar("_T")

_PASSES = 2
"""Rounds over every member before giving up; an election takes about one election timeout."""
_PAUSE = 0.2
"""Seconds between rounds."""

# etcd errors that say the request was not proposed: safe to send elsewhere.
_NOT_PROPOSED = ("no leader", "too many requests", "not capable", "not leader")


class _Retry(Exception):
    """Try the next member."""


def _verdict(call: Call, response: httpx.Response | None, exc: Exception | None) -> Any:
    """The answer's JSON, or raise: _Retry, LeaseGone, InvalidInput or StoreUnavailable."""
    if exc is not None:
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
            raise _Retry from exc  # nothing was sent
        if call.kind == "write":
            raise StoreUnavailable(
                f"etcd did not answer a write ({type(exc).__name__}: {exc}); its outcome is "
                "unknown: retry with the same request ID"
            ) from exc
        raise _Retry from exc
    assert response is not None
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code == 200:
        if isinstance(answer, dict) and "header" in answer:
            return answer
        raise StoreMisconfigured(
            f"{response.url} answered, but not as etcd's v3 JSON gateway does",
            cause=response.text[:200],
        )
    message = str(answer.get("error") or answer.get("message") or response.text[:200])
    if "lease not found" in message:
        raise LeaseGone(message)
    if "too many operations" in message or "request is too large" in message:
        raise InvalidInput(
            f"etcd refused the request: {message}. The cluster's --max-txn-ops or "
            "--max-request-bytes is below what the URL says (max_txn_ops=, "
            "max_request_bytes=): set them to the cluster's values",
            field="targets",
            value=message,
        )
    if call.kind != "write" or any(part in message for part in _NOT_PROPOSED):
        raise _Retry(message)
    raise StoreUnavailable(
        f"etcd failed a write ({response.status_code}: {message}); its outcome is unknown: "
        "retry with the same request ID"
    )


Exchange: TypeAlias = Generator[
    tuple[str, float], tuple["httpx.Response | None", "Exception | None"], Any
]


def _exchange(members: _Members, call: Call) -> Exchange:
    """Which member to send ``call`` to next, and what its answer means; both drivers run this.

    Yields ``(url, pause)``: the driver waits ``pause`` seconds, posts the call
    there and sends back ``(response, None)`` or ``(None, exception)``. Returns
    the answer's JSON, or raises :class:`LeaseGone`, :class:`~dibs.InvalidInput`
    or :class:`~dibs.StoreUnavailable`. A revoke never fails: a lease left
    behind expires on its own.
    """
    last: BaseException | None = None
    for attempt in range(_PASSES):
        for i, url in enumerate(members.order()):
            response, exc = yield url, (_PAUSE if attempt and not i else 0.0)
            try:
                return _verdict(call, response, exc)
            except _Retry as retry:
                last = retry.__cause__ or retry
                members.failed(url)
            except (StoreUnavailable, LeaseGone, StoreMisconfigured) as failed:
                if not isinstance(failed, LeaseGone):
                    members.failed(url)
                if call.kind == "revoke":
                    return {}
                raise
    if call.kind == "revoke":
        return {}
    raise _unreachable(members.settings, last)


def _unreachable(settings: Settings, last: BaseException | None) -> StoreUnavailable:
    return StoreUnavailable(
        f"no etcd member answered (tried {', '.join(settings.endpoints)}): {last}"
    )


class _Members:
    """Which member to ask first; moves on when one fails. Safe from any thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._urls = [f"http://{e}" for e in settings.endpoints]
        self._first = 0
        self._lock = threading.Lock()  # guards _first

    def order(self) -> list[str]:
        with self._lock:
            first = self._first
        n = len(self._urls)
        return [self._urls[(first + i) % n] for i in range(n)]

    def failed(self, url: str) -> None:
        with self._lock:
            if self._urls[self._first] == url:
                self._first = (self._first + 1) % len(self._urls)

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.settings.timeout, connect=self.settings.connect_timeout)


_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=None)
"""No cap on one client's connections: its pool never closes an idle one to make room.

The blocking driver gives every thread its own client, because httpcore's pool is not
safe for one connection to be handed between threads: a pool pass in one thread reads
another's connection as idle (its state, unlocked) and then as "expired" (its socket is
readable -- with the answer that thread is about to read) and closes it under the thread
using it: "Bad file descriptor", an unknown outcome (StoreUnavailable) on a healthy
cluster. A pool with a cap also closes "surplus idle" connections a waiting request was
just handed (encode/httpcore#1110). The asyncio driver shares one client per loop; a pass
there cannot interleave with another task between those checks, and with no cap it never
closes a connection to make room. Each connection is one caller in flight, so threads and
tasks bound their number.
"""


def _close_client(client: httpx.Client, pid: int) -> None:
    """Close ``client`` if this process opened it; a forked child leaves the parent's alone."""
    if os.getpid() == pid:
        client.close()


class _Own:
    """One thread's client; when the thread ends its holder goes, and a finalizer closes it."""

    __slots__ = ("__weakref__", "client", "pid")

    def __init__(self, client: httpx.Client, pid: int) -> None:
        self.client = client
        self.pid = pid


class SyncDriver:
    """Runs plans on a blocking ``httpx.Client`` per thread (and per process: a fork gets its own).

    No connection is shared between threads (see :data:`_LIMITS`). A thread's client is
    closed when the thread ends, and every thread's client when the store closes.
    """

    def __init__(self, settings: Settings) -> None:
        self.members = _Members(settings)
        self._local = threading.local()
        self._finalizers: set[weakref.finalize[Any, Any]] = set()
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()  # guards _finalizers and _ssl

    def _http(self) -> httpx.Client:
        own: _Own | None = getattr(self._local, "own", None)
        pid = os.getpid()
        if own is not None and own.pid == pid and not own.client.is_closed:
            return own.client
        with self._lock:
            if self._ssl is None:
                # httpx builds (and loads certificates into) a context per client by
                # default, about 65 ms: a new thread would pay it. One per store instead.
                self._ssl = httpx.create_ssl_context()
            context = self._ssl
        client = httpx.Client(timeout=self.members.timeout(), limits=_LIMITS, verify=context)
        own = _Own(client, pid)
        finalizer = weakref.finalize(own, _close_client, client, pid)
        finalizer.atexit = False  # the process is going: its sockets go with it
        with self._lock:
            self._finalizers = {f for f in self._finalizers if f.alive}
            self._finalizers.add(finalizer)
        self._local.own = own  # replaces (and so finalizes) a forked or closed holder
        return client

    def run(self, plan: Plan[_T]) -> _T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                call = plan.throw(error) if error is not None else plan.send(value)
            except StopIteration as done:
                result: _T = done.value
                return result
            error = None
            try:
                value = self.send(call)
            except LeaseGone as gone:
                error = gone
            except BaseException:
                plan.close()
                raise

    def send(self, call: Call) -> Any:
        client = self._http()
        steps = _exchange(self.members, call)
        outcome: tuple[httpx.Response | None, Exception | None] | None = None
        while True:
            try:
                url, pause = steps.send(outcome)  # type: ignore[arg-type]  # None starts it
            except StopIteration as done:
                return done.value
            if pause:
                time.sleep(pause)
            try:
                outcome = (client.post(url + call.path, json=call.body), None)
            except httpx.HTTPError as exc:
                outcome = (None, exc)

    def close(self) -> None:
        with self._lock:
            finalizers, self._finalizers = self._finalizers, set()
        for finalizer in finalizers:
            finalizer()  # closes that thread's client once (this process's only)


class AsyncDriver:
    """Runs plans on an ``httpx.AsyncClient`` of the loop the store belongs to."""

    def __init__(self, settings: Settings) -> None:
        self.members = _Members(settings)
        self._client: httpx.AsyncClient | None = None
        self._pid = 0

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._pid != os.getpid():
            self._client = httpx.AsyncClient(timeout=self.members.timeout(), limits=_LIMITS)
            self._pid = os.getpid()
        return self._client

    async def run(self, plan: Plan[_T]) -> _T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                call = plan.throw(error) if error is not None else plan.send(value)
            except StopIteration as done:
                result: _T = done.value
                return result
            error = None
            try:
                value = await self.send(call)
            except LeaseGone as gone:
                error = gone
            except BaseException:
                plan.close()
                raise

    async def send(self, call: Call) -> Any:
        client = self._http()
        steps = _exchange(self.members, call)
        outcome: tuple[httpx.Response | None, Exception | None] | None = None
        while True:
            try:
                url, pause = steps.send(outcome)  # type: ignore[arg-type]  # None starts it
            except StopIteration as done:
                return done.value
            if pause:
                await asyncio.sleep(pause)
            try:
                outcome = (await client.post(url + call.path, json=call.body), None)
            except httpx.HTTPError as exc:
                outcome = (None, exc)

    async def close(self) -> None:
        if self._client is not None and self._pid == os.getpid():
            await self._client.aclose()
        self._client = None
