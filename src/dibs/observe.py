"""OpenTelemetry spans and metrics around a store's calls, for those who ask: ``instrument(store)``.

Off by default and free when off: nothing in dibs imports OpenTelemetry
until :func:`instrument` is called, and an uninstrumented store runs exactly
the code it always did. The ``otel`` extra installs the API
(``pip install 'dibs[otel]'``); the application installs and configures an
SDK and exporter as usual, or passes providers here.

Each call of the contract (``claim``, ``confirm``, ``extend``, ``release``,
``get``, ``holder_of``, ``claims_of``, ``sweep``) becomes one span named
``dibs.<operation>`` (kind CLIENT) with these attributes:

* ``dibs.store``: the store's scheme (``memory``, ``sqlite``, ``postgresql``…);
* ``dibs.operation``: the operation;
* ``dibs.outcome``: ``granted``, ``taken`` or ``replayed`` for a claim,
  ``ok`` for the rest, ``error`` when it raised;
* ``dibs.targets``: how many targets a claim names;
* ``error.type``: the exception's class when it raised (the span's status is
  then ERROR; the exception's message is not recorded, since it may name a
  holder).

An async store (:func:`dibs.aio.open`) is instrumented the same way:
``instrument(async_store)`` returns an :class:`InstrumentedAsyncStore` whose
coroutines make the same spans and metrics. Both faces are one implementation:
:class:`InstrumentedStore`'s traced calls are generated from
:class:`InstrumentedAsyncStore`'s by ``scripts/unasync.py`` (dropping ``async``
and ``await``), so the two cannot drift.

Holder names, resources, slots, claim and request IDs are never recorded:
they may be personal data. Two instruments are recorded on the meter
``dibs``:

* ``dibs.claims`` (counter, ``{claim}``): claims by ``dibs.store`` and ``dibs.outcome``;
* ``dibs.operation.duration`` (histogram, seconds): every call by
  ``dibs.store``, ``dibs.operation`` and ``dibs.outcome``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Self, TypeVar, overload

from dibs._extras import needs
from dibs._model import Claim, ClaimResult, Span, SweepResult, Target, Unit
from dibs._request import ClaimRequest
from dibs.exceptions import InvalidInput
from dibs.stores.base import Store
from dibs.stores.base_async import AsyncStore

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from dibs.stores.capabilities import AsyncChangeFeed, ChangeFeed, ClaimLog
    from dibs.stores.jobs import JobTable

__all__ = ["InstrumentedAsyncStore", "InstrumentedStore", "instrument"]

_T = TypeVar("_T")

_classes: dict[type[Store], type[InstrumentedStore]] = {}


@overload
def instrument(
    store: Store,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> InstrumentedStore: ...


@overload
def instrument(
    store: AsyncStore,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> InstrumentedAsyncStore: ...


def instrument(
    store: Store | AsyncStore,
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> InstrumentedStore | InstrumentedAsyncStore:
    """``store`` with a span and metrics around every call; the same store, claims and errors.

    Takes a sync store (:func:`dibs.open`) and returns an
    :class:`InstrumentedStore`, or an async one (:func:`dibs.aio.open`) and
    returns an :class:`InstrumentedAsyncStore`. Uses the global tracer and
    meter providers unless others are given. Closing the returned store closes
    ``store``. Raises :class:`~dibs.InvalidInput` for something that is not a
    store, and :class:`~dibs.MissingExtra` when ``opentelemetry-api`` is not installed.
    """
    if isinstance(store, InstrumentedStore | InstrumentedAsyncStore):
        return store
    if not isinstance(store, Store | AsyncStore):
        raise InvalidInput(
            f"instrument() takes a dibs store, got {store!r}", field="store", value=store
        )
    with needs("otel", "dibs.observe.instrument()"):
        from opentelemetry import metrics, trace  # noqa: PLC0415  (optional: only when asked)
    import dibs  # noqa: PLC0415  (dibs imports this module's users; here only for the version)

    tracer = trace.get_tracer("dibs", dibs.__version__, tracer_provider=tracer_provider)
    meter = metrics.get_meter("dibs", dibs.__version__, meter_provider=meter_provider)
    if isinstance(store, AsyncStore):
        return InstrumentedAsyncStore(store, _Telemetry(store.scheme, tracer, meter))
    cls = _classes.get(type(store))
    if cls is None:
        # A subclass per store class, so that the class-level facts (scheme, in_process,
        # local_clock, holds_outlive_ttl, client_stamps, verify_faults) read as the
        # wrapped store's.
        cls = type(
            f"Instrumented{type(store).__name__}",
            (InstrumentedStore,),
            {
                "scheme": getattr(type(store), "scheme", "plugin"),
                "in_process": type(store).in_process,
                "local_clock": type(store).local_clock,
                "holds_outlive_ttl": type(store).holds_outlive_ttl,
                "client_stamps": type(store).client_stamps,
                "verify_faults": type(store).verify_faults,
                "__module__": __name__,
            },
        )
        _classes[type(store)] = cls
    return cls(store, tracer, meter)


class _Telemetry:
    """The spans and instruments both instrumented faces record with."""

    def __init__(self, scheme: str, tracer: Any, meter: Any) -> None:
        from opentelemetry.context import attach, detach  # noqa: PLC0415
        from opentelemetry.trace import SpanKind, StatusCode, set_span_in_context  # noqa: PLC0415

        self.scheme = scheme
        self._tracer = tracer
        self._kind = SpanKind.CLIENT
        self._error = StatusCode.ERROR
        self._attach = attach
        self._detach = detach
        self._in_context = set_span_in_context
        self._claims = meter.create_counter(
            "dibs.claims", unit="{claim}", description="Claims, by store and outcome"
        )
        self._duration = meter.create_histogram(
            "dibs.operation.duration",
            unit="s",
            description="Duration of store calls, by store, operation and outcome",
        )

    def start(self, operation: str, targets: int | None) -> tuple[Any, Any, float]:
        """Start the call's span and make it current: (span, context token, start time)."""
        attributes: dict[str, str | int] = {"dibs.store": self.scheme, "dibs.operation": operation}
        if targets is not None:
            attributes["dibs.targets"] = targets
        span = self._tracer.start_span(f"dibs.{operation}", kind=self._kind, attributes=attributes)
        # Attached by hand rather than with start_as_current_span(): two context
        # managers fewer per call, and no exception recorded (its message may name
        # a holder).
        return span, self._attach(self._in_context(span)), time.perf_counter()

    def failed(
        self, span: Any, operation: str, exc: BaseException, started: float, counted: bool
    ) -> None:
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_attribute("dibs.outcome", "error")
        span.set_status(self._error)
        self._measure(operation, "error", started, counted=counted)

    def done(self, span: Any, operation: str, outcome: str, started: float, counted: bool) -> None:
        span.set_attribute("dibs.outcome", outcome)
        self._measure(operation, outcome, started, counted=counted)

    def end(self, span: Any, token: Any) -> None:
        self._detach(token)
        span.end()

    # --- generated from the shared part below (scripts/unasync.py): edit that, then run it ---
    def traced(
        self,
        operation: str,
        call: Callable[[], _T],
        outcome: Callable[[_T], str] | None = None,
        targets: int | None = None,
    ) -> _T:
        """Run ``call`` in the operation's span and measure it; its result, or its error.

        The span is current in this context while the call runs, so spans the call
        makes (a driver's) nest under it; on the async face that context is the
        calling task's, and other tasks never see it. An error, a cancellation too,
        makes an error span.
        """
        span, token, started = self.start(operation, targets)
        try:
            result = call()
        except BaseException as exc:
            self.failed(span, operation, exc, started, outcome is not None)
            raise
        else:
            self.done(span, operation, outcome(result) if outcome else "ok", started, bool(outcome))
            return result
        finally:
            self.end(span, token)

    # --- end of the generated part ---

    # --- shared with the sync face: scripts/unasync.py makes traced() from this part ---
    async def traced_async(
        self,
        operation: str,
        call: Callable[[], Awaitable[_T]],
        outcome: Callable[[_T], str] | None = None,
        targets: int | None = None,
    ) -> _T:
        """Run ``call`` in the operation's span and measure it; its result, or its error.

        The span is current in this context while the call runs, so spans the call
        makes (a driver's) nest under it; on the async face that context is the
        calling task's, and other tasks never see it. An error, a cancellation too,
        makes an error span.
        """
        span, token, started = self.start(operation, targets)
        try:
            result = await call()
        except BaseException as exc:
            self.failed(span, operation, exc, started, outcome is not None)
            raise
        else:
            self.done(span, operation, outcome(result) if outcome else "ok", started, bool(outcome))
            return result
        finally:
            self.end(span, token)

    # --- end of the shared part ---

    def _measure(self, operation: str, outcome: str, started: float, *, counted: bool) -> None:
        seconds = time.perf_counter() - started
        labels = {"dibs.store": self.scheme, "dibs.outcome": outcome}
        if counted:
            self._claims.add(1, labels)
        self._duration.record(seconds, {**labels, "dibs.operation": operation})


def _count(targets: Target | Iterable[Target]) -> int | None:
    # Counted only when that costs nothing: an iterator is the store's to consume.
    if isinstance(targets, Unit | Span):
        return 1
    if isinstance(targets, list | tuple | set | frozenset):
        return len(targets)
    return None


class InstrumentedStore(Store):
    """A store whose calls are traced and measured; everything else is the wrapped store's.

    Made by :func:`instrument`. Attributes the wrapped store has and this
    class does not (``path``, ``schema``…) are read from it.
    """

    scheme = "instrumented"

    def __init__(self, store: Store, tracer: Any, meter: Any) -> None:
        super().__init__(clock=store.clock, request_retention=store.request_retention)
        self.store = store
        """The wrapped store."""
        self._telemetry = _Telemetry(self.scheme, tracer, meter)
        self._traced = self._telemetry.traced

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """Open the store ``url`` names (as :func:`dibs.open` does) and instrument it."""
        from dibs.stores import open_store  # noqa: PLC0415  (the registry imports the stores)

        return instrument(open_store(url, **options))  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        # Only for names this class lacks: the wrapped store's own attributes.
        if name.startswith("__") or name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)

    def __repr__(self) -> str:
        return f"instrument({self.store!r})"

    # --- generated from InstrumentedAsyncStore (scripts/unasync.py): edit that, then run it ---

    def claim(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = "exclusive",
    ) -> ClaimResult:
        """Traced :meth:`dibs.Store.claim`."""
        return self._traced(
            "claim",
            lambda: self.store.claim(
                targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode
            ),
            _claim_outcome,
            _count(targets),
        )

    def confirm(self, claim_id: str, *, holder: str, fence: int) -> Claim:
        """Traced :meth:`dibs.Store.confirm`."""
        return self._traced(
            "confirm", lambda: self.store.confirm(claim_id, holder=holder, fence=fence)
        )

    def extend(self, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
        """Traced :meth:`dibs.Store.extend`."""
        return self._traced(
            "extend", lambda: self.store.extend(claim_id, holder=holder, fence=fence, ttl=ttl)
        )

    def release(self, claim_id: str, *, holder: str, fence: int) -> bool:
        """Traced :meth:`dibs.Store.release`."""
        return self._traced(
            "release", lambda: self.store.release(claim_id, holder=holder, fence=fence)
        )

    def get(self, claim_id: str) -> Claim | None:
        """Traced :meth:`dibs.Store.get`."""
        return self._traced("get", lambda: self.store.get(claim_id))

    def holder_of(self, target: Unit | Span) -> str | None:
        """Traced :meth:`dibs.Store.holder_of`."""
        return self._traced("holder_of", lambda: self.store.holder_of(target))

    def claims_of(self, holder: str) -> list[Claim]:
        """Traced :meth:`dibs.Store.claims_of`."""
        return self._traced("claims_of", lambda: self.store.claims_of(holder))

    def sweep(self) -> SweepResult:
        """Traced :meth:`dibs.Store.sweep`."""
        return self._traced("sweep", self.store.sweep)

    # The contract's _-methods are never reached (the public methods above
    # delegate whole), but a store must define them.

    def _claim(self, request: ClaimRequest) -> ClaimResult:
        return self.store._claim(request)

    def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return self.store._confirm(claim_id, holder, fence)

    def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return self.store._extend(claim_id, holder, fence, ttl)

    def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return self.store._release(claim_id, holder, fence)

    def _get(self, claim_id: str) -> Claim | None:
        return self.store._get(claim_id)

    def _holder_of(self, target: Unit | Span) -> str | None:
        return self.store._holder_of(target)

    def _claims_of(self, holder: str) -> list[Claim]:
        return self.store._claims_of(holder)

    def _sweep(self) -> SweepResult:
        return self.store._sweep()

    def _now(self) -> float:
        return self.store._now()

    def _close(self) -> None:
        self.store.close()

    # --- end of the generated part ---

    # --- the rest is the wrapped store's ---------------------------------------------------------

    def job_table(self) -> JobTable | None:
        """The wrapped store's job table (its calls are not traced)."""
        return self.store.job_table()

    def change_feed(self) -> ChangeFeed | None:
        """The wrapped store's change feed."""
        return self.store.change_feed()

    def claim_log(self) -> ClaimLog | None:
        """The wrapped store's claim log."""
        return self.store.claim_log()

    def integrity_check(self) -> str | None:
        """The wrapped store's integrity check."""
        return self.store.integrity_check()


class InstrumentedAsyncStore(AsyncStore):
    """An async store whose calls are traced and measured; everything else is the wrapped store's.

    Made by :func:`instrument` from a :func:`dibs.aio.open` store. Its
    coroutines make the spans and metrics :class:`InstrumentedStore`'s calls
    make; answers, errors, opening, closing and the event loop it belongs to
    are the wrapped store's. The async patterns (``dibs.aio.Lot``,
    ``dibs.aio.match``, ``dibs.aio.booking``) and ``lease()`` run on it, their
    store calls traced.
    """

    scheme = "instrumented"

    def __init__(self, store: AsyncStore, telemetry: _Telemetry) -> None:
        super().__init__()
        self.store = store
        """The wrapped async store."""
        self.scheme = store.scheme  # type: ignore[misc]  # per instance: the wrapped store's
        self._inline = store._inline
        self._logger = store._logger
        self._traced = telemetry.traced_async

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Self:
        """The async store ``url`` names (as :func:`dibs.aio.open` makes it), instrumented."""
        from dibs.aio import open as open_async  # noqa: PLC0415  (dibs.aio imports the stores)

        return instrument(open_async(url, **options))  # type: ignore[return-value]

    def __getattr__(self, name: str) -> Any:
        # Only for names this class lacks: the wrapped store's own (request_retention, clock).
        if name.startswith("__") or name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)

    def __repr__(self) -> str:
        return f"instrument({self.store!r})"

    async def open(self) -> Self:
        """Open the wrapped store now: :meth:`dibs.aio.AsyncStore.open`."""
        await self.store.open()
        return self

    async def close(self) -> None:
        """Close the wrapped store: :meth:`dibs.aio.AsyncStore.close`."""
        await self.store.close()

    @property
    def closed(self) -> bool:
        """Whether the wrapped store was closed."""
        return self.store.closed

    async def now(self) -> datetime:
        """The wrapped store's :meth:`~dibs.aio.AsyncStore.now` (not traced)."""
        return await self.store.now()

    async def _open(self) -> None:
        await self.store.open()

    # --- shared with the sync face: scripts/unasync.py makes InstrumentedStore's from this part ---

    async def claim(
        self,
        targets: Target | Iterable[Target],
        *,
        holder: str,
        request_id: str | None = None,
        ttl: float | None = None,
        mode: str = "exclusive",
    ) -> ClaimResult:
        """Traced :meth:`dibs.aio.AsyncStore.claim`."""
        return await self._traced(
            "claim",
            lambda: self.store.claim(
                targets, holder=holder, request_id=request_id, ttl=ttl, mode=mode
            ),
            _claim_outcome,
            _count(targets),
        )

    async def confirm(self, claim_id: str, *, holder: str, fence: int) -> Claim:
        """Traced :meth:`dibs.aio.AsyncStore.confirm`."""
        return await self._traced(
            "confirm", lambda: self.store.confirm(claim_id, holder=holder, fence=fence)
        )

    async def extend(self, claim_id: str, *, holder: str, fence: int, ttl: float) -> Claim:
        """Traced :meth:`dibs.aio.AsyncStore.extend`."""
        return await self._traced(
            "extend", lambda: self.store.extend(claim_id, holder=holder, fence=fence, ttl=ttl)
        )

    async def release(self, claim_id: str, *, holder: str, fence: int) -> bool:
        """Traced :meth:`dibs.aio.AsyncStore.release`."""
        return await self._traced(
            "release", lambda: self.store.release(claim_id, holder=holder, fence=fence)
        )

    async def get(self, claim_id: str) -> Claim | None:
        """Traced :meth:`dibs.aio.AsyncStore.get`."""
        return await self._traced("get", lambda: self.store.get(claim_id))

    async def holder_of(self, target: Unit | Span) -> str | None:
        """Traced :meth:`dibs.aio.AsyncStore.holder_of`."""
        return await self._traced("holder_of", lambda: self.store.holder_of(target))

    async def claims_of(self, holder: str) -> list[Claim]:
        """Traced :meth:`dibs.aio.AsyncStore.claims_of`."""
        return await self._traced("claims_of", lambda: self.store.claims_of(holder))

    async def sweep(self) -> SweepResult:
        """Traced :meth:`dibs.aio.AsyncStore.sweep`."""
        return await self._traced("sweep", self.store.sweep)

    # The contract's _-methods are never reached (the public methods above
    # delegate whole), but a store must define them.

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        return await self.store._claim(request)

    async def _confirm(self, claim_id: str, holder: str, fence: int) -> Claim:
        return await self.store._confirm(claim_id, holder, fence)

    async def _extend(self, claim_id: str, holder: str, fence: int, ttl: float) -> Claim:
        return await self.store._extend(claim_id, holder, fence, ttl)

    async def _release(self, claim_id: str, holder: str, fence: int) -> bool:
        return await self.store._release(claim_id, holder, fence)

    async def _get(self, claim_id: str) -> Claim | None:
        return await self.store._get(claim_id)

    async def _holder_of(self, target: Unit | Span) -> str | None:
        return await self.store._holder_of(target)

    async def _claims_of(self, holder: str) -> list[Claim]:
        return await self.store._claims_of(holder)

    async def _sweep(self) -> SweepResult:
        return await self.store._sweep()

    async def _now(self) -> float:
        return await self.store._now()

    async def _close(self) -> None:
        await self.store.close()

    # --- end of the shared part ---

    # --- the rest is the wrapped store's (each face has its own feed type) ----------------------

    def change_feed(self) -> AsyncChangeFeed | None:
        """The wrapped store's change feed (its reads are not traced)."""
        return self.store.change_feed()


def _claim_outcome(result: ClaimResult) -> str:
    if result.replayed:
        return "replayed"
    return "granted" if result else "taken"
