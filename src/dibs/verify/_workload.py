"""One client of the workload: random claims, confirms, extends, releases, retries and reads.

A client is sequential (one op at a time), like a request handler. Its mix of
operations is :attr:`Workload.mix`; a hold's TTL is the base ``ttl`` times one
of :attr:`Workload.ttl_spread`, chosen at random, so that some holds die
between a client's ops and its confirms and extends race their expiry. A
separate sweeper (:class:`Sweeper`) calls ``sweep()`` every
``sweep_interval`` seconds, as ``dibs serve`` does. It records
every op's invocation before calling the store and its completion after, as
JSON lines on a file descriptor it owns, so a ``kill -9`` loses at most the
completion of the op in flight (which the runner then records as unknown).

The client's own clock, used only for its decisions (which of its holds it
believes still live), may be skewed; the store never sees it.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dibs._model import Claim, ClaimResult, Span, Target, Unit, target_from_json, target_to_json
from dibs.exceptions import (
    ClaimNotFound,
    HoldLost,
    InvalidInput,
    NotHolder,
    RequestConflict,
    ResourceBusy,
    SpanKindMismatch,
)
from dibs.lease import LEASE_TTL_MIN
from dibs.ratelimit import Decision, RateLimit
from dibs.semaphore import Semaphore
from dibs.stores import redact
from dibs.stores.base import Store
from dibs.verify._history import write_events
from dibs.verify._log import micros
from dibs.verify._planted_lease import crowd, renew_for, transition_weights, wrong_fence_rate
from dibs.verify._waitlist import WAITLIST_PLANTS, waitlist_op

__all__ = [
    "DEFAULT_MIX",
    "POOL_PREFIX",
    "RACE_WINDOW",
    "Client",
    "Sweeper",
    "Workload",
    "client_skew",
    "mark_pool_logs",
    "open_events",
    "parse_mix",
]

DEFAULT_MIX: tuple[tuple[str, float], ...] = (
    ("claim", 44.0),
    ("retry", 6.0),
    ("transition", 38.0),
    ("holder_of", 4.0),
    ("get", 5.0),
    ("claims_of", 3.0),
    ("semaphore", 0.0),
    ("waitlist", 0.0),
    ("rate", 5.0),
)
"""Relative weights of a client's ops: fresh claims, retries of an earlier request
ID (a fifth of them with other input), confirm/extend/release of a claim it
holds, the three reads, holds of a :class:`dibs.Semaphore` permit (off by
default; ``--mix semaphore=5`` turns them on, and the ``semaphore-n-plus-one``
plant does), and rate-limit decisions (``RateLimit.acquire``)."""

SEMAPHORE_PERMITS = 2
"""Permits of the workload's one semaphore, ``<run>-sem``."""

OP_KINDS = tuple(kind for kind, _ in DEFAULT_MIX)

RATE_KEYS = 2
"""How many rate-limit keys a run's ``rate`` ops share."""

SHARED_SHARE = 0.35
"""The share of fresh claims made ``mode="shared"`` on a store that takes them."""

RACE_WINDOW = 0.0005
"""Seconds a planted check-then-act waits between its check and its act: real code
does work there (a log line, an RPC)."""


def parse_mix(text: str) -> tuple[tuple[str, float], ...]:
    """``claim=40,get=10``: the default mix with these weights replaced.

    Raises :class:`~dibs.InvalidInput` for an unknown kind or a bad weight.
    """
    weights = dict(DEFAULT_MIX)
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, value = item.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if kind not in weights or not (0 <= weight < float("inf")):
            raise InvalidInput(
                f"bad mix entry {item!r}: give KIND=WEIGHT, KIND one of {', '.join(OP_KINDS)}",
                field="mix",
                value=text,
            )
        weights[kind] = weight
    if weights["claim"] <= 0:
        raise InvalidInput("the mix needs a positive claim weight", field="mix", value=text)
    return tuple(weights.items())


@dataclass(frozen=True)
class Workload:
    """What the clients do: how many, how much, on what, with which faults."""

    store: str
    clients: int = 4
    ops: int = 1000
    """Operations per client, across its restarts."""
    resources: int = 6
    span_resources: int = 2
    slots: int = 4
    ttl: float = 0.2
    seed: int = 0
    faults: tuple[str, ...] = ()
    plant: str | None = None
    skew: float = 5.0
    fault_interval: float = 0.5
    """Seconds between faults of each kind."""
    restart_every: int = 4
    """The ``restart`` fault restarts the server every this many fault rounds."""
    mix: tuple[tuple[str, float], ...] = DEFAULT_MIX
    ttl_spread: tuple[float, ...] = (0.02, 0.1, 0.5, 1.0)
    """A hold's TTL is ``ttl`` times one of these (and 8 % of claims are confirmed at once)."""
    sweep_interval: float | None = 0.05
    """Seconds between the sweeper's ``sweep()`` calls; None: no sweeper."""
    admin_url: str | None = None
    """PostgreSQL: a role allowed to ``pg_terminate_backend`` the clients' connections."""
    rate: str = "2/250ms"
    """The rate of the rate-limit keys the ``rate`` ops share (:data:`RATE_KEYS` of them):
    small, so that the clients keep every key full and an over-admission shows."""
    run: str = field(default_factory=lambda: secrets.token_hex(3))
    """Prefix of this run's resource names, so a store that already holds
    claims (an earlier run's, or real ones) cannot look like an anomaly."""

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON-able dict (the history header)."""
        return {
            "store": redact(self.store),
            "clients": self.clients,
            "ops": self.ops,
            "resources": self.resources,
            "span_resources": self.span_resources,
            "slots": self.slots,
            "ttl": self.ttl,
            "seed": self.seed,
            "faults": list(self.faults),
            "plant": self.plant,
            "skew": self.skew,
            "fault_interval": self.fault_interval,
            "restart_every": self.restart_every,
            "mix": [list(m) for m in self.mix],
            "ttl_spread": list(self.ttl_spread),
            "sweep_interval": self.sweep_interval,
            "rate": self.rate,
            "run": self.run,
        }  # admin_url stays out of the history: it may carry a password


@dataclass
class _Held:
    """A claim this client believes it has."""

    id: str
    fence: int
    targets: list[list[Any]]
    res: str
    expires_at: int | None  # µs, store clock; None once confirmed


@dataclass
class Client:
    """A sequential client: generates ops, calls the store, records both ends."""

    workload: Workload
    index: int
    incarnation: int
    store: Store
    out: int
    """File descriptor the events go to."""
    skew: float = 0.0
    crash: threading.Event | None = None
    """memory:// only: set by the nemesis to make this client thread die mid-op."""
    pause: threading.Event | None = None
    """memory:// only: set by the nemesis to stall this client mid-op past the TTL."""
    rng: random.Random = field(init=False)
    name: str = field(init=False)
    mine: list[_Held] = field(default_factory=list)
    requests: list[tuple[str | None, list[list[Any]], float | None, str, str]] = field(
        default_factory=list
    )
    seq: int = 0
    seen: list[tuple[str, str, list[list[Any]]]] = field(default_factory=list)
    """Claims this client has known (ID, resource, targets), for ``get``."""
    rate_limit: Callable[[Store, str, str], RateLimit] = RateLimit
    """Makes the client's rate limits (the ``rate-over-limit`` plant passes a broken one)."""
    limits: dict[str, RateLimit] = field(default_factory=dict)
    gen: list[int] = field(default_factory=lambda: [0])
    """The last generation of the ``semaphore-n-plus-one`` plant's barrier this client saw."""

    def __post_init__(self) -> None:
        w = self.workload
        self.rng = random.Random(f"{w.seed}-{self.index}-{self.incarnation}")
        self.name = f"c{self.index}"

    # --- op generation ---------------------------------------------------------------------------

    def _units(self) -> tuple[str, list[Unit]]:
        w, rng = self.workload, self.rng
        res = f"{w.run}-u{rng.randrange(w.resources)}"
        count = 1 if rng.random() < 0.75 else rng.choice((2, 3))
        first = rng.randrange(max(1, w.slots - count + 1))
        return res, [Unit(res, str(first + i)) for i in range(min(count, w.slots))]

    def _span(self) -> tuple[str, list[Span]]:
        res = f"{self.workload.run}-s{self.rng.randrange(max(1, self.workload.span_resources))}"
        lo = self.rng.randrange(12)
        return res, [Span(res, lo, lo + self.rng.randrange(1, 4))]

    def _ttl(self) -> float | None:
        r, ttl = self.rng.random(), self.workload.ttl
        if r < 0.08:
            return None
        return ttl * self.rng.choice(self.workload.ttl_spread)

    def next_op(self) -> tuple[str, dict[str, Any], Callable[[], Any]]:
        """Choose the next op: its name, its recorded arguments, and the call."""
        rng, store = self.rng, self.store
        if len(self.mine) > 6:
            return self._transition("release", self.mine[0])
        mix = self.workload.mix
        if self.workload.plant == "semaphore-n-plus-one" and not dict(mix).get("semaphore"):
            mix = (*mix, ("semaphore", 20.0))  # the plant is in the semaphore: use it
        if self.workload.plant in WAITLIST_PLANTS and not dict(mix).get("waitlist"):
            mix = (*mix, ("waitlist", 40.0))  # the plant is in the waiting list: use it
        kinds, weights = zip(*mix, strict=True)
        kind = rng.choices(kinds, weights)[0]
        if kind == "retry" and self.requests:
            old_rid, old_targets, ttl, old_res, mode = rng.choice(self.requests[-20:])
            if rng.random() < 0.2:  # misuse: the same request ID with other input
                ttl = 7.0 if ttl != 7.0 else 8.0
            return self._claim(old_rid, old_targets, ttl, old_res, mode)
        if kind == "get" and self.seen:
            cid, res, targets = rng.choice(self.seen[-20:])
            args = {"res": res, "targets": targets, "claim_id": cid}
            return "get", args, lambda: store.get(cid)
        if kind == "semaphore":
            res = f"{self.workload.run}-sem"
            holder = f"{self.name}-sem"
            permit_args = {"res": res, "holder": holder, "permits": SEMAPHORE_PERMITS}
            return "semaphore", permit_args, self._permit
        if kind == "rate":
            return self._rate()
        if kind == "waitlist":
            return waitlist_op(self)
        if kind == "claims_of":
            holder = f"c{rng.randrange(self.workload.clients)}"
            return "claims_of", {"res": "*", "holder": holder}, lambda: store.claims_of(holder)
        if kind in ("claim", "retry", "get") or (kind == "transition" and not self.mine):
            res, items = self._span() if rng.random() < 0.2 else self._units()
            ordered: list[Target] = sorted(items, key=_sort_key)
            rid = None
            if rng.random() < 0.8:
                rid = f"{self.workload.run}-{self.name}.{self.incarnation}.r{self.seq}"
            # Readers beside writers, on a store that takes shared claims (drawn only
            # there, so a run on any other store keeps its seed's ops).
            shared = getattr(self.store, "shared_holds", False) and rng.random() < SHARED_SHARE
            mode = "shared" if shared else "exclusive"
            ttl = self._ttl()
            return self._claim(rid, [target_to_json(t) for t in ordered], ttl, res, mode)
        if kind == "transition":
            now_us = (time.time() + self.skew) * 1_000_000
            believed = [h for h in self.mine if h.expires_at is None or h.expires_at > now_us]
            pool = believed if believed and rng.random() < 0.85 else self.mine
            held = rng.choice(pool)
            weights = transition_weights(self.workload.plant)
            fn = rng.choices(("confirm", "extend", "release"), weights)[0]
            return self._transition(fn, held)
        res, items = self._span() if rng.random() < 0.2 else self._units()
        target = items[0]
        return (
            "holder_of",
            {"res": res, "target": target_to_json(target)},
            lambda: store.holder_of(target),
        )

    def _claim(
        self,
        rid: str | None,
        targets: list[list[Any]],
        ttl: float | None,
        res: str,
        mode: str = "exclusive",
    ) -> tuple[str, dict[str, Any], Callable[[], Any]]:
        objs = [target_from_json(t) for t in targets]
        if rid is not None:
            self.requests.append((rid, targets, ttl, res, mode))
        args = {"res": res, "targets": targets, "holder": self.name, "rid": rid, "ttl": ttl}
        if mode != "exclusive":
            args["mode"] = mode
        return (
            "claim",
            args,
            lambda: self.store.claim(objs, holder=self.name, request_id=rid, ttl=ttl, mode=mode),
        )

    def _permit(self) -> dict[str, Any]:
        """Hold a permit of the run's semaphore a moment; when it was surely held, and by whom.

        ``entered`` and ``left`` are monotonic times inside the hold (after the
        lease was entered, before its exit began): the checker counts overlaps of
        these, so a count over the permits is a breach, never a false alarm. A
        permit lost meanwhile is left out (its end is unknown).
        """
        w = self.workload
        cls = Semaphore if w.plant != "semaphore-n-plus-one" else _n_plus_one()
        sem = cls(self.store, f"{w.run}-sem", permits=SEMAPHORE_PERMITS)
        ttl = max(LEASE_TTL_MIN, w.ttl * 5)
        entered = left = 0.0
        try:
            with sem.lease(holder=f"{self.name}-sem", ttl=ttl, wait=w.ttl) as permit:
                entered = time.monotonic()
                time.sleep(w.ttl * self.rng.choice((0.05, 0.25)))
                if w.plant == "semaphore-n-plus-one":  # the holds that breach it, for certain
                    arrival = f"{self.name}-crowd"
                    crowd(self.store, sem.key, arrival, SEMAPHORE_PERMITS + 1, self.gen)
                left = time.monotonic()
                slot = permit.slot
        except ResourceBusy:
            return {"granted": False}
        except HoldLost:
            return {"granted": True, "lost": True}
        return {"granted": True, "lost": False, "entered": entered, "left": left, "slot": slot}

    # --- rate limits: their decisions are checked apart (dibs.verify._model.rate_over_limit) ---

    def _rate(self) -> tuple[str, dict[str, Any], Callable[[], Any]]:
        """Ask one of the shared rate-limit keys for one or two units."""
        w, rng = self.workload, self.rng
        key = f"{w.run}-r{rng.randrange(RATE_KEYS)}"
        limit = self.limits.get(key)
        if limit is None:
            limit = self.limits[key] = self.rate_limit(self.store, key, w.rate)
        cost = 1 if rng.random() < 0.7 else 2
        args = {"res": key, "rate": w.rate, "cost": cost}
        return "rate", args, lambda: limit.acquire(cost)

    def _transition(self, fn: str, held: _Held) -> tuple[str, dict[str, Any], Callable[[], Any]]:
        plant = self.workload.plant
        misuse = self.rng.random() < wrong_fence_rate(plant)
        fence = held.fence + 1 if misuse else held.fence  # misuse: a wrong fence
        args: dict[str, Any] = {
            "res": held.res,
            "targets": held.targets,
            "holder": self.name,
            "claim_id": held.id,
            "fence": fence,
        }
        store = self.store
        if fn == "confirm":
            return fn, args, lambda: store.confirm(held.id, holder=self.name, fence=fence)
        if fn == "extend":
            ttl = self.workload.ttl
            args["ttl"] = ttl
            renew = renew_for(plant)  # by claim ID, as a watchdog renews: dibs.renew
            return fn, args, lambda: renew(store, held.id, holder=self.name, fence=fence, ttl=ttl)
        return fn, args, lambda: store.release(held.id, holder=self.name, fence=fence)

    # --- running ---------------------------------------------------------------------------------

    def run(self, count: int, stopped: Callable[[], bool] | None = None) -> None:
        """Do ``count`` ops, recording each; returns early if the nemesis crashes this client.

        ``stopped``, if given, is asked before each op: True ends the run there.
        """
        for _ in range(count):
            if stopped is not None and stopped():
                return
            if not self.step():
                return

    def step(self) -> bool:
        """Do one op; False if this client "died" in it (memory:// crash fault)."""
        fn, args, call = self.next_op()
        op_id = f"{self.name}.{self.incarnation}.{self.seq}"
        self.seq += 1
        self._emit({"e": "i", "id": op_id, "c": self.name, "f": fn, "a": args})
        if self.pause is not None and self.pause.is_set():
            self.pause.clear()
            time.sleep(self.workload.ttl * 3)  # stalled after invoking, before the store call
        try:
            result = call()
        except HoldLost as exc:
            status, value = "fail", {"error": "HoldLost", "reason": str(exc.reason.value)}
            if value["reason"] != "fence":
                self.mine = [h for h in self.mine if h.id != args["claim_id"]]
        except (ClaimNotFound, NotHolder, RequestConflict, SpanKindMismatch, InvalidInput) as exc:
            status, value = "fail", {"error": type(exc).__name__}
        except Exception as exc:  # the outcome was not learned: unknown
            status, value = "unknown", {"error": type(exc).__name__, "message": str(exc)[:200]}
        else:
            status, value = "ok", self._learn(fn, args, result)
        if self.crash is not None and self.crash.is_set():
            self.crash.clear()
            self._emit({"e": "unknown", "id": op_id, "v": {"error": "killed"}})
            return False
        self._emit({"e": status, "id": op_id, "v": value})
        return True

    def _emit(self, event: dict[str, Any]) -> None:
        event["t"] = time.monotonic()
        event["w"] = time.time()
        write_events(self.out, [event])

    def _learn(self, fn: str, args: dict[str, Any], result: Any) -> dict[str, Any]:
        """Encode the result for the history and update what this client believes it holds."""
        if fn in ("semaphore", "waitlist"):
            assert isinstance(result, dict)
            return result
        if fn == "claim":
            assert isinstance(result, ClaimResult)
            value: dict[str, Any] = {
                "granted": result.granted,
                "replayed": result.replayed,
                "taken": [target_to_json(t) for t in result.taken],
            }
            claim = result.claim
            if claim is not None:
                value.update(_claim_json(claim))
                value["claim_id"] = claim.id
                if not any(s[0] == claim.id for s in self.seen):
                    self.seen.append((claim.id, args["res"], args["targets"]))
                if not any(h.id == claim.id for h in self.mine) and claim.state.value in (
                    "held",
                    "confirmed",
                ):
                    self.mine.append(
                        _Held(
                            claim.id, claim.fence, args["targets"], args["res"], value["expires_at"]
                        )
                    )
            return value
        if fn in ("confirm", "extend"):
            assert isinstance(result, Claim)
            for h in self.mine:
                if h.id == result.id:
                    h.expires_at = None if fn == "confirm" else _us_or_none(result)
            return _claim_json(result)
        if fn == "release":
            self.mine = [h for h in self.mine if h.id != args["claim_id"]]
            return {"released": bool(result)}
        if fn == "get":
            if result is None:
                return {"found": False}
            assert isinstance(result, Claim)
            return {"found": True, **_claim_json(result)}
        if fn == "claims_of":
            return {"claims": [_full_claim_json(c) for c in result]}
        if fn == "rate":
            assert isinstance(result, Decision)
            decided: dict[str, Any] = {"allowed": result.allowed, "retry_after": result.retry_after}
            if result.claim is not None:
                # The admission's times on the store's clock, and no claim ID: the log
                # replay judges the slot claims as claims no call explains.
                decided["created_at"] = micros(result.claim.created_at)
                decided["expires_at"] = _us_or_none(result.claim)
            return decided
        return {"holder": result}


POOL_PREFIX = "dibs-verify psycopg: "
"""Marks a client's psycopg log lines on its stderr, for the runner to count."""

DRIVER_LOGGER = "psycopg"
"""psycopg's loggers: ``psycopg.pool`` reconnecting after a fault, and ``psycopg``
itself ("error ignored in rollback on ...") when a fault cut a connection mid-query."""


class _PoolLines(logging.Handler):
    """psycopg's warnings (a connection cut by a fault) as one marked line each."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage().replace("\n", " ")
            sys.stderr.write(f"{POOL_PREFIX}{record.levelname} {message}\n")
            sys.stderr.flush()
        except Exception:  # a log line must never kill the client
            self.handleError(record)


def mark_pool_logs() -> None:
    """Send psycopg's log records to stderr as marked lines instead of free text."""
    logger = logging.getLogger(DRIVER_LOGGER)
    logger.addHandler(_PoolLines(logging.WARNING))
    logger.propagate = False


def client_skew(workload: Workload, index: int) -> float:
    """The offset of client ``index``'s own clock under the skew fault: ± ``workload.skew``."""
    return workload.skew if index % 2 == 0 else -workload.skew


def _us_or_none(claim: Claim) -> int | None:
    return None if claim.expires_at is None else micros(claim.expires_at)


def _claim_json(claim: Claim) -> dict[str, Any]:
    shown = {
        "fence": claim.fence,
        "state": claim.state.value,
        "created_at": micros(claim.created_at),
        "updated_at": micros(claim.updated_at),
        "expires_at": _us_or_none(claim),
        "holder": claim.holder,
    }
    if claim.mode != "exclusive":
        shown["mode"] = claim.mode
    return shown


def _full_claim_json(claim: Claim) -> dict[str, Any]:
    return {
        "claim_id": claim.id,
        "targets": [target_to_json(t) for t in claim.targets],
        **_claim_json(claim),
    }


def _sort_key(t: Target) -> tuple[str, str, float]:
    if isinstance(t, Unit):
        return (t.resource, t.slot, 0.0)
    return (t.resource, "", float(t.start))  # type: ignore[arg-type]


def open_events(path: str) -> int:
    """Open a client's event file for appending (one ``write`` per event)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


@dataclass
class Sweeper:
    """The sweeper a server runs: ``sweep()`` every ``workload.sweep_interval`` seconds.

    It records each sweep as an op of client ``sweeper`` (on resource ``*``:
    a sweep touches every resource) until ``stopped()`` says the clients are done.
    """

    workload: Workload
    store: Store
    out: int
    incarnation: int = 0

    def run(self, stopped: Callable[[], bool]) -> None:
        """Sweep until ``stopped()``; a sweep that fails is recorded, and sweeping goes on."""
        seq = 0
        interval = self.workload.sweep_interval or 0.05
        while not stopped():
            op_id = f"sweeper.{self.incarnation}.{seq}"
            seq += 1
            invoked: dict[str, Any] = {
                "e": "i",
                "id": op_id,
                "c": "sweeper",
                "f": "sweep",
                "a": {"res": "*"},
            }
            _emit(self.out, invoked)
            value: dict[str, Any]
            try:
                done = self.store.sweep()
            except Exception as exc:  # the outcome was not learned
                status, value = "unknown", {"error": type(exc).__name__}
            else:
                status = "ok"
                value = {
                    "expired": done.expired,
                    "purged_claims": done.purged_claims,
                    "purged_requests": done.purged_requests,
                }
            _emit(self.out, {"e": status, "id": op_id, "v": value})
            time.sleep(interval)


def _emit(out: int, event: dict[str, Any]) -> None:
    event["t"] = time.monotonic()
    event["w"] = time.time()
    write_events(out, [event])


def _n_plus_one() -> type[Semaphore]:
    """The ``semaphore-n-plus-one`` plant: a semaphore that counts one slot too many."""
    from dibs.semaphore import _Limit  # noqa: PLC0415

    class NPlusOne(Semaphore):
        def _current(self) -> Any:
            limit = yield from super()._current()
            # BUG: one slot past the limit, as an off-by-one in a slot loop would.
            return _Limit(limit.version, limit.permits + 1, limit.cap + 1)

    return NPlusOne
