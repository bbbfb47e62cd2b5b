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

One exchange with the members (:func:`_exchange`) is a plan both drivers run
with :func:`dibs._drive.drive` / ``adrive``; ``SyncDriver.send`` is generated
from ``AsyncDriver.send`` (``scripts/unasync.py``). What stays per driver is
how a client is owned: one per thread and process on the blocking face, one
per loop on the async face.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Generator
from typing import Any, TypeAlias, TypeVar

from dibs._extras import needs

with needs("etcd", "the etcd:// store"):
    import httpx

from dibs._drive import adrive, drive
from dibs.exceptions import InvalidInput, StoreClosed, StoreMisconfigured, StoreUnavailable
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


Outcome: TypeAlias = tuple["httpx.Response | None", "Exception | None"]
"""What a post came to: the response, or the error that stood for one."""

Exchange: TypeAlias = Generator[tuple[str, float], Outcome, Any]


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
        self._timeouts = {"timeout": self.timeout().as_dict()}  # as a client would pass them
        self._parsed: dict[str, httpx.URL] = {}  # parsing a URL was a third of a request's

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

    def request(self, url: str, call: Call) -> httpx.Request:
        """The POST of ``call`` to ``url``: JSON as httpx encodes it, and this store's timeouts."""
        where = url + call.path
        parsed = self._parsed.get(where)
        if parsed is None:  # a handful: members times the gateway's paths
            parsed = self._parsed[where] = httpx.URL(where)
        return httpx.Request("POST", parsed, json=call.body, extensions=self._timeouts)


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


# A plan's requests go straight to the client's transport (its connection pool), as
# ``Client.send`` would hand them on, minus what etcd's gateway never needs on each
# request: merging the client's URL, headers and cookies into it, the auth and redirect
# flows, event hooks, and parsing every answer for cookies through ``http.cookiejar``.
# That was about half the client CPU of a call, on both faces. The transport raises the
# same ``httpx`` errors; each function below reads the answer whole, as a client does,
# and closes it on any error (a cancellation too), so its connection goes back to the
# pool or is dropped, never left half read.


async def _asend_request(
    transport: httpx.AsyncBaseTransport, request: httpx.Request
) -> httpx.Response:
    """``request``'s whole answer from ``transport``: ``AsyncClient.send`` without the extras."""
    response = await transport.handle_async_request(request)
    response.request = request
    try:
        await response.aread()
    except BaseException:
        await response.aclose()
        raise
    return response


def _send_request(transport: httpx.BaseTransport, request: httpx.Request) -> httpx.Response:
    """``request``'s whole answer from ``transport``: ``Client.send`` without the extras."""
    response = transport.handle_request(request)
    response.request = request
    try:
        response.read()
    except BaseException:
        response.close()
        raise
    return response


_ssl: ssl.SSLContext | None = None
_ssl_lock = threading.Lock()  # guards _ssl


def _ssl_context() -> ssl.SSLContext:
    """The process's one TLS context for the drivers' transports, made on first use.

    httpx builds (and loads certificates into) a context per transport by default:
    27-65 ms of CPU, which every thread's client and every async store paid once (the
    async tests open hundreds). The members are spoken to over plain ``http://``, so
    the context is never used for a handshake; sharing one is safe in any case.
    """
    global _ssl
    with _ssl_lock:
        if _ssl is None:
            _ssl = httpx.create_ssl_context()
        return _ssl


def _close_client(client: httpx.Client, pid: int) -> None:
    """Close ``client`` if this process opened it; a forked child leaves the parent's alone."""
    if os.getpid() == pid:
        client.close()


class _Own:
    """One thread's client; when the thread ends its holder goes, and a finalizer closes it."""

    __slots__ = ("__weakref__", "busy", "client", "close", "pid", "transport")

    def __init__(self, client: httpx.Client, transport: httpx.BaseTransport, pid: int) -> None:
        self.client = client
        self.transport = transport  # the client's own: closing the client closes it
        self.pid = pid
        self.busy = 0  # plans running on it now (its driver's _lock guards this)
        self.close: Callable[[], object] = client.close  # its finalizer, once it has one


class SyncDriver:
    """Runs plans on a blocking ``httpx.Client`` per thread (and per process: a fork gets its own).

    No connection is shared between threads (see :data:`_LIMITS`). A thread's client is
    closed when the thread ends, and every thread's client when the store closes: at once
    if no plan runs on it, else when its plan ends. A plan running when the store closes
    runs to its end, so its answer stands (never a socket closed under a request that
    etcd may have applied); a plan that starts after the close raises
    :class:`~dibs.StoreClosed`.
    """

    def __init__(self, settings: Settings, store: str = "EtcdStore") -> None:
        self.members = _Members(settings)
        self._local = threading.local()
        self._finalizers: set[weakref.finalize[Any, Any]] = set()
        self._closed = False
        self._store = store
        self._lock = threading.Lock()  # guards _finalizers, _closed and each _Own.busy

    def _http(self) -> httpx.Client:
        return self._own().client

    def _pool(self) -> httpx.BaseTransport:
        return self._own().transport

    def _own(self) -> _Own:
        own: _Own | None = getattr(self._local, "own", None)
        pid = os.getpid()
        if own is not None and own.pid == pid and not own.client.is_closed:
            return own
        transport = httpx.HTTPTransport(limits=_LIMITS, verify=_ssl_context())
        client = httpx.Client(timeout=self.members.timeout(), transport=transport)
        own = _Own(client, transport, pid)
        finalizer = weakref.finalize(own, _close_client, client, pid)
        finalizer.atexit = False  # the process is going: its sockets go with it
        own.close = finalizer
        with self._lock:
            self._finalizers = {f for f in self._finalizers if f.alive}
            self._finalizers.add(finalizer)
        self._local.own = own  # replaces (and so finalizes) a forked or closed holder
        return own

    def _closed_error(self) -> StoreClosed:
        return StoreClosed(f"this {self._store} is closed")

    def _checkout(self) -> _Own:
        """This thread's client, marked busy until :meth:`_checkin`; StoreClosed once closed."""
        if self._closed:
            raise self._closed_error()
        own = self._own()
        with self._lock:
            if not self._closed:
                own.busy += 1
                return own
        own.close()  # close() came while it was made, and found it idle or not yet there
        raise self._closed_error()

    def _checkin(self, own: _Own) -> None:
        with self._lock:
            own.busy -= 1
            last = self._closed and not own.busy
        if last:  # the store closed while this plan ran: its client goes now
            own.close()

    def run(self, plan: Plan[_T]) -> _T:
        own = self._checkout()
        try:
            return drive(plan, self.send, LeaseGone)
        finally:
            self._checkin(own)

    # --- generated from AsyncDriver.send (scripts/unasync.py): edit that, then run it ---
    def send(self, call: Call) -> Any:
        transport = self._pool()

        def post(step: tuple[str, float]) -> Outcome:
            url, pause = step
            if pause:
                time.sleep(pause)
            try:
                return (_send_request(transport, self.members.request(url, call)), None)
            except httpx.HTTPError as exc:
                return (None, exc)

        return drive(_exchange(self.members, call), post)

    # --- end of the generated part ---

    def close(self) -> None:
        """Refuse new plans; close every idle client now, and each busy one as its plan ends."""
        idle: list[weakref.finalize[Any, Any]] = []
        with self._lock:
            self._closed = True
            for finalizer in self._finalizers:
                found = finalizer.peek()
                if found is not None and not found[0].busy:
                    idle.append(finalizer)
            self._finalizers = set()
        for finalizer in idle:
            finalizer()  # closes that thread's client once (this process's only)


class AsyncDriver:
    """Runs plans on an ``httpx.AsyncClient`` of the loop the store belongs to.

    :meth:`close` refuses new plans, waits for the plans in flight to end (their
    answers stand, as on the blocking driver), then closes the client.
    """

    def __init__(self, settings: Settings, store: str = "AsyncEtcdStore") -> None:
        self.members = _Members(settings)
        self._client: httpx.AsyncClient | None = None
        self._transport: httpx.AsyncBaseTransport | None = None  # the client's own
        self._pid = 0
        self._closed = False
        self._store = store
        self._running = 0  # plans in flight
        self._drained: asyncio.Event | None = None  # set when the last one ends, while closing

    def _http(self) -> httpx.AsyncClient:
        if self._client is None or self._pid != os.getpid():
            transport = httpx.AsyncHTTPTransport(limits=_LIMITS, verify=_ssl_context())
            self._client = httpx.AsyncClient(timeout=self.members.timeout(), transport=transport)
            self._transport = transport
            self._pid = os.getpid()
        return self._client

    def _pool(self) -> httpx.AsyncBaseTransport:
        self._http()
        assert self._transport is not None
        return self._transport

    async def run(self, plan: Plan[_T]) -> _T:
        if self._closed:
            raise StoreClosed(f"this {self._store} is closed")
        self._running += 1
        try:
            return await adrive(plan, self.send, LeaseGone)
        finally:
            self._running -= 1
            if not self._running and self._drained is not None:
                self._drained.set()

    # --- shared with the sync face: scripts/unasync.py makes SyncDriver.send from this part ---
    async def send(self, call: Call) -> Any:
        transport = self._pool()

        async def post(step: tuple[str, float]) -> Outcome:
            url, pause = step
            if pause:
                await asyncio.sleep(pause)
            try:
                return (await _asend_request(transport, self.members.request(url, call)), None)
            except httpx.HTTPError as exc:
                return (None, exc)

        return await adrive(_exchange(self.members, call), post)

    # --- end of the shared part ---

    async def close(self) -> None:
        self._closed = True
        if self._pid == os.getpid():  # a forked child's plans in flight are the parent's
            while self._running:
                self._drained = asyncio.Event()
                await self._drained.wait()
        if self._client is not None and self._pid == os.getpid():
            await self._client.aclose()
        self._client = None
        self._transport = None
