"""Run a function once per idempotency key on a store, and replay its result: ``@dibs.idempotent``.

The decorator keeps three kinds of record, all of them ordinary claims, so it
works on every store that keeps the claim contract (plug-ins included) and
needs no table of its own:

``Unit("dibs.idempotent.run:<name>", key)``
    A hold with the in-progress TTL while one call runs the function. The
    claim is the linearization point of "who runs it": exactly one caller gets
    it; a caller that finds it taken is told the call is in progress. A call
    that crashes leaves the hold to expire, and the next caller takes it over.
    Its holder is the call's own, ``dibs.idempotent.<payload fingerprint>.<nonce>``.

``Unit("dibs.idempotent.done:<name>", key)`` plus result units
    One claim, written in one atomic step while the run hold is still held: the
    done unit and the serialized result, cut into units of
    ``"dibs.idempotent.result:<name>"``. It is a hold whose TTL is the result
    retention (the store's ``request_retention`` by default), so ``sweep()``
    forgets it like any other record. Its holder is fixed by the name, the key
    and the payload: ``dibs.idempotent.<payload fingerprint>.kept.<digest of
    name and key>``, so a replay is one read, ``claims_of`` that holder.

A store must offer ``claim`` (group claims of up to a few hundred units),
``release``, ``holder_of`` and ``claims_of``: the contract every store passes.

A first call makes four store calls, two of them writes: ``claims_of`` (no
result), the run hold's claim, ``holder_of`` the done unit (still no result,
read under the hold), and the claim that stores the result. A replay makes one,
``claims_of``. Why each remaining step is there, and why the run hold is not
released after a result is stored:

* The run hold stays until its TTL once the result is stored, when the result
  outlives it (``keep`` past the hold's expiry: the default). Every duplicate
  looks for a result before it looks at the run hold (first with ``claims_of``,
  then, if its claim is refused, with ``holder_of`` the done unit), so a
  lingering hold never reads as "in progress" while a result is there. When the
  result would expire first (``keep`` shorter than what is left of ``ttl``) the
  hold is released as before: else a call after ``keep`` would be told "in
  progress" although nothing runs. So a finished call's live run hold always has
  its live result behind it (both expiries are the store's clock). A crashed or
  cancelled call stores nothing and still releases (or leaves) its hold as before.
* A caller that wins the run hold reads ``holder_of`` the done unit again
  before it runs anything. A result stored between its first read and its claim
  is possible still: the finisher's hold may have expired meanwhile (this
  caller stalled past ``ttl``), it may have been released (``keep`` < ``ttl``,
  or a caller on the previous release, which always released), or the record is
  in the previous release's form (its holder was the call's own, so
  ``claims_of`` the fixed holder cannot find it). The same read tells a result
  stored with a different payload (a conflict), which ``claims_of`` the fixed
  holder cannot see.
* Records written by the previous release (the done claim under the call's own
  holder) are found by that read and replayed with ``claims_of`` their holder;
  the previous release finds this one's records the same way, since its holder
  starts with the payload fingerprint as before.

The protocol is written once, as generators that yield store calls; a
synchronous driver runs them for plain functions and an asynchronous one for
``async def`` functions (a coroutine method is awaited, a blocking one runs in
a worker thread), so a native asynchronous store slots in unchanged.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import inspect
import itertools
import json
import pickle
import secrets
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from dibs._drive import adrive, drive
from dibs._model import Claim, ClaimResult, Unit, check_name, check_seconds
from dibs._shield import to_the_end as _to_the_end
from dibs.exceptions import DibsError, InvalidInput, RequestConflict, StoreUnavailable
from dibs.limits import NAME_MAX_BYTES, TTL_MAX, TTL_MIN
from dibs.stores.base import DEFAULT_REQUEST_RETENTION

__all__ = [
    "JSON",
    "PICKLE",
    "RESULT_MAX_BYTES",
    "IdempotencyInProgress",
    "JSONSerializer",
    "PickleSerializer",
    "Serializer",
    "idempotent",
]

P = ParamSpec("P")
R = TypeVar("R")

PREFIX = "dibs.idempotent"
RESULT_MAX_BYTES = 256 * 1024
"""The largest serialized result, in bytes (after base64, for one that is not printable ASCII)."""
_NONCE_BYTES = 16
_CHUNK = NAME_MAX_BYTES - 2 * _NONCE_BYTES - 8  # a result slot is "<nonce>.<index:06d>.<chunk>"
_ROUNDS = 64  # a record that keeps vanishing between two reads is not worth more
_RETRIES = 4  # claims tried when the store cannot be reached, 50 ms apart and doubling
_FIRST_PAUSE, _LAST_PAUSE = 0.01, 0.5  # polls of a running call with wait=, doubling


class IdempotencyInProgress(DibsError, RuntimeError):
    """Raised when another call with this ``key`` (same payload) is running ``name`` now.

    ``expires_at`` is when that call's in-progress hold runs out (None if it
    ended as this was raised): after it, a new call runs the function again.
    Retry later with the same key and payload to get the stored result.
    """

    key: str
    name: str
    expires_at: datetime | None


class Serializer(Protocol):
    """Turns a function's result into bytes and back."""

    def dumps(self, value: Any) -> bytes:
        """The value as bytes; raise ``TypeError`` or ``ValueError`` if it has no encoding."""
        ...

    def loads(self, data: bytes) -> Any:
        """The value :meth:`dumps` made ``data`` from."""
        ...


class JSONSerializer:
    """JSON, the default: a replay returns lists for tuples and strings for dict keys."""

    def dumps(self, value: Any) -> bytes:
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("ascii")

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class PickleSerializer:
    """Pickle, opt-in: any picklable result comes back as itself.

    Only for a store that nobody untrusted can write to: unpickling runs code.
    """

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)  # the docs say: a trusted store only


JSON = JSONSerializer()
PICKLE = PickleSerializer()
_SERIALIZERS: dict[str, Serializer] = {"json": JSON, "pickle": PICKLE}


# --- the protocol, once, as generators of store calls ---------------------------------------------

_Call = tuple[str, tuple[Any, ...], dict[str, Any]]
"""A store call: method name, positional and keyword arguments."""


@dataclass(frozen=True, slots=True)
class _Record:
    """One call's identity: where its records live and who it is on the store."""

    name: str
    key: str
    fingerprint: str
    holder: str
    nonce: str
    kept: str
    """The stored result's holder: the same for every call with this name, key and payload."""

    @property
    def run(self) -> Unit:
        return Unit(f"{PREFIX}.run:{self.name}", self.key)

    @property
    def done(self) -> Unit:
        return Unit(f"{PREFIX}.done:{self.name}", self.key)


@dataclass(frozen=True, slots=True)
class _Replay:
    data: bytes


def _fingerprint_of(holder: str) -> str:
    return holder[len(PREFIX) + 1 :].split(".", 1)[0]


def _conflict(record: _Record) -> RequestConflict:
    return RequestConflict(
        f"idempotency key {record.key!r} of {record.name!r} was used with a different payload",
        request_id=record.key,
        key=record.key,
        name=record.name,
    )


def _begin(
    record: _Record, ttl: float, wait: float, tried: list[str] | None = None
) -> Generator[_Call, Any, _Replay | Claim]:
    """Find the stored result, or take the run hold; wait, then raise, while another runs it.

    ``tried`` gets the request ID of each run-hold claim before it is sent: a
    caller cancelled meanwhile replays them (:func:`_recall`) to learn whether one
    was granted, and ends it.
    """
    deadline = time.monotonic() + wait
    pause = _FIRST_PAUSE
    vanished = 0
    for attempt in itertools.count():
        replay = yield from _read_kept(record)
        if replay is not None:
            return replay
        request_id = f"{record.holder}.run.{attempt}"
        if tried is not None:
            tried.append(request_id)
        won = yield from _claim(record, [record.run], ttl, request_id)
        if won:
            assert won.claim is not None
            # Read again under the hold: a result stored since the read above, by a
            # caller whose hold then ended, one with another payload, or one in the
            # previous release's form (see the module docstring). Stored results are
            # written before their run hold ends, so this read, made while holding
            # it, sees any there is.
            try:
                replay = yield from _read_done(record)
            except RequestConflict:
                yield from _release(record, won.claim)
                raise
            if replay is None:
                return won.claim
            yield from _release(record, won.claim)
            return replay
        # Refused: a call runs now, or one finished and its hold outlives it (the
        # hold stays once the result is stored): a result first, then the hold.
        replay = yield from _read_done(record)
        if replay is not None:
            return replay
        running: str | None = yield ("holder_of", (record.run,), {})
        if running is None:
            vanished += 1
            if vanished < _ROUNDS:
                continue  # it ended between the claim and the read: look again
            raise IdempotencyInProgress(
                f"the records of {record.name!r} for key {record.key!r} kept changing; retry",
                key=record.key,
                name=record.name,
                expires_at=None,
            )
        if _fingerprint_of(running) != record.fingerprint:
            raise _conflict(record)
        left = deadline - time.monotonic()
        if left > 0:
            # Poll: a store has no portable way to say "this hold ended".
            yield ("sleep", (min(pause, left),), {})
            pause = min(pause * 2, _LAST_PAUSE)
            continue
        claims: list[Claim] = yield ("claims_of", (running,), {})
        expires = [c.expires_at for c in claims if record.run in c.targets]
        raise IdempotencyInProgress(
            f"{record.name!r} is already running for idempotency key {record.key!r}",
            key=record.key,
            name=record.name,
            expires_at=expires[0] if expires else None,
        )
    raise AssertionError("unreachable")


def _recall(record: _Record, ttl: float, tried: list[str]) -> Generator[_Call, Any, None]:
    """End every run hold a cancelled :func:`_begin` may have been granted without learning it.

    Each claim is replayed by its request ID (the same input, so the store answers
    what it decided, or decides now if the claim never reached it) and a granted
    one is released: the key is free at once for a retry, not "in progress" until
    ``ttl`` although the function never ran.
    """
    for request_id in tried:
        won = yield from _claim(record, [record.run], ttl, request_id)
        if won.claim is not None:
            yield from _release(record, won.claim)


def _read_kept(record: _Record) -> Generator[_Call, Any, _Replay | None]:
    """The result stored for this name, key and payload, in one read; None if there is none."""
    claims: list[Claim] = yield ("claims_of", (record.kept,), {})
    return _replay_of(record, claims)


def _read_done(record: _Record) -> Generator[_Call, Any, _Replay | None]:
    """The result stored for this key, in either form; raises if its payload differs."""
    holder: str | None = yield ("holder_of", (record.done,), {})
    if holder is None:
        return None
    if _fingerprint_of(holder) != record.fingerprint:
        raise _conflict(record)
    claims: list[Claim] = yield ("claims_of", (holder,), {})
    return _replay_of(record, claims)  # None: it expired between the two reads


def _replay_of(record: _Record, claims: list[Claim]) -> _Replay | None:
    for claim in claims:
        if record.done in claim.targets:
            return _Replay(_decode(claim))
    return None


def _finish(
    record: _Record, run: Claim, result: list[Unit], keep: float
) -> Generator[_Call, Any, None]:
    """Store the result; end the run hold only if the result would expire before it."""
    targets = [record.done, *result]
    # Not granted only when this call's run hold expired and another call, which
    # took it over, stored its result first: that result stands.
    stored = yield from _claim(record, targets, keep, f"{record.holder}.done", record.kept)
    kept = stored.claim
    if kept is not None and _outlives(kept, run):
        # The hold may stay to its TTL: every duplicate reads the result before it
        # looks at the hold, and the result lasts longer (module docstring).
        return
    # The result is stored: the function's caller gets it even if ending the run
    # hold fails, since a duplicate reads the result before it looks at that hold,
    # which expires after its ttl all the same.
    with contextlib.suppress(StoreUnavailable):
        yield from _release(record, run)


def _outlives(kept: Claim, run: Claim) -> bool:
    # Both expiries are the store's own clock, so they compare without skew.
    if kept.expires_at is None:
        return True
    return run.expires_at is not None and kept.expires_at >= run.expires_at


def _claim(
    record: _Record, targets: list[Unit], ttl: float, request_id: str, holder: str | None = None
) -> Generator[_Call, Any, ClaimResult]:
    """Claim with a request ID, retrying a store that could not be reached.

    A claim that was written but whose answer was lost is replayed by its
    request ID rather than claimed twice, so a lost answer never strands the
    run hold until its TTL or loses a stored result.
    """
    for attempt in range(_RETRIES):
        try:
            result: ClaimResult = yield (
                "claim",
                (targets,),
                {"holder": holder or record.holder, "ttl": ttl, "request_id": request_id},
            )
            return result
        except StoreUnavailable:
            if attempt == _RETRIES - 1:
                raise
            yield ("sleep", (0.05 * 2**attempt,), {})
    raise AssertionError("unreachable")


def _unstorable(
    record: _Record, result: list[Unit], store: object, refused: InvalidInput
) -> InvalidInput:
    """The store refused the claim that keeps a result (more units than one of its claims
    takes: etcd's transactions): the result's fault, told as such; nothing was stored."""
    return InvalidInput(
        f"the result of {record.name!r} needs {len(result)} units of up to {_CHUNK} bytes, "
        f"more than one claim on {type(store).__name__} takes ({refused}); return less",
        field="result",
        value=len(result),
    )


def _release(record: _Record, run: Claim) -> Generator[_Call, Any, None]:
    yield ("release", (run.id,), {"holder": record.holder, "fence": run.fence})


def _encode(record: _Record, data: bytes) -> list[Unit]:
    # Printable ASCII is stored as it is, anything else in base64; "t" or "b" says which.
    text = data.decode("ascii") if data.isascii() else ""
    text = text if text.isprintable() else ""
    encoded = "t" + text if text or not data else "b" + base64.b64encode(data).decode("ascii")
    size = len(encoded) - 1  # the tag is ours, not the result's
    if size > RESULT_MAX_BYTES:
        raise InvalidInput(
            f"the result of {record.name!r} is {size} bytes serialized"
            f"{'' if encoded[0] == 't' else ' (in base64)'}; at most {RESULT_MAX_BYTES} are kept",
            field="result",
            value=size,
        )
    resource = f"{PREFIX}.result:{record.name}"
    return [
        Unit(resource, f"{record.nonce}.{i:06d}.{encoded[at : at + _CHUNK]}")
        for i, at in enumerate(range(0, max(len(encoded), 1), _CHUNK))
    ]


def _decode(claim: Claim) -> bytes:
    prefix = f"{PREFIX}.result:"
    parts = sorted(u.slot.split(".", 2)[1:] for u in claim.units if u.resource.startswith(prefix))
    encoded = "".join(chunk for _, chunk in parts)
    if encoded.startswith("b"):
        return base64.b64decode(encoded[1:])
    return encoded[1:].encode("ascii")


# --- drivers -------------------------------------------------------------------------------------

_T = TypeVar("_T")


def _drive(steps: Generator[_Call, Any, _T], store: Any) -> _T:
    """Run a protocol generator against a blocking store; every error goes back into it."""

    def perform(call: _Call) -> Any:
        method, args, kwargs = call
        if method == "sleep":
            return time.sleep(*args)
        return getattr(store, method)(*args, **kwargs)

    return drive(steps, perform, Exception)


async def _drive_async(steps: Generator[_Call, Any, _T], store: Any) -> _T:
    """Run a protocol generator without blocking the event loop.

    A coroutine method (a native asynchronous store) is awaited; a blocking
    one runs in a worker thread.
    """

    async def perform(call: _Call) -> Any:
        method, args, kwargs = call
        if method == "sleep":
            return await asyncio.sleep(*args)
        bound = getattr(store, method)
        if inspect.iscoroutinefunction(bound):
            return await bound(*args, **kwargs)
        return await asyncio.to_thread(bound, *args, **kwargs)

    return await adrive(steps, perform, Exception)


# --- the decorator -------------------------------------------------------------------------------


def idempotent(
    store: Any,
    *,
    key: str | Callable[..., object] | None = None,
    payload: Callable[..., object] | None = None,
    name: str | None = None,
    ttl: float = 60.0,
    wait: float = 0.0,
    keep: float | None = None,
    serializer: str | Serializer = "json",
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function once per idempotency key; replay its result after that.

    ``key`` names the parameter whose value is the idempotency key, or is a
    function of the call's arguments that returns it; without one, the key is
    the payload's fingerprint. ``payload`` is a function of the call's
    arguments that returns what must match on a replay (JSON-able); by default
    it is every argument by name, but for a method's ``self`` or ``cls``.
    ``name`` scopes the keys (default: the function's module and qualified
    name). ``ttl`` is how long, in seconds, a
    call is "in progress" before a crashed one can be run again: make it
    longer than the function takes. ``wait`` is how long, in seconds, a
    duplicate waits for a running call to finish before it gives up (default
    0: it raises at once). ``keep`` is how long a result is kept
    (default: the store's ``request_retention``, at most a year). The result
    goes through ``serializer``: ``"json"`` (default), ``"pickle"`` or any
    :class:`Serializer`.

    Works on ``async def`` functions too (store calls then run in a worker
    thread, or are awaited on a native asynchronous store).

    A call raises :class:`IdempotencyInProgress` while another call with the
    same key and payload runs (after waiting up to ``wait`` seconds: retry it),
    :class:`~dibs.RequestConflict` for the same key with a different payload,
    :class:`~dibs.InvalidInput` for a bad option, key, payload or an
    unserializable result, and what the store raises. When the function
    raises, nothing is stored and the next call runs it again.
    """
    ttl_seconds = check_seconds(ttl, "ttl", TTL_MIN, TTL_MAX)
    wait_seconds = check_seconds(wait, "wait", 0.0, TTL_MAX)
    if keep is not None:
        check_seconds(keep, "keep", TTL_MIN, TTL_MAX)
    codec = _serializer(serializer)
    if key is not None and not isinstance(key, str) and not callable(key):
        raise InvalidInput(
            f"key must be a parameter name or a function, got {key!r}", field="key", value=key
        )
    if payload is not None and not callable(payload):
        raise InvalidInput(
            f"payload must be a function, got {payload!r}", field="payload", value=payload
        )

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        scope = name if name is not None else f"{fn.__module__}.{fn.__qualname__}"
        check_name(scope, "name")
        if len(f"{PREFIX}.result:{scope}".encode()) > NAME_MAX_BYTES:
            raise InvalidInput(
                f"name must be at most {NAME_MAX_BYTES - len(PREFIX) - 8} bytes in UTF-8",
                field="name",
                value=scope,
            )
        signature = inspect.signature(fn)
        if isinstance(key, str) and key not in signature.parameters:
            raise InvalidInput(
                f"key {key!r} is not a parameter of {scope}{signature}", field="key", value=key
            )

        # A method's instance is not part of its payload: two objects may well
        # send the same request.
        first = next(iter(signature.parameters), None)
        own = first if first in ("self", "cls") else None

        def record_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Record:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            chosen = (
                payload(*args, **kwargs)
                if payload is not None
                else {k: v for k, v in bound.arguments.items() if k != own}
            )
            try:
                text = json.dumps(chosen, sort_keys=True, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidInput(
                    f"the payload of {scope} must be JSON-able to be compared on a replay "
                    f"({exc}); pass payload= to choose what identifies a call",
                    field="payload",
                    value=chosen,
                ) from None
            fingerprint = hashlib.sha256(text.encode()).hexdigest()
            idem: object
            if key is None:
                idem = fingerprint
            else:
                idem = bound.arguments[key] if isinstance(key, str) else key(*args, **kwargs)
                if isinstance(idem, int) and not isinstance(idem, bool):
                    idem = str(idem)
            nonce = secrets.token_hex(_NONCE_BYTES)
            holder = f"{PREFIX}.{fingerprint}.{nonce}"
            checked = check_name(idem, "key")
            # A digest of the name and key keeps the holder short whatever their size;
            # a replay also checks the done unit itself, so a collision misleads nobody.
            scoped = json.dumps([scope, checked]).encode()
            kept = f"{PREFIX}.{fingerprint}.kept.{hashlib.sha256(scoped).hexdigest()[:32]}"
            return _Record(scope, checked, fingerprint, holder, nonce, kept)

        def retention() -> float:
            if keep is not None:
                return keep
            kept = getattr(store, "request_retention", DEFAULT_REQUEST_RETENTION)
            return min(float(kept), TTL_MAX)

        def dump(record: _Record, value: object) -> bytes:
            try:
                return codec.dumps(value)
            except (TypeError, ValueError, pickle.PicklingError, AttributeError) as exc:
                raise InvalidInput(
                    f"the result of {record.name} could not be serialized ({exc}); "
                    f"return something the serializer takes, or pass serializer=",
                    field="result",
                    value=value,
                ) from None

        def _abandon(record: _Record, run_hold: Claim) -> None:
            # Best effort: if this fails, the hold expires after ttl all the same.
            with contextlib.suppress(DibsError):
                _drive(_release(record, run_hold), store)

        async def _abandon_async(record: _Record, run_hold: Claim) -> None:
            with contextlib.suppress(DibsError):
                await _to_the_end(_drive_async(_release(record, run_hold), store))

        async def _recall_async(record: _Record, tried: list[str]) -> None:
            # Best effort, as _abandon: a hold this misses expires after ttl all the same.
            with contextlib.suppress(DibsError):
                await _to_the_end(_drive_async(_recall(record, ttl_seconds, tried), store))

        if not inspect.iscoroutinefunction(fn) and inspect.iscoroutinefunction(
            getattr(store, "claim", None)
        ):
            raise InvalidInput(
                f"{scope} is a plain function but the store is asynchronous: "
                "decorate an async def function, or pass a blocking store",
                field="store",
                value=store,
            )
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                record = record_for(args, kwargs)
                tried: list[str] = []
                try:
                    started = await _drive_async(
                        _begin(record, ttl_seconds, wait_seconds, tried), store
                    )
                except asyncio.CancelledError:
                    # Cancelled with a run-hold claim in flight (or just answered): the
                    # store may have granted it; learn that and end it, or the key stays
                    # "in progress" for ttl though the function never ran.
                    await _recall_async(record, tried)
                    raise
                if isinstance(started, _Replay):
                    return codec.loads(started.data)
                try:
                    value = await fn(*args, **kwargs)
                    result = _encode(record, dump(record, value))
                except BaseException:
                    await _abandon_async(record, started)
                    raise
                try:
                    # To its end even if cancelled now: the function ran, so its result
                    # is stored (a retry replays it) and the run hold ends.
                    await _to_the_end(
                        _drive_async(_finish(record, started, result, retention()), store)
                    )
                except InvalidInput as refused:
                    await _abandon_async(record, started)
                    raise _unstorable(record, result, store, refused) from refused
                return value

            return cast(Callable[P, R], run_async)

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            record = record_for(args, kwargs)
            started = _drive(_begin(record, ttl_seconds, wait_seconds), store)
            if isinstance(started, _Replay):
                return cast(R, codec.loads(started.data))
            try:
                value = fn(*args, **kwargs)
                result = _encode(record, dump(record, value))
            except BaseException:
                _abandon(record, started)
                raise
            try:
                _drive(_finish(record, started, result, retention()), store)
            except InvalidInput as refused:
                _abandon(record, started)
                raise _unstorable(record, result, store, refused) from refused
            return value

        return run

    return decorate


def _serializer(serializer: str | Serializer) -> Serializer:
    if isinstance(serializer, str):
        if serializer not in _SERIALIZERS:
            raise InvalidInput(
                f"serializer must be 'json', 'pickle' or a Serializer, got {serializer!r}",
                field="serializer",
                value=serializer,
            )
        return _SERIALIZERS[serializer]
    if not (
        callable(getattr(serializer, "dumps", None))
        and callable(getattr(serializer, "loads", None))
    ):
        raise InvalidInput(
            f"serializer must have dumps() and loads(), got {serializer!r}",
            field="serializer",
            value=serializer,
        )
    return serializer
