"""A semaphore with ``permits`` slots: at most that many live holders, across processes and hosts.

``dibs.Semaphore(store, key, permits=N)``; ``with sem.lease(holder=..., ttl=...)``
holds one permit as a fenced, auto-renewing :meth:`~dibs.Store.lease` on one of
the units ``(key, "0")`` .. ``(key, "N-1")``. The claim of a unit is the
decision, so two holders never share a slot and, while the limit stands, never
more than N hold one.

The limit lives in the store, so every process agrees on it and it may change
at run time: version ``v`` of it is a confirmed claim on the unit
``(key, "permits/v")`` whose holder spells ``permits`` and ``cap``, the most
permits the key has ever had. A version is written once (the claim of its unit
is the compare-and-set), so the versions are a prefix ``1..V``, found by
galloping from the last one seen. A :class:`Semaphore` declares its
``permits`` on first use (writing a new version when the store's differs);
:meth:`Semaphore.set_permits` changes it later.

Lowering the limit from M to N leaves holders on slots ``N..M-1``. They can
only leave: a new holder is admitted on a slot below N only. An acquirer that
finds none of them live just claims a free slot below N (exclusive slots: at
most N). Otherwise it reads every slot and claims the lowest free slot ``i``
only if ``i + 1 + (live claims above i) <= N``: the slots below ``i`` hold at
most ``i``, and the ones above it can only empty, so the count after it joins
is at most N. A lowered limit thus admits no one new until the count is below
it. Each acquirer reads the version before its reads and again after its
claim; when it moved, the claim is released and the acquirer starts again, so
every admission was judged under one version of the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from dibs._bell import alisten, listen, rung
from dibs._drive import adrive, drive
from dibs._lease import _terms, check_on_lost
from dibs._model import Claim, ClaimResult, Unit
from dibs._queue import Place, QCall, QPause, awaited, behind, queue_name
from dibs._queue import abandon as abandon_queue
from dibs._queue import join as join_queue
from dibs._queue import leave as leave_queue
from dibs._queue import live as live_tickets
from dibs._queue import position as queue_position
from dibs._queue import renew as renew_ticket
from dibs._shield import to_the_end
from dibs.exceptions import ClaimNotFound, HoldLost, InvalidInput, ResourceBusy, StoreUnavailable
from dibs.lease import AsyncLease, Lease
from dibs.stores.base import Store
from dibs.stores.base_async import AsyncStore

__all__ = ["PERMITS_MAX", "AsyncSemaphore", "AsyncSemaphoreLease", "Semaphore", "SemaphoreLease"]

PERMITS_MAX = 10_000
"""The most permits a semaphore takes: an acquirer may read every slot up to the highest ever."""

_LEFT = (HoldLost, ClaimNotFound, StoreUnavailable)  # queue errors the rules decide on
_VERSION = "permits/"  # slot prefix of the limit's versions
_FIRST_PAUSE = 0.005
_MAX_PAUSE = 0.25
_random = random.Random()  # our own: a semaphore never moves the global random state


def check_permits(permits: object) -> int:
    """``permits`` as an int from 0 to :data:`PERMITS_MAX`; raises :class:`~dibs.InvalidInput`."""
    if isinstance(permits, bool) or not isinstance(permits, int) or not 0 <= permits <= PERMITS_MAX:
        raise InvalidInput(
            f"permits must be an int from 0 to {PERMITS_MAX}, got {permits!r}",
            field="permits",
            value=permits,
        )
    return permits


def check_key(key: object) -> str:
    """``key`` as a semaphore key (a unit's resource); raises :class:`~dibs.InvalidInput`."""
    try:
        Unit(key, "0")  # type: ignore[arg-type]
    except InvalidInput as exc:
        raise InvalidInput(
            f"a semaphore's key {exc.message.removeprefix('resource ')}", field="key", value=key
        ) from None
    assert isinstance(key, str)
    return key


@dataclass(frozen=True, slots=True)
class _Limit:
    """One version of a key's limit, as stored."""

    version: int
    permits: int
    cap: int

    @property
    def holder(self) -> str:
        return f"semaphore-permits-{self.permits}-cap-{self.cap}"

    @classmethod
    def parse(cls, version: int, holder: str) -> _Limit:
        _, permits, _, cap = holder.removeprefix("semaphore-").split("-")
        return cls(version, int(permits), int(cap))


_NONE = _Limit(0, 0, 0)


# --- steps: what the rules below ask a face to do -------------------------------------


@dataclass(frozen=True, slots=True)
class _Read:
    unit: Unit


@dataclass(frozen=True, slots=True)
class _Write:
    unit: Unit
    holder: str


@dataclass(frozen=True, slots=True)
class _Enter:
    unit: Unit


@dataclass(frozen=True, slots=True)
class _Exit:
    lease: Any


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


_Step = _Read | _Write | _Enter | _Exit | _Sleep | QCall | QPause
_Rule = Generator[_Step, Any, Any]


def _version_unit(key: str, version: int) -> Unit:
    return Unit(key, f"{_VERSION}{version}")


def _latest(key: str, known: _Limit) -> _Rule:
    """The newest version of the limit (``_NONE`` if none): gallop up from ``known``, bisect."""
    holder = yield _Read(_version_unit(key, known.version + 1))
    if holder is None:
        return known
    low, low_holder, step = known.version + 1, holder, 1
    while True:  # the versions are a prefix: find a free one above
        high = low + step
        found = yield _Read(_version_unit(key, high))
        if found is None:
            break
        low, low_holder, step = high, found, step * 2
    while high - low > 1:  # low is written, high is not
        middle = (low + high) // 2
        found = yield _Read(_version_unit(key, middle))
        if found is None:
            high = middle
        else:
            low, low_holder = middle, found
    return _Limit.parse(low, low_holder)


def _set(key: str, permits: int, known: _Limit) -> _Rule:
    """Make ``permits`` the limit unless it is already; the version written or found."""
    limit = yield from _latest(key, known)
    while limit.permits != permits or limit.version == 0:
        wanted = _Limit(limit.version + 1, permits, max(limit.cap, permits))
        # The claim of the next version's unit is the compare-and-set: one writer per version.
        result: ClaimResult = yield _Write(_version_unit(key, wanted.version), wanted.holder)
        if result:
            return wanted
        limit = yield from _latest(key, limit)
    return limit


class _Rules:
    """What both faces share: the key, the declared permits and the newest limit seen."""

    def __init__(self, key: object, permits: object) -> None:
        self.key = check_key(key)
        self._permits = check_permits(permits)
        self._limit = _NONE
        self._declared = False

    def _current(self) -> _Rule:
        """The limit now, declaring this handle's permits on its first use."""
        if not self._declared:
            self._limit = yield from _set(self.key, self._permits, self._limit)
            self._declared = True
            return self._limit
        limit = yield from _latest(self.key, self._limit)
        self._limit = limit
        return limit

    def _set_rule(self, permits: int) -> _Rule:
        self._limit = yield from _set(self.key, permits, self._limit)
        self._permits, self._declared = permits, True
        return self._limit.permits

    def _read_rule(self) -> _Rule:
        limit = yield from self._current()
        return limit.permits

    def _holders_rule(self) -> _Rule:
        limit = yield from self._current()
        holders = []
        for slot in range(limit.cap):
            holder = yield _Read(Unit(self.key, str(slot)))
            if holder is not None:
                holders.append(holder)
        return holders

    def _acquire_rule(self, holder: str, wait: float | None, place: Place | None = None) -> _Rule:
        """Claim a slot as a lease; the lease entered and the limit it was judged under.

        With ``wait`` other than 0, waiters are served first come, first served:
        one queue per key (:mod:`dibs._queue`), and only its head tries the slots.
        ``place`` holds the waiter's ticket, for the face to give back if cut off.
        """
        key = self.key
        started = time.monotonic()
        delay = _FIRST_PAUSE
        place = Place() if place is None else place
        queue = queue_name("semaphore", key)
        permits = 0
        joined = None  # the ticket just taken, whose place the join read
        while True:
            since = rung()  # before the reads: a release while they run ends the pause below
            if wait == 0:
                got, permits = yield from self._once()
                if got is not None:
                    return got
            else:
                if place.ticket is None:
                    if not (yield from live_tickets(queue)):  # no one queues: try at once
                        got, permits = yield from self._once()
                        if got is not None:
                            return got
                    until = None if wait is None else started + wait
                    joined = yield from join_queue(queue, place, until=until)
                ticket = place.ticket
                if ticket is not None:  # None: no turn at the counter before the deadline
                    if not (yield from renew_ticket(ticket)):
                        place.ticket = None  # expired while we were paused: queue again
                        continue
                    fresh, joined = ticket is joined, None  # the join read its place
                    ahead = len(ticket.ahead) if fresh else (yield from queue_position(ticket))
                    if ahead is None:
                        place.ticket = None
                        continue
                    if ahead == 0:  # the head: only it may try the slots
                        got, permits = yield from self._once()
                        if got is not None:
                            yield from leave_queue(ticket)
                            place.ticket = None
                            return got
            waited = time.monotonic() - started
            if wait is not None and waited >= wait:
                if place.ticket is not None:
                    ticket, place.ticket = place.ticket, None
                    yield from leave_queue(ticket)
                raise ResourceBusy(
                    f"semaphore {key!r} for {holder!r}: all {permits} permits taken,"
                    f" waited {waited:.3g}s",
                    resource=key,
                    waited=waited,
                    permits=permits,
                )
            # A release in this process ends the pause (dibs._bell): for one behind the
            # head, only the release of every ticket ahead of it. The pause is for what
            # comes unrung: an expiry, or a release in another process.
            ids = awaited(place)
            least, most = (0.0, delay) if ids is None else (behind(ids) / 2, behind(ids))
            pause = _random.uniform(least, most)
            if wait is not None:
                pause = min(pause, max(0.0, started + wait - time.monotonic()))
            yield QPause(pause, _random.uniform(0, delay) / 4, since, ids=ids)
            delay = min(delay * 2, _MAX_PAUSE)

    def _once(self) -> _Rule:
        """One try at a slot; the lease and limit (or None), and the permits judged under."""
        key = self.key
        while True:
            limit = yield from self._current()
            permits = limit.permits
            live_above = []  # live claims on slots a lowered limit left behind
            for slot in range(permits, limit.cap):
                if (yield _Read(Unit(key, str(slot)))) is not None:
                    live_above.append(slot)
            if not live_above:
                # No one above the limit, and no one can join there: the slots decide.
                start = _random.randrange(permits) if permits else 0
                order = [(start + i) % permits for i in range(permits)]
                candidates = order[:1]
                lease = None
                if candidates:
                    lease = yield _Enter(Unit(key, str(candidates[0])))
                if lease is None and permits > 1:
                    free = []
                    for slot in order[1:]:
                        if (yield _Read(Unit(key, str(slot)))) is None:
                            free.append(slot)
                    for slot in free:
                        lease = yield _Enter(Unit(key, str(slot)))
                        if lease is not None:
                            break
            else:
                lease = yield from self._lowest(limit, live_above)
            if lease is None:
                return None, permits
            # Judged under one version only: a limit changed meanwhile means judge again.
            after = yield from _latest(key, limit)
            if after.version == limit.version:
                return (lease, limit), permits
            self._limit = after
            yield _Exit(lease)

    def _lowest(self, limit: _Limit, live_above: list[int]) -> _Rule:
        """Under a lowered limit: the lowest free slot, if the count stays within it once joined."""
        key, permits = self.key, limit.permits
        live = [False] * permits
        for slot in range(permits):
            live[slot] = (yield _Read(Unit(key, str(slot)))) is not None
        if all(live):
            return None
        lowest = live.index(False)
        above = sum(live[lowest + 1 :]) + len(live_above)
        if lowest + 1 + above > permits:
            return None  # the count is not below the limit yet
        return (yield _Enter(Unit(key, str(lowest))))


# --- the faces ------------------------------------------------------------------------


class _LeaseView:
    """What a semaphore's lease shows: its slot and the limit, then the inner lease's hold."""

    _inner: Lease | AsyncLease

    def __init__(self, semaphore_key: str, holder: str, ttl: float) -> None:
        self.key = semaphore_key
        self._holder = holder
        self._ttl = ttl
        self._limit = _NONE
        self._entered = False

    def _take(self, inner: Lease | AsyncLease, limit: _Limit) -> None:
        self._inner, self._limit = inner, limit

    def _live(self) -> Lease | AsyncLease:
        try:
            return self._inner
        except AttributeError:
            raise RuntimeError("the lease holds no permit yet: use it in a with block") from None

    @property
    def holder(self) -> str:
        """The holder the permit is held for."""
        return self._holder

    @property
    def ttl(self) -> float:
        """Seconds each renewal pushes the hold's expiry to."""
        return self._ttl

    @property
    def slot(self) -> int:
        """The permit's slot: the hold is on the unit ``(key, str(slot))``."""
        target = self._live().targets[0]
        assert isinstance(target, Unit)
        return int(target.slot)

    @property
    def permits(self) -> int:
        """The limit the permit was granted under."""
        self._live()
        return self._limit.permits

    @property
    def claim(self) -> Claim:
        """The permit's hold, as of its latest renewal."""
        return self._live().claim

    @property
    def id(self) -> str:
        """The hold's claim ID."""
        return self._live().id

    @property
    def fence(self) -> int:
        """The hold's fence token: pass it to what the block writes, to refuse stale holders."""
        return self._live().fence

    @property
    def renewals(self) -> int:
        """How many renewals have succeeded so far."""
        return self._live().renewals

    @property
    def lost(self) -> bool:
        """Whether the hold is known lost, or may have expired unrenewed."""
        return self._live().lost

    @property
    def error(self) -> HoldLost | None:
        """The :class:`~dibs.HoldLost` that ended the permit, or None while it holds."""
        return self._live().error

    def check(self) -> None:
        """Raise :class:`~dibs.HoldLost` if the permit's hold is lost."""
        self._live().check()

    def _enter(self) -> None:
        if self._entered:
            raise RuntimeError("a semaphore lease is entered once; call sem.lease() again")
        self._entered = True

    def __repr__(self) -> str:
        inner = getattr(self, "_inner", None)
        where = "waiting" if inner is None else f"slot {self.slot} fence={inner.fence}"
        return f"<{type(self).__name__} {self.key!r} {self._holder!r} {where}>"


class SemaphoreLease(_LeaseView):
    """``with sem.lease(holder=..., ttl=...) as permit:``: one permit, renewed while the block runs.

    Entering raises :class:`~dibs.ResourceBusy` when every permit stays taken
    past ``wait``; the block then behaves as a :class:`~dibs.lease.Lease`
    (``check()``, ``lost``, ``fence``; the ``with`` raises
    :class:`~dibs.HoldLost` when the hold was lost).
    """

    def __init__(
        self,
        semaphore: Semaphore,
        *,
        holder: str,
        ttl: float,
        wait: float | None,
        renew_every: float | None,
        on_lost: Callable[[HoldLost], object] | None,
        max_hold: float | None,
    ) -> None:
        terms = _terms(Unit(semaphore.key, "0"), holder, ttl, wait, renew_every, max_hold)
        super().__init__(semaphore.key, terms.holder, terms.ttl)
        self._semaphore = semaphore
        self._wait = terms.wait
        self._renew_every = renew_every
        self._on_lost = check_on_lost(on_lost)
        self._max_hold = max_hold
        self._pending: Lease | None = None
        self._place = Place()

    def __enter__(self) -> Self:
        self._enter()
        sem = self._semaphore
        try:
            inner, limit = drive(
                sem._acquire_rule(self._holder, self._wait, self._place), self._perform, _LEFT
            )
        except BaseException as exc:
            if self._pending is not None:  # entered, then interrupted before it was handed over
                self._pending.__exit__(type(exc), exc, exc.__traceback__)
            with contextlib.suppress(Exception):  # cut off while queued: the next one goes on
                drive(
                    abandon_queue(queue_name("semaphore", sem.key), self._place),
                    sem._perform,
                    _LEFT,
                )
            raise
        self._take(inner, limit)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        inner = self._live()
        assert isinstance(inner, Lease)
        inner.__exit__(exc_type, exc, tb)

    def _perform(self, step: _Step) -> Any:
        store = self._semaphore.store
        match step:
            case _Enter(unit):
                lease = store.lease(
                    unit,
                    holder=self._holder,
                    ttl=self._ttl,
                    renew_every=self._renew_every,
                    on_lost=self._on_lost,
                    max_hold=self._max_hold,
                )
                try:
                    lease.__enter__()
                except ResourceBusy:
                    return None
                self._pending = lease
                return lease
            case _Exit(lease):
                self._pending = None
                lease.__exit__(None, None, None)
                return None
        return self._semaphore._perform(step)


class Semaphore(_Rules):
    """At most ``permits`` live holders of ``key``, across processes: see :mod:`dibs.semaphore`.

    ``permits`` is declared on first use: if the store's limit for ``key``
    differs, this handle's replaces it. Raises :class:`~dibs.InvalidInput` for
    a bad key or permits. Share one instance among threads.
    """

    def __init__(self, store: Store, key: str, *, permits: int) -> None:
        super().__init__(key, permits)
        self.store = store

    def lease(
        self,
        *,
        holder: str,
        ttl: float,
        wait: float | None = 0.0,
        renew_every: float | None = None,
        on_lost: Callable[[HoldLost], object] | None = None,
        max_hold: float | None = None,
    ) -> SemaphoreLease:
        """One permit for a ``with`` block, as a fenced, auto-renewing hold on a free slot.

        ``wait`` is how long entering waits for a permit (0: not at all; None:
        as long as it takes) before raising :class:`~dibs.ResourceBusy`.
        ``on_lost`` and ``max_hold`` act on the permit's hold as on
        :meth:`dibs.Store.lease`'s. Raises :class:`~dibs.InvalidInput` here for
        bad arguments, as :meth:`dibs.Store.lease` does.
        """
        return SemaphoreLease(
            self,
            holder=holder,
            ttl=ttl,
            wait=wait,
            renew_every=renew_every,
            on_lost=on_lost,
            max_hold=max_hold,
        )

    def holders(self) -> list[str]:
        """The holders of live permits, in slot order (a snapshot; one holder may hold several)."""
        held: list[str] = drive(self._holders_rule(), self._perform)
        return held

    @property
    def permits(self) -> int:
        """The permits this handle declares or last set; :meth:`current_permits` reads the store."""
        return self._permits

    def current_permits(self) -> int:
        """The limit in the store now (declaring this handle's on first use)."""
        found: int = drive(self._read_rule(), self._perform)
        return found

    def set_permits(self, permits: int) -> None:
        """Change the limit for every process; a lower one admits no one new until fewer hold.

        Raises :class:`~dibs.InvalidInput` for a bad ``permits``.
        """
        drive(self._set_rule(check_permits(permits)), self._perform)

    def _perform(self, step: _Step) -> Any:
        store = self.store
        match step:
            case _Read(unit):
                return store.holder_of(unit)
            case _Write(unit, holder):
                return store.claim(unit, holder=holder)
            case _Sleep(seconds):
                time.sleep(seconds)
                return None
            case QPause(seconds, _, since, _, ids):
                listen(since, seconds, ids)
                return None
            case QCall(method, args, kwargs):
                return getattr(store, method)(*args, **kwargs)
        raise AssertionError(step)  # pragma: no cover

    def __repr__(self) -> str:
        return f"<Semaphore {self.key!r} permits={self._permits}>"


class AsyncSemaphoreLease(_LeaseView):
    """``async with sem.lease(holder=..., ttl=...) as permit:``: :class:`SemaphoreLease`, awaited.

    Its loss cancels the block's task, and ``async with`` raises
    :class:`~dibs.HoldLost`, as an :class:`~dibs.lease.AsyncLease` does.
    """

    def __init__(
        self,
        semaphore: AsyncSemaphore,
        *,
        holder: str,
        ttl: float,
        wait: float | None,
        renew_every: float | None,
        on_lost: Callable[[HoldLost], object] | None,
        max_hold: float | None,
    ) -> None:
        terms = _terms(Unit(semaphore.key, "0"), holder, ttl, wait, renew_every, max_hold)
        super().__init__(semaphore.key, terms.holder, terms.ttl)
        self._semaphore = semaphore
        self._wait = terms.wait
        self._renew_every = renew_every
        self._on_lost = check_on_lost(on_lost)
        self._max_hold = max_hold
        self._pending: AsyncLease | None = None
        self._place = Place()

    async def __aenter__(self) -> Self:
        self._enter()
        sem = self._semaphore
        try:
            inner, limit = await adrive(
                sem._acquire_rule(self._holder, self._wait, self._place), self._perform, _LEFT
            )
        except BaseException as exc:
            if self._pending is not None:  # entered, then interrupted before it was handed over
                await to_the_end(self._pending.__aexit__(type(exc), exc, exc.__traceback__))
            with contextlib.suppress(Exception):  # cut off while queued: the next one goes on
                await to_the_end(
                    adrive(
                        abandon_queue(queue_name("semaphore", sem.key), self._place),
                        sem._perform,
                        _LEFT,
                    )
                )
            raise
        self._take(inner, limit)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        inner = self._live()
        assert isinstance(inner, AsyncLease)
        await inner.__aexit__(exc_type, exc, tb)

    async def _perform(self, step: _Step) -> Any:
        store = self._semaphore.store
        match step:
            case _Enter(unit):
                lease = store.lease(
                    unit,
                    holder=self._holder,
                    ttl=self._ttl,
                    renew_every=self._renew_every,
                    on_lost=self._on_lost,
                    max_hold=self._max_hold,
                )
                try:
                    await lease.__aenter__()
                except ResourceBusy:
                    return None
                self._pending = lease
                return lease
            case _Exit(lease):
                self._pending = None
                await lease.__aexit__(None, None, None)
                return None
        return await self._semaphore._perform(step)


class AsyncSemaphore(_Rules):
    """:class:`Semaphore` on an :class:`~dibs.aio.AsyncStore`: the same rules, awaited.

    ``dibs.aio.Semaphore``. Share one instance among the tasks of one event loop.
    """

    def __init__(self, store: AsyncStore, key: str, *, permits: int) -> None:
        super().__init__(key, permits)
        self.store = store

    def lease(
        self,
        *,
        holder: str,
        ttl: float,
        wait: float | None = 0.0,
        renew_every: float | None = None,
        on_lost: Callable[[HoldLost], object] | None = None,
        max_hold: float | None = None,
    ) -> AsyncSemaphoreLease:
        """One permit for an ``async with`` block: :meth:`Semaphore.lease`."""
        return AsyncSemaphoreLease(
            self,
            holder=holder,
            ttl=ttl,
            wait=wait,
            renew_every=renew_every,
            on_lost=on_lost,
            max_hold=max_hold,
        )

    async def holders(self) -> list[str]:
        """The holders of live permits, in slot order: :meth:`Semaphore.holders`."""
        held: list[str] = await adrive(self._holders_rule(), self._perform)
        return held

    @property
    def permits(self) -> int:
        """The permits this handle declares (or last set): :attr:`Semaphore.permits`."""
        return self._permits

    async def current_permits(self) -> int:
        """The limit in the store now: :meth:`Semaphore.current_permits`."""
        found: int = await adrive(self._read_rule(), self._perform)
        return found

    async def set_permits(self, permits: int) -> None:
        """Change the limit for every process: :meth:`Semaphore.set_permits`."""
        await adrive(self._set_rule(check_permits(permits)), self._perform)

    async def _perform(self, step: _Step) -> Any:
        store = self.store
        match step:
            case _Read(unit):
                return await store.holder_of(unit)
            case _Write(unit, holder):
                return await store.claim(unit, holder=holder)
            case _Sleep(seconds):
                await asyncio.sleep(seconds)
                return None
            case QPause(seconds, _, since, _, ids):
                await alisten(since, seconds, ids)
                return None
            case QCall(method, args, kwargs):
                return await getattr(store, method)(*args, **kwargs)
        raise AssertionError(step)  # pragma: no cover

    def __repr__(self) -> str:
        return f"<dibs.aio.Semaphore {self.key!r} permits={self._permits}>"
